"""OSU's C timing loop for the MPI library's collectives, compiled against the MPI in use.

At one byte, a Python loop around `comm.Allgather(send, recv)` costs a microsecond or
more per call over OSU's C loop: the Python call itself, not the harness. For the
library's own collectives (what `Communicator.library_call` binds: a `functools.partial`
of `Allgather`, `Reduce_scatter_block` or `Allreduce` on numpy buffers with a predefined
op) the harness runs the same loop in C instead (timing_c.c, through ctypes).

Built on first use, not at `pip install`: the build must see the MPI that mpi4py loads
(the MPI wheel, a module's MPI), which pip's build environment does not. The `mpicc` next
to the running Python (an MPI wheel's), else the one on PATH, compiles timing_c.c into a
shared library in a cache (`$CCBENCH_CACHE`, else `$XDG_CACHE_HOME/ccbench`, else
`~/.cache/ccbench`), named by a hash of the source, the MPI library's version string
and the compiler; rank 0 builds it, the others load it (or build their own copy where
the cache is not shared). Before use the library must report the MPI version mpi4py
reports and mpi4py's handle size; otherwise, and where no compiler is found, the Python
loop runs. `CCBENCH_TIMER=python` forces the Python loop, `CCBENCH_TIMER=c` makes a
missing C loop an error. The CSV's `timer` column says which loop timed each row.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ccbench.kernels import switches
from ccbench.kernels.errors import UsageError

SOURCE = Path(__file__).with_name("timing_c.c")
TIMERS = ("auto", "c", "python")
_COLLECTIVE = {"Allgather": 0, "Reduce_scatter_block": 1, "Allreduce": 2}
_BUILD_TIMEOUT_S = 120


class Unavailable(Exception):
    """The C loop cannot run here; the message says why."""


def requested_timer(given: switches.Switches | None = None) -> str:
    """CCBENCH_TIMER: auto (default), c or python; from `given` switches, else those the
    options layer installed."""
    value = (given or switches.current()).timer
    value = value.strip().lower() or "auto"
    if value not in TIMERS:
        raise UsageError(f"CCBENCH_TIMER={value!r}: choose one of {', '.join(TIMERS)}")
    return value


def cache_dir(environ=None) -> Path:
    """CCBENCH_CACHE (the installed switches), else the user's cache folder (from `environ`,
    default this process's environment)."""
    env = os.environ if environ is None else environ
    if switches.current().cache:
        return Path(switches.current().cache)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ccbench"


def find_mpicc() -> str | None:
    """The mpicc beside this Python (an MPI wheel's), else the first on PATH."""
    names = ["mpicc"]
    # MPICH built for the standard MPI ABI (8-byte handles) has its own wrapper
    if MPI._sizeof(MPI.Comm) == 8 and "MPICH" in MPI.Get_library_version():
        names.insert(0, "mpicc_abi")
    for name in names:
        beside = Path(sys.executable).parent / name
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def library_version() -> str:
    return MPI.Get_library_version().replace("\0", "").strip()


def library_path(mpicc: str, source: Path = SOURCE, cache: Path | None = None) -> Path:
    """Where the library for this source, MPI and compiler lives (built or not)."""
    key = hashlib.sha256()
    for part in (
        source.read_bytes(),
        library_version().encode(),
        mpicc.encode(),
        str(MPI._sizeof(MPI.Comm)).encode(),
    ):
        key.update(part)
        key.update(b"\0")
    return (cache or cache_dir()) / f"timing_c-{key.hexdigest()[:16]}.so"


def build(mpicc: str, target: Path, source: Path = SOURCE) -> Path:
    """Compile `source` into `target` (atomically: a half-written library is never seen)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [mpicc, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)],
            capture_output=True,
            text=True,
            timeout=_BUILD_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise Unavailable(f"{mpicc} failed: {detail[-1] if detail else proc.returncode}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{mpicc} failed: {exc}") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def load(path: Path) -> ctypes.CDLL:
    """Load the library and check it was built for the MPI mpi4py uses."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise Unavailable(f"cannot load {path.name}: {exc}") from exc
    if lib.ccbench_handle_size() != MPI._sizeof(MPI.Comm):
        raise Unavailable("the C loop was built for another MPI ABI than mpi4py's")
    text = ctypes.create_string_buffer(MPI.MAX_LIBRARY_VERSION_STRING)
    lib.ccbench_library_version(text, len(text))
    if text.value.decode(errors="replace").strip() != library_version():
        raise Unavailable("the C loop links another MPI library than mpi4py's")
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    common = [pointer, integer, pointer, pointer, integer, pointer, pointer]
    lib.ccbench_warm_up.argtypes = [*common, integer, integer]
    lib.ccbench_timed_per_call.argtypes = [*common, integer, pointer]
    lib.ccbench_timed_batch.argtypes = [*common, integer, pointer]
    for function in (lib.ccbench_warm_up, lib.ccbench_timed_per_call, lib.ccbench_timed_batch):
        function.restype = integer
    return lib


_LIBRARY: dict[int, tuple[ctypes.CDLL | None, str]] = {}


def prepare(comm: MPI.Comm) -> tuple[ctypes.CDLL | None, str]:
    """(library, "") on every rank of `comm`, or (None, why not) on every rank. Collective:
    rank 0 builds into the cache first; every rank then loads; all agree on the result."""
    key = id(comm)
    if key in _LIBRARY:
        return _LIBRARY[key]
    lib, reason = None, ""
    mpicc = find_mpicc()
    if mpicc is None:
        reason = "no mpicc beside this Python or on PATH"
    path = library_path(mpicc) if mpicc else None
    if comm.Get_rank() == 0 and path is not None and not path.exists():
        try:
            build(mpicc, path)
        except Unavailable as exc:
            reason = str(exc)
    reason = comm.bcast(reason, root=0) or reason
    if not reason:
        try:
            if not path.exists():  # a cache this rank does not share with rank 0
                build(mpicc, path)
            lib = load(path)
        except Unavailable as exc:
            reason = str(exc)
    reasons = comm.allgather(reason)
    failed = [f"rank {r}: {why}" for r, why in enumerate(reasons) if why]
    result = (lib, "") if not failed else (None, failed[0])
    _LIBRARY[key] = result
    return result


class CompiledLoop:
    """The harness's warm-up and timed loops, in C, for one bound library collective."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        comm: MPI.Comm,
        collective: int,
        send: np.ndarray,
        recv: np.ndarray,
        count: int,
        datatype: MPI.Datatype,
        op: MPI.Op,
    ):
        self.lib, self.collective, self.count = lib, collective, count
        # keep every object whose handle address is passed alive as long as this loop
        self._keep = (comm, send, recv, datatype, op)
        self.handles = (MPI._addressof(comm), MPI._addressof(datatype), MPI._addressof(op))
        self.send = send.ctypes.data if send.size else None
        self.recv = recv.ctypes.data if recv.size else None

    def _args(self):
        comm, datatype, op = self.handles
        return (comm, self.collective, self.send, self.recv, self.count, datatype, op)

    def _check(self, status: int) -> None:
        if status != MPI.SUCCESS:
            raise MPI.Exception(status)

    def warm_up(self, warmup: int, timing: str) -> None:
        self._check(self.lib.ccbench_warm_up(*self._args(), warmup, int(timing != "batch")))

    def timed(self, iterations: int, timing: str) -> np.ndarray:
        if timing == "batch":
            times = np.empty(min(10, iterations))
            self._check(self.lib.ccbench_timed_batch(*self._args(), iterations, times.ctypes.data))
        else:
            times = np.empty(iterations)
            self._check(
                self.lib.ccbench_timed_per_call(*self._args(), iterations, times.ctypes.data)
            )
        return times


def library_collective(run):
    """(collective id, comm, send, recv, count, datatype, op) when `run` is one of the
    library's collectives bound on host numpy buffers with a predefined op; else None."""
    if not isinstance(run, functools.partial) or run.keywords:
        return None
    comm = getattr(run.func, "__self__", None)
    name = getattr(run.func, "__name__", "")
    if not isinstance(comm, MPI.Comm) or name not in _COLLECTIVE:
        return None
    send, recv, *rest = run.args
    op = rest[0] if rest else MPI.SUM
    arrays = (send, recv)
    if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays):
        return None
    if send.dtype != recv.dtype or not op.is_predefined:
        return None
    # the predefined datatype mpi4py itself sends a numpy buffer of this dtype as
    datatype = MPI._typedict.get(send.dtype.char)
    if datatype is None or not datatype.is_predefined:
        return None
    count = recv.size if name == "Reduce_scatter_block" else send.size
    return _COLLECTIVE[name], comm, send, recv, count, datatype, op


def compiled_loop(comm: MPI.Comm, run, timer: str = "auto") -> tuple[CompiledLoop | None, str]:
    """The C loop for `run`, or (None, why not). Collective over `comm` when it builds:
    every rank passes the same kind of `run`, so every rank takes the same branch."""
    if timer == "python":
        return None, "python timer asked for"
    bound = library_collective(run)
    if bound is None:
        return None, "not one of the MPI library's collectives on host buffers"
    lib, reason = prepare(comm)
    if lib is None:
        if timer == "c":
            raise UsageError(f"CCBENCH_TIMER=c but the C timing loop is unavailable: {reason}")
        return None, reason
    collective, run_comm, send, recv, count, datatype, op = bound
    return CompiledLoop(lib, run_comm, collective, send, recv, count, datatype, op), ""

"""OSU's C timing loop for the MPI library's collectives, compiled against the MPI in use.

At one byte, a Python loop around `comm.Allgather(send, recv)` costs a microsecond or
more per call over OSU's C loop: the Python call itself, not the harness. For the
library's own collectives (what `Communicator.library_call` binds: a `functools.partial`
of a collective's `mpi_call` in collectives/spec.py on numpy buffers with a predefined
op) the harness runs the same loop in C instead (timing_c.c, through ctypes). The C
source names no collective: the calls are written into it from the specs (each spec's
MPI call, its argument list and its count), so a collective whose argument list the
loop does not know is refused with that reason (`c_refusal`), never skipped unsaid.

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

from ccbench.collectives.pipeline import POLL_S, SPIN_S
from ccbench.collectives.spec import (
    MPI_ARGS_GATHERED,
    MPI_ARGS_REDUCED,
    SPECS,
    CollectiveSpec,
)
from ccbench.kernels import switches
from ccbench.kernels.errors import UsageError

SOURCE = Path(__file__).with_name("timing_c.c")
TIMERS = ("auto", "c", "python")
_BUILD_TIMEOUT_S = 120
# The C arguments of each kind of MPI call a spec names (its `mpi_arguments`); `call` in
# timing_c.c holds send, recv, count, type, op and comm.
C_ARGUMENTS = {
    MPI_ARGS_GATHERED: "send, count, type, recv, count, type, comm",
    MPI_ARGS_REDUCED: "send, recv, count, type, op, comm",
}
_CALLS_MARK = "/* CALLS */"


def c_refusal(described: CollectiveSpec) -> str | None:
    """Why OSU's C loop cannot call this collective (None: it can)."""
    if described.mpi_arguments in C_ARGUMENTS:
        return None
    return (
        f"the C timing loop cannot call {described.name}'s MPI_{described.mpi_call}: its "
        f"argument list ({described.mpi_arguments}) is none of the loop's "
        f"({', '.join(C_ARGUMENTS)})"
    )


def c_collectives() -> tuple[CollectiveSpec, ...]:
    """The collectives the C loop calls, in the order of its cases (their numbers)."""
    return tuple(s for s in SPECS.values() if c_refusal(s) is None)


def source_text(source: Path = SOURCE) -> str:
    """The C source with one case of `call` per collective of the specs it can call."""
    cases = "\n    ".join(
        f"case {i}: /* {s.name} */\n"
        f"        return MPI_{s.mpi_call}({C_ARGUMENTS[s.mpi_arguments]});"
        for i, s in enumerate(c_collectives())
    )
    return source.read_text().replace(_CALLS_MARK, cases)


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
        source_text(source).encode(),
        library_version().encode(),
        mpicc.encode(),
        str(MPI._sizeof(MPI.Comm)).encode(),
    ):
        key.update(part)
        key.update(b"\0")
    return (cache or cache_dir()) / f"timing_c-{key.hexdigest()[:16]}.so"


def build(mpicc: str, target: Path, source: Path = SOURCE) -> Path:
    """Compile `source`, its calls written from the specs, into `target` (atomically: a
    half-written library is never seen)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    written = Path(f"{tmp}.c")
    try:
        written.write_text(source_text(source))
        proc = subprocess.run(
            [mpicc, "-O2", "-shared", "-fPIC", "-o", tmp, str(written)],
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
        written.unlink(missing_ok=True)
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
    how = ctypes.POINTER(BarrierSpec)
    lib.ccbench_warm_up.argtypes = [*common, integer, integer, how]
    lib.ccbench_timed_per_call.argtypes = [*common, integer, pointer, how]
    lib.ccbench_timed_batch.argtypes = [*common, integer, pointer, how]
    for function in (lib.ccbench_warm_up, lib.ccbench_timed_per_call, lib.ccbench_timed_batch):
        function.restype = integer
    return lib


class BarrierSpec(ctypes.Structure):
    """timing_c.c's barrier_t: MPI_Barrier, or the yielding barrier with its timings."""

    _fields_ = [
        ("yielding", ctypes.c_int),
        ("spin_s", ctypes.c_double),
        ("poll_s", ctypes.c_double),
    ]


def barrier_spec(barrier: str) -> BarrierSpec:
    """The C loop's barrier for the harness's `barrier` ("blocking" or "yielding"), its
    waits those of the Python loop's (collectives/pipeline.idle_wait)."""
    return BarrierSpec(int(barrier == "yielding"), SPIN_S, POLL_S)


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

    def warm_up(self, warmup: int, timing: str, barrier: str = "blocking") -> None:
        how = ctypes.byref(barrier_spec(barrier))
        self._check(self.lib.ccbench_warm_up(*self._args(), warmup, int(timing != "batch"), how))

    def timed(self, iterations: int, timing: str, barrier: str = "blocking") -> np.ndarray:
        how = ctypes.byref(barrier_spec(barrier))
        if timing == "batch":
            times = np.empty(min(10, iterations))
            self._check(
                self.lib.ccbench_timed_batch(*self._args(), iterations, times.ctypes.data, how)
            )
        else:
            times = np.empty(iterations)
            self._check(
                self.lib.ccbench_timed_per_call(*self._args(), iterations, times.ctypes.data, how)
            )
        return times


_NOT_LIBRARY = "not one of the MPI library's collectives on host buffers"


def library_collective(run):
    """(collective id, comm, send, recv, count, datatype, op) when `run` is one of the
    library's collectives bound on host numpy buffers with a predefined op, and one the C
    loop can call; else None."""
    return _recognised(run)[0]


def _recognised(run) -> tuple[tuple | None, str, bool]:
    """(library_collective's tuple, "", False), or (None, why not, whether the reason is
    a collective of the library that the C loop cannot call)."""
    if not isinstance(run, functools.partial) or run.keywords:
        return None, _NOT_LIBRARY, False
    comm = getattr(run.func, "__self__", None)
    name = getattr(run.func, "__name__", "")
    described = next((s for s in SPECS.values() if s.mpi_call == name), None)
    if not isinstance(comm, MPI.Comm) or described is None:
        return None, _NOT_LIBRARY, False
    refusal = c_refusal(described)
    if refusal is not None:
        return None, refusal, True
    bound = _bound(run, comm, described)
    return bound, "" if bound else _NOT_LIBRARY, False


def _bound(run, comm, described: CollectiveSpec):
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
    count = described.mpi_count(send.size, recv.size, comm.Get_size())
    return c_collectives().index(described), comm, send, recv, count, datatype, op


def compiled_loop(comm: MPI.Comm, run, timer: str = "auto") -> tuple[CompiledLoop | None, str]:
    """The C loop for `run`, or (None, why not). Collective over `comm` when it builds:
    every rank passes the same kind of `run`, so every rank takes the same branch."""
    if timer == "python":
        return None, "python timer asked for"
    bound, why, refused = _recognised(run)
    if bound is None:
        if timer == "c" and refused:
            raise UsageError(f"CCBENCH_TIMER=c, but {why}")
        return None, why
    lib, reason = prepare(comm)
    if lib is None:
        if timer == "c":
            raise UsageError(f"CCBENCH_TIMER=c but the C timing loop is unavailable: {reason}")
        return None, reason
    collective, run_comm, send, recv, count, datatype, op = bound
    return CompiledLoop(lib, run_comm, collective, send, recv, count, datatype, op), ""

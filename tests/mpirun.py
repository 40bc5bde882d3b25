"""Launch real MPI ranks from tests: `mpiexec -n N python ARGS` from the repository root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ccbench.scripts.launchers import binding_enabled, mpiexec_command

REPO = Path(__file__).resolve().parent.parent


# Open MPI's launcher prints its own notices (show_help blocks between dashed lines, lines
# naming prterun, PMIx runtime errors, its libevent's "[warn] Epoll ..." as ranks that
# exit early close their sockets) when ranks exit non-zero, and MPICH a line per
# MPI_Abort; they are not ccbench's.
_HELP_RULE = re.compile(r"^-{20,}$")
_LAUNCHER_LINE = re.compile(
    r"^(prterun|mpiexec|mpirun)\b.*(detected|noticed|exited)"
    r"|^\[[\w.-]+:\d+\] (PMIX|PRTE) ERROR"
    r"|^\[warn\] Epoll \w+\(\d+\) on fd \d+ failed"
    r"|^Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): "
    r"application called MPI_Abort"
)


def without_launcher_notices(stderr: str) -> str:
    lines, inside = [], False
    for line in stderr.splitlines():
        if line and not line.strip("\x00"):  # Open MPI's launcher ends some output with NULs
            continue
        if _HELP_RULE.match(line.strip()):
            inside = not inside
            continue
        if not inside and not _LAUNCHER_LINE.match(line.strip()):
            lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


def hydra_skip() -> str | None:
    """Why ranks cannot be started inside an emulated cluster here, or None: `ccbench
    cluster run` drives MPICH's Hydra launcher (the Open MPI equivalent is by hand)."""
    from ccbench.scripts.launchers import MPICH, find_mpiexec, mpi_family

    if mpi_family(find_mpiexec()) != MPICH:
        return (
            "`ccbench cluster run` drives MPICH's Hydra; this environment's MPI is "
            "another (docs/emulated-cluster.md shows the Open MPI equivalent)"
        )
    return None


def variant_module(name: str) -> list[str]:
    """The Python arguments that run a benchmark variant (`python -m ...`)."""
    return ["-m", f"ccbench.benchmarks.{name}"]


def is_case_driver(module: str) -> bool:
    """tests/drivers/*_cases.py: many cases in one launch, one JSON line per case."""
    return module.startswith("tests.drivers.") and module.endswith("_cases")


def mpirun(
    nranks: int,
    args: list[str],
    timeout: float = 120,
    env: dict | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run `args` under `mpiexec -n nranks` with this Python; output captured as text.

    A run that outlives `timeout` is killed and raises subprocess.TimeoutExpired, so a
    deadlock fails the test instead of hanging it.
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [full_env.get("PYTHONPATH")])]
    )
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    args = list(map(str, args))
    if args[:1] == ["-m"] and is_case_driver(args[1]):
        # mpi4py's runner calls MPI_Abort on an uncaught exception: a rank that raises
        # ends the launch at once instead of leaving the others waiting in a collective
        args = ["-m", "mpi4py", *args]
    command = mpiexec_command(
        nranks, [sys.executable, *args], bind=binding_enabled(environ=full_env)
    )
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd or REPO,
        stdin=subprocess.DEVNULL,
    )
    proc.stderr = without_launcher_notices(proc.stderr)
    return proc


_CASE_RESULTS: dict[tuple[str, int], dict] = {}


def case_results(driver: str, nranks: int, timeout: float = 280) -> dict[str, dict]:
    """Run a case driver (one JSON line per case from rank 0) once per rank count.

    Many cases share one mpiexec launch; parametrized tests then assert each case.
    """
    import json

    key = (driver, nranks)
    if key not in _CASE_RESULTS:
        proc = mpirun(nranks, ["-m", driver], timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        _CASE_RESULTS[key] = {line["case"]: line for line in lines}
    return _CASE_RESULTS[key]

"""`ccbench ...` as a user runs it: a subprocess of this Python, output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.mpirun import REPO


def ccbench(
    *args: str,
    timeout: float = 300,
    cwd: Path | None = REPO,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run the command line with `args`; `env` is added to this process's environment.

    A run past `timeout` raises subprocess.TimeoutExpired, so a hang fails the test."""
    return subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )

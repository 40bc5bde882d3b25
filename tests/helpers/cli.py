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


def parse_osu(stdout: str) -> list[list[str]]:
    """What a parser written for OSU's C benchmarks does: skip '#', split on blanks."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        int(fields[0])
        float(fields[1])  # average latency
        rows.append(fields)
    return rows

"""Git and signals for the tests that run ccbench on a throw-away copy of this checkout
(the gate, compare on a broken tree, the docs in a scratch copy); the `clone` fixture is
in tests/conftest.py."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """`git -C repo args`'s output, less its last newline (a status line keeps its
    leading space); a failing command raises."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout.rstrip("\n")


def interruptible() -> None:
    """In the child: Ctrl-C as a terminal delivers it, even where this test runs in the
    background of a shell (which starts its jobs with SIGINT ignored, and Python keeps an
    ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

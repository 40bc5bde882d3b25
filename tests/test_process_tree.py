"""No rank outlives a stopped tool: a stop that lands while the launcher starts, and ranks
a launcher starts in sessions of their own after it was told to stop (as Hydra does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ccbench.scripts import process_tree
from ccbench.scripts.launchers import kill_group
from ccbench.scripts.sweeps import sweep
from tests.test_sweep_runs import processes_mentioning

# Deaf to SIGTERM for its first `delay` seconds, in which it starts its rank in a
# session of its own; then it waits, deaf still, for its end.
_LATE_LAUNCHER = """
import pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(float(sys.argv[1]))
rank = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
subprocess.Popen([sys.executable, "-c", rank, sys.argv[2]], start_new_session=True)
time.sleep(120)
"""


def _cleanup(marker: str) -> None:
    for pid in processes_mentioning(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_stops_deferred_delivers_the_stop_after_the_block():
    seen = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with process_tree.stops_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the interpreter runs handlers between bytecodes
            assert seen == []  # held back
            inside = True
        assert inside and seen == [signal.SIGTERM]  # delivered once, after the block
        assert signal.getsignal(signal.SIGTERM) is not None
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.timeout(60)
def test_kill_group_finds_ranks_started_after_it_was_called(tmp_path):
    """The launcher ignores SIGTERM and starts its rank 0.5 s after kill_group began: the
    rank, in a session of its own, is found and killed with the launcher."""
    marker = str(tmp_path / "late-rank")
    proc = subprocess.Popen(
        [sys.executable, "-c", _LATE_LAUNCHER, "0.5", marker],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(0.2)
        assert processes_mentioning(marker) == [proc.pid]  # no rank yet
        kill_group(proc, grace_s=2.0)
        assert proc.poll() is not None
        assert processes_mentioning(marker) == []
    finally:
        _cleanup(marker)


@pytest.mark.timeout(60)
def test_a_stop_while_the_sweep_starts_a_task_leaves_no_rank(tmp_path, monkeypatch):
    """SIGTERM inside Popen, the moment the launcher exists and before the sweep holds it
    (the race that a sweep killed as a task starts runs into): run_task still stops it."""
    marker = str(tmp_path / "started-rank")
    real_popen = subprocess.Popen

    def popen_then_stopped(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # undeferred, the handler raises here: the launcher is lost
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_stopped)
    old = signal.signal(signal.SIGTERM, sweep._interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            sweep.run_task(
                [sys.executable, "-c", _LATE_LAUNCHER, "0.2", marker],
                tmp_path / "task.log",
                timeout=None,
                echo=False,
                on_row=lambda size: None,
            )
        assert processes_mentioning(marker) == []
    finally:
        signal.signal(signal.SIGTERM, old)
        _cleanup(marker)

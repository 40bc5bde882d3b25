"""The processes below a launcher, whichever session they run in.

MPICH's Hydra starts its proxy, and the proxy every rank, in a session of its own
(`setsid`), so signalling the launcher's process group misses them: a launcher killed
before it has stopped its ranks (a timeout's SIGKILL, or a `ccbench compare` ended by
SIGTERM while its `cluster run` child goes on) leaves them running, in the emulated
cluster's namespaces too. Taken while the launcher still runs, the tree below it names
them all (no pid namespace is entered: `ip netns exec` and `nsenter -U -m -n` keep the
host's pids).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, start time, state) of a process; None once it has gone (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    # after the command's ")": state, ppid, ... starttime is the 20th field
    return int(fields[1]), fields[19], fields[0]


@contextlib.contextmanager
def stops_deferred():
    """Hold SIGINT, SIGTERM and SIGHUP back while a launcher starts, then deliver them.

    A stop that raises inside `subprocess.Popen` (or between it and the caller's `try`)
    leaves a started launcher that nobody holds, and so nobody stops: its ranks outlive
    the tool. Inside this block a stop is only noted; on leaving it the handlers are put
    back and the signal raised again, where the caller already holds the process. Off the
    main thread, where handlers cannot be set, it defers nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)  # None: set outside Python
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` now: pid -> its start time (which tells it from a later
    process given the same pid). Empty without /proc."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return {}
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in entries:
        st = _stat(entry)
        if st is not None:
            children.setdefault(st[0], []).append((entry, st[1]))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            if child not in found:
                found[child] = start
                todo.append(child)
    return found


def running(processes: dict[int, str]) -> list[int]:
    """Those of `processes` still running (not ended, not a zombie, not a new process
    with a reused pid)."""
    alive = []
    for pid, start in processes.items():
        st = _stat(pid)
        if st is not None and st[1] == start and st[2] != "Z":
            alive.append(pid)
    return alive


def signal_all(processes: dict[int, str], sig: int) -> None:
    for pid in running(processes):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_tree(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """Stop a launcher that shares our process group, and every process below it: SIGTERM
    (Hydra passes it on to its ranks), then SIGKILL for whatever still runs after
    `grace_s`. Ranks the launcher starts meanwhile are found and signalled too. Returns
    once none of them runs."""
    below = descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        signal_all(below, sig)
        signalled = set(below)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
            if proc.poll() is None:  # ranks it started since are below it still
                below.update(descendants(proc.pid))
                signal_all({p: t for p, t in below.items() if p not in signalled}, sig)
                signalled.update(below)
            elif not running(below):
                return

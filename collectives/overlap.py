"""Merged-gradient execution: a plan's allreduces overlapped with a (replayed) backward.

The main thread plays the device: it waits until each group's last gradient is ready,
as a device busy computing would, leaving the host free, and hands the group, the
moment it is complete, to a communication thread that allreduces the groups in order
(one stream, as Horovod's background thread and DDP's reducer).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from ccbench.collectives.mgwfbp import Plan


class CommThread:
    """Runs submitted allreduces one after another, off the compute (main) thread."""

    def __init__(self):
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="allreduce", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (call := self._work.get()) is not None:
            try:
                start = time.perf_counter()
                call()
                self._done.put((start, time.perf_counter()))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                self._done.put(exc)

    def submit(self, call) -> None:
        self._work.put(call)

    def wait(self, count: int) -> np.ndarray:
        """Wait for ``count`` completions; their (start, end) times."""
        times = np.empty((count, 2))
        for k in range(count):
            item = self._done.get()
            if isinstance(item, BaseException):
                raise item
            times[k] = item
        return times

    def close(self) -> None:
        self._work.put(None)
        self._thread.join()


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


@dataclass
class Schedule:
    """One strategy made executable: group ready times and bound allreduce calls."""

    plan: Plan
    ready_s: np.ndarray  # from backward start
    calls: list


def make_schedule(
    p: Plan, bind, send: np.ndarray, recv: np.ndarray, elements: np.ndarray
) -> Schedule:
    """Bind one allreduce per group on its slice of the flat (backward-order) buffers."""
    edges = np.concatenate(([0], np.cumsum(elements)))
    calls = [bind(send[edges[a] : edges[b]], recv[edges[a] : edges[b]]) for a, b in p.groups]
    return Schedule(p, p.ready_us * 1e-6, calls)


def replay_iteration(s: Schedule, stream: CommThread) -> tuple[float, float, float, float]:
    """One iteration, in seconds: forward end and backward end (from the start), end of
    the last allreduce (from the start) and the time spent inside allreduces."""
    t0 = time.perf_counter()
    backward_start = t0 + s.plan.forward_us * 1e-6
    _sleep_until(backward_start)
    forward_end = time.perf_counter()
    for ready, call in zip(s.ready_s, s.calls, strict=True):
        _sleep_until(backward_start + ready)
        stream.submit(call)
    _sleep_until(backward_start + s.plan.backward_us * 1e-6)
    backward_end = time.perf_counter()
    comm = stream.wait(len(s.calls))
    comm_end = max(comm[-1, 1], backward_end)
    busy = float(np.sum(comm[:, 1] - comm[:, 0]))
    return forward_end - t0, backward_end - t0, comm_end - t0, busy

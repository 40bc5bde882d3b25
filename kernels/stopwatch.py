"""Timing regions on the host clock, or with device events on a device buffer.

On a GPU a call returns once its work is queued: a host clock around it measures the
launch, not the work. As nccl-tests does, a device region is timed by two events on the
current stream, recorded around the call; the host waits for the stream only after the
region (`settle`), and reads the elapsed times after the loop (`seconds`). Events are
allocated before the loop (`prepare`), never inside it.

Each region also counts the host synchronisations declared inside it
(kernels.arrays.SYNCS): what the timed calls needed (staging through host memory), 0
where nothing stalls the host.
"""

from __future__ import annotations

import time
import weakref

import numpy as np

from ccbench.kernels import arrays

# told after each settle (`settled()`), outside the timed region: the device has passed
# every event recorded so far (collectives/pipeline.py's Breakdown reads its own then)
_SETTLE_LISTENERS: weakref.WeakSet = weakref.WeakSet()


def on_settle(listener) -> None:
    """Call ``listener.settled()`` after every settle of a device region (weakly held)."""
    _SETTLE_LISTENERS.add(listener)


class Stopwatch:
    """`begin(i)` / `end(i)` around region i; `seconds()` the lengths of regions 0..n-1."""

    def __init__(self, buffer: str | None = None, clock=time.perf_counter):
        b = arrays.backend(buffer) if buffer is not None else None
        self.backend = b if b is not None and b.device else None
        self.clock = clock
        self.starts: list = []
        self.stops: list = []
        self.syncs = 0  # declared host synchronisations inside the regions
        self._mark = 0

    @property
    def on_device(self) -> bool:
        return self.backend is not None

    def prepare(self, n: int) -> None:
        """Room for n regions (events are created here, outside the timed region)."""
        while len(self.starts) < n:
            if self.backend is not None:
                self.starts.append(self.backend.event())
                self.stops.append(self.backend.event())
            else:
                self.starts.append(0.0)
                self.stops.append(0.0)

    def begin(self, i: int) -> None:
        self._mark = arrays.SYNCS.count
        if self.backend is not None:
            self.backend.region(True)
            self.starts[i].record()
        else:
            self.starts[i] = self.clock()

    def end(self, i: int) -> None:
        if self.backend is not None:
            self.stops[i].record()
            self.backend.region(False)
        else:
            self.stops[i] = self.clock()
        self.syncs += arrays.SYNCS.count - self._mark

    def settle(self) -> None:
        """Wait for the device after a region (outside it); nothing on the host."""
        if self.backend is not None:
            with arrays.declared():
                self.backend.synchronize()
            for listener in list(_SETTLE_LISTENERS):
                listener.settled()

    def seconds(self, n: int) -> np.ndarray:
        """The lengths of regions 0..n-1 (on a device: once its stream has run them)."""
        if self.backend is None:
            return np.array(self.stops[:n]) - np.array(self.starts[:n])
        self.settle()
        return np.array(
            [
                self.backend.elapsed_s(a, b)
                for a, b in zip(self.starts[:n], self.stops[:n], strict=True)
            ]
        )

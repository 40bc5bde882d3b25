"""A strict device double for tests: a GPU array library without a GPU.

No GPU is available to CI, yet what matters on one can be checked on the CPU: that a
timed call never stalls the host. This module is a small array library whose arrays
behave, where it matters here, like cupy's:

* their memory is "device" memory: implicit conversion to host refuses
  (`np.asarray(x)`, mixing with numpy arrays in an operation or an assignment raise
  TypeError, as cupy does), and the conversions a GPU library allows but that wait for
  the device (`float(x)`, `int(x)`, `bool(x)`, `x.item()`, `x.tolist()`) are counted as
  host synchronisations;
* copies are explicit, with cupy's rules: `x.get()` (device to host, a synchronisation),
  `x.set(host)` and `asarray(host)` (host to device);
* a stream whose `synchronize` is counted, and events (`record`, `elapsed`);
* the codecs' device kernels (`Kernels`: the compiled host kernels on the double's
  memory, their range check a vote into a flag kept on the device, as
  kernels/codec_device.py's is);
* CUDA graphs (`Graph`, --cuda-graph): inside a capture an allocation, a host
  synchronisation or a copy between host and device raises, as CUDA refuses them; a
  replay is one host launch, its captured work running on the device (re-run here, its
  kernels not launched again by the host).

Operations run at once on numpy storage (an ideal device: every kernel has finished when
it returns). The namespace is numpy's, with arguments and results wrapped, so the
codecs' array-API kernels run on it unchanged. Counted per process (`STATS`): every
synchronisation, those inside a timed region (kernels.stopwatch marks the regions), and
among them those ccbench did not declare (kernels.arrays.declared): a timed call's
accidental stalls. With CCBENCH_DOUBLE_STRICT=1 an undeclared one in a timed region
raises at once, naming its place.

Registered as the `double` buffer (-d double) when CCBENCH_TEST_BACKENDS names this
module; each rank takes device `double:<node-local rank>`.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ccbench.kernels import arrays, backends, cuda_graph
from ccbench.kernels import codec_fused as fused
from tests.devicedouble_memory import (
    CURRENT,
    NAMESPACE,
    STATS,
    WRITES,
    Device,
    DoubleArray,
    record_alloc,
    record_launch,
    record_sync,
)


class Event:
    """A timing event: the time its stream reached it (at once, on this ideal device)."""

    def __init__(self):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        record_sync("event.synchronize()")


class CopyStream:
    """A copy stream (cupy's non-blocking Stream, torch's side stream): copies queue in
    order and land only when something waits for them, so a reader that skips its wait
    reads stale bytes (a fault the tests see as a wrong result, not a timing)."""

    def __init__(self):
        self.queue: list = []  # (position, kind, apply) not yet landed
        self.issued = 0  # copies ever queued: positions
        self.landed = 0  # copies landed, in order
        self.last_kind = ""  # the direction of the last copy queued
        self.after = 0  # the current stream's kernels this stream waited for (a count)

    def enqueue(self, kind: str, apply) -> None:
        STATS.copies[kind] += 1
        self.issued += 1
        self.last_kind = kind
        self.queue.append((self.issued, kind, apply))

    def land(self, upto: int) -> None:
        while self.queue and self.queue[0][0] <= upto:
            _, _, apply = self.queue.pop(0)
            apply()
            self.landed += 1

    def wait_event(self, event) -> None:
        """Copies queued later start after `event`, recorded on the current stream: after
        the kernels enqueued there before it. (An event of another copy stream would order
        nothing the readers see: they land copies by their own waits.)"""
        if event.stream is None:
            self.after = max(self.after, event.kernels)


class CopyEvent:
    """An event for ordering staging copies. Recorded on a copy stream, it is passed once
    every copy queued before it has landed: a consumer stream's wait lands them at once;
    the host finds it passed by `synchronize()` or at the second `query()` (a copy is
    under way when first polled). The host's waits (a `synchronize()`, or the poll that
    finds the copies landed) are counted once per recording, by the direction of the
    copies waited for; recorded on the current stream, it is passed at once."""

    def __init__(self):
        self.stream: CopyStream | None = None
        self.position = 0
        self.kind = ""
        self.polls = 0
        self.waited = False
        self.kernels = 0  # recorded on the current stream: the kernels enqueued before it

    def record(self, stream=None) -> None:
        self.stream = stream if isinstance(stream, CopyStream) else None
        self.polls, self.waited = 0, False
        self.kernels = WRITES.kernels
        if self.stream is not None:
            self.position = self.stream.issued
            self.kind = self.stream.last_kind

    def _passed(self) -> bool:
        return self.stream is None or self.stream.landed >= self.position

    def _host_waited(self) -> None:
        if not self.waited and self.kind:
            STATS.copy_waits[self.kind] += 1
        self.waited = True

    def query(self) -> bool:
        if self._passed():
            return True
        self.polls += 1
        if self.polls < 2:
            return False
        self.stream.land(self.position)
        self._host_waited()
        return True

    @property
    def done(self) -> bool:  # cupy's spelling
        return self.query()

    def synchronize(self) -> None:
        record_sync("copy event.synchronize()")  # a wait, however short
        if not self._passed():
            self.stream.land(self.position)
        self._host_waited()

    def let_wait(self) -> None:
        """A stream waits for this event: what it waits for lands before its next kernel."""
        if self.stream is not None:
            self.stream.land(self.position)


def _wrote(*outputs) -> None:
    for out in outputs:
        if out is not None:
            WRITES.wrote(out._a)


class Kernels:
    """The codecs' device kernels on the double, as kernels/codec_device.py's are on a GPU:
    one "launch" each (the compiled host kernels on the storage, encode, decode and the
    hop), and the range check a vote into the codec's flag for this device (an int32
    device array allocated once per codec and device): left alone on data in range, the
    largest |x| bits where a value is not, never read back here. CCBENCH_DOUBLE_KERNELS=0
    leaves the double on the codecs' array-API kernels (torch-CUDA without cupy)."""

    @staticmethod
    def flag_key(x):
        return x.device

    @staticmethod
    def new_flag(x):
        return DoubleArray(np.zeros(1, np.int32), x.device)

    @staticmethod
    def read_flag(flag) -> int:
        """The flag's value (a host synchronisation), then reset on the device."""
        value = int(flag.get()[0])
        flag.fill(0)
        return value

    @staticmethod
    def _vote(flag, values) -> None:
        """A refused encode's vote (the kernels' atomicMax): the largest |x| bits."""
        bits = np.bitwise_and(values._a.view(np.int32), 0x7FFFFFFF)
        flag._a[0] = max(int(flag._a[0]), int(bits.max()))

    def bfp_encode(self, codec, x, payload, tile_width, flag):
        WRITES.wrote(payload._a)
        if not fused.host_kernels().bfp_encode(
            x._a, payload._a, codec.block, tile_width, codec.rate
        ):
            self._vote(flag, x)

    def bfp_decode(self, codec, payload, out, tile_width):
        WRITES.wrote(out._a)
        fused.host_kernels().bfp_decode(payload._a, out._a, codec.block, tile_width, codec.rate)

    def bfp_decode_add_encode(self, codec, payload, own, target, out, tile_width, flag):
        _wrote(target, out)
        dest = np.empty(0, np.uint8) if out is None else out._a
        if not fused.host_kernels().bfp_decode_add_encode(
            payload._a, own._a, target._a, dest, codec.block, tile_width, codec.rate
        ):
            self._vote(flag, target)

    def cast_encode(self, x, payload, bfloat, flag):
        WRITES.wrote(payload._a)
        if not fused.host_kernels().cast_encode(x._a, payload._a, bfloat):
            self._vote(flag, x)

    def cast_decode(self, payload, out, bfloat):
        WRITES.wrote(out._a)
        fused.host_kernels().cast_decode(payload._a, out._a, bfloat)

    def cast_decode_add_encode(self, payload, own, target, out, bfloat, flag):
        _wrote(target, out)
        dest = np.empty(0, np.uint8) if out is None else out._a
        if not fused.host_kernels().cast_decode_add_encode(
            payload._a, own._a, target._a, dest, bfloat
        ):
            self._vote(flag, target)


def _launched(kernel):
    def launch(self, *args):
        record_launch()  # one kernel launch each, as kernels/codec_device.py's
        return kernel(self, *args)

    return launch


for _name in (
    "bfp_encode",
    "bfp_decode",
    "bfp_decode_add_encode",
    "cast_encode",
    "cast_decode",
    "cast_decode_add_encode",
):
    setattr(Kernels, _name, _launched(getattr(Kernels, _name)))
KERNELS = Kernels()


class Graph:
    """A CUDA graph of one call on the double. The capture runs the call once (this ideal
    device runs its work at once; a replay overwrites what it wrote) with CUDA's refusals
    armed; a replay is one host launch and runs the captured call again as the device
    would, its work not counted as launched by the host."""

    def __init__(self):
        self.call = None

    def capture(self, call) -> None:
        with cuda_graph.capture_region():
            call()
        self.call = call

    def replay(self) -> None:
        if self.call is None:
            raise RuntimeError("replay of a graph that captured nothing")
        record_launch()
        STATS.replays += 1
        STATS.replaying = True
        try:
            self.call()
        finally:
            STATS.replaying = False


class DoubleBackend(backends.Backend):
    name = "double"
    device = True
    holds = tuple(d for d in arrays.DTYPES if d != "bfloat16")  # as cupy

    def owns(self, x) -> bool:
        return isinstance(x, DoubleArray)

    def empty(self, count, dtype):
        return DoubleArray(np.empty(count, dtype=dtype))

    def from_numpy(self, values, dtype):
        return NAMESPACE.asarray(np.ascontiguousarray(values), dtype=dtype)

    def fill(self, x, values):
        x.set(np.ascontiguousarray(values, dtype=x.dtype))

    def to_numpy(self, x):
        return x.get()

    def synchronize(self) -> None:
        record_sync("stream.synchronize()")

    def select(self, local_rank: int) -> None:
        CURRENT[0] = Device(local_rank)

    def label(self) -> str:
        return repr(CURRENT[0])

    def describe(self) -> dict:
        return {"device": self.label(), "name": "ccbench device double"}

    def event(self):
        return Event()

    def elapsed_s(self, start, stop) -> float:
        return stop.t - start.t

    def region(self, timed: bool) -> None:
        STATS.in_region = timed

    def address(self, x) -> int:
        return x._a.__array_interface__["data"][0]

    def copy_out(self, x, host) -> None:
        x.view(np.uint8).get(out=host)

    def copy_in(self, host, x) -> None:
        x.view(np.uint8).set(host)

    def pinned_empty(self, nbytes: int) -> np.ndarray:
        STATS.pinned += 1
        record_alloc()
        return np.empty(nbytes, np.uint8)

    def copy_stream(self):
        return CopyStream()

    def copy_event(self):
        return CopyEvent()

    def record(self, event, stream=None) -> None:
        event.record(stream)

    def stream_wait(self, event, stream=None) -> None:
        """`stream` (None: the current one) waits for `event`. Only a wait by the stream
        that reads the copies' bytes lands them for it; a copy stream's wait orders its
        own later copies (behind the current stream's kernels, for a D2H copy)."""
        if isinstance(stream, CopyStream):
            stream.wait_event(event)
        else:
            event.let_wait()

    def event_done(self, event) -> bool:
        if isinstance(event, CopyEvent):
            return event.query()
        return event.t is not None

    def copy_out_async(self, x, host, stream) -> None:
        if not isinstance(host, np.ndarray) or not isinstance(x, DoubleArray):
            raise TypeError("copy_out_async: a device array into a host array")
        if WRITES.written_at(x._a) > stream.after:
            raise RuntimeError(
                "device double: a D2H copy of a buffer that a kernel wrote after the copy "
                "stream's last wait for the current stream: on a GPU it may read bytes "
                "the kernel has not yet written"
            )
        source = x.view(np.uint8)._a  # the bytes as they are when the copy runs

        def apply():
            host[...] = source

        record_launch()
        stream.enqueue("d2h", apply)

    def copy_in_async(self, host, x, stream) -> None:
        if not isinstance(host, np.ndarray) or not isinstance(x, DoubleArray):
            raise TypeError("copy_in_async: a host array into a device array")
        target = x.view(np.uint8)._a

        def apply():
            target[...] = host

        record_launch()
        stream.enqueue("h2d", apply)

    def graph(self):
        return Graph()

    def codec_kernels(self):
        if os.environ.get("CCBENCH_DOUBLE_KERNELS", "1") == "0" or fused.host_kernels() is None:
            return None
        return KERNELS

    def direct(self, x):
        # a transport that reads device memory itself (GPU-aware MPI, NCCL): the storage
        return x._a

    def tensor(self, x):
        import torch

        return torch.from_numpy(x._a)


arrays.register(DoubleBackend())

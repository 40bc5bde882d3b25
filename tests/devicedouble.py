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
  kernels/codec_device.py's is).

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
import traceback

import numpy as np

from ccbench.kernels import arrays, backends
from ccbench.kernels import codec_fused as fused

STRICT_ENV = "CCBENCH_DOUBLE_STRICT"


class Stats:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.syncs = 0            # every host synchronisation
        self.timed = 0            # inside a timed region
        self.undeclared = 0       # inside a timed region, not declared by ccbench
        self.transfers = 0        # explicit host <-> device copies
        self.allocs = 0           # device allocations (new storage, not views)
        self.timed_allocs = 0     # among them, those inside a timed region
        self.pinned = 0           # page-locked host allocations (counted in allocs too)
        self.timed_transfers = 0  # synchronous explicit copies inside a timed region
        self.copies = {"d2h": 0, "h2d": 0}  # asynchronous copies on copy streams
        self.copy_waits = {"d2h": 0, "h2d": 0}  # copies the host waited for
        self.in_region = False
        self.where: list[str] = []  # the first undeclared ones' places
        self.alloc_where: list[str] = []  # the first timed allocations' places

    def snapshot(self) -> dict:
        return {"syncs": self.syncs, "timed": self.timed, "undeclared": self.undeclared,
                "transfers": self.transfers, "allocs": self.allocs,
                "timed_allocs": self.timed_allocs, "pinned": self.pinned,
                "timed_transfers": self.timed_transfers, "copies": dict(self.copies),
                "copy_waits": dict(self.copy_waits), "where": list(self.where),
                "alloc_where": list(self.alloc_where)}


STATS = Stats()


def _sync(what: str) -> None:
    STATS.syncs += 1
    if not STATS.in_region:
        return
    STATS.timed += 1
    if arrays.SYNCS.depth == 0:
        STATS.undeclared += 1
        frame = [f for f in traceback.extract_stack()[:-2] if "devicedouble" not in f.filename]
        place = f"{what} at {frame[-1].filename}:{frame[-1].lineno}" if frame else what
        if len(STATS.where) < 5:
            STATS.where.append(place)
        if os.environ.get(STRICT_ENV) == "1":
            raise RuntimeError(f"device double: host synchronisation in a timed call: {place}")


def _place() -> str:
    frame = [f for f in traceback.extract_stack()[:-3] if "devicedouble" not in f.filename]
    return f"{frame[-1].filename}:{frame[-1].lineno}" if frame else "?"


def _transfer() -> None:
    STATS.transfers += 1
    if STATS.in_region:
        STATS.timed_transfers += 1


def _alloc() -> None:
    """A new device allocation (cupy's pool would serve it, but a timed call that
    allocates pays the pool's bookkeeping and may grow it: counted, never refused)."""
    STATS.allocs += 1
    if STATS.in_region:
        STATS.timed_allocs += 1
        if len(STATS.alloc_where) < 5:
            STATS.alloc_where.append(_place())


class Device:
    type = "double"

    def __init__(self, index: int = 0):
        self.index = index

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("double", self.index))

    def __repr__(self) -> str:
        return f"double:{self.index}"


CURRENT = [Device(0)]


def _unwrap(value):
    if isinstance(value, DoubleArray):
        return value._a
    if isinstance(value, np.ndarray):
        raise TypeError("Unsupported type <class 'numpy.ndarray'>: device arrays do not "
                        "mix with host arrays (copy explicitly)")
    if isinstance(value, list | tuple):
        return type(value)(_unwrap(v) for v in value)
    return value


def _wrap(value):
    if isinstance(value, np.ndarray):
        return DoubleArray(value)
    if isinstance(value, np.generic):  # a device library returns 0-d device arrays
        return DoubleArray(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


# a device computes on: no floating-point warnings (overflow to Inf, NaN), as on a GPU
_QUIET = {"all": "ignore"}


def _binary(name: str):
    def op(self, other):
        with np.errstate(**_QUIET):
            return _wrap(getattr(self._a, name)(_unwrap(other)))
    op.__name__ = name
    return op


def _inplace(name: str):
    def op(self, other):
        with np.errstate(**_QUIET):
            getattr(self._a, name)(_unwrap(other))
        return self
    op.__name__ = name
    return op


class DoubleArray:
    """A device array: numpy storage the host may not read without an explicit copy."""

    __slots__ = ("_a", "device")

    def __init__(self, storage: np.ndarray, device: Device | None = None):
        self._a = storage
        self.device = device or CURRENT[0]
        if storage.base is None:  # storage of its own: an allocation, not a view
            _alloc()

    # what a device array tells without a copy
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: self._a.flags)
    strides = property(lambda self: self._a.strides)
    T = property(lambda self: DoubleArray(self._a.T, self.device))

    def __array_namespace__(self, api_version=None):
        return NAMESPACE

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"DoubleArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"

    # implicit conversions: refused, or counted as the synchronisations they are
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def _scalar(self, what: str):
        _sync(what)
        return self._a

    def __bool__(self) -> bool:
        return bool(self._scalar("bool()"))

    def __float__(self) -> float:
        return float(self._scalar("float()"))

    def __int__(self) -> int:
        return int(self._scalar("int()"))

    def __index__(self) -> int:
        return self._scalar("index").__index__()

    def item(self):
        return self._scalar(".item()").item()

    def tolist(self):
        return self._scalar(".tolist()").tolist()

    # explicit copies (cupy's)
    def get(self, out=None, stream=None):
        _sync(".get()")
        _transfer()
        if out is None:
            return self._a.copy()
        out[...] = self._a
        return out

    def set(self, host, stream=None) -> None:
        if not isinstance(host, np.ndarray):
            raise TypeError("set takes a host (numpy) array")
        _transfer()
        self._a[...] = host

    # views and element access
    def view(self, dtype):
        return DoubleArray(self._a.view(dtype), self.device)

    def reshape(self, *shape):
        return DoubleArray(self._a.reshape(*shape), self.device)

    def astype(self, dtype, copy=True):
        return DoubleArray(self._a.astype(dtype, copy=copy), self.device)

    def copy(self):
        return DoubleArray(self._a.copy(), self.device)

    def fill(self, value) -> None:
        self._a.fill(_unwrap(value))

    def ravel(self):
        return DoubleArray(self._a.ravel(), self.device)

    def __getitem__(self, key):
        if isinstance(key, DoubleArray) and key.dtype == np.bool_:
            _sync("boolean mask")  # the result's length depends on the data
        return _wrap(self._a[_index(key)])

    def __setitem__(self, key, value) -> None:
        with np.errstate(**_QUIET):
            self._a[_index(key)] = _unwrap(value)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def sum(self, *args, **kwargs):
        return _wrap(self._a.sum(*args, **kwargs))

    def max(self, *args, **kwargs):
        return _wrap(self._a.max(*args, **kwargs))

    def min(self, *args, **kwargs):
        return _wrap(self._a.min(*args, **kwargs))

    def any(self, *args, **kwargs):
        return _wrap(self._a.any(*args, **kwargs))

    def all(self, *args, **kwargs):
        return _wrap(self._a.all(*args, **kwargs))

    def __neg__(self):
        return DoubleArray(-self._a, self.device)

    def __abs__(self):
        return DoubleArray(abs(self._a), self.device)

    def __invert__(self):
        return DoubleArray(~self._a, self.device)


def _index(key):
    if isinstance(key, DoubleArray):
        return key._a
    if isinstance(key, tuple):
        return tuple(k._a if isinstance(k, DoubleArray) else k for k in key)
    return key


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
              "lshift", "rshift", "lt", "le", "gt", "ge", "eq", "ne", "matmul"):
    setattr(DoubleArray, f"__{_name}__", _binary(f"__{_name}__"))
    if _name not in ("lt", "le", "gt", "ge", "eq", "ne"):
        setattr(DoubleArray, f"__r{_name}__", _binary(f"__r{_name}__"))
        setattr(DoubleArray, f"__i{_name}__", _inplace(f"__i{_name}__"))


class _Namespace:
    """numpy's functions on device arrays: arguments unwrapped, results wrapped; host
    arrays refused except by the explicit copies (asarray)."""

    def __getattr__(self, name: str):
        target = getattr(np, name)
        if not callable(target) or isinstance(target, type):
            return target  # dtypes, constants

        def call(*args, **kwargs):
            kwargs.pop("device", None)
            out = kwargs.get("out")
            if out is not None:
                kwargs["out"] = _unwrap(out)
            with np.errstate(**_QUIET):
                result = target(*_unwrap(args), **kwargs)
            if out is not None and isinstance(out, DoubleArray) and result is out._a:
                return out  # written in place: no new storage
            return _wrap(result)

        call.__name__ = name
        return call

    def asarray(self, obj, dtype=None, device=None, copy=None):
        if isinstance(obj, DoubleArray):
            return obj.astype(dtype) if dtype is not None and obj.dtype != dtype else obj
        STATS.transfers += 1  # host to device
        return DoubleArray(np.array(obj, dtype=dtype, copy=True))

    def astype(self, x, dtype, copy=True, device=None):
        return x.astype(dtype, copy=copy)

    def reshape(self, x, shape, copy=None):
        return x.reshape(shape)

    def empty(self, shape, dtype=None, device=None):
        return DoubleArray(np.empty(shape, dtype=dtype))

    def zeros(self, shape, dtype=None, device=None):
        return DoubleArray(np.zeros(shape, dtype=dtype))

    def ones(self, shape, dtype=None, device=None):
        return DoubleArray(np.ones(shape, dtype=dtype))

    def full(self, shape, value, dtype=None, device=None):
        return DoubleArray(np.full(shape, value, dtype=dtype))

    def arange(self, *args, dtype=None, device=None):
        return DoubleArray(np.arange(*args, dtype=dtype))

    def asnumpy(self, x):
        return x.get()

    # results whose shape depends on the data: the host waits to learn it (as cupy's)
    def nonzero(self, x):
        _sync("nonzero()")
        return _wrap(np.nonzero(_unwrap(x)))

    def flatnonzero(self, x):
        _sync("flatnonzero()")
        return _wrap(np.flatnonzero(_unwrap(x)))

    def unique(self, x, *args, **kwargs):
        _sync("unique()")
        return _wrap(np.unique(_unwrap(x), *args, **kwargs))


NAMESPACE = _Namespace()


class Event:
    """A timing event: the time its stream reached it (at once, on this ideal device)."""

    def __init__(self):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        _sync("event.synchronize()")


class CopyStream:
    """A copy stream (cupy's non-blocking Stream, torch's side stream): copies queue in
    order and land only when something waits for them, so a reader that skips its wait
    reads stale bytes (a fault the tests see as a wrong result, not a timing)."""

    def __init__(self):
        self.queue: list = []  # (position, kind, apply) not yet landed
        self.issued = 0        # copies ever queued: positions
        self.landed = 0        # copies landed, in order
        self.last_kind = ""    # the direction of the last copy queued

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
        """Copies queued later start after `event`: on this ideal device every kernel
        recorded before it has finished already."""


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

    def record(self, stream=None) -> None:
        self.stream = stream if isinstance(stream, CopyStream) else None
        self.polls, self.waited = 0, False
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
        _sync("copy event.synchronize()")  # a wait, however short
        if not self._passed():
            self.stream.land(self.position)
        self._host_waited()

    def let_wait(self) -> None:
        """A stream waits for this event: what it waits for lands before its next kernel."""
        if self.stream is not None:
            self.stream.land(self.position)


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
        if not fused.host_kernels().bfp_encode(x._a, payload._a, codec.block, tile_width,
                                               codec.rate):
            self._vote(flag, x)

    def bfp_decode(self, codec, payload, out, tile_width):
        fused.host_kernels().bfp_decode(payload._a, out._a, codec.block, tile_width,
                                        codec.rate)

    def bfp_decode_add_encode(self, codec, payload, own, target, out, tile_width, flag):
        dest = np.empty(0, np.uint8) if out is None else out._a
        if not fused.host_kernels().bfp_decode_add_encode(
                payload._a, own._a, target._a, dest, codec.block, tile_width, codec.rate):
            self._vote(flag, target)

    def cast_encode(self, x, payload, bfloat, flag):
        if not fused.host_kernels().cast_encode(x._a, payload._a, bfloat):
            self._vote(flag, x)

    def cast_decode(self, payload, out, bfloat):
        fused.host_kernels().cast_decode(payload._a, out._a, bfloat)

    def cast_decode_add_encode(self, payload, own, target, out, bfloat, flag):
        dest = np.empty(0, np.uint8) if out is None else out._a
        if not fused.host_kernels().cast_decode_add_encode(payload._a, own._a, target._a,
                                                           dest, bfloat):
            self._vote(flag, target)


KERNELS = Kernels()


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
        _sync("stream.synchronize()")

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
        _alloc()
        return np.empty(nbytes, np.uint8)

    def copy_stream(self):
        return CopyStream()

    def copy_event(self):
        return CopyEvent()

    def record(self, event, stream=None) -> None:
        event.record(stream)

    def stream_wait(self, event, stream=None) -> None:
        event.let_wait()

    def event_done(self, event) -> bool:
        if isinstance(event, CopyEvent):
            return event.query()
        return event.t is not None

    def copy_out_async(self, x, host, stream) -> None:
        if not isinstance(host, np.ndarray) or not isinstance(x, DoubleArray):
            raise TypeError("copy_out_async: a device array into a host array")
        source = x.view(np.uint8)._a  # the bytes as they are when the copy runs

        def apply():
            host[...] = source
        stream.enqueue("d2h", apply)

    def copy_in_async(self, host, x, stream) -> None:
        if not isinstance(host, np.ndarray) or not isinstance(x, DoubleArray):
            raise TypeError("copy_in_async: a host array into a device array")
        target = x.view(np.uint8)._a

        def apply():
            target[...] = host
        stream.enqueue("h2d", apply)

    def codec_kernels(self):
        if os.environ.get("CCBENCH_DOUBLE_KERNELS", "1") == "0" or \
                fused.host_kernels() is None:
            return None
        return KERNELS

    def direct(self, x):
        # a transport that reads device memory itself (GPU-aware MPI, NCCL): the storage
        return x._a

    def tensor(self, x):
        import torch

        return torch.from_numpy(x._a)


arrays.register(DoubleBackend())

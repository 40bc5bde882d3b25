"""The device double's memory (tests/devicedouble.py): arrays on numpy storage that refuse
implicit conversion to host, count the waits a GPU library would make (`STATS`), and the
array namespace the codecs' array-API kernels run on."""

from __future__ import annotations

import os
import traceback

import numpy as np

from ccbench.kernels import arrays, cuda_graph

STRICT_ENV = "CCBENCH_DOUBLE_STRICT"


class Stats:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.syncs = 0  # every host synchronisation
        self.timed = 0  # inside a timed region
        self.undeclared = 0  # inside a timed region, not declared by ccbench
        self.transfers = 0  # explicit host <-> device copies
        self.allocs = 0  # device allocations (new storage, not views)
        self.timed_allocs = 0  # among them, those inside a timed region
        self.pinned = 0  # page-locked host allocations (counted in allocs too)
        self.timed_transfers = 0  # synchronous explicit copies inside a timed region
        self.copies = {"d2h": 0, "h2d": 0}  # asynchronous copies on copy streams
        self.copy_waits = {"d2h": 0, "h2d": 0}  # copies the host waited for
        self.launches = 0  # work the host launched: kernels, array operations, copies,
        # graph replays (a replay's own work runs on the device: not launched again)
        self.timed_launches = 0  # among them, those inside a timed region
        self.replays = 0  # graph replays
        self.replaying = False
        self.in_region = False
        self.where: list[str] = []  # the first undeclared ones' places
        self.alloc_where: list[str] = []  # the first timed allocations' places

    def snapshot(self) -> dict:
        return {
            "syncs": self.syncs,
            "timed": self.timed,
            "undeclared": self.undeclared,
            "transfers": self.transfers,
            "allocs": self.allocs,
            "timed_allocs": self.timed_allocs,
            "pinned": self.pinned,
            "timed_transfers": self.timed_transfers,
            "copies": dict(self.copies),
            "copy_waits": dict(self.copy_waits),
            "launches": self.launches,
            "timed_launches": self.timed_launches,
            "replays": self.replays,
            "where": list(self.where),
            "alloc_where": list(self.alloc_where),
        }


STATS = Stats()


def refuse_in_capture(what: str) -> None:
    """What CUDA refuses while a stream is being captured into a graph (an allocation, a
    synchronisation, a copy to or from the host): it raises, as torch does."""
    if cuda_graph.capturing():
        raise RuntimeError(
            f"CUDA error: operation not permitted when stream is capturing ({what} at {_place()})"
        )


def record_launch() -> None:
    """Work the host launches on the device (a kernel, an array operation, a copy); a
    graph's replay launches its captured work itself, on the device."""
    if STATS.replaying:
        return
    STATS.launches += 1
    if STATS.in_region:
        STATS.timed_launches += 1


def record_sync(what: str) -> None:
    refuse_in_capture(what)
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
    refuse_in_capture("a copy between host and device memory")
    record_launch()
    STATS.transfers += 1
    if STATS.in_region:
        STATS.timed_transfers += 1


def record_alloc() -> None:
    """A new device allocation (cupy's pool would serve it, but a timed call that
    allocates pays the pool's bookkeeping and may grow it: counted, and refused only
    inside a graph capture, as CUDA refuses it there)."""
    refuse_in_capture("a device allocation")
    STATS.allocs += 1
    if STATS.in_region:
        STATS.timed_allocs += 1
        if len(STATS.alloc_where) < 5:
            STATS.alloc_where.append(_place())


class Writes:
    """The current stream's kernels, counted, and the count at each storage's last write.
    A copy on another stream may read a buffer only once that stream waited for an event
    recorded after the kernels that wrote it: on a GPU it would race them otherwise."""

    def __init__(self):
        self.kernels = 0
        self.last: dict[int, int] = {}  # id of a root storage -> kernels at its last write

    @staticmethod
    def root(storage: np.ndarray) -> np.ndarray:
        while isinstance(storage.base, np.ndarray):
            storage = storage.base
        return storage

    def wrote(self, storage: np.ndarray) -> None:
        self.kernels += 1
        self.last[id(self.root(storage))] = self.kernels

    def fresh(self, storage: np.ndarray) -> None:
        """A new allocation: whatever an earlier storage at this address was, forgotten."""
        self.last.pop(id(storage), None)

    def written_at(self, storage: np.ndarray) -> int:
        return self.last.get(id(self.root(storage)), 0)


WRITES = Writes()


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
        raise TypeError(
            "Unsupported type <class 'numpy.ndarray'>: device arrays do not "
            "mix with host arrays (copy explicitly)"
        )
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


def _written(value):
    """`value`, a kernel's result: its storage written on the current stream."""
    if isinstance(value, DoubleArray):
        WRITES.wrote(value._a)
    elif isinstance(value, tuple):
        for v in value:
            _written(v)
    return value


def _binary(name: str):
    def op(self, other):
        record_launch()
        with np.errstate(**_QUIET):
            return _written(_wrap(getattr(self._a, name)(_unwrap(other))))

    op.__name__ = name
    return op


def _inplace(name: str):
    def op(self, other):
        record_launch()
        with np.errstate(**_QUIET):
            getattr(self._a, name)(_unwrap(other))
        WRITES.wrote(self._a)
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
            record_alloc()
            WRITES.fresh(storage)

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
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use "
            "`.get()` to construct a NumPy array explicitly."
        )

    def _scalar(self, what: str):
        record_sync(what)
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
        record_sync(".get()")
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
        return _written(DoubleArray(self._a.astype(dtype, copy=copy), self.device))

    def copy(self):
        return _written(DoubleArray(self._a.copy(), self.device))

    def fill(self, value) -> None:
        record_launch()
        self._a.fill(_unwrap(value))
        WRITES.wrote(self._a)

    def ravel(self):
        return DoubleArray(self._a.ravel(), self.device)

    def __getitem__(self, key):
        if isinstance(key, DoubleArray) and key.dtype == np.bool_:
            record_sync("boolean mask")  # the result's length depends on the data
        return _wrap(self._a[_index(key)])

    def __setitem__(self, key, value) -> None:
        record_launch()
        with np.errstate(**_QUIET):
            self._a[_index(key)] = _unwrap(value)
        WRITES.wrote(self._a)

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


for _name in (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "and",
    "or",
    "xor",
    "lshift",
    "rshift",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
    "matmul",
):
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
            record_launch()
            if out is not None:
                kwargs["out"] = _unwrap(out)
            with np.errstate(**_QUIET):
                result = target(*_unwrap(args), **kwargs)
            if out is not None and isinstance(out, DoubleArray) and result is out._a:
                return _written(out)  # written in place: no new storage
            return _written(_wrap(result))

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
        record_sync("nonzero()")
        return _wrap(np.nonzero(_unwrap(x)))

    def flatnonzero(self, x):
        record_sync("flatnonzero()")
        return _wrap(np.flatnonzero(_unwrap(x)))

    def unique(self, x, *args, **kwargs):
        record_sync("unique()")
        return _wrap(np.unique(_unwrap(x), *args, **kwargs))


NAMESPACE = _Namespace()

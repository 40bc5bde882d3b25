"""Buffer backends: numpy and torch here, cupy and torch-CUDA on a GPU cluster.

Everything that allocates, converts, copies or synchronises a benchmark buffer goes
through this module, so the harness and the collectives never branch on the backend. GPU
libraries are imported only when a GPU buffer is asked for.

A backend is *device* when the host cannot read its memory (a GPU's, or the test-only
device double's). Copies between host and device and waits for the device are explicit
here: `to_host`, `to_device` and `host_sync` *declare* a host synchronisation and count
it (`SYNCS`), so a timed call reports the ones its algorithm needs (staging through host
memory for an MPI that cannot read the device) and the device double of the tests can
tell them from accidental ones (an implicit `float()` of a device scalar).

Test-only backends register themselves (`register`) from the modules named in
CCBENCH_TEST_BACKENDS (comma-separated); the option parsers then offer them too.
"""

from __future__ import annotations

import importlib
import mmap
import os
from contextlib import contextmanager, nullcontext

import numpy as np

from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import BUFFERS, DTYPES, nbytes

TEST_BACKENDS_ENV = "CCBENCH_TEST_BACKENDS"

# How host buffers are paged: "off" allocates as OSU's C benchmarks do (plain malloc, no
# advice); "madvise" asks the kernel for transparent huge pages on large numpy arrays, as
# numpy does by default. Measured on a 2-core host, 16 MiB int8 allgather on 2 bound
# ranks: 2.1-2.5 ms with huge pages against 3.4-3.5 ms without; OSU's binary 3.4-4.1 ms.
HUGEPAGE_POLICIES = ("off", "madvise")
DEFAULT_HUGEPAGES = "off"


def set_hugepages(policy: str) -> str:
    """Apply a host-buffer paging policy to numpy allocations from now on; returns it as
    applied ("off", "madvise", or "numpy default" where numpy cannot be told)."""
    if policy not in HUGEPAGE_POLICIES:
        raise UsageError(f"--hugepages {policy!r}: choose one of {', '.join(HUGEPAGE_POLICIES)}")
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    if setter is None:
        return "numpy default"
    setter(policy == "madvise")
    return policy


def transparent_hugepages() -> str:
    """The kernel's transparent huge page mode (always, madvise, never), or ''."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return ""
    chosen = [w.strip("[]") for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else ""


# Host buffers start on a page boundary, as OSU's (posix_memalign to the page size). Two
# heap buffers whose page offsets differ by a few bytes (what malloc hands out in a row)
# made the MPI library's copies between them run at half speed: a 64 KiB float32
# allgather on 2 bound ranks of a 2-core host took 37-41 us on numpy's own buffers against
# 16-19 us on page-aligned ones, in the same launches. The offsets and the times were
# measured; 4K aliasing, which the pattern fits, is inferred.
PAGE_BYTES = mmap.PAGESIZE


def page_aligned_numpy(count: int, dtype: str) -> np.ndarray:
    """An uninitialised numpy array of `count` elements whose data starts on a page."""
    nbytes = count * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + PAGE_BYTES, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE_BYTES
    return raw[start:start + nbytes].view(dtype)


def page_aligned_torch(count: int, dtype):
    """An uninitialised CPU tensor of `count` elements of torch `dtype`, starting on a page."""
    import torch

    nbytes = count * torch.empty(0, dtype=dtype).element_size()
    raw = torch.empty(nbytes + PAGE_BYTES, dtype=torch.uint8)
    start = -raw.data_ptr() % PAGE_BYTES
    return raw[start:start + nbytes].view(dtype)


def empty_like(like, count: int, dtype=None):
    """An uninitialised 1-D array of `count` elements of `dtype` (like's by default) on
    like's backend and device; host memory starts on a page (see PAGE_BYTES)."""
    dtype = like.dtype if dtype is None else dtype
    if isinstance(like, np.ndarray):
        return page_aligned_numpy(count, dtype)
    if type(like).__module__.startswith("torch") and like.device.type == "cpu":
        return page_aligned_torch(count, dtype)
    import array_api_compat

    xp = array_api_compat.array_namespace(like)
    return xp.empty((count,), dtype=dtype, device=array_api_compat.device(like))


class SyncCounter:
    """Declared host synchronisations of this process (waits for the device, copies
    between host and device); `depth` > 0 while one is under way."""

    def __init__(self):
        self.count = 0
        self.depth = 0


SYNCS = SyncCounter()


@contextmanager
def declared():
    """A host synchronisation the algorithm needs: counted, and known to be meant."""
    SYNCS.count += 1
    SYNCS.depth += 1
    try:
        yield
    finally:
        SYNCS.depth -= 1


class Backend:
    """One kind of buffer. Host backends need none of the device hooks."""

    name = ""
    device = False
    holds = DTYPES  # the dtypes its arrays can hold

    def check(self) -> None:
        """Raise UsageError when this backend cannot run here."""

    def owns(self, x) -> bool:
        raise NotImplementedError

    def empty(self, count: int, dtype: str):
        raise NotImplementedError

    def from_numpy(self, values: np.ndarray, dtype: str):
        raise NotImplementedError

    def fill(self, x, values: np.ndarray) -> None:
        """x[...] = host `values` cast to x's dtype (an explicit copy on a device)."""
        raise NotImplementedError

    def to_numpy(self, x) -> np.ndarray:
        raise NotImplementedError

    # device hooks -----------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for the work queued on the current stream."""

    def select(self, local_rank: int) -> None:
        """Make the device of this node-local rank the current one."""

    def label(self) -> str:
        return "cpu"

    def describe(self) -> dict:
        """What the sidecar records about this rank's device."""
        return {"device": self.label()}

    def event(self):
        """A timing event on the current stream (device backends)."""
        raise NotImplementedError

    def elapsed_s(self, start, stop) -> float:
        raise NotImplementedError

    def event_done(self, event) -> bool:
        """Whether the stream has passed the event (never waits)."""
        raise NotImplementedError

    def region(self, timed: bool) -> None:
        """Entering (True) or leaving a timed region (the test double counts in it)."""

    def codec_kernels(self):
        """The codecs' device kernels of this backend, if it brings its own (None: cupy's,
        kernels/codec_device.py, where cupy runs)."""
        return None

    def address(self, x) -> int:
        raise NotImplementedError

    def copy_out(self, x, host: np.ndarray) -> None:
        """host (uint8, nbytes(x)) = the bytes of device array x."""
        raise NotImplementedError

    def copy_in(self, host: np.ndarray, x) -> None:
        """The bytes of device array x = host (uint8)."""
        raise NotImplementedError

    def direct(self, x):
        """What an MPI that reads device memory is handed for x."""
        return x

    # staging through host memory (device backends) ----------------------------------
    def pinned_empty(self, nbytes: int) -> np.ndarray:
        """A uint8 host buffer the device copies at bus speed (page-locked); host
        backends never stage, so plain page-aligned memory."""
        return page_aligned_numpy(nbytes, "uint8")

    def copy_stream(self):
        """A new stream for staging copies, not ordered with the current stream."""
        raise NotImplementedError

    def copy_event(self):
        """An event without timing, for ordering copies (recorded later, reused)."""
        raise NotImplementedError

    def record(self, event, stream=None) -> None:
        """Record `event` on `stream` (None: the current stream)."""
        event.record(stream)

    def stream_wait(self, event, stream=None) -> None:
        """Make `stream` (None: the current stream) wait for `event`; the host goes on."""
        raise NotImplementedError

    def event_synchronize(self, event) -> None:
        """The host waits until the device has passed `event`."""
        event.synchronize()

    def copy_out_async(self, x, host: np.ndarray, stream) -> None:
        """Enqueue host (uint8, pinned) = the bytes of device array x on `stream`."""
        raise NotImplementedError

    def copy_in_async(self, host: np.ndarray, x, stream) -> None:
        """Enqueue the bytes of device array x = host (uint8, pinned) on `stream`."""
        raise NotImplementedError

    def byte_view(self, x):
        """A contiguous 1-D device array's bytes, as a device array (sliceable)."""
        return x.view(np.uint8)

    def tensor(self, x):
        """A zero-copy torch tensor of x's memory, for torch.distributed."""
        raise NotImplementedError


class _Numpy(Backend):
    name = "numpy"
    holds = tuple(d for d in DTYPES if d != "bfloat16")

    def owns(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def empty(self, count, dtype):
        return page_aligned_numpy(count, dtype)

    def from_numpy(self, values, dtype):
        out = page_aligned_numpy(np.size(values), dtype).reshape(np.shape(values))
        out[...] = values
        return out

    def fill(self, x, values):
        x[...] = values

    def to_numpy(self, x):
        return x

    def tensor(self, x):
        import torch

        return torch.from_numpy(x)


class _Torch(Backend):
    """torch tensors on the CPU (`torch`) or on the current CUDA device (`torch-cuda`)."""

    def __init__(self, name: str, cuda: bool):
        self.name, self.device, self.cuda = name, cuda, cuda

    def check(self):
        try:
            import torch
        except ImportError:
            raise UsageError(f"-d {self.name} needs torch (pip install 'ccbench[torch]')"
                             ) from None
        if self.cuda and not torch.cuda.is_available():
            raise UsageError("-d torch-cuda: torch sees no CUDA device on this host")

    def owns(self, x):
        if not type(x).__module__.startswith("torch"):
            return False
        return (x.device.type != "cpu") == self.cuda

    def _where(self):
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.cuda else "cpu"

    def empty(self, count, dtype):
        import torch

        if self.cuda:
            return torch.empty(count, dtype=getattr(torch, dtype), device=self._where())
        return page_aligned_torch(count, getattr(torch, dtype))

    def from_numpy(self, values, dtype):
        import torch

        host = torch.from_numpy(np.ascontiguousarray(values))
        if self.cuda:
            return host.to(device=self._where(), dtype=getattr(torch, dtype))
        out = self.empty(host.numel(), dtype).view(host.shape)
        out.copy_(host)
        return out

    def fill(self, x, values):
        import torch

        x.copy_(torch.from_numpy(np.ascontiguousarray(values)))

    def to_numpy(self, x):
        import torch

        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()

    def synchronize(self):
        if self.cuda:
            import torch

            torch.cuda.current_stream().synchronize()

    def select(self, local_rank):
        if self.cuda:
            import torch

            torch.cuda.set_device(local_rank % torch.cuda.device_count())

    def label(self):
        if not self.cuda:
            return "cpu"
        import torch

        return f"cuda:{torch.cuda.current_device()}"

    def describe(self):
        if not self.cuda:
            return {"device": "cpu"}
        import torch

        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {"device": self.label(), "name": props.name,
                "uuid": str(getattr(props, "uuid", "")),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def event(self):
        import torch

        return torch.cuda.Event(enable_timing=True)

    def elapsed_s(self, start, stop):
        return start.elapsed_time(stop) * 1e-3

    def event_done(self, event):
        return event.query()

    def address(self, x):
        return x.data_ptr()

    def copy_out(self, x, host):
        import torch

        torch.from_numpy(host).copy_(x.view(-1).view(torch.uint8))

    def copy_in(self, host, x):
        import torch

        x.view(-1).view(torch.uint8).copy_(torch.from_numpy(host))

    def pinned_empty(self, nbytes):
        import torch

        if not self.cuda:
            return page_aligned_numpy(nbytes, "uint8")
        # the tensor stays alive as the numpy array's base
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()

    def copy_stream(self):
        import torch

        return torch.cuda.Stream()  # from torch's pool: created non-blocking

    def copy_event(self):
        import torch

        return torch.cuda.Event()

    def record(self, event, stream=None):
        import torch

        event.record(torch.cuda.current_stream() if stream is None else stream)

    def stream_wait(self, event, stream=None):
        import torch

        (torch.cuda.current_stream() if stream is None else stream).wait_event(event)

    def copy_out_async(self, x, host, stream):
        import torch

        with torch.cuda.stream(stream):
            torch.from_numpy(host).copy_(x, non_blocking=True)

    def copy_in_async(self, host, x, stream):
        import torch

        with torch.cuda.stream(stream):
            x.copy_(torch.from_numpy(host), non_blocking=True)

    def byte_view(self, x):
        import torch

        return x.view(-1).view(torch.uint8)

    def tensor(self, x):
        return x


class _Cupy(Backend):
    name = "cupy"
    device = True
    holds = tuple(d for d in DTYPES if d != "bfloat16")

    def check(self):
        try:
            import cupy
        except ImportError:
            raise UsageError("-d cupy needs cupy (pip install 'ccbench[gpu]')") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError:
            count = 0
        if count == 0:
            raise UsageError("-d cupy: no CUDA device on this host")

    def owns(self, x):
        return type(x).__module__.startswith("cupy")

    def empty(self, count, dtype):
        import cupy

        return cupy.empty(count, dtype=dtype)

    def from_numpy(self, values, dtype):
        import cupy

        return cupy.asarray(np.ascontiguousarray(values, dtype=dtype))

    def fill(self, x, values):
        # ndarray.set takes host memory only: cast on the host, then one copy
        x.set(np.ascontiguousarray(values, dtype=x.dtype))

    def to_numpy(self, x):
        import cupy

        return cupy.asnumpy(x)

    def synchronize(self):
        import cupy

        cupy.cuda.get_current_stream().synchronize()

    def select(self, local_rank):
        import cupy

        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()

    def label(self):
        import cupy

        return f"cuda:{cupy.cuda.Device().id}"

    def describe(self):
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props.get("name", b"")
        return {"device": self.label(),
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "pci_bus_id": cupy.cuda.Device().pci_bus_id,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def event(self):
        import cupy

        return cupy.cuda.Event()

    def elapsed_s(self, start, stop):
        import cupy

        return cupy.cuda.get_elapsed_time(start, stop) * 1e-3

    def event_done(self, event):
        return event.done

    def address(self, x):
        return x.data.ptr

    def copy_out(self, x, host):
        x.view(np.uint8).get(out=host)

    def copy_in(self, host, x):
        x.view(np.uint8).set(host)

    def pinned_empty(self, nbytes):
        import cupyx

        return cupyx.empty_pinned(nbytes, dtype=np.uint8)  # from cupy's pinned pool

    def copy_stream(self):
        import cupy

        return cupy.cuda.Stream(non_blocking=True)

    def copy_event(self):
        import cupy

        return cupy.cuda.Event(disable_timing=True)

    def record(self, event, stream=None):
        import cupy

        event.record(cupy.cuda.get_current_stream() if stream is None else stream)

    def stream_wait(self, event, stream=None):
        import cupy

        (cupy.cuda.get_current_stream() if stream is None else stream).wait_event(event)

    def copy_out_async(self, x, host, stream):
        import cupy

        runtime = cupy.cuda.runtime
        runtime.memcpyAsync(host.ctypes.data, x.data.ptr, host.nbytes,
                            runtime.memcpyDeviceToHost, stream.ptr)

    def copy_in_async(self, host, x, stream):
        import cupy

        runtime = cupy.cuda.runtime
        runtime.memcpyAsync(x.data.ptr, host.ctypes.data, host.nbytes,
                            runtime.memcpyHostToDevice, stream.ptr)

    def tensor(self, x):
        import torch

        return torch.as_tensor(x, device=f"cuda:{x.device.id}")


_BACKENDS: dict[str, Backend] = {
    "numpy": _Numpy(), "torch": _Torch("torch", False),
    "torch-cuda": _Torch("torch-cuda", True), "cupy": _Cupy(),
}
_TEST_LOADED = False


def register(backend: Backend) -> None:
    """Add a (test-only) backend under its name."""
    _BACKENDS[backend.name] = backend


def _load_test_backends() -> None:
    global _TEST_LOADED
    if _TEST_LOADED:
        return
    _TEST_LOADED = True
    for module in filter(None, (m.strip() for m in os.environ.get(TEST_BACKENDS_ENV, "")
                                .split(","))):
        importlib.import_module(module)


def buffer_choices() -> tuple[str, ...]:
    """What -d accepts: the four backends, and test-only ones where registered."""
    _load_test_backends()
    return (*BUFFERS, *(n for n in _BACKENDS if n not in BUFFERS))


def backend(buffer: str) -> Backend:
    _load_test_backends()
    try:
        return _BACKENDS[buffer]
    except KeyError:
        raise UsageError(f"unknown buffer {buffer!r}; choose one of "
                         f"{', '.join(buffer_choices())}") from None


def backend_of(x) -> Backend:
    """The backend an array belongs to."""
    for b in _BACKENDS.values():
        if b.owns(x):
            return b
    raise UsageError(f"no buffer backend holds a {type(x).__name__}")


def is_gpu(buffer: str) -> bool:
    """True for device buffers (a GPU's memory, or the test double's)."""
    return backend(buffer).device


def is_device_array(x) -> bool:
    if isinstance(x, np.ndarray):
        return False
    return backend_of(x).device


def check_supported(buffer: str, dtype: str) -> None:
    """Raise UsageError when `buffer` cannot hold `dtype` or is not usable here."""
    b = backend(buffer)
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if dtype not in b.holds:
        raise UsageError(f"{buffer} buffers cannot hold {dtype}; use -d torch")
    b.check()


def empty(buffer: str, count: int, dtype: str):
    """An uninitialised 1-D array of `count` elements on `buffer`."""
    return backend(buffer).empty(count, dtype)


def from_numpy(buffer: str, array: np.ndarray, dtype: str):
    """Copy a host numpy array onto `buffer`, cast to `dtype` (rounding to nearest)."""
    return backend(buffer).from_numpy(array, dtype)


def fill(x, values: np.ndarray) -> None:
    """x[...] = float64 host `values` rounded to x's dtype, for any backend (on a device,
    an explicit copy, outside the timed calls)."""
    backend_of(x).fill(x, values)


def to_numpy(x) -> np.ndarray:
    """A host numpy copy (or view) of any backend array; bfloat16 comes back as float32.

    On a device this is an explicit copy, outside the timed calls (validation, accuracy).
    """
    if isinstance(x, np.ndarray):
        return x
    b = backend_of(x)
    if not b.device:
        return b.to_numpy(x)
    with declared():
        return b.to_numpy(x)


def host_view(x) -> np.ndarray:
    """A zero-copy numpy view of a host array, for MPI; bfloat16 is viewed as uint16.

    mpi4py parses numpy buffers fastest; building the view once at set-up keeps the
    per-call cost of the timed loop at that of a bare mpi4py call.
    """
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__
    if module.startswith("torch"):
        import torch

        if x.device.type != "cpu":
            raise ValueError("host_view needs a host tensor")
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(np.uint16)
        return x.numpy()
    raise ValueError(f"no host view for {type(x).__name__}")


def to_host(x, host: np.ndarray) -> None:
    """host (uint8, nbytes(x) long) = the bytes of device array x: a declared sync."""
    with declared():
        backend_of(x).copy_out(x, host[:nbytes(x)])


def to_device(host: np.ndarray, x) -> None:
    """The bytes of device array x = host (uint8): a declared host transfer."""
    with declared():
        backend_of(x).copy_in(host[:nbytes(x)], x)


def wait_copy(x, event) -> None:
    """The host waits for a staging copy of x's backend (a declared sync)."""
    with declared():
        backend_of(x).event_synchronize(event)


def poll_copy(x, event) -> bool:
    """Whether a staging copy has finished, without waiting; the poll that finds it done
    ends a host wait (declared and counted once, as `wait_copy` would be)."""
    if not backend_of(x).event_done(event):
        return False
    SYNCS.count += 1
    return True


def host_driven(x):
    """Around a call whose algorithm reads a device's data back at every step (sparse
    block maps, message headers): declared once per call; nothing on the host."""
    return declared() if is_device_array(x) else nullcontext()


def host_sync(x) -> None:
    """Wait until the work queued on x's device is done: a declared sync."""
    b = backend_of(x)
    if b.device:
        with declared():
            b.synchronize()


def synchronize(buffer: str) -> None:
    """Wait for queued device work (a declared sync); a no-op on host buffers."""
    b = backend(buffer)
    if b.device:
        with declared():
            b.synchronize()


def select_device(buffer: str, local_rank: int) -> None:
    """Each rank its own device: the node-local rank's (modulo the devices it sees)."""
    backend(buffer).select(local_rank)


def device_label(buffer: str) -> str:
    """This rank's device as rows record it: 'cpu', 'cuda:1', ..."""
    return backend(buffer).label()

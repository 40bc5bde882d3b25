"""The buffer backends (numpy, torch, torch-CUDA, cupy) behind kernels/arrays.py, and the
count of declared host synchronisations (`SYNCS`, `declared`) they keep. GPU libraries
are imported only when a GPU buffer is asked for."""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np

from ccbench.kernels.errors import UsageError
from ccbench.kernels.host_memory import page_aligned_numpy, page_aligned_torch
from ccbench.kernels.vocabulary import DTYPES


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

    def graph(self):
        """A graph to capture one call into and replay it (`capture(call)`, `replay()`:
        kernels/cuda_graph.py); device backends only."""
        raise UsageError(f"--cuda-graph: -d {self.name} buffers live on the host: no device")

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


class NumpyBackend(Backend):
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


class TorchBackend(Backend):
    """torch tensors on the CPU (`torch`) or on the current CUDA device (`torch-cuda`)."""

    def __init__(self, name: str, cuda: bool):
        self.name, self.device, self.cuda = name, cuda, cuda

    def check(self):
        try:
            import torch
        except ImportError:
            raise UsageError(f"-d {self.name} needs torch (pip install 'ccbench[torch]')") from None
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
        return {
            "device": self.label(),
            "name": props.name,
            "uuid": str(getattr(props, "uuid", "")),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }

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

    def graph(self):
        if not self.cuda:
            return super().graph()
        from ccbench.kernels.cuda_graph import TorchGraph

        return TorchGraph(cupy=False)


class CupyBackend(Backend):
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
        return {
            "device": self.label(),
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "pci_bus_id": cupy.cuda.Device().pci_bus_id,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }

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
        runtime.memcpyAsync(
            host.ctypes.data, x.data.ptr, host.nbytes, runtime.memcpyDeviceToHost, stream.ptr
        )

    def copy_in_async(self, host, x, stream):
        import cupy

        runtime = cupy.cuda.runtime
        runtime.memcpyAsync(
            x.data.ptr, host.ctypes.data, host.nbytes, runtime.memcpyHostToDevice, stream.ptr
        )

    def tensor(self, x):
        import torch

        return torch.as_tensor(x, device=f"cuda:{x.device.id}")

    def graph(self):
        try:
            import torch  # noqa: F401 - the graph is torch's (NCCL's calls are too)
        except ImportError:
            raise UsageError(
                "--cuda-graph on -d cupy needs torch (pip install 'ccbench[torch]')"
            ) from None
        from ccbench.kernels.cuda_graph import TorchGraph

        return TorchGraph(cupy=True)

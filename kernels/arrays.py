"""Buffer backends: numpy and torch here, cupy and torch-CUDA on a GPU cluster.

Everything that allocates, converts or synchronises a benchmark buffer goes through
this module, so the harness and the collectives never branch on the backend. GPU
libraries are imported only when a GPU buffer is asked for.
"""

from __future__ import annotations

import numpy as np

from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import BUFFERS, DTYPES

# Backends whose arrays cannot hold a dtype (numpy and cupy have no bfloat16).
_UNSUPPORTED = {("numpy", "bfloat16"), ("cupy", "bfloat16")}

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


def is_gpu(buffer: str) -> bool:
    return buffer in ("cupy", "torch-cuda")


def check_supported(buffer: str, dtype: str) -> None:
    """Raise UsageError when `buffer` cannot hold `dtype` or is not usable here."""
    if buffer not in BUFFERS:
        raise UsageError(f"unknown buffer {buffer!r}; choose one of {', '.join(BUFFERS)}")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if (buffer, dtype) in _UNSUPPORTED:
        raise UsageError(f"{buffer} buffers cannot hold {dtype}; use -d torch")
    if buffer in ("torch", "torch-cuda"):
        try:
            import torch
        except ImportError:
            raise UsageError(f"-d {buffer} needs torch (pip install 'ccbench[torch]')") from None
        if buffer == "torch-cuda" and not torch.cuda.is_available():
            raise UsageError("-d torch-cuda: torch sees no CUDA device on this host")
    if buffer == "cupy":
        try:
            import cupy
        except ImportError:
            raise UsageError("-d cupy needs cupy (pip install 'ccbench[gpu]')") from None
        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise UsageError("-d cupy: no CUDA device on this host")


def _torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)


def empty(buffer: str, count: int, dtype: str):
    """An uninitialised 1-D array of `count` elements on `buffer`."""
    if buffer == "numpy":
        return np.empty(count, dtype=dtype)
    if buffer in ("torch", "torch-cuda"):
        import torch

        device = "cuda" if buffer == "torch-cuda" else "cpu"
        return torch.empty(count, dtype=_torch_dtype(dtype), device=device)
    if buffer == "cupy":
        import cupy

        return cupy.empty(count, dtype=dtype)
    raise UsageError(f"unknown buffer {buffer!r}")


def from_numpy(buffer: str, array: np.ndarray, dtype: str):
    """Copy a host numpy array onto `buffer`, cast to `dtype` (rounding to nearest)."""
    if buffer == "numpy":
        return np.ascontiguousarray(array, dtype=dtype)
    if buffer in ("torch", "torch-cuda"):
        import torch

        device = "cuda" if buffer == "torch-cuda" else "cpu"
        return torch.from_numpy(np.ascontiguousarray(array)).to(
            device=device, dtype=_torch_dtype(dtype)
        )
    if buffer == "cupy":
        import cupy

        return cupy.asarray(array, dtype=dtype)
    raise UsageError(f"unknown buffer {buffer!r}")


def to_numpy(x) -> np.ndarray:
    """A host numpy copy (or view) of any backend array; bfloat16 comes back as float32."""
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__
    if module.startswith("torch"):
        import torch

        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()
    if module.startswith("cupy"):
        import cupy

        return cupy.asnumpy(x)
    return np.asarray(x)


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


def synchronize(buffer: str) -> None:
    """Wait for queued device work; a no-op on host buffers."""
    if buffer == "torch-cuda":
        import torch

        torch.cuda.synchronize()
    elif buffer == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()

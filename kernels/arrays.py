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
import os
from contextlib import nullcontext

import numpy as np

from ccbench.kernels.backends import (
    SYNCS,
    Backend,
    CupyBackend,
    NumpyBackend,
    TorchBackend,
    declared,
)
from ccbench.kernels.errors import UsageError
from ccbench.kernels.host_memory import page_aligned_numpy, page_aligned_torch
from ccbench.kernels.vocabulary import BUFFERS, DTYPES, nbytes

TEST_BACKENDS_ENV = "CCBENCH_TEST_BACKENDS"


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


_BACKENDS: dict[str, Backend] = {
    "numpy": NumpyBackend(),
    "torch": TorchBackend("torch", False),
    "torch-cuda": TorchBackend("torch-cuda", True),
    "cupy": CupyBackend(),
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
    # The test backends' hook: the one CCBENCH_ variable read below the options layer
    # (benchmarks/switches.py), here where it acts, since backends register before any
    # option parser offers them (docs/environment.md).
    for module in filter(
        None, (m.strip() for m in os.environ.get(TEST_BACKENDS_ENV, "").split(","))
    ):
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
        raise UsageError(
            f"unknown buffer {buffer!r}; choose one of {', '.join(buffer_choices())}"
        ) from None


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
        backend_of(x).copy_out(x, host[: nbytes(x)])


def to_device(host: np.ndarray, x) -> None:
    """The bytes of device array x = host (uint8): a declared host transfer."""
    with declared():
        backend_of(x).copy_in(host[: nbytes(x)], x)


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

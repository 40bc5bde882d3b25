"""Host buffers as the benchmarks allocate them: page-aligned, with the transparent huge
page policy chosen (`--hugepages`)."""

from __future__ import annotations

import mmap

import numpy as np

from ccbench.kernels.errors import UsageError

# How host buffers are paged: "off" allocates as OSU's C benchmarks do (plain malloc, no
# advice); "madvise" asks the kernel for transparent huge pages on large numpy arrays, as
# numpy does by default (docs/compression.md, "Huge pages", measures the difference).
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


# Host buffers start on a page boundary, as OSU's (posix_memalign to the page size): heap
# buffers whose page offsets differ by a few bytes halved the MPI library's copies between
# them (docs/compression.md, "Against OSU Micro-Benchmarks' own binaries").
PAGE_BYTES = mmap.PAGESIZE


def page_aligned_numpy(count: int, dtype: str) -> np.ndarray:
    """An uninitialised numpy array of `count` elements whose data starts on a page."""
    nbytes = count * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + PAGE_BYTES, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE_BYTES
    return raw[start : start + nbytes].view(dtype)


def page_aligned_torch(count: int, dtype):
    """An uninitialised CPU tensor of `count` elements of torch `dtype`, starting on a page."""
    import torch

    nbytes = count * torch.empty(0, dtype=dtype).element_size()
    raw = torch.empty(nbytes + PAGE_BYTES, dtype=torch.uint8)
    start = -raw.data_ptr() % PAGE_BYTES
    return raw[start : start + nbytes].view(dtype)

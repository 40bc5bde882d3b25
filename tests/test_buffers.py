"""Host buffers start on a page, as OSU's posix_memalign'd ones: the MPI library's copies
between two buffers whose page offsets differ by a few bytes stall on 4K aliasing."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from ccbench.kernels import arrays

DTYPES = ("int8", "float16", "float32", "float64")


def _address(x) -> int:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return x.untyped_storage().data_ptr() + x.storage_offset() * x.element_size()


def _buffers():
    yield "numpy", DTYPES
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    yield "torch", (*DTYPES, "bfloat16")


@pytest.mark.parametrize("count", [1, 3, 1000, 16385, 262144])
def test_empty_buffers_start_on_a_page(count):
    for buffer, dtypes in _buffers():
        # Allocated in a row, as the harness allocates send and receive buffers.
        for dtype in dtypes:
            first = arrays.empty(buffer, count, dtype)
            second = arrays.empty(buffer, count * 2, dtype)
            for x, n in ((first, count), (second, 2 * count)):
                assert _address(x) % mmap.PAGESIZE == 0, (buffer, dtype, count)
                assert tuple(x.shape) == (n,)
                assert str(x.dtype).removeprefix("torch.") == dtype


def test_copies_from_numpy_start_on_a_page_and_keep_values_and_shape():
    values = np.arange(-6.0, 6.0).reshape(3, 4) / 4  # exact in every dtype below
    for buffer, dtypes in _buffers():
        for dtype in dtypes:
            x = arrays.from_numpy(buffer, values, dtype)
            assert _address(x) % mmap.PAGESIZE == 0, (buffer, dtype)
            assert tuple(x.shape) == (3, 4)
            got = arrays.to_numpy(x).astype(np.float64)
            want = np.trunc(values) if dtype == "int8" else values
            np.testing.assert_array_equal(got, want)


def test_buffers_that_go_over_the_wire_start_on_a_page():
    """The ring's block scratch and codec payloads (OmniReduce's messages take the same
    allocation, `arrays.empty_like`)."""
    from ccbench.collectives.ring import empty_like_block
    from ccbench.kernels.codec_base import empty_payload

    for buffer, dtypes in _buffers():
        for dtype in dtypes:
            like = arrays.empty(buffer, 8, dtype)
            block = empty_like_block(like, 1000)
            payload = empty_payload(like, 4099)
            assert _address(block) % mmap.PAGESIZE == 0, (buffer, dtype)
            assert block.dtype == like.dtype and tuple(block.shape) == (1000,)
            assert _address(payload) % mmap.PAGESIZE == 0, (buffer, dtype)
            assert tuple(payload.shape) == (4099,)
            assert str(payload.dtype).removeprefix("torch.") == "uint8"

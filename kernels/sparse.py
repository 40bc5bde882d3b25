"""Block-sparsity kernels: non-zero block bitmap, compaction, scatter and scatter-add.

A tensor of `count` elements is cut into blocks of `block_size` elements; the last block
is partial when `count` does not divide. Every function works on the array namespace of
its input (array-api-compat), so one source serves numpy and torch here and cupy or
torch-CUDA on a GPU. Block ids are integer arrays of the same namespace and device,
sorted ascending and unique (as `nonzero_block_ids` returns them); only the partial
tail block needs special handling, and it is always the last id.

Advanced-index assignment (`out[ids] = v`, `out[ids] += v` with unique ids) goes beyond
the array-API standard but behaves identically on numpy, torch and cupy.
"""

from __future__ import annotations

from array_api_compat import array_namespace, is_numpy_array, is_torch_array
from array_api_compat import device as array_device


def block_count(count: int, block_size: int) -> int:
    """Number of blocks, the last one partial when block_size does not divide count."""
    return -(-count // block_size)


def split_blocks(x, block_size: int):
    """(full, tail): a (nfull, block_size) view of the full blocks and a 1-D tail view."""
    nfull = x.shape[0] // block_size
    cut = nfull * block_size
    return x[:cut].reshape(nfull, block_size), x[cut:]


def block_mask(x, block_size: int, threshold: float = 0.0):
    """Boolean array, one entry per block: True where any |x| > threshold.

    threshold 0 is lossless: a block is non-zero as soon as one element is non-zero.
    """
    xp = array_namespace(x)
    full, tail = split_blocks(x, block_size)
    if threshold == 0:
        mask = xp.any(full != 0, axis=1)
        if tail.shape[0]:
            mask = xp.concat([mask, xp.reshape(xp.any(tail != 0), (1,))])
    else:
        mask = xp.any(xp.abs(full) > threshold, axis=1)
        if tail.shape[0]:
            mask = xp.concat([mask, xp.reshape(xp.any(xp.abs(tail) > threshold), (1,))])
    return mask


def nonzero_block_ids(x, block_size: int, threshold: float = 0.0):
    """Ascending int64 ids of the blocks holding any |x| > threshold."""
    xp = array_namespace(x)
    return xp.astype(xp.nonzero(block_mask(x, block_size, threshold))[0], xp.int64)


def _has_tail_id(count: int, block_size: int, ids) -> bool:
    # the partial tail block can only be the last (largest) id
    return count % block_size != 0 and ids.shape[0] > 0 and int(ids[-1]) == count // block_size


def _take_rows(full, ids, out):
    """out[:] = full[ids] without an intermediate copy where the library allows it."""
    if is_numpy_array(full):
        import numpy as np

        np.take(full, ids, axis=0, out=out, mode="clip")  # 'raise' buffers out
    elif is_torch_array(full):
        import torch

        torch.index_select(full, 0, ids, out=out)
    else:
        xp = array_namespace(full)
        out[...] = xp.take(full, ids, axis=0)


def gather_blocks(x, ids, block_size: int, out=None):
    """Compact the blocks `ids` of the 1-D tensor x into a (len(ids), block_size) array.

    A partial tail block is padded with zeros. `out` (optional, contiguous, shape
    (len(ids), block_size), dtype of x) receives the blocks in place, e.g. a view into a
    message buffer, so the compaction is the only copy.
    """
    xp = array_namespace(x)
    k = ids.shape[0]
    if out is None:
        out = xp.empty((k, block_size), dtype=x.dtype, device=array_device(x))
    full, tail = split_blocks(x, block_size)
    nfull_ids = k - 1 if _has_tail_id(x.shape[0], block_size, ids) else k
    if nfull_ids:
        _take_rows(full, ids[:nfull_ids], out[:nfull_ids])
    if nfull_ids < k:
        out[k - 1, : tail.shape[0]] = tail
        out[k - 1, tail.shape[0] :] = 0
    return out


def scatter_blocks(out, ids, blocks, block_size: int) -> None:
    """out[block ids] = blocks (the inverse of gather_blocks; the padding is dropped)."""
    k = ids.shape[0]
    full, tail = split_blocks(out, block_size)
    nfull_ids = k - 1 if _has_tail_id(out.shape[0], block_size, ids) else k
    if nfull_ids:
        full[ids[:nfull_ids]] = blocks[:nfull_ids]
    if nfull_ids < k:
        tail[...] = blocks[k - 1, : tail.shape[0]]


def zero_blocks(out, ids, block_size: int) -> None:
    """out[block ids] = 0 (a partial tail block only its own elements)."""
    k = ids.shape[0]
    full, tail = split_blocks(out, block_size)
    nfull_ids = k - 1 if _has_tail_id(out.shape[0], block_size, ids) else k
    if nfull_ids:
        full[ids[:nfull_ids]] = 0
    if nfull_ids < k:
        tail[...] = 0


def scatter_add_blocks(out, ids, blocks, block_size: int) -> None:
    """out[block ids] += blocks; out is the 1-D tensor or a padded (nblocks, block_size)."""
    k = ids.shape[0]
    if out.ndim == 2:
        out[ids] += blocks
        return
    full, tail = split_blocks(out, block_size)
    nfull_ids = k - 1 if _has_tail_id(out.shape[0], block_size, ids) else k
    if nfull_ids:
        full[ids[:nfull_ids]] += blocks[:nfull_ids]
    if nfull_ids < k:
        tail[...] += blocks[k - 1, : tail.shape[0]]


def dropped_abs_sum(x, mask, block_size: int) -> float:
    """Sum of |x| over the blocks that `mask` leaves out (the mass a threshold drops)."""
    xp = array_namespace(x)
    full, tail = split_blocks(x, block_size)
    nfull = full.shape[0]
    total = 0.0
    dropped_full = ~mask[:nfull]
    if nfull and bool(xp.any(dropped_full)):
        rows = xp.nonzero(dropped_full)[0]
        total += float(xp.sum(xp.abs(xp.astype(xp.take(full, rows, axis=0), xp.float64))))
    if tail.shape[0] and not bool(mask[nfull]):
        total += float(xp.sum(xp.abs(xp.astype(tail, xp.float64))))
    return total

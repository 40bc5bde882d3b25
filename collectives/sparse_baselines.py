"""AllGather-based sparse allreduce, the baseline OmniReduce is compared with.

Every rank compacts its non-zero blocks (ids and values), the ranks exchange the block
counts, then every rank's compacted blocks travel the ring once (the allgather schedule
of `collectives.ring`, with per-rank segment sizes), and each rank scatter-adds all
segments, in rank order, into a zeroed output. Volume per rank: (P-1) segments of
(4 + block bytes) per block, whatever the overlap between ranks.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import array_namespace, device

from ccbench.collectives.ring import allgather_schedule, ring_allgather, ring_neighbors
from ccbench.kernels import arrays
from ccbench.kernels.sparse import gather_blocks, nonzero_block_ids, scatter_add_blocks
from ccbench.kernels.vocabulary import SPARSE_INDEX_BYTES, dtype_name, itemsize


def _align(nbytes: int) -> int:
    return -(-nbytes // 16) * 16


class AllgatherSparse:
    """A bound allgather-sparse allreduce of `send` into `recv`; call it to run one."""

    def __init__(self, comm, send, recv, block_size: int, threshold: float = 0.0):
        self.comm, self.send, self.recv = comm, send, recv
        self.block_size, self.threshold = block_size, threshold
        self.xp = array_namespace(send)
        self.block_bytes = block_size * itemsize(dtype_name(send))
        self.packed = self.xp.empty(0, dtype=self.xp.uint8, device=device(send))
        self.counts = np.zeros(comm.size, dtype=np.int64)

    def _segment_bytes(self, k: int) -> int:
        # every segment and its values start aligned
        return _align(_align(SPARSE_INDEX_BYTES * k) + k * self.block_bytes)

    def _segment(self, offset: int, k: int):
        """(ids int32, values (k, block_size)) views of one rank's segment."""
        ids = self.packed[offset : offset + SPARSE_INDEX_BYTES * k].view(self.xp.int32)
        start = offset + _align(SPARSE_INDEX_BYTES * k)
        values = self.packed[start : start + k * self.block_bytes].view(self.send.dtype)
        return ids, values.reshape(k, self.block_size)

    def __call__(self) -> None:
        # host-driven: the block counts and ids come back from a device every call
        with arrays.host_driven(self.send):
            self._call()

    def _call(self) -> None:
        comm, xp = self.comm, self.xp
        ids = nonzero_block_ids(self.send, self.block_size, self.threshold)
        ring_allgather(comm, np.array([ids.shape[0]], dtype=np.int64), self.counts)
        sizes = [self._segment_bytes(int(k)) for k in self.counts]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        if self.packed.shape[0] < offsets[-1]:  # grows once, then reused
            self.packed = xp.empty(offsets[-1], dtype=xp.uint8, device=device(self.send))
        k = ids.shape[0]
        mine_ids, mine_values = self._segment(offsets[comm.rank], k)
        mine_ids[...] = xp.astype(ids, xp.int32)
        if k:
            gather_blocks(self.send, ids, self.block_size, out=mine_values)
        left, right = ring_neighbors(comm.rank, comm.size)
        for _, send_rank, recv_rank in allgather_schedule(comm.rank, comm.size):
            comm.sendrecv(
                self.packed[offsets[send_rank] : offsets[send_rank + 1]],
                right,
                self.packed[offsets[recv_rank] : offsets[recv_rank + 1]],
                left,
            )
        self.recv[...] = 0
        for rank in range(comm.size):  # rank order on every rank: the same sums everywhere
            count = int(self.counts[rank])
            if count:
                seg_ids, values = self._segment(offsets[rank], count)
                scatter_add_blocks(self.recv, xp.astype(seg_ids, xp.int64), values, self.block_size)

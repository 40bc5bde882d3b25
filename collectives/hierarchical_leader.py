"""Hierarchical collectives through node leaders (`--hierarchy leader`).

The node's data meets at its first rank (local index 0, the leader), the leaders run the
variant's collective across nodes on M times a rank's share, and the result goes back
inside the node. The other design (collectives/hierarchical.py, `--hierarchy node`) runs
M inter-node collectives at once, one per local index, each on its share. Both send the
same bytes through a node's link; through a leader they go as one collective of larger
messages (N - 1 steps, not M collectives of N - 1 steps each), while the node's other
ranks wait and the leader alone runs the codec. docs/hierarchical.md has both measured.

Inside a node, per collective:

* allgather: the M blocks gathered to the leader (its node's slab), the leaders'
  allgather of the slabs into the result, the result broadcast to the node;
* reduce-scatter: the ring reduce-scatter of M pieces of the input, the pieces gathered
  to the leader (the node's sum), the leaders' reduce-scatter of the sums into the node's
  slab of the result, each rank's block scattered back;
* allreduce: as reduce-scatter to the node's sum, the leaders' allreduce, the result
  broadcast.

Gather, broadcast and scatter are linear: the leader posts one message per local rank
(M is a node's GPU count, a handful).
"""

from __future__ import annotations

from ccbench.collectives.compressed import ring_raw_bytes
from ccbench.collectives.hierarchical import Hierarchical, YieldingRing
from ccbench.collectives.phases import REDUCE
from ccbench.collectives.ring import RingScratch, block_bounds, ring_reduce_scatter_blocks
from ccbench.kernels import arrays
from ccbench.kernels.reduce import copy_into

_TAG_TO_LEADER = 7401  # gather to the node's leader
_TAG_FROM_LEADER = 7402  # broadcast or scatter from it
LEADER = 0  # the leader's local index


def gather_to_leader(ring: YieldingRing, block, slab, bounds) -> None:
    """Each rank's `block` into slab[bounds[k]] on the leader (slab: None elsewhere)."""
    comm = ring.comm
    if comm.rank != LEADER:
        ring.complete([comm.isend(block, LEADER, _TAG_TO_LEADER)] if block.shape[0] else [])
        return
    a, b = bounds[LEADER]
    copy_into(slab[a:b], block)
    ring.complete(
        [
            comm.irecv(slab[a:b], k, _TAG_TO_LEADER)
            for k, (a, b) in enumerate(bounds)
            if k != LEADER and b > a
        ]
    )


def broadcast_from_leader(ring: YieldingRing, buf) -> None:
    """The leader's `buf` into every rank's."""
    comm = ring.comm
    if comm.rank != LEADER:
        ring.complete([comm.irecv(buf, LEADER, _TAG_FROM_LEADER)])
        return
    ring.complete([comm.isend(buf, k, _TAG_FROM_LEADER) for k in range(comm.size) if k != LEADER])


def scatter_from_leader(ring: YieldingRing, source, out, count: int) -> None:
    """Block k of the leader's `source` (blocks of `count`) into rank k's `out`."""
    comm = ring.comm
    if comm.rank != LEADER:
        ring.complete([comm.irecv(out, LEADER, _TAG_FROM_LEADER)] if count else [])
        return
    copy_into(out, source[LEADER * count : (LEADER + 1) * count])
    ring.complete(
        [
            comm.isend(source[k * count : (k + 1) * count], k, _TAG_FROM_LEADER)
            for k in range(comm.size)
            if k != LEADER and count
        ]
    )


class LeaderHierarchical(Hierarchical):
    """One hierarchical collective through node leaders, bound to its buffers (module
    docstring). Its byte counters and breakdown are Hierarchical's; a rank that is not
    its node's leader has no inter-node collective (`inner` None)."""

    def _bind(self, described, bind_inter) -> None:
        sendbuf, recvbuf, local = self.sendbuf, self.recvbuf, self.local
        n_send, n_recv = sendbuf.shape[0], recvbuf.shape[0]
        m = self.layout.ranks_per_node
        self.leader = local == LEADER
        self.inner = None
        if described.gathers and not described.reduces:
            count = n_send
            self.slab_bounds = [(k * count, (k + 1) * count) for k in range(m)]
            self.slab = arrays.empty_like(sendbuf, m * count) if self.leader else None
            if self.leader:
                self.inner = bind_inter(self.inter, self.slab, recvbuf)
            self._run = self._allgather
            intra_raw = (m - 1) * n_recv if self.leader else count
        else:
            self.pieces = block_bounds(n_send, m)
            p0, p1 = self.pieces[local]
            self.partial = arrays.empty_like(sendbuf, p1 - p0)
            self.scratch = RingScratch(sendbuf, max(b - a for a, b in self.pieces))
            self.node_sum = arrays.empty_like(sendbuf, n_send) if self.leader else None
            if not described.gathers:  # reduce-scatter: the node's slab, block by block
                count = n_recv
                self.node_result = arrays.empty_like(sendbuf, m * count) if self.leader else None
                if self.leader:
                    self.inner = bind_inter(self.inter, self.node_sum, self.node_result)
                self._run = self._reduce_scatter
                back = (m - 1) * count if self.leader else 0
            else:
                count = n_send
                if self.leader:
                    self.inner = bind_inter(self.inter, self.node_sum, recvbuf)
                self._run = self._allreduce
                back = (m - 1) * n_send if self.leader else 0
            to_leader = 0 if self.leader else p1 - p0
            intra_raw = ring_raw_bytes((REDUCE,), self.pieces, local, m, 1) + to_leader + back
        self.count = count
        self.raw_bytes = (intra_raw * self.item if m > 1 else 0) + getattr(
            self.inner, "raw_bytes", 0
        )

    def _to_leader_sum(self) -> None:
        """The node's sum of the input on its leader (`node_sum`)."""
        self._intra(
            ring_reduce_scatter_blocks, self.sendbuf, self.pieces, self.partial, self.scratch
        )
        self._intra(gather_to_leader, self.partial, self.node_sum, self.pieces)

    def _allgather(self) -> None:
        self._intra(gather_to_leader, self.sendbuf, self.slab, self.slab_bounds)
        if self.leader:
            self._across()
        self._intra(broadcast_from_leader, self.recvbuf)

    def _reduce_scatter(self) -> None:
        self._to_leader_sum()
        if self.leader:
            self._across()
        self._intra(scatter_from_leader, self.node_result, self.recvbuf, self.count)

    def _allreduce(self) -> None:
        self._to_leader_sum()
        if self.leader:
            self._across()
        self._intra(broadcast_from_leader, self.recvbuf)

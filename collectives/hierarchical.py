"""Hierarchical collectives: uncompressed inside a node, compressed (or not) across nodes.

A cluster has two levels: ranks of one node on fast links, nodes on a slower network.
These collectives send across the network only what must cross it. Two designs, both
measured (docs/hierarchical.md): per local rank (`node`), the ranks of one local index,
one per node, form an inter-node communicator and every rank's link carries its share;
through node leaders (`leader`), the node's data meets at its first rank, which alone
runs the inter-node collective on M times the data. With N nodes of M ranks (rank r on
node r // M, local index r % M, as SLURM's block distribution and `ccbench cluster up
--nodes N --ranks-per-node M` place them), per local rank:

* allgather: the inter-node allgather of each rank's block among the ranks of its local
  index (N blocks, each copied to its place in the result), then, per node's slab of the
  result (its M ranks' blocks), the intra-node allgather in place;
* reduce-scatter: per node's slab of the send buffer (the blocks of its M ranks), the
  intra-node reduce-scatter (this rank's block of every slab, summed over its node: the
  node's partial sums, N blocks), then the inter-node reduce-scatter of the partial
  sums: each node's contribution crosses the network once, compressed once where the
  inter-node collective compresses each contribution once;
* allreduce: the intra-node reduce-scatter of M pieces, the inter-node allreduce of this
  rank's piece, the intra-node allgather of the pieces.

Through leaders, inside a node: gather to the leader (allgather: the M blocks, its node's
slab; reducing: the ring reduce-scatter of M pieces, then the pieces gathered: the node's
sum), the leaders' collective across nodes on that, then back from the leader (allgather
and allreduce: the whole result to each rank; reduce-scatter: each rank's block). Gather
and broadcast are linear (the leader posts one message per local rank).

The inter-node collective is bound by the caller (`bind_inter`): a compressed variant
(collectives/compressed.py: the point-to-point ring, the collective-level ring, the
library-backed one) or the uncompressed baseline (collectives/baseline.py), so each
comparison is like with like. Inside a node: the uncompressed ring of
collectives/ring.py over the node's communicator (a departure from the library
collectives hierarchical libraries use inside a node: it takes blocks that differ in
length, works on a slab in place, and counts the bytes it sends; with 2 ranks per node
it is the one exchange any algorithm makes, per slab). The levels run one after another
(`levels` "series"), but for the allgather's own slab, exchanged while the level across
runs; through shared memory (collectives/hierarchical_shared.py) the level inside a node
may run beside the level across ("overlapped").
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from ccbench.collectives.compressed import ring_raw_bytes
from ccbench.collectives.pipeline import (
    CODEC_CPU,
    FIELDS,
    WAIT,
    Breakdown,
    idle_wait,
)
from ccbench.collectives.ring import (
    RingScratch,
    block_bounds,
    ring_allgather_inplace,
    ring_reduce_scatter_blocks,
)
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays, switches
from ccbench.kernels.errors import UsageError
from ccbench.kernels.reduce import copy_into
from ccbench.kernels.vocabulary import dtype_name, itemsize


@dataclass(frozen=True)
class NodeLayout:
    """N nodes of M consecutive ranks each."""

    nodes: int
    ranks_per_node: int

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local(self, rank: int) -> int:
        return rank % self.ranks_per_node


def ranks_per_node_from_environment() -> int | None:
    """`ccbench cluster run`'s CCBENCH_RANKS_PER_NODE, else SLURM's tasks per node where
    every node has as many ("4", or "4(x2)"); None where neither says."""
    given = switches.current().ranks_per_node
    if given.isdigit():
        return int(given)
    slurm = re.fullmatch(r"(\d+)(\(x\d+\))?", os.environ.get("SLURM_NTASKS_PER_NODE", ""))
    return int(slurm.group(1)) if slurm else None


def node_layout(comm, ranks_per_node: int | None = None) -> NodeLayout:
    """The node layout of `comm`: `ranks_per_node` where given (on one host it fakes
    nodes), else the environment's (`ccbench cluster run`, SLURM), else the ranks' host
    names, which must give every node as many consecutive ranks. UsageError where the
    ranks do not split so. Collective where it asks the host names."""
    size = comm.size
    if ranks_per_node is None:
        ranks_per_node = ranks_per_node_from_environment()
    if ranks_per_node is None:
        hosts = comm.allgather_obj(comm.processor_name())
        ranks_per_node = hosts.count(hosts[0])
        blocks = [hosts[i : i + ranks_per_node] for i in range(0, size, ranks_per_node)]
        names = [b[0] for b in blocks]
        if any(len(set(b)) != 1 or len(b) != ranks_per_node for b in blocks) or len(
            set(names)
        ) != len(names):
            raise UsageError(
                "hierarchical collectives need every node to hold as many consecutive "
                "ranks; these ranks' hosts do not (give --ranks-per-node)"
            )
    if ranks_per_node < 1 or size % ranks_per_node:
        raise UsageError(f"--ranks-per-node {ranks_per_node}: {size} ranks do not make whole nodes")
    return NodeLayout(size // ranks_per_node, ranks_per_node)


_TAG_INTRA = 7400
_TAG_OWN_SLAB = 7403  # the own node's slab, exchanged while the level across nodes runs


class YieldingRing:
    """The node's communicator as the ring of collectives/ring.py sees it, whose
    exchanges give the core away while they wait (pipeline.idle_wait) instead of
    spinning in MPI: on a host whose ranks outnumber its cores, a rank that reaches the
    intra-node level first would otherwise take the core from the rank of its node that
    is still decoding, the one it waits for. It yields rather than sleeps: MPI's shared
    memory moves a large message only while both sides poll (sleeping between polls
    slowed 16 MiB exchanges severalfold here)."""

    def __init__(self, comm, wait: str = "yield"):
        self.comm, self.rank, self.size, self.wait = comm, comm.rank, comm.size, wait

    def sendrecv(self, sendbuf, dest: int, recvbuf, source: int, tag: int = _TAG_INTRA) -> None:
        self.complete(self.comm.exchange(sendbuf, dest, recvbuf, source, tag))

    def barrier(self) -> None:
        """The node's barrier, yielding the core while it waits."""
        self.complete([self.comm.ibarrier()])

    def complete(self, requests) -> None:
        """Wait for `requests`, yielding the core between tests."""
        if not self.comm.any_completion:
            self.comm.waitall(requests)
            return
        since = time.perf_counter()
        while not self.comm.testall(requests):
            idle_wait(since, self.wait)


class Hierarchical:
    """One hierarchical collective bound to its buffers (module docstring). Calling it
    runs one blocking collective from sendbuf into recvbuf. After each call,
    `intra_wire_bytes` and `inter_wire_bytes` are what this rank sent at each level; both
    are added to `comm.wire_bytes`. `raw_bytes` is what it would send uncompressed.
    `level_times` holds each call's seconds inside the node (outside the level across:
    where the levels overlap, what is left of the level inside after the level across)
    and across nodes."""

    intra_node = "ring"  # how the level inside a node moves its bytes
    levels = "series"  # the levels one after the other, or "overlapped"

    def __init__(self, comm, layout: NodeLayout, collective: str, sendbuf, recvbuf, bind_inter):
        described = spec(collective)
        if arrays.is_device_array(sendbuf):
            raise UsageError("hierarchical collectives run on host buffers")
        n_send, n_recv = sendbuf.shape[0], recvbuf.shape[0]
        if not described.fits(n_send, n_recv, comm.size):
            raise ValueError(
                f"{collective} on {comm.size} ranks: {n_send} values in, {n_recv} out do not fit"
            )
        self.comm, self.layout, self.collective = comm, layout, collective
        self.sendbuf, self.recvbuf = sendbuf, recvbuf
        node, local = layout.node(comm.rank), layout.local(comm.rank)
        self.node, self.local = node, local
        # the ranks of this node, by local index; the ranks of this local index, by node
        self.intra = comm.split(node, local)
        self.inter = comm.split(local, node)
        self.ring = YieldingRing(self.intra)
        self.phases = described.phases
        self.breakdown = Breakdown(comm, sendbuf)
        self.intra_wire_bytes = self.inter_wire_bytes = 0
        self.level_times: list[list[float]] = []  # per call: [inside the node, across], s
        self.item = itemsize(dtype_name(sendbuf))
        self._bind(described, bind_inter)

    def _bind(self, described, bind_inter) -> None:
        """Per local rank: the inter-node collective on this rank's share, and what this
        rank's rings inside the node send."""
        sendbuf, recvbuf, local = self.sendbuf, self.recvbuf, self.local
        n_send, n_recv = sendbuf.shape[0], recvbuf.shape[0]
        m, n_nodes, item = self.layout.ranks_per_node, self.layout.nodes, self.item
        if described.gathers and not described.reduces:
            # the blocks of node nd's ranks lie together in the result (its slab); this
            # rank's inter-node result, one block per node, lands in `gathered` first
            count = n_send
            self.gathered = arrays.empty_like(sendbuf, n_nodes * count)
            self.inner = bind_inter(self.inter, sendbuf, self.gathered)
            self._run = self._allgather
        elif not described.gathers:
            # node nd's slab of the send buffer holds the blocks of its ranks: reduced
            # inside the node, slab by slab, into this rank's block of each node's slab
            count = n_recv  # one rank's block of the result
            self.partial = arrays.empty_like(sendbuf, n_nodes * count)
            self.scratch = RingScratch(sendbuf, count)
            self.inner = bind_inter(self.inter, self.partial, recvbuf)
            self._run = self._reduce_scatter
        else:
            self.pieces = block_bounds(n_send, m)
            p0, p1 = self.pieces[local]
            self.partial = arrays.empty_like(sendbuf, p1 - p0)
            self.scratch = RingScratch(sendbuf, max(b - a for a, b in self.pieces))
            self.inner = bind_inter(self.inter, self.partial, recvbuf[p0:p1])
            self._run = self._allreduce
            count = n_send
        self.count = count
        if self._run == self._allreduce:
            bounds, slabs = self.pieces, 1
        else:  # one ring per node's slab, of blocks of `count`
            bounds, slabs = [(k * count, (k + 1) * count) for k in range(m)], n_nodes
        self.block_bounds = bounds
        intra_raw = slabs * ring_raw_bytes(self.phases, bounds, local, m, item) if m > 1 else 0
        self.raw_bytes = intra_raw + getattr(self.inner, "raw_bytes", 0)

    # one call ---------------------------------------------------------------------
    def __call__(self) -> None:
        started = self.breakdown.start()
        intra0, inter0 = self.intra.wire_bytes, self.inter.wire_bytes
        self.level_times.append([0.0, 0.0])
        self._run()
        self.intra_wire_bytes = self.intra.wire_bytes - intra0
        self.inter_wire_bytes = self.inter.wire_bytes - inter0
        self.comm.wire_bytes += self.intra_wire_bytes + self.inter_wire_bytes
        self.breakdown.finish(started)

    def _intra(self, fn, *args) -> None:
        """One intra-node ring, its time counted as waiting on the wire (its wall time
        only: the codec's CPU time is the codec's)."""
        t0 = time.perf_counter()
        fn(self.ring, *args)
        elapsed = time.perf_counter() - t0
        self.breakdown.add(WAIT, elapsed)
        self.level_times[-1][0] += elapsed

    def _across(self) -> None:
        """The inter-node collective; its own time breakdown (codec, wait) joins this
        call's, an uncompressed one counts as waiting on the wire."""
        inner = getattr(self.inner, "breakdown", None)
        t0 = time.perf_counter()
        self.inner()
        elapsed = time.perf_counter() - t0
        self.level_times[-1][1] += elapsed
        if inner is None:
            self.breakdown.add(WAIT, elapsed)
            return
        row = inner.rows[-1]
        for field, name in enumerate(FIELDS):
            if name in ("call", "stage"):
                continue
            if field == CODEC_CPU:
                self.breakdown.add(field, 0.0, row[field])
            else:
                self.breakdown.add(field, row[field])

    def level_seconds(self, start: int = 0, stop: int | None = None) -> tuple[float, float]:
        """Mean seconds per call inside the node and across nodes over calls
        [start:stop] (0.0 where none)."""
        calls = self.level_times[start:stop]
        if not calls:
            return 0.0, 0.0
        return (
            sum(c[0] for c in calls) / len(calls),
            sum(c[1] for c in calls) / len(calls),
        )

    def _slabs(self, buf):
        """Node nd's slab of `buf`: the blocks of its M ranks, in rank order."""
        span = self.layout.ranks_per_node * self.count
        return [buf[nd * span : (nd + 1) * span] for nd in range(self.layout.nodes)]

    def _allgather(self) -> None:
        count, local = self.count, self.local
        slabs = self._slabs(self.recvbuf)
        # this node's slab needs nothing from across: its blocks are exchanged inside the
        # node (each rank's to every other, posted at once) while the level across runs,
        # whose waits progress them
        own = slabs[self.node]
        mine = own[local * count : (local + 1) * count]
        copy_into(mine, self.sendbuf)  # (in place: the same memory)
        posted = self._post_slab_exchange(own)
        self._across()
        self._intra(lambda ring: ring.complete(posted))
        # node nd's block of this local index goes to its place in nd's slab; then each
        # other slab is gathered in place inside the node (a ring of M per slab)
        for nd, slab in enumerate(slabs):
            if nd == self.node:
                continue
            src = nd * count
            copy_into(slab[local * count : (local + 1) * count], self.gathered[src : src + count])
            self._intra(ring_allgather_inplace, slab, self.block_bounds)

    def _post_slab_exchange(self, slab) -> list:
        """Nonblocking: this rank's block of `slab` to every other rank of the node, and
        theirs into their places (M-1 blocks each way, as the ring sends)."""
        comm, count, local = self.intra, self.count, self.local
        requests = []
        for k in range(self.layout.ranks_per_node):
            if k != local and count:
                requests.append(comm.irecv(slab[k * count : (k + 1) * count], k, _TAG_OWN_SLAB))
        for k in range(self.layout.ranks_per_node):
            if k != local and count:
                block = slab[local * count : (local + 1) * count]
                requests.append(comm.isend(block, k, _TAG_OWN_SLAB))
        return requests

    def _reduce_scatter(self) -> None:
        count = self.count
        for nd, slab in enumerate(self._slabs(self.sendbuf)):
            out = self.partial[nd * count : (nd + 1) * count]
            self._intra(ring_reduce_scatter_blocks, slab, self.block_bounds, out, self.scratch)
        self._across()

    def _allreduce(self) -> None:
        self._intra(
            ring_reduce_scatter_blocks, self.sendbuf, self.pieces, self.partial, self.scratch
        )
        self._across()
        self._intra(ring_allgather_inplace, self.recvbuf, self.pieces)

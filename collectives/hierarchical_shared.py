"""Hierarchical collectives whose level inside a node goes through shared memory
(`--hierarchy node --intra-node shm`).

Each rank of a node maps one segment per rank of its node (a file in the host's shared
memory, /dev/shm, mapped by all of them and unlinked once they have: nothing is left
behind, even by a rank that dies); between two synchronisations every rank of the node
reads its peers' segments directly. A block crosses the node with one copy, made by the
rank that needs it at its own pace. Through MPI's messages (`--intra-node ring`) the same
block is copied twice (into the transport's cells, out of them), and a large message
moves only while both ranks poll: where a node's ranks outnumber its cores, each
exchange waits for both to be scheduled at once. (Not an MPI shared-memory window: a
window left to MPI_Finalize fails it over OFI, and the benchmarks' ops have no teardown.)

Rule of use: a rank writes its segment only after a sync (the node's barrier) that
follows every peer's last read of it, and reads a peer's segment only after a sync that
follows the peer's write: one sync before a segment is rewritten (from the second call
on), one after. The barrier is an MPI call, which orders the memory around it.

Per local rank, as collectives/hierarchical.py (N nodes of M ranks, block `count`):

* allgather: the inter-node allgather writes this local index's N blocks straight into
  the rank's segment; after a sync each rank copies every peer's N blocks, and its own,
  to their places in the result;
* reduce-scatter: each rank writes into its segment the blocks of its input that its
  peers reduce (block k of every node's slab, k not its own index); after a sync it sums
  its own block of each slab with its peers' copies of it (the node's partial sums, in
  local-index order), then the inter-node reduce-scatter runs on them;
* allreduce: the same reduce-scatter of M pieces, the inter-node allreduce of this rank's
  piece into its segment, a sync, every piece copied from its owner's segment.

The bytes counted inside a node are those a rank reads from its peers' segments (what
the ring would have sent it).
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from ccbench.collectives.hierarchical import Hierarchical
from ccbench.collectives.pipeline import WAIT
from ccbench.collectives.ring import block_bounds
from ccbench.kernels import arrays
from ccbench.kernels.errors import UsageError
from ccbench.kernels.reduce import add_into, copy_into

SHARED_FOLDER = "/dev/shm"  # the host's shared memory (tmpfs)
_TOKEN = np.dtype(np.int64)


def _typed(raw: np.ndarray, like):
    """The bytes `raw` (uint8) as an array of `like`'s kind and dtype, sharing memory:
    numpy, or a torch tensor on the host (the training loops' buffers)."""
    if isinstance(like, np.ndarray):
        return raw.view(like.dtype)
    import torch

    return torch.from_numpy(raw).view(like.dtype)


def _itemsize(like) -> int:
    return like.dtype.itemsize if isinstance(like, np.ndarray) else like.element_size()


def shareable(buffer) -> bool:
    """Whether a buffer's kind can live in the segments: numpy, or torch on the host."""
    if isinstance(buffer, np.ndarray):
        return True
    return type(buffer).__module__.startswith("torch") and buffer.device.type == "cpu"


class NodeSegments:
    """One segment of `count` items like `like` (numpy, or a torch tensor on the host) per
    rank of `comm` (the node's ranks), each rank's readable by all: `mine` to write,
    `of(k)` to read local rank k's.
    Collective over `comm`. `shared` is False where the node's ranks share no memory
    (each rank's segment carries a token that every other rank must read back) or the
    host's shared memory has no room for them; the segments are then not to be used."""

    def __init__(self, comm, count: int, like):
        data_bytes = count * _itemsize(like)
        # the data, then a token that proves the mapping is shared
        nbytes = data_bytes + _TOKEN.itemsize
        path, token = None, int.from_bytes(os.urandom(7), "little")
        try:
            fd, path = tempfile.mkstemp(prefix="ccbench-node-", dir=SHARED_FOLDER)
            try:
                # reserved now: a tmpfs that fills up later (a container's small
                # /dev/shm) would kill the rank with SIGBUS mid-call
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        except OSError:
            if path is not None:
                os.unlink(path)
            path = None
        paths = comm.allgather_obj(path)
        maps = [None] * comm.size
        try:
            if path is not None:
                maps[comm.rank] = np.memmap(path, np.uint8, "r+", shape=(nbytes,))
                maps[comm.rank][-_TOKEN.itemsize :].view(_TOKEN)[0] = token
            comm.barrier()  # every token written
            for k, other in enumerate(paths):
                if k != comm.rank and other is not None:
                    try:
                        maps[k] = np.memmap(other, np.uint8, "r+", shape=(nbytes,))
                    except (OSError, ValueError):
                        maps[k] = None
            tokens = comm.allgather_obj(token)
            shared = all(
                m is not None and int(m[-_TOKEN.itemsize :].view(_TOKEN)[0]) == tokens[k]
                for k, m in enumerate(maps)
            )
            self.shared = bool(comm.allreduce_value(int(shared), op="min"))
            comm.barrier()  # every rank has mapped every segment: the names may go
        finally:
            if path is not None:
                os.unlink(path)
        if not self.shared:
            return
        self._views = [_typed(np.asarray(m[:data_bytes]), like) for m in maps]
        self.mine = self._views[comm.rank]
        self.count = count

    def of(self, k: int) -> np.ndarray:
        return self._views[k]

    def sync(self, ring) -> None:
        """Every write before this, on any rank of the node, is seen by every rank after
        it: the node's barrier, yielding the core while it waits."""
        ring.barrier()


class SharedHierarchical(Hierarchical):
    """One hierarchical collective per local rank whose level inside the node reads the
    peers' shared segments (module docstring), where the node's ranks share memory and
    the buffers are on the host; the ring of Hierarchical where not (`required`: refused in
    one line instead).
    Counters, breakdown and levels as Hierarchical's; `intra_node` says which ran."""

    required = False  # `--intra-node shm`: True; `auto`: False

    def _bind(self, described, bind_inter) -> None:
        sendbuf, recvbuf = self.sendbuf, self.recvbuf
        n_send, n_recv = sendbuf.shape[0], recvbuf.shape[0]
        m, n_nodes = self.layout.ranks_per_node, self.layout.nodes
        self.calls = 0
        if described.gathers and not described.reduces:
            items = n_nodes * n_send
        elif not described.gathers:
            items = n_send
        else:
            items = n_send + max(b - a for a, b in block_bounds(n_send, m))
        if not shareable(sendbuf):
            if self.required:
                raise UsageError("--intra-node shm runs on host buffers")
            super()._bind(described, bind_inter)
            return
        segments = NodeSegments(self.intra, items, sendbuf)
        # one design on every node: a node on the ring would not meet a node on shared
        # memory at the same collective calls
        if not self.comm.allreduce_value(int(segments.shared), op="min"):
            if self.required:
                raise UsageError(
                    "--intra-node shm: the ranks given as one node do not share memory "
                    f"({SHARED_FOLDER}), or it has no room for their segments; use "
                    "--intra-node ring or auto, or a --ranks-per-node that matches the hosts"
                )
            super()._bind(described, bind_inter)
            return
        self.segments, self.intra_node = segments, "shm"
        if described.gathers and not described.reduces:
            count = n_send
            self.gathered = self.segments.mine  # the inter-node result, readable by peers
            self.inner = bind_inter(self.inter, sendbuf, self.gathered)
            self._run = self._allgather_shared
            moved = (m - 1) * n_nodes * count
        elif not described.gathers:
            count = n_recv
            # block k of node nd's slab at [(nd * m + k) * count], as in the input
            self.partial = arrays.empty_like(sendbuf, n_nodes * count)
            self.inner = bind_inter(self.inter, self.partial, recvbuf)
            self._run = self._reduce_scatter_shared
            moved = (m - 1) * n_nodes * count
        else:
            count = n_send
            self.pieces = block_bounds(n_send, m)
            p0, p1 = self.pieces[self.local]
            # the input's pieces for the peers, then this rank's reduced piece
            self.partial = arrays.empty_like(sendbuf, p1 - p0)
            self.result = self.segments.mine[n_send : n_send + (p1 - p0)]
            self.inner = bind_inter(self.inter, self.partial, self.result)
            self._run = self._allreduce_shared
            moved = (m - 1) * (p1 - p0) + n_send - (p1 - p0)  # its piece's copies; the others
        self.count = count
        self.moved_bytes = moved * self.item if m > 1 else 0
        self.raw_bytes = self.moved_bytes + getattr(self.inner, "raw_bytes", 0)

    def __call__(self) -> None:
        super().__call__()
        self.calls += 1

    def _shared(self, fn) -> None:
        """One stretch of the level inside the node: its wall time counted as waiting on
        the wire, as the ring's is."""
        t0 = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
        self.breakdown.add(WAIT, elapsed)
        self.levels[-1][0] += elapsed

    def _sync(self) -> None:
        self.segments.sync(self.ring)

    def _before_rewrite(self) -> None:
        """The sync that lets this rank rewrite its segment: every peer has read it."""
        if self.calls:
            self._sync()

    def _allgather_shared(self) -> None:
        count, m = self.count, self.layout.ranks_per_node
        slabs = self._slabs(self.recvbuf)
        self._shared(self._before_rewrite)
        self._across()

        def gather() -> None:
            self._sync()
            for nd, slab in enumerate(slabs):
                for k in range(m):
                    src = self.segments.of(k)[nd * count : (nd + 1) * count]
                    copy_into(slab[k * count : (k + 1) * count], src)

        self._shared(gather)
        self.intra.wire_bytes += self.moved_bytes

    def _reduce_scatter_shared(self) -> None:
        count, local, m = self.count, self.local, self.layout.ranks_per_node
        mine, send = self.segments.mine, self.sendbuf

        def reduce() -> None:
            self._before_rewrite()
            for nd in range(self.layout.nodes):
                for k in range(m):
                    if k != local:
                        at = (nd * m + k) * count
                        copy_into(mine[at : at + count], send[at : at + count])
            self._sync()
            for nd in range(self.layout.nodes):
                at = (nd * m + local) * count
                out = self.partial[nd * count : (nd + 1) * count]
                self._sum_block(out, at, count)

        self._shared(reduce)
        self.intra.wire_bytes += self.moved_bytes
        self._across()

    def _sum_block(self, out, at: int, count: int) -> None:
        """out = the node's sum of the input's [at, at + count): this rank's own values
        and its peers' copies, in local-index order."""
        for k in range(self.layout.ranks_per_node):
            own = k == self.local
            values = (self.sendbuf if own else self.segments.of(k))[at : at + count]
            if k == 0:
                copy_into(out, values)
            else:
                add_into(out, out, values)

    def _allreduce_shared(self) -> None:
        local = self.local
        mine, send = self.segments.mine, self.sendbuf
        p0, p1 = self.pieces[local]

        def reduce() -> None:
            self._before_rewrite()
            for k, (a, b) in enumerate(self.pieces):
                if k != local:
                    copy_into(mine[a:b], send[a:b])
            self._sync()
            self._sum_block(self.partial, p0, p1 - p0)

        self._shared(reduce)
        self._across()

        def gather() -> None:
            self._sync()
            n_send = send.shape[0]
            for k, (a, b) in enumerate(self.pieces):
                source = self.segments.of(k)[n_send : n_send + (b - a)]
                copy_into(self.recvbuf[a:b], source)

        self._shared(gather)
        self.intra.wire_bytes += self.moved_bytes


class RequiredSharedHierarchical(SharedHierarchical):
    """`--intra-node shm`: shared memory inside the node, or one line saying why not."""

    required = True

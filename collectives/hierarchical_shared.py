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

Beside the level across (`levels` "overlapped"): where the collective across nodes is
the collective-level ring with inline progress (collectives/compressed.py, whose hooks
ask for each chunk of its input before reading it, announce each chunk of its result
once decoded, and lend its waits), the allgather and the reduce-scatter run the level
inside the node chunk by chunk in those waits instead of after or before it:

* allgather: each rank announces every chunk the inter-node allgather decodes into its
  segment (a message of no bytes to each peer, which also orders the memory written
  before it) and, while its own inter-node collective waits, copies the announced chunks
  of its peers, and its own, to their places in the result; the rest after it;
* reduce-scatter: in its waits each rank copies into its segment its peers' values of
  each chunk of the node's partial sums and announces them, a chunk of each block in
  turn, then sums each chunk whose announcements have all arrived; a chunk the
  inter-node reduce-scatter asks for before then is made at once, its own offers first
  (every rank offers in one order, so none waits on a peer that waits on it).

The allreduce keeps its levels in series. The bytes counted inside a node are those a
rank reads from its peers' segments (what the ring would have sent it).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import deque
from itertools import zip_longest

import numpy as np

from ccbench.collectives.costmodel import OVERLAPPED_LEVELS
from ccbench.collectives.hierarchical import Hierarchical
from ccbench.collectives.pipeline import idle_wait
from ccbench.collectives.ring import block_bounds
from ccbench.kernels import arrays
from ccbench.kernels.errors import UsageError
from ccbench.kernels.reduce import add_into, copy_into

SHARED_FOLDER = "/dev/shm"  # the host's shared memory (tmpfs)
_TAG_READY = 8000  # + a chunk's index: "this chunk of my segment is final"
MPI_TAG_FLOOR = 32767  # the least MPI_TAG_UB the standard allows
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
        self._no_bytes = np.empty(0, np.uint8)
        if described.gathers and not described.reduces:
            count = n_send
            self.gathered = self.segments.mine  # the inter-node result, readable by peers
            self.inner = bind_inter(self.inter, sendbuf, self.gathered)
            self._run = self._allgather_shared
            if self.collective in OVERLAPPED_LEVELS and self._streams(self.inner, "result"):
                self._run, self.levels = self._allgather_streamed, "overlapped"
            moved = (m - 1) * n_nodes * count
        elif not described.gathers:
            count = n_recv
            # block k of node nd's slab at [(nd * m + k) * count], as in the input
            self.partial = arrays.empty_like(sendbuf, n_nodes * count)
            self.inner = bind_inter(self.inter, self.partial, recvbuf)
            self._run = self._reduce_scatter_shared
            if self.collective in OVERLAPPED_LEVELS and self._streams(self.inner, "input"):
                self._run, self.levels = self._reduce_scatter_streamed, "overlapped"
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
        """One stretch of the level inside the node, timed as the ring's is."""
        self._intra(lambda ring: fn())

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

    def _streams(self, inner, order: str) -> bool:
        """Whether the level inside the node can run beside the level across: nodes to
        cross, an inner collective that asks for each range of its input before it reads
        it (`needs`), announces each range of its result it finishes (`delivered`) and
        lends its waits (`side_work`), all from this thread (collectives/compressed.py's
        collective-level ring with inline progress), and a tag for every chunk. Its
        chunks are `chunks`: of its result in block order (`order` "result"), or of its
        input in the order it reads them ("input"). The same answer on every rank (same
        sizes, same options)."""
        if self.layout.nodes < 2 or not self.comm.any_completion:
            return False
        if not hasattr(inner, "side_work") or getattr(inner, "codec_threads", 1):
            return False
        if order == "input":
            blocks = inner.input_order(inner.phases[0])
        else:
            blocks = range(len(inner.chunks))
        per_block = [[(c0, c1) for c0, c1 in inner.chunks[b] if c1 > c0] for b in blocks]
        chunks = [chunk for block in per_block for chunk in block]
        if _TAG_READY + len(chunks) > MPI_TAG_FLOOR:
            return False
        self.chunk_index = {c0: j for j, (c0, _) in enumerate(chunks)}
        self.chunks = chunks
        # input chunks are offered to the peers a chunk of each block in turn: the
        # inter-node reduce-scatter encodes its first block's chunks at the codec's pace
        # but needs the next block's as partial sums arrive, at the link's, and a peer
        # waits for a chunk's offer as soon as it needs it
        numbered, j = [], 0
        for block in per_block:
            numbered.append(list(range(j, j + len(block))))
            j += len(block)
        turns = zip_longest(*numbered)
        self.offer_order = [j for turn in turns for j in turn if j is not None]
        self.offer_place = {j: i for i, j in enumerate(self.offer_order)}
        return True

    def _listen(self) -> None:
        """Post a receive for every peer's announcement of every chunk."""
        m, local, n = self.layout.ranks_per_node, self.local, len(self.chunks)
        peers = [k for k in range(m) if k != local]
        self._awaited = [
            self.intra.irecv(self._no_bytes, k, _TAG_READY + j) for k in peers for j in range(n)
        ]
        self._awaited_from = [(k, j) for k in peers for j in range(n)]
        self._unheard = len(self._awaited)
        self._announced = []

    def _heard(self) -> list[tuple[int, int]]:
        """The (peer, chunk) announcements that arrived since the last look."""
        if not self._unheard:
            return []
        arrived = [self._awaited_from[i] for i in self.intra.testsome(self._awaited)]
        self._unheard -= len(arrived)
        return arrived

    def _tell(self, k: int, j: int) -> None:
        """Announce chunk j to local rank k (a message of no bytes, which also orders the
        memory written before it)."""
        self._announced.append(self.intra.isend(self._no_bytes, k, _TAG_READY + j))

    def _beside(self, hooks: dict, finish) -> None:
        """The level across with `hooks` set on it, then `finish` (the level inside the
        node's rest) timed as that level."""
        for name, hook in hooks.items():
            setattr(self.inner, name, hook)
        try:
            self._across()
        finally:
            for name in hooks:
                setattr(self.inner, name, None)
        self._shared(finish)

    def _allgather_streamed(self) -> None:
        """As _allgather_shared, with the copies out of the node's segments made while the
        level across waits on its link: each rank announces every chunk of its segment as
        the inter-node collective decodes it there, and copies its peers' announced
        chunks, and its own, to their places in the result in the waits of its own
        inter-node collective; what is left after it, as the announcements arrive."""
        self._shared(self._before_rewrite)
        self._listen()
        self._todo = deque()

        def drain() -> None:
            since = time.perf_counter()
            while self._todo or self._unheard:
                if not self._copy_one():
                    idle_wait(since, self.ring.wait)
            self.ring.complete(self._announced)

        self._beside({"delivered": self._announce, "side_work": self._copy_one}, drain)
        self.intra.wire_bytes += self.moved_bytes

    def _announce(self, c0: int, c1: int) -> None:
        """The inter-node collective has decoded [c0, c1) of this rank's segment: tell the
        node's other ranks, and copy it to its own place too."""
        j = self.chunk_index[c0]
        for k in range(self.layout.ranks_per_node):
            if k != self.local:
                self._tell(k, j)
        self._todo.append((self.local, j))

    def _copy_one(self) -> bool:
        """One announced chunk (local rank k's chunk j) from its segment to its place in
        the result; False where none is announced yet."""
        if not self._todo:
            self._todo.extend(self._heard())
        if not self._todo:
            return False
        k, j = self._todo.popleft()
        c0, c1 = self.chunks[j]
        count, m = self.count, self.layout.ranks_per_node
        nd, off = divmod(c0, count)
        at = (nd * m + k) * count + off
        copy_into(self.recvbuf[at : at + (c1 - c0)], self.segments.of(k)[c0:c1])
        return True

    def _reduce_scatter_streamed(self) -> None:
        """As _reduce_scatter_shared, with the level inside the node run chunk by chunk
        beside the level across, in the order the inter-node reduce-scatter reads its
        input (the node's partial sums): in its waits, each rank copies the chunks its
        peers sum into its segment and announces them, then sums the chunks whose
        announcements have all arrived; a chunk the inter-node collective asks for
        before then is made at once (its own copies first, so no rank waits on one that
        waits on it)."""
        self._shared(self._before_rewrite)
        self._listen()
        self._offered = 0  # chunks of the order copied for the peers and announced
        self._summed = [False] * len(self.chunks)
        self._heard_from = [0] * len(self.chunks)
        self._next_sum = 0

        def finish() -> None:  # every chunk was asked for; the announcements' sends
            for j in range(len(self.chunks)):
                self._make(j)
            self.ring.complete(self._announced)

        self._beside({"needs": self._need, "side_work": self._advance}, finish)
        self.intra.wire_bytes += self.moved_bytes

    def _place(self, j: int, k: int) -> tuple[int, int]:
        """Where chunk j of the partial sums lies in the input's block of local rank k:
        (offset, length)."""
        c0, c1 = self.chunks[j]
        nd, off = divmod(c0, self.count)
        return (nd * self.layout.ranks_per_node + k) * self.count + off, c1 - c0

    def _offer(self) -> None:
        """The next chunk to offer: each peer's values of it into this rank's segment,
        announced to that peer."""
        j = self.offer_order[self._offered]
        for k in range(self.layout.ranks_per_node):
            if k != self.local:
                at, n = self._place(j, k)
                copy_into(self.segments.mine[at : at + n], self.sendbuf[at : at + n])
                self._tell(k, j)
        self._offered += 1

    def _sum(self, j: int) -> None:
        c0, c1 = self.chunks[j]
        at, n = self._place(j, self.local)
        self._sum_block(self.partial[c0:c1], at, n)
        self._summed[j] = True

    def _listened(self) -> None:
        for _, j in self._heard():
            self._heard_from[j] += 1

    def _ready(self, j: int) -> bool:
        return self._heard_from[j] == self.layout.ranks_per_node - 1

    def _advance(self) -> bool:
        """One piece of the level inside the node: offer the next chunk, else sum the
        first chunk all peers have offered; False where neither can be done yet."""
        if self._offered < len(self.chunks):
            self._offer()
            return True
        self._listened()
        while self._next_sum < len(self.chunks) and self._summed[self._next_sum]:
            self._next_sum += 1
        for j in range(self._next_sum, len(self.chunks)):
            if not self._summed[j] and self._ready(j):
                self._sum(j)
                return True
        return False

    def _make(self, j: int) -> None:
        """Chunk j summed: this rank's offers through j first, then the sum once every
        peer's offer of it has arrived."""
        while self._offered <= self.offer_place[j]:
            self._offer()
        since = time.perf_counter()
        while not self._summed[j]:
            self._listened()
            if self._ready(j):
                self._sum(j)
            else:
                idle_wait(since, self.ring.wait)

    def _need(self, c0: int, c1: int) -> None:
        """The inter-node collective reads partial[c0:c1]: made now where not yet."""
        j = self.chunk_index[c0]
        if not self._summed[j]:
            self._make(j)

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

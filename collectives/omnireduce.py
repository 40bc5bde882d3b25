"""OmniReduce: sparse streaming allreduce through aggregators (Fei et al., SIGCOMM 2021).

The tensor is cut into blocks of `block_size` elements; the blocks are split into
contiguous streams, and each stream belongs to one aggregator. Per stream:

- a worker sends only its non-zero blocks, in order, `fusion` blocks per message; each
  message carries the blocks' positions and the position of the worker's next non-zero
  block after them (its "next index"; the stream's end when it has no more). A worker
  with no data in a stream sends one empty message holding only that next index;
- the aggregator adds each block into its accumulator and keeps every worker's next
  index. A position is finished once the minimum next index has passed it: every worker
  holding data there has delivered it. Finished positions that anyone held are returned
  to all workers, fused, with the global next position (the minimum next index, i.e.
  the next position any worker holds). Blocks zero on every worker never travel;
- a worker keeps at most `window` messages in flight per stream. A message leaves the
  window when a result's global next position has passed its last block, so a worker
  sends its block at a position only when it holds data there, and streams ahead of
  the slowest worker by at most `window` messages instead of stopping and waiting.

Aggregators are colocated (every rank aggregates `streams_per_aggregator` streams, the
rank's own share skips the wire) or dedicated (the last K ranks only aggregate, as in
the paper's testbed; their input is ignored and their output holds the sums of their
own streams only). With threshold T > 0 a block is sent only if some |x| > T.

All sends go through `collectives.comm.Communicator`, so the wire bytes are measured.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from array_api_compat import array_namespace, device
from mpi4py import MPI

from ccbench.collectives.ring import block_bounds
from ccbench.kernels.arrays import host_view, to_numpy
from ccbench.kernels.errors import UsageError
from ccbench.kernels.reduce import copy_into
from ccbench.kernels.sparse import (
    block_count,
    gather_blocks,
    nonzero_block_ids,
    scatter_add_blocks,
    scatter_blocks,
    zero_blocks,
)
from ccbench.kernels.vocabulary import SPARSE_INDEX_BYTES, dtype_name, itemsize

# Header of every message, int32: [blocks k, next position, data messages still to come
# (worker messages only), spare], then the k block positions, then the blocks.
HEADER_FIELDS = 4
TAG_BASE = 1000  # data tags TAG_BASE + s, result tags TAG_BASE + streams + s
MAX_TAG = 32767  # the smallest MPI_TAG_UB the standard allows


@dataclass(frozen=True)
class Layout:
    """Where every block goes: streams of contiguous blocks and their aggregators."""

    count: int
    block_size: int
    nblocks: int
    streams: tuple[tuple[int, int], ...]  # [start, stop) block positions per stream
    aggregator_of: tuple[int, ...]  # rank aggregating each stream
    workers: tuple[int, ...]  # ranks holding data
    fusion: int
    window: int

    def streams_of(self, rank: int) -> list[int]:
        return [s for s, agg in enumerate(self.aggregator_of) if agg == rank]

    @cached_property
    def message_blocks(self) -> int:
        """Blocks one message can hold: `fusion`, or a whole stream if that is less."""
        longest = max((stop - start for start, stop in self.streams), default=1)
        return max(1, min(self.fusion, longest))


def make_layout(count: int, block_size: int, size: int, aggregators: int = 0,
                streams_per_aggregator: int = 2, fusion: int = 1024, window: int = 4) -> Layout:
    """The layout on `size` ranks: colocated when aggregators == 0, else the last K ranks.

    Streams are contiguous runs of blocks dealt to the aggregators round-robin.
    """
    if aggregators:
        agg_ranks = list(range(size - aggregators, size))
        workers = tuple(range(size - aggregators))
    else:
        agg_ranks = list(range(size))
        workers = tuple(range(size))
    nblocks = block_count(count, block_size)
    nstreams = min(len(agg_ranks) * streams_per_aggregator, nblocks)
    if TAG_BASE + 2 * nstreams > MAX_TAG:
        raise UsageError(f"{nstreams} omnireduce streams need more MPI tags than MPI promises "
                         f"({MAX_TAG}); use fewer --streams")
    streams = tuple(block_bounds(nblocks, nstreams)) if nstreams else ()
    aggregator_of = tuple(agg_ranks[s % len(agg_ranks)] for s in range(nstreams))
    return Layout(count, block_size, nblocks, streams, aggregator_of, workers, fusion, window)


# Messages -----------------------------------------------------------------------------------


def _align16(nbytes: int) -> int:
    return -(-nbytes // 16) * 16


class Message:
    """One reusable message buffer, sent only as far as it is filled.

    Layout: the int32 header fields, the k block positions, then (16-byte aligned) the
    k blocks; a partial tail block travels without its padding. The header is a live
    numpy view for host buffers; device buffers keep a host copy that is pushed before
    a send and pulled after a receive.
    """

    def __init__(self, like, layout: Layout):
        xp = array_namespace(like)
        item = itemsize(dtype_name(like))
        self.block_size = layout.block_size
        self.block_bytes = layout.block_size * item
        tail = layout.count % layout.block_size
        self.tail = tail
        self.tail_id = layout.count // layout.block_size if tail else -1
        self.tail_cut = (layout.block_size - tail) * item if tail else 0
        blocks = layout.message_blocks
        capacity = _align16(SPARSE_INDEX_BYTES * (HEADER_FIELDS + blocks))
        self.raw = xp.empty(capacity + blocks * self.block_bytes, dtype=xp.uint8,
                            device=device(like))
        self.dtype = like.dtype
        self.on_host = str(device(like)) == "cpu"
        if self.on_host:
            self.ints = host_view(self.raw)[:capacity].view(np.int32)
        else:
            self.ints = np.zeros(capacity // SPARSE_INDEX_BYTES, dtype=np.int32)
        self._xp = xp
        self.nbytes = 0

    @staticmethod
    def _offset(k: int) -> int:
        return _align16(SPARSE_INDEX_BYTES * (HEADER_FIELDS + k))

    def blocks(self, k: int):
        """The (k, block_size) data view for a message of k blocks."""
        offset = self._offset(k)
        return self.raw[offset: offset + k * self.block_bytes].view(self.dtype).reshape(
            k, self.block_size)

    def write(self, k: int, next_position: int, remaining: int, positions) -> None:
        """Fill the header (the blocks are written into `blocks(k)` by the caller)."""
        ints = self.ints
        ints[0], ints[1], ints[2] = k, next_position, remaining
        ints[HEADER_FIELDS:HEADER_FIELDS + k] = positions
        self.nbytes = self._offset(k) + k * self.block_bytes
        if k and int(positions[-1]) == self.tail_id:
            self.nbytes -= self.tail_cut
        if not self.on_host:
            header = self._offset(k)
            self.raw[:header] = self._xp.asarray(self.ints.view(np.uint8)[:header],
                                                 device=device(self.raw))

    def read(self) -> tuple[int, int, int, np.ndarray]:
        """(k, next position, remaining, positions) of a received message."""
        if not self.on_host:
            self.ints[...] = to_numpy(self.raw[: self.ints.nbytes]).view(np.int32)
        ints = self.ints
        k = int(ints[0])
        return k, int(ints[1]), int(ints[2]), ints[HEADER_FIELDS:HEADER_FIELDS + k]

    def received_blocks(self, k: int, positions: np.ndarray):
        """The k received blocks; the padding of a trimmed tail block is zeroed."""
        blocks = self.blocks(k)
        if k and int(positions[-1]) == self.tail_id:
            blocks[k - 1, self.tail:] = 0
        return blocks

    def wire(self):
        """The bytes that travel: header, positions and blocks as written."""
        return self.raw[: self.nbytes]


class Inbox:
    """Receives from one source with one tag, processed strictly in arrival order."""

    def __init__(self, comm, source: int, tag: int, factory):
        self.comm, self.source, self.tag = comm, source, tag
        self.factory = factory  # buffers are allocated when first needed, then reused
        self.free: deque = deque()
        self.posted: deque = deque()  # (message, request)

    def post(self) -> None:
        message = self.free.popleft() if self.free else self.factory()
        self.posted.append((message, self.comm.irecv(message.raw, self.source, self.tag)))

    def ready(self) -> bool:
        return bool(self.posted) and not _mpi_request(self.posted[0][1])

    def pop(self) -> Message:
        message, request = self.posted.popleft()
        if request is not _mpi_request(request):  # staged through host: copy it over
            request.Wait()
        self.free.append(message)  # reusable once the caller has read it
        return message

    def cancel_rest(self, keep: int = 0) -> None:
        """Cancel the receives posted after the first `keep`: no message will match them.

        Called when the last message of the call is known, so a message of the next call
        can never be matched by a receive of this one.
        """
        while len(self.posted) > keep:
            message, request = self.posted.pop()
            mpi_request = _mpi_request(request)
            mpi_request.Cancel()
            mpi_request.Wait()
            self.free.append(message)


def _mpi_request(request) -> MPI.Request:
    # the communicator returns a wrapper for device receives staged through host memory
    return request if isinstance(request, MPI.Request) else request.request


class Outbox:
    """Send buffers reused once their sends have completed, in order.

    `take` never waits on a peer: when the oldest buffer is still on its way, a new one
    is allocated instead (a wait here could close a cycle of ranks each waiting for the
    other to receive). Workers stay within `window` buffers by their credit rule.
    """

    def __init__(self, factory):
        self.factory = factory  # buffers are allocated when first needed, then reused
        self.free: list = []
        self.busy: deque = deque()  # (message, send requests), oldest first

    def take(self) -> tuple[Message, list]:
        while self.busy and MPI.Request.Testall(self.busy[0][1]):
            self.free.append(self.busy.popleft()[0])
        message = self.free.pop() if self.free else self.factory()
        requests: list = []
        self.busy.append((message, requests))
        return message, requests

    def drain(self) -> None:
        for message, requests in self.busy:
            MPI.Request.Waitall(requests)
            self.free.append(message)
        self.busy.clear()


# The two roles --------------------------------------------------------------------------------


class WorkerStream:
    """A worker's side of one remote stream: its blocks, its window, its results."""

    def __init__(self, engine: OmniReduce, stream: int):
        self.engine = engine
        self.stream = stream
        layout = engine.layout
        self.start, self.stop = layout.streams[stream]
        self.send, self.recv = engine.regions(stream)
        self.aggregator = layout.aggregator_of[stream]
        like = engine.send
        self.outbox = Outbox(lambda: Message(like, layout))
        self.inbox = Inbox(engine.comm, self.aggregator, TAG_BASE + len(layout.streams) + stream,
                           lambda: Message(like, layout))
        # results land in posted buffers (no unexpected-message copy inside MPI)
        self.result_receives = max(2, layout.window)

    def begin(self) -> None:
        """Scan this stream's part of the input; zero its part of the output."""
        engine = self.engine
        self.ids = nonzero_block_ids(self.send, engine.layout.block_size, engine.threshold)
        self.positions = to_numpy(self.ids) + self.start
        self.cursor = 0
        self.messages_left = max(1, -(-self.positions.shape[0] // engine.layout.message_blocks))
        self.in_flight: deque[int] = deque()  # last position of each unfinished message
        self.done = False
        self.filled = self.start  # output blocks before this position are final
        for _ in range(self.result_receives):
            self.inbox.post()

    def can_send(self) -> bool:
        return self.messages_left > 0 and len(self.in_flight) < self.engine.layout.window

    def send_next(self) -> None:
        layout, comm = self.engine.layout, self.engine.comm
        lo = self.cursor
        hi = min(lo + layout.message_blocks, self.positions.shape[0])
        k = hi - lo
        next_position = int(self.positions[hi]) if hi < self.positions.shape[0] else self.stop
        message, requests = self.outbox.take()
        if k:
            gather_blocks(self.send, self.ids[lo:hi], layout.block_size, out=message.blocks(k))
        self.messages_left -= 1
        message.write(k, next_position, self.messages_left, self.positions[lo:hi])
        requests.append(comm.isend(message.wire(), self.aggregator, TAG_BASE + self.stream))
        self.in_flight.append(int(self.positions[hi - 1]) if k else -1)
        self.cursor = hi

    def on_result(self, message: Message) -> None:
        k, global_next, _, positions = message.read()
        block = self.engine.layout.block_size
        if k:
            local = self.engine.index_array(positions - self.start)
            scatter_blocks(self.recv, local, message.blocks(k), block)
        if k < global_next - self.filled:  # positions nobody held up to the global next
            gaps = np.ones(global_next - self.filled, dtype=bool)
            gaps[positions - self.filled] = False
            zero_blocks(self.recv, self.engine.index_array(
                np.flatnonzero(gaps) + (self.filled - self.start)), block)
        self.filled = global_next
        while self.in_flight and self.in_flight[0] < global_next:
            self.in_flight.popleft()
        if global_next >= self.stop:
            self.done = True
            self.inbox.cancel_rest()
            return
        self.inbox.post()
        while self.can_send():
            self.send_next()


class AggregatorStream:
    """An aggregator's side of one stream: next indices, sums, fused results.

    The sums accumulate in this rank's own output for the stream, which is where they
    must end anyway: the colocated worker's blocks are copied in, never sent.
    """

    def __init__(self, engine: OmniReduce, stream: int):
        self.engine = engine
        self.stream = stream
        layout = engine.layout
        self.start, self.stop = layout.streams[stream]
        self.send, self.acc = engine.regions(stream)
        self.touched = np.zeros(self.stop - self.start, dtype=bool)
        self.remote_workers = [w for w in layout.workers if w != engine.comm.rank]
        self.local_worker = engine.comm.rank in layout.workers
        self.worker_index = {w: i for i, w in enumerate(layout.workers)}
        like = engine.send
        self.inboxes = {w: Inbox(engine.comm, w, TAG_BASE + stream, lambda: Message(like, layout))
                        for w in self.remote_workers}  # fmt: skip
        self.outbox = Outbox(lambda: Message(like, layout))
        self.result_tag = TAG_BASE + len(layout.streams) + stream
        most_messages = max(1, -(-(self.stop - self.start) // layout.message_blocks))
        self.first_receives = min(layout.window, most_messages)

    def begin(self) -> None:
        self.frontier = np.full(len(self.engine.layout.workers), self.start, dtype=np.int64)
        self.touched[...] = False
        self.unposted: dict[int, int] = {}  # worker -> data messages announced, not posted
        self.emitted = self.start
        self.done = False
        # as many receives as a worker may send at once, so its messages land in place;
        # its first message says how many follow, and surplus receives are cancelled
        for inbox in self.inboxes.values():
            for _ in range(self.first_receives):
                inbox.post()

    def add_local(self) -> None:
        """The colocated worker's own blocks go straight into the sums."""
        engine, block = self.engine, self.engine.layout.block_size
        ids = nonzero_block_ids(self.send, block, engine.threshold)
        if engine.threshold == 0:
            copy_into(self.acc, self.send)  # blocks not in ids are zero already
        else:
            self.acc[...] = 0
            if ids.shape[0]:
                scatter_blocks(self.acc, ids, gather_blocks(self.send, ids, block), block)
        self.touched[to_numpy(ids)] = True
        self.frontier[self.worker_index[engine.comm.rank]] = self.stop
        self.emit()

    def on_data(self, worker: int, message: Message) -> None:
        k, next_position, remaining, positions = message.read()
        inbox = self.inboxes[worker]
        if worker not in self.unposted:  # first message: now we know how many follow
            inbox.cancel_rest(keep=remaining)
            self.unposted[worker] = remaining - len(inbox.posted)
        if k:
            local = positions - self.start
            blocks = message.received_blocks(k, positions)
            scatter_add_blocks(self.acc, self.engine.index_array(local), blocks,
                               self.engine.layout.block_size)
            self.touched[local] = True
        self.frontier[self.worker_index[worker]] = next_position
        while self.unposted[worker] and len(inbox.posted) < self.engine.layout.window:
            inbox.post()
            self.unposted[worker] -= 1
        self.emit()

    def emit(self) -> None:
        """Return every finished position anyone held, fused, with the global next."""
        finished = int(self.frontier.min())
        if finished <= self.emitted:
            return
        lo = self.emitted - self.start
        local = np.flatnonzero(self.touched[lo: finished - self.start]) + lo
        self.emitted = finished
        if local.shape[0] == 0 and finished < self.stop:
            return
        engine, layout = self.engine, self.engine.layout
        fusion = layout.message_blocks
        chunks = max(1, -(-local.shape[0] // fusion))
        for c in range(chunks):
            rows = local[c * fusion:(c + 1) * fusion]
            k = rows.shape[0]
            last = c == chunks - 1
            global_next = finished if last else int(local[(c + 1) * fusion]) + self.start
            message, requests = self.outbox.take()
            if k:
                gather_blocks(self.acc, engine.index_array(rows), layout.block_size,
                              out=message.blocks(k))
            message.write(k, global_next, 0, rows + self.start)
            wire = message.wire()
            for worker in self.remote_workers:
                requests.append(engine.comm.isend(wire, worker, self.result_tag))
        if finished >= self.stop:
            self.done = True


# The engine -------------------------------------------------------------------------------------


class OmniReduce:
    """A bound OmniReduce allreduce of `send` into `recv`; call it to run one collective.

    Views, message pools and request lists are set up once here; each call scans the
    input, streams and aggregates.
    """

    def __init__(self, comm, send, recv, layout: Layout, threshold: float = 0.0):
        self.comm, self.send, self.recv = comm, send, recv
        self.layout, self.threshold = layout, threshold
        self.xp = array_namespace(send)
        self.device = device(send)
        rank = comm.rank
        self.is_worker = rank in layout.workers
        self.aggregating = [AggregatorStream(self, s) for s in layout.streams_of(rank)]
        remote = [s for s in range(len(layout.streams)) if layout.aggregator_of[s] != rank]
        self.working = [WorkerStream(self, s) for s in remote] if self.is_worker else []

    def regions(self, stream: int):
        """(send, recv) views of the elements of one stream's blocks."""
        start, stop = self.layout.streams[stream]
        block = self.layout.block_size
        lo, hi = start * block, min(stop * block, self.layout.count)
        return self.send[lo:hi], self.recv[lo:hi]

    def index_array(self, host_ids: np.ndarray):
        """Block ids as an int64 array of the buffers' namespace and device."""
        return self.xp.asarray(host_ids.astype(np.int64, copy=False), device=self.device)

    def __call__(self) -> None:
        if not self.is_worker:
            self.recv[...] = 0  # a dedicated aggregator's output: its streams' sums only
        for aggregator in self.aggregating:
            aggregator.begin()
        for worker in self.working:  # scan a stream, then put its first window on the wire
            worker.begin()
            while worker.can_send():
                worker.send_next()
        if self.is_worker:
            for aggregator in self.aggregating:
                aggregator.add_local()
        self._progress()
        for worker in self.working:
            worker.outbox.drain()
        for aggregator in self.aggregating:
            aggregator.outbox.drain()

    def _progress(self) -> None:
        """Wait for any receive, then handle every inbox whose oldest message is in."""
        inboxes = [(w.inbox, w.on_result, None) for w in self.working]
        for aggregator in self.aggregating:
            inboxes += [(inbox, aggregator.on_data, w) for w, inbox in aggregator.inboxes.items()]
        while not self._finished():
            # messages are handled in order per inbox, so only the oldest receives count
            owners = [entry for entry in inboxes if entry[0].posted]
            if not owners:
                raise RuntimeError("omnireduce: unfinished streams but no receive posted")
            heads = [_mpi_request(entry[0].posted[0][1]) for entry in owners]
            for index in MPI.Request.Waitsome(heads):
                inbox, handler, worker = owners[index]
                while inbox.ready():
                    message = inbox.pop()
                    if worker is None:
                        handler(message)
                    else:
                        handler(worker, message)

    def _finished(self) -> bool:
        return all(w.done for w in self.working) and all(a.done for a in self.aggregating)


def omnireduce_allreduce(comm, sendbuf, recvbuf, block_size: int = 256, fusion: int = 1024,
                         window: int = 4, aggregators: int = 0, streams_per_aggregator: int = 2,
                         threshold: float = 0.0) -> None:
    """One OmniReduce allreduce (set-up included; bind an `OmniReduce` to time it)."""
    layout = make_layout(sendbuf.shape[0], block_size, comm.size, aggregators,
                         streams_per_aggregator, fusion, window)
    OmniReduce(comm, sendbuf, recvbuf, layout, threshold)()


def stream_share(layout: Layout, rank: int) -> np.ndarray:
    """Boolean per block: the blocks of the streams `rank` aggregates."""
    share = np.zeros(layout.nblocks, dtype=bool)
    for s in layout.streams_of(rank):
        start, stop = layout.streams[s]
        share[start:stop] = True
    return share

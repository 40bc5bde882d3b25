"""OmniReduce: sparse streaming allreduce through aggregators (Fei et al., SIGCOMM 2021).

The tensor is cut into blocks of `block_size` elements; the blocks are split into
contiguous streams, and each stream belongs to one aggregator. Blocks zero on every
worker never travel, and every packet carries next-index metadata. Two protocols:

``request-driven`` (the paper's; the default). Each aggregator has `slots` slots; a slot
serves one stream and aggregates one fused packet at a time. The stream's blocks are
laid out in rows of `fusion` columns (column c holds positions start + c, start + c +
fusion, ...), and every column is driven by the aggregator:

- a worker's first packet carries no block, only its first non-zero position in every
  column; the aggregator answers with the global next position of every column (the
  least position any worker holds there);
- a worker then sends, in one packet, the blocks at exactly those positions it holds,
  each with its own next position in the same column, and nothing else: it sends only
  after a response that asked for what it holds next;
- once every worker holding an asked position has delivered, the slot returns, in one
  packet to every worker, the sums at the asked positions with each column's new
  global next position, which is the next request.

So a slot keeps `fusion` block positions in aggregation, one round trip per fused
packet, and a worker never runs ahead of the aggregator.

``stream-ahead`` (a departure from the paper, named for what it does). Per stream:

- a worker sends only its non-zero blocks, in order, `fusion` blocks per message; each
  message carries the blocks' positions and the position of the worker's next non-zero
  block after them (its "next index"; the stream's end when it has no more). A worker
  with no data in a stream sends one empty message holding only that next index;
- the aggregator adds each block into its accumulator and keeps every worker's next
  index. A position is finished once the minimum next index has passed it: every worker
  holding data there has delivered it. Finished positions that anyone held are returned
  to all workers, fused, with the global next position (the minimum next index, i.e.
  the next position any worker holds);
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

import os
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
# (stream-ahead worker messages) or first-packet flag (request-driven), m next positions
# that follow the k block positions (request-driven)], the k block positions, the m next
# positions, then the blocks.
HEADER_FIELDS = 4
PROTOCOLS = ("request-driven", "stream-ahead")
FIRST = 1  # request-driven: the packet of a worker's or a slot's first exchange
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
    protocol: str = "request-driven"

    def streams_of(self, rank: int) -> list[int]:
        return [s for s, agg in enumerate(self.aggregator_of) if agg == rank]

    @cached_property
    def message_blocks(self) -> int:
        """Blocks one message can hold: `fusion`, or a whole stream if that is less."""
        longest = max((stop - start for start, stop in self.streams), default=1)
        return max(1, min(self.fusion, longest))

    @cached_property
    def message_indices(self) -> int:
        """int32 positions one message can hold: a position per block, and (request-driven)
        a next position per block, or per column in a first packet."""
        return self.message_blocks * (2 if self.protocol == "request-driven" else 1)

    def columns(self, stream: int) -> int:
        """Request-driven: columns of one stream (its blocks in rows of this many)."""
        start, stop = self.streams[stream]
        return max(1, min(self.fusion, stop - start))


def make_layout(count: int, block_size: int, size: int, aggregators: int = 0,
                streams_per_aggregator: int = 2, fusion: int = 1024, window: int = 4,
                protocol: str = "request-driven") -> Layout:
    """The layout on `size` ranks: colocated when aggregators == 0, else the last K ranks.

    Streams are contiguous runs of blocks dealt to the aggregators round-robin; with the
    request-driven protocol each stream is one slot of its aggregator, so
    `streams_per_aggregator` is the slots per aggregator.
    """
    if protocol not in PROTOCOLS:
        raise UsageError(f"unknown omnireduce protocol {protocol!r}; use {', '.join(PROTOCOLS)}")
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
    return Layout(count, block_size, nblocks, streams, aggregator_of, workers, fusion, window,
                  protocol)


# Messages -----------------------------------------------------------------------------------


def _align16(nbytes: int) -> int:
    return -(-nbytes // 16) * 16


class Message:
    """One reusable message buffer, sent only as far as it is filled.

    Layout: the int32 header fields, the k block positions, the m next positions
    (request-driven only), then (16-byte aligned) the k blocks; a partial tail block
    travels without its padding, so it must be the message's last block. The header is a live
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
        capacity = _align16(SPARSE_INDEX_BYTES * (HEADER_FIELDS + layout.message_indices))
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
    def _offset(indices: int) -> int:
        return _align16(SPARSE_INDEX_BYTES * (HEADER_FIELDS + indices))

    def blocks(self, k: int, m: int = 0):
        """The (k, block_size) data view for a message of k blocks and m next positions."""
        offset = self._offset(k + m)
        return self.raw[offset: offset + k * self.block_bytes].view(self.dtype).reshape(
            k, self.block_size)

    def write(self, k: int, next_position: int, remaining: int, positions,
              nexts=None) -> None:
        """Fill the header (the blocks are written into `blocks(k, m)` by the caller)."""
        ints = self.ints
        m = 0 if nexts is None else len(nexts)
        ints[0], ints[1], ints[2], ints[3] = k, next_position, remaining, m
        ints[HEADER_FIELDS:HEADER_FIELDS + k] = positions
        if m:
            ints[HEADER_FIELDS + k:HEADER_FIELDS + k + m] = nexts
        self.nbytes = self._offset(k + m) + k * self.block_bytes
        if k and int(positions[-1]) == self.tail_id:
            self.nbytes -= self.tail_cut
        if not self.on_host:
            header = self._offset(k + m)
            self.raw[:header] = self._xp.asarray(self.ints.view(np.uint8)[:header],
                                                 device=device(self.raw))

    def read(self) -> tuple[int, int, int, np.ndarray]:
        """(k, next position, remaining, positions) of a received message."""
        if not self.on_host:
            self.ints[...] = to_numpy(self.raw[: self.ints.nbytes]).view(np.int32)
        ints = self.ints
        k = int(ints[0])
        return k, int(ints[1]), int(ints[2]), ints[HEADER_FIELDS:HEADER_FIELDS + k]

    def nexts(self) -> np.ndarray:
        """The m next positions of a message just read."""
        k, m = int(self.ints[0]), int(self.ints[3])
        return self.ints[HEADER_FIELDS + k:HEADER_FIELDS + k + m]

    def received_blocks(self, k: int, positions: np.ndarray, m: int = 0):
        """The k received blocks; the padding of a trimmed tail block is zeroed."""
        blocks = self.blocks(k, m)
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


def _wait_some(requests: list) -> list[int]:
    """Indices of completed requests; polls, yielding the core in between.

    Ranks often outnumber cores (4 ranks on 2 cores here): a rank spinning in
    MPI_Waitsome takes the core from the rank whose answer it waits for, and every
    round trip of the request-driven protocol would pay for that.
    """
    while True:
        done = MPI.Request.Testsome(requests)
        if done:
            return done
        os.sched_yield()


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


# The request-driven protocol --------------------------------------------------------------


class ColumnCursor:
    """One worker's non-zero blocks of a stream, column by column (request-driven).

    Positions are local to the stream; `heads[c]` is the next position the worker holds
    in column c, or the stream's length once the column is exhausted.
    """

    def __init__(self, ids: np.ndarray, columns: int, length: int):
        cols = ids % columns
        self.by_column = ids[np.argsort(cols, kind="stable")]  # ids are sorted: rows in order
        counts = np.bincount(cols, minlength=columns)
        self.ends = np.cumsum(counts)
        self.next_index = self.ends - counts
        self.length = length
        self.heads = np.full(columns, length, dtype=np.int64)
        self._refresh(np.arange(columns))

    def _refresh(self, cols: np.ndarray) -> None:
        index = self.next_index[cols]
        held = index < self.ends[cols]
        self.heads[cols] = self.length
        self.heads[cols[held]] = self.by_column[index[held]]

    def advance(self, cols: np.ndarray) -> None:
        """Step past the current head of each column in `cols`."""
        self.next_index[cols] += 1
        self._refresh(cols)


class RequestWorker:
    """A worker's side of one remote stream: it sends what the aggregator asks for, only."""

    def __init__(self, engine: OmniReduce, stream: int):
        self.engine = engine
        self.stream = stream
        layout = engine.layout
        self.start, self.stop = layout.streams[stream]
        self.length = self.stop - self.start
        self.columns = layout.columns(stream)
        self.send, self.recv = engine.regions(stream)
        self.aggregator = layout.aggregator_of[stream]
        like = engine.send
        self.outbox = Outbox(lambda: Message(like, layout))
        self.inbox = Inbox(engine.comm, self.aggregator, TAG_BASE + len(layout.streams) + stream,
                           lambda: Message(like, layout))
        # results land in posted buffers; a worker not asked in a round may see two in a row
        self.result_receives = 2

    def begin(self) -> None:
        """Scan this stream's part of the input, zero its output, announce the first heads."""
        engine = self.engine
        ids = to_numpy(nonzero_block_ids(self.send, engine.layout.block_size, engine.threshold))
        self.cursor = ColumnCursor(ids.astype(np.int64), self.columns, self.length)
        self.request = np.full(self.columns, -1, dtype=np.int64)
        self.done = False
        self.recv[...] = 0  # positions nobody holds are never returned
        for _ in range(self.result_receives):
            self.inbox.post()
        message, requests = self.outbox.take()
        message.write(0, -1, FIRST, (), nexts=self.cursor.heads + self.start)
        requests.append(engine.comm.isend(message.wire(), self.aggregator, TAG_BASE + self.stream))

    def on_result(self, message: Message) -> None:
        k, _, first, positions = message.read()
        nexts = message.nexts().astype(np.int64) - self.start
        block = self.engine.layout.block_size
        if first:
            self.request[...] = nexts
        elif k:
            local = positions.astype(np.int64) - self.start
            scatter_blocks(self.recv, self.engine.index_array(local),
                           message.blocks(k, k), block)
            self.request[local % self.columns] = nexts
        if (self.request >= self.length).all():
            self.done = True
            self.inbox.cancel_rest()
            return
        self.inbox.post()
        heads = self.cursor.heads
        asked = np.flatnonzero((heads == self.request) & (heads < self.length))
        if asked.shape[0]:
            self.send_asked(asked)

    def send_asked(self, asked: np.ndarray) -> None:
        """One packet: the blocks at the asked positions, each with its column's next."""
        engine, layout = self.engine, self.engine.layout
        held = self.cursor.heads[asked]
        order = np.argsort(held)
        asked, held = asked[order], held[order]
        self.cursor.advance(asked)
        k = asked.shape[0]
        message, requests = self.outbox.take()
        gather_blocks(self.send, engine.index_array(held), layout.block_size,
                      out=message.blocks(k, k))
        message.write(k, -1, 0, held + self.start, nexts=self.cursor.heads[asked] + self.start)
        requests.append(engine.comm.isend(message.wire(), self.aggregator,
                                          TAG_BASE + self.stream))
        engine.counters["packets"] += 1
        engine.counters["blocks"] += k
        # the rule, checked where it is applied: every block at its column's request
        engine.counters["unrequested"] += int(np.count_nonzero(
            held != self.request[held % self.columns]))
        if engine.sent is not None:
            engine.sent.append((self.stream, (held + self.start).tolist()))


class RequestAggregator:
    """One slot of an aggregator: a stream driven column by column (request-driven).

    The sums accumulate in this rank's own output for the stream, as in stream-ahead.
    """

    def __init__(self, engine: OmniReduce, stream: int):
        self.engine = engine
        self.stream = stream
        layout = engine.layout
        self.start, self.stop = layout.streams[stream]
        self.length = self.stop - self.start
        self.columns = layout.columns(stream)
        self.send, self.acc = engine.regions(stream)
        self.remote_workers = [w for w in layout.workers if w != engine.comm.rank]
        self.local_worker = engine.comm.rank in layout.workers
        like = engine.send
        self.inboxes = {w: Inbox(engine.comm, w, TAG_BASE + stream, lambda: Message(like, layout))
                        for w in self.remote_workers}  # fmt: skip
        self.row = {w: i for i, w in enumerate(self.remote_workers)}
        self.outbox = Outbox(lambda: Message(like, layout))
        self.result_tag = TAG_BASE + len(layout.streams) + stream

    def begin(self) -> None:
        self.heads = np.full((len(self.remote_workers), self.columns), self.length,
                             dtype=np.int64)  # each remote worker's next, per column
        self.request = np.full(self.columns, -1, dtype=np.int64)
        self.first = True
        self.pending = len(self.remote_workers)  # the first packets
        self.local = None
        self.done = False
        for inbox in self.inboxes.values():
            inbox.post()

    def add_local(self) -> None:
        """The colocated worker's blocks go straight into the sums; it answers at once."""
        engine, block = self.engine, self.engine.layout.block_size
        ids = nonzero_block_ids(self.send, block, engine.threshold)
        if engine.threshold == 0:
            copy_into(self.acc, self.send)
        else:
            self.acc[...] = 0
            if ids.shape[0]:
                scatter_blocks(self.acc, ids, gather_blocks(self.send, ids, block), block)
        self.local = ColumnCursor(to_numpy(ids).astype(np.int64), self.columns, self.length)
        self.complete_rounds()

    def on_data(self, worker: int, message: Message) -> None:
        k, _, first, positions = message.read()
        nexts = message.nexts().astype(np.int64) - self.start
        row = self.row[worker]
        if first:
            self.heads[row] = nexts
        elif k:
            local = positions.astype(np.int64) - self.start
            blocks = message.received_blocks(k, positions, k)
            scatter_add_blocks(self.acc, self.engine.index_array(local), blocks,
                               self.engine.layout.block_size)
            self.heads[row, local % self.columns] = nexts
        self.pending -= 1
        self.inboxes[worker].post()  # its next packet, if it is asked again
        self.complete_rounds()

    def complete_rounds(self) -> None:
        """Answer every round whose asked blocks are all in (the colocated worker's at once)."""
        while not self.done and self.pending == 0 and (self.local is not None
                                                       or not self.local_worker):
            self.respond()

    def respond(self) -> None:
        first, self.first = self.first, False
        if first:
            cols = np.arange(self.columns)
        else:
            cols = np.flatnonzero(self.request < self.length)  # every one was asked and is in
            if self.local is not None:
                self.local.advance(cols[self.local.heads[cols] == self.request[cols]])
        finished = self.request[cols]
        nexts = self.heads[:, cols].min(axis=0, initial=self.length)
        if self.local is not None:
            nexts = np.minimum(nexts, self.local.heads[cols])
        self.request[cols] = nexts
        live = self.request < self.length
        self.pending = int(((self.heads == self.request) & live).any(axis=1).sum())
        if not live.any():
            self.done = True
            for inbox in self.inboxes.values():  # before the last answer: no packet can come
                inbox.cancel_rest()
        if not self.remote_workers:
            return
        engine, layout = self.engine, self.engine.layout
        message, requests = self.outbox.take()
        if first:
            message.write(0, -1, FIRST, (), nexts=nexts + self.start)  # the first requests
        else:
            order = np.argsort(finished)
            finished, nexts = finished[order], nexts[order]
            k = finished.shape[0]
            gather_blocks(self.acc, engine.index_array(finished), layout.block_size,
                          out=message.blocks(k, k))
            message.write(k, -1, 0, finished + self.start, nexts=nexts + self.start)
        wire = message.wire()
        for worker in self.remote_workers:
            requests.append(engine.comm.isend(wire, worker, self.result_tag))


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
        driven = layout.protocol == "request-driven"
        aggregator_class = RequestAggregator if driven else AggregatorStream
        worker_class = RequestWorker if driven else WorkerStream
        self.aggregating = [aggregator_class(self, s) for s in layout.streams_of(rank)]
        remote = [s for s in range(len(layout.streams)) if layout.aggregator_of[s] != rank]
        self.working = [worker_class(self, s) for s in remote] if self.is_worker else []
        # request-driven worker packets of the last call: packets, blocks, and blocks sent
        # at a position their column's last response did not ask for (must stay 0)
        self.counters = {"packets": 0, "blocks": 0, "unrequested": 0}
        self.sent: list | None = None  # set to a list to record (stream, positions) per packet

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
        self.counters = dict.fromkeys(self.counters, 0)
        if self.sent is not None:
            self.sent.clear()
        if not self.is_worker:
            self.recv[...] = 0  # a dedicated aggregator's output: its streams' sums only
        for aggregator in self.aggregating:
            aggregator.begin()
        for worker in self.working:  # scan a stream, then put its first packets on the wire
            worker.begin()
            if self.layout.protocol == "stream-ahead":
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
            for index in _wait_some(heads):
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
                         threshold: float = 0.0, protocol: str = "request-driven") -> None:
    """One OmniReduce allreduce (set-up included; bind an `OmniReduce` to time it)."""
    layout = make_layout(sendbuf.shape[0], block_size, comm.size, aggregators,
                         streams_per_aggregator, fusion, window, protocol)
    OmniReduce(comm, sendbuf, recvbuf, layout, threshold)()


def stream_share(layout: Layout, rank: int) -> np.ndarray:
    """Boolean per block: the blocks of the streams `rank` aggregates."""
    share = np.zeros(layout.nblocks, dtype=bool)
    for s in layout.streams_of(rank):
        start, stop = layout.streams[s]
        share[start:stop] = True
    return share

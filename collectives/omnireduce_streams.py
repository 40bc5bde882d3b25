"""OmniReduce's streams as both protocols share them: the messages, the mailboxes, and the
set-up of a stream's two sides.

A message is one reusable buffer; an inbox holds the receives of one stream from one peer,
handled in arrival order; an outbox reuses send buffers once their sends have completed.
A worker's side of a stream talks to the stream's aggregator, the aggregator's side to
every remote worker; the protocols (`omnireduce_request`, `omnireduce_stream_ahead`) add
what each side does with the messages. The engine (`collectives.omnireduce.OmniReduce`)
calls each side's `begin` once per collective, then hands over every received message.

All sends go through the communicator (`collectives.comm`), so the wire bytes are
measured; its requests are tested and cancelled there too.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from array_api_compat import array_namespace, device

from ccbench.collectives.omnireduce_layout import TAG_BASE, Layout
from ccbench.kernels.arrays import empty_like, host_view, to_numpy
from ccbench.kernels.reduce import copy_into
from ccbench.kernels.sparse import gather_blocks, nonzero_block_ids, scatter_blocks
from ccbench.kernels.vocabulary import SPARSE_INDEX_BYTES, dtype_name, itemsize

# Header of every message, int32: [blocks k, next position, data messages still to come
# (stream-ahead worker messages) or first-packet flag (request-driven), m next positions
# that follow the k block positions (request-driven)], the k block positions, the m next
# positions, then the blocks.
HEADER_FIELDS = 4


def _align16(nbytes: int) -> int:
    return -(-nbytes // 16) * 16


class Message:
    """One reusable message buffer, sent only as far as it is filled.

    Layout: the int32 header fields, the k block positions, the m next positions
    (request-driven only), then (16-byte aligned) the k blocks; a partial tail block
    travels without its padding, so it must be the message's last block. The header is a live
    numpy view for host buffers. Device buffers keep it on the host: staged through host
    memory, it goes into the staging buffer on the host before a send and comes out of it
    after a receive (`head` of comm.isend / irecv), never through the device; only for a
    GPU-aware MPI is it pushed to the device before a send and pulled after a receive.
    """

    def __init__(self, like, layout: Layout, comm=None):
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
        self.raw = empty_like(like, capacity + blocks * self.block_bytes, xp.uint8)
        self.dtype = like.dtype
        self.on_host = str(device(like)) == "cpu"
        stages = getattr(comm, "stages", None)
        self.staged = not self.on_host and stages is not None and stages(like)
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
        return (
            self.raw[offset : offset + k * self.block_bytes]
            .view(self.dtype)
            .reshape(k, self.block_size)
        )

    def write(self, k: int, next_position: int, remaining: int, positions, nexts=None) -> None:
        """Fill the header (the blocks are written into `blocks(k, m)` by the caller)."""
        ints = self.ints
        m = 0 if nexts is None else len(nexts)
        ints[0], ints[1], ints[2], ints[3] = k, next_position, remaining, m
        ints[HEADER_FIELDS : HEADER_FIELDS + k] = positions
        if m:
            ints[HEADER_FIELDS + k : HEADER_FIELDS + k + m] = nexts
        self.nbytes = self._offset(k + m) + k * self.block_bytes
        if k and int(positions[-1]) == self.tail_id:
            self.nbytes -= self.tail_cut
        if not self.on_host and not self.staged:  # a GPU-aware MPI reads the device
            header = self._offset(k + m)
            self.raw[:header] = self._xp.asarray(
                self.ints.view(np.uint8)[:header], device=device(self.raw)
            )

    def read(self) -> tuple[int, int, int, np.ndarray]:
        """(k, next position, remaining, positions) of a received message."""
        if not self.on_host and not self.staged:  # staged: the comm filled self.ints
            self.ints[...] = to_numpy(self.raw[: self.ints.nbytes]).view(np.int32)
        ints = self.ints
        k = int(ints[0])
        return k, int(ints[1]), int(ints[2]), ints[HEADER_FIELDS : HEADER_FIELDS + k]

    def nexts(self) -> np.ndarray:
        """The m next positions of a message just read."""
        k, m = int(self.ints[0]), int(self.ints[3])
        return self.ints[HEADER_FIELDS + k : HEADER_FIELDS + k + m]

    def received_blocks(self, k: int, positions: np.ndarray, m: int = 0):
        """The k received blocks; the padding of a trimmed tail block is zeroed."""
        blocks = self.blocks(k, m)
        if k and int(positions[-1]) == self.tail_id:
            blocks[k - 1, self.tail :] = 0
        return blocks

    def wire(self):
        """The bytes that travel: header, positions and blocks as written."""
        return self.raw[: self.nbytes]

    def send(self, comm, dest: int, tag: int):
        """Post this message's send; staged, its header goes from the host copy."""
        if self.staged:
            head = self.ints.view(np.uint8)[: self._offset(int(self.ints[0]) + int(self.ints[3]))]
            return comm.isend(self.wire(), dest, tag, head=head)
        return comm.isend(self.wire(), dest, tag)

    def receive(self, comm, source: int, tag: int):
        """Post a receive into this message; staged, its header lands on the host too."""
        if self.staged:
            return comm.irecv(self.raw, source, tag, head=self.ints.view(np.uint8))
        return comm.irecv(self.raw, source, tag)


class Inbox:
    """Receives from one source with one tag, processed strictly in arrival order."""

    def __init__(self, comm, source: int, tag: int, factory):
        self.comm, self.source, self.tag = comm, source, tag
        self.factory = factory  # buffers are allocated when first needed, then reused
        self.free: deque = deque()
        self.posted: deque = deque()  # (message, request)

    def post(self) -> None:
        message = self.free.popleft() if self.free else self.factory()
        self.posted.append((message, message.receive(self.comm, self.source, self.tag)))

    def ready(self) -> bool:
        return bool(self.posted) and self.comm.completed(self.posted[0][1])

    def pop(self) -> Message:
        message, _ = self.posted.popleft()  # tested complete (a staged one copied in)
        self.free.append(message)  # reusable once the caller has read it
        return message

    def cancel_rest(self, keep: int = 0) -> None:
        """Cancel the receives posted after the first `keep`: no message will match them.

        Called when the last message of the call is known, so a message of the next call
        can never be matched by a receive of this one.
        """
        while len(self.posted) > keep:
            message, request = self.posted.pop()
            self.comm.cancel(request)
            self.free.append(message)


class Outbox:
    """Send buffers reused once their sends have completed, in order.

    `take` never waits on a peer: when the oldest buffer is still on its way, a new one
    is allocated instead (a wait here could close a cycle of ranks each waiting for the
    other to receive). Workers stay within `window` buffers by their credit rule.
    """

    def __init__(self, comm, factory):
        self.comm = comm
        self.factory = factory  # buffers are allocated when first needed, then reused
        self.free: list = []
        self.busy: deque = deque()  # (message, send requests), oldest first

    def take(self) -> tuple[Message, list]:
        while self.busy and self.comm.testall(self.busy[0][1]):
            self.free.append(self.busy.popleft()[0])
        message = self.free.pop() if self.free else self.factory()
        requests: list = []
        self.busy.append((message, requests))
        return message, requests

    def drain(self) -> None:
        for message, requests in self.busy:
            self.comm.waitall(requests)
            self.free.append(message)
        self.busy.clear()


class StreamSide:
    """One side of one stream: the engine that drives it and the stream's block bounds."""

    def __init__(self, engine, stream: int):
        self.engine = engine
        self.stream = stream
        self.start, self.stop = engine.layout.streams[stream]

    def new_message(self) -> Message:
        """A message buffer for this stream (the mailboxes allocate them when needed)."""
        return Message(self.engine.send, self.engine.layout, self.engine.comm)


class WorkerSide(StreamSide):
    """A worker's side of one remote stream: its views of the input and the output, and
    its mailboxes to and from the stream's aggregator."""

    def __init__(self, engine, stream: int):
        super().__init__(engine, stream)
        self.send, self.recv = engine.regions(stream)
        self.aggregator = engine.layout.aggregator_of[stream]
        self.outbox = Outbox(engine.comm, self.new_message)
        self.inbox = Inbox(
            engine.comm,
            self.aggregator,
            TAG_BASE + len(engine.layout.streams) + stream,
            self.new_message,
        )


class AggregatorSide(StreamSide):
    """An aggregator's side of one stream: an inbox per remote worker, one outbox for the
    results sent to them all.

    The sums accumulate in this rank's own output for the stream, which is where they
    must end anyway: the colocated worker's blocks are copied in, never sent.
    """

    def __init__(self, engine, stream: int):
        super().__init__(engine, stream)
        self.send, self.acc = engine.regions(stream)
        rank, workers = engine.comm.rank, engine.layout.workers
        self.remote_workers = [w for w in workers if w != rank]
        self.local_worker = rank in workers
        self.inboxes = {
            w: Inbox(engine.comm, w, TAG_BASE + stream, self.new_message)
            for w in self.remote_workers
        }
        self.outbox = Outbox(engine.comm, self.new_message)
        self.result_tag = TAG_BASE + len(engine.layout.streams) + stream

    def sum_local(self):
        """The colocated worker's own blocks go straight into the sums; returns their ids."""
        engine, block = self.engine, self.engine.layout.block_size
        ids = nonzero_block_ids(self.send, block, engine.threshold)
        if engine.threshold == 0:
            copy_into(self.acc, self.send)  # blocks not in ids are zero already
        else:
            self.acc[...] = 0
            if ids.shape[0]:
                scatter_blocks(self.acc, ids, gather_blocks(self.send, ids, block), block)
        return ids

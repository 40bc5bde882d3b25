"""OmniReduce's ``request-driven`` protocol (the paper's; the default). Each aggregator
has `slots` slots; a slot serves one stream and aggregates one fused packet at a time.
The stream's blocks are laid out in rows of `fusion` columns (column c holds positions
start + c, start + c + fusion, ...), and every column is driven by the aggregator:

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
"""

from __future__ import annotations

import numpy as np

from ccbench.collectives.omnireduce_layout import TAG_BASE
from ccbench.collectives.omnireduce_streams import AggregatorSide, Message, WorkerSide
from ccbench.kernels.arrays import to_numpy
from ccbench.kernels.sparse import (
    gather_blocks,
    nonzero_block_ids,
    scatter_add_blocks,
    scatter_blocks,
)

FIRST = 1  # request-driven: the packet of a worker's or a slot's first exchange


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


class RequestWorker(WorkerSide):
    """A worker's side of one remote stream: it sends what the aggregator asks for, only."""

    def __init__(self, engine, stream: int):
        super().__init__(engine, stream)
        self.length = self.stop - self.start
        self.columns = engine.layout.columns(stream)
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
        requests.append(message.send(engine.comm, self.aggregator, TAG_BASE + self.stream))

    def on_result(self, message: Message) -> None:
        k, _, first, positions = message.read()
        nexts = message.nexts().astype(np.int64) - self.start
        block = self.engine.layout.block_size
        if first:
            self.request[...] = nexts
        elif k:
            local = positions.astype(np.int64) - self.start
            scatter_blocks(self.recv, self.engine.index_array(local), message.blocks(k, k), block)
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
        gather_blocks(
            self.send, engine.index_array(held), layout.block_size, out=message.blocks(k, k)
        )
        message.write(k, -1, 0, held + self.start, nexts=self.cursor.heads[asked] + self.start)
        requests.append(message.send(engine.comm, self.aggregator, TAG_BASE + self.stream))
        engine.counters["packets"] += 1
        engine.counters["blocks"] += k
        # the rule, checked where it is applied: every block at its column's request
        engine.counters["unrequested"] += int(
            np.count_nonzero(held != self.request[held % self.columns])
        )
        if engine.sent is not None:
            engine.sent.append((self.stream, (held + self.start).tolist()))


class RequestAggregator(AggregatorSide):
    """One slot of an aggregator: a stream driven column by column (request-driven)."""

    def __init__(self, engine, stream: int):
        super().__init__(engine, stream)
        self.length = self.stop - self.start
        self.columns = engine.layout.columns(stream)
        self.row = {w: i for i, w in enumerate(self.remote_workers)}

    def begin(self) -> None:
        self.heads = np.full(
            (len(self.remote_workers), self.columns), self.length, dtype=np.int64
        )  # each remote worker's next, per column
        self.request = np.full(self.columns, -1, dtype=np.int64)
        self.first = True
        self.pending = len(self.remote_workers)  # the first packets
        self.local = None
        self.done = False
        for inbox in self.inboxes.values():
            inbox.post()

    def add_local(self) -> None:
        """The colocated worker's blocks go straight into the sums; it answers at once."""
        ids = self.sum_local()
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
            scatter_add_blocks(
                self.acc, self.engine.index_array(local), blocks, self.engine.layout.block_size
            )
            self.heads[row, local % self.columns] = nexts
        self.pending -= 1
        self.inboxes[worker].post()  # its next packet, if it is asked again
        self.complete_rounds()

    def complete_rounds(self) -> None:
        """Answer every round whose asked blocks are all in (the colocated worker's at once)."""
        while (
            not self.done
            and self.pending == 0
            and (self.local is not None or not self.local_worker)
        ):
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
            gather_blocks(
                self.acc, engine.index_array(finished), layout.block_size, out=message.blocks(k, k)
            )
            message.write(k, -1, 0, finished + self.start, nexts=nexts + self.start)
        for worker in self.remote_workers:
            requests.append(message.send(engine.comm, worker, self.result_tag))

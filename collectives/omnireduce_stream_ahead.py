"""OmniReduce's ``stream-ahead`` protocol (a departure from the paper, named for what it
does). Per stream:

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
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ccbench.collectives.omnireduce_layout import TAG_BASE
from ccbench.collectives.omnireduce_streams import AggregatorSide, Message, WorkerSide
from ccbench.kernels.arrays import to_numpy
from ccbench.kernels.sparse import (
    gather_blocks,
    nonzero_block_ids,
    scatter_add_blocks,
    scatter_blocks,
    zero_blocks,
)


class WorkerStream(WorkerSide):
    """A worker's side of one remote stream: its blocks, its window, its results."""

    def __init__(self, engine, stream: int):
        super().__init__(engine, stream)
        # results land in posted buffers (no unexpected-message copy inside MPI)
        self.result_receives = max(2, engine.layout.window)

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
        requests.append(message.send(comm, self.aggregator, TAG_BASE + self.stream))
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
            zero_blocks(
                self.recv,
                self.engine.index_array(np.flatnonzero(gaps) + (self.filled - self.start)),
                block,
            )
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


class AggregatorStream(AggregatorSide):
    """An aggregator's side of one stream: next indices, sums, fused results."""

    def __init__(self, engine, stream: int):
        super().__init__(engine, stream)
        layout = engine.layout
        self.touched = np.zeros(self.stop - self.start, dtype=bool)
        self.worker_index = {w: i for i, w in enumerate(layout.workers)}
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
        ids = self.sum_local()
        self.touched[to_numpy(ids)] = True
        self.frontier[self.worker_index[self.engine.comm.rank]] = self.stop
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
            scatter_add_blocks(
                self.acc, self.engine.index_array(local), blocks, self.engine.layout.block_size
            )
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
        local = np.flatnonzero(self.touched[lo : finished - self.start]) + lo
        self.emitted = finished
        if local.shape[0] == 0 and finished < self.stop:
            return
        engine, layout = self.engine, self.engine.layout
        fusion = layout.message_blocks
        chunks = max(1, -(-local.shape[0] // fusion))
        for c in range(chunks):
            rows = local[c * fusion : (c + 1) * fusion]
            k = rows.shape[0]
            last = c == chunks - 1
            global_next = finished if last else int(local[(c + 1) * fusion]) + self.start
            message, requests = self.outbox.take()
            if k:
                gather_blocks(
                    self.acc, engine.index_array(rows), layout.block_size, out=message.blocks(k)
                )
            message.write(k, global_next, 0, rows + self.start)
            for worker in self.remote_workers:
                requests.append(message.send(engine.comm, worker, self.result_tag))
        if finished >= self.stop:
            self.done = True

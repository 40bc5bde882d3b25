"""OmniReduce: sparse streaming allreduce through aggregators (Fei et al., SIGCOMM 2021).

The tensor is cut into blocks of `block_size` elements; the blocks are split into
contiguous streams, and each stream belongs to one aggregator
(`collectives.omnireduce_layout`). Blocks zero on every worker never travel, and every
packet carries next-index metadata (`collectives.omnireduce_streams`). Two protocols:
``request-driven``, the paper's (`collectives.omnireduce_request`), and
``stream-ahead`` (`collectives.omnireduce_stream_ahead`). With threshold T > 0 a block
is sent only if some |x| > T.

The engine binds one allreduce to its buffers, starts every stream of
this rank, as worker and as aggregator, and hands each received message to its stream.
"""

from __future__ import annotations

import os

import numpy as np
from array_api_compat import array_namespace, device

from ccbench.collectives.omnireduce_layout import Layout
from ccbench.collectives.omnireduce_request import RequestAggregator, RequestWorker
from ccbench.collectives.omnireduce_stream_ahead import AggregatorStream, WorkerStream
from ccbench.kernels import arrays
from ccbench.kernels.errors import UsageError


class OmniReduce:
    """A bound OmniReduce allreduce of `send` into `recv`; call it to run one collective.

    Views, message pools and request lists are set up once here; each call scans the
    input, streams and aggregates.
    """

    def __init__(self, comm, send, recv, layout: Layout, threshold: float = 0.0):
        if not (comm.tagged and comm.any_completion):
            raise UsageError(
                f"omnireduce tags its streams and tests and cancels its receives; the "
                f"{comm.transport} transport can do neither (torch.distributed completes a "
                f"receive only when waited for): use --transport mpi, or --algorithm dense, "
                f"dense-ring or allgather-sparse"
            )
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
        # host-driven: every step reads headers and block maps back from a device
        with arrays.host_driven(self.send):
            self._call()

    def _call(self) -> None:
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
            heads = [entry[0].posted[0][1] for entry in owners]
            for index in _wait_some(self.comm, heads):
                inbox, handler, worker = owners[index]
                while inbox.ready():
                    message = inbox.pop()
                    if worker is None:
                        handler(message)
                    else:
                        handler(worker, message)

    def _finished(self) -> bool:
        return all(w.done for w in self.working) and all(a.done for a in self.aggregating)


def _wait_some(comm, requests: list) -> list[int]:
    """Indices of completed requests; polls, yielding the core in between.

    Ranks often outnumber cores (4 ranks on 2 cores here): a rank spinning in
    MPI_Waitsome takes the core from the rank whose answer it waits for, and every
    round trip of the request-driven protocol would pay for that.
    """
    while True:
        done = comm.testsome(requests)
        if done:
            return done
        os.sched_yield()

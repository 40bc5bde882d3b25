"""Staging a device buffer through pinned host memory for an MPI that cannot read device
memory (collectives/comm.py's default): the pinned mirror of a device buffer with the
events of its copies, the copy streams, and the staged send and receive requests."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ccbench.kernels.vocabulary import nbytes


class Mirror:
    """A pinned host buffer staging one device buffer, with the events of its copies:
    `out_event` passed when its last device-to-host copy has landed, `in_event` when the
    last host-to-device copy out of it has (until then a receive must not overwrite it)."""

    __slots__ = ("host", "out_event", "in_event")

    def __init__(self, host: np.ndarray, out_event, in_event):
        self.host, self.out_event, self.in_event = host, out_event, in_event


class Stager:
    """The staging state of one device backend: two copy streams (device to host, host to
    device: one copy engine each), and two events re-recorded at every use (a stream
    wait captures an event as it is when enqueued, so one of each suffices)."""

    def __init__(self, backend):
        self.backend = backend
        self.d2h, self.h2d = backend.copy_stream(), backend.copy_stream()
        self.produced = backend.copy_event()  # the current stream's work, before a D2H
        self.consumed = backend.copy_event()  # the current stream's reads, before an H2D

    def copy_out(self, x, host: np.ndarray, event) -> None:
        """Enqueue host = x's bytes behind the kernels that wrote x; `event` marks it."""
        b = self.backend
        b.record(self.produced)
        b.stream_wait(self.produced, self.d2h)
        b.copy_out_async(x, host, self.d2h)
        b.record(event, self.d2h)

    def before_copies_in(self) -> None:
        """Later H2D copies wait for the current stream's kernels (which may still read
        the buffers they overwrite)."""
        self.backend.record(self.consumed)
        self.backend.stream_wait(self.consumed, self.h2d)

    def copy_in(self, host: np.ndarray, x) -> None:
        self.backend.copy_in_async(host, x, self.h2d)

    def after_copies_in(self, event) -> None:
        """The current stream waits for the H2D copies so far; the host does not."""
        self.backend.record(event, self.h2d)
        self.backend.stream_wait(event)


class StagedSend:
    """A send staged through host memory: its D2H copy is under way; MPI's send is posted
    once a progress call finds the copy landed (in posting order, so messages to one peer
    keep their order)."""

    def __init__(self, comm, x, mirror: Mirror, count: int, dest: int, tag: int):
        self.comm, self.x, self.mirror = comm, x, mirror
        self.count, self.dest, self.tag = count, dest, tag
        self.request: MPI.Request | None = None  # MPI's, once posted

    def post(self) -> None:
        self.request = self.comm.mpi.Isend(self.mirror.host[: self.count], self.dest, self.tag)

    def mpi_request(self) -> MPI.Request:
        return self.request if self.request is not None else MPI.Request()  # null: inactive

    def Wait(self) -> None:
        if self.request is None:
            self.comm._post_sends(block=True, upto=self)
        self.request.Wait()

    def Test(self) -> bool:
        self.comm._post_sends(block=False)
        return self.request is not None and self.request.Test()

    def complete(self) -> bool:
        return self.request is not None and not self.request


class StagedRecv:
    """A receive staged through host memory: once it completes, its H2D copy is enqueued
    and the current stream waits for it (the host never does). `head`, a host array,
    gets the message's first bytes on the host too (OmniReduce's headers)."""

    def __init__(self, comm, mirror: Mirror, out, head: np.ndarray | None, source: int, tag: int):
        self.comm, self.mirror, self.out, self.head = comm, mirror, out, head
        self.request = comm.mpi.Irecv(mirror.host[: nbytes(out)], source, tag)
        self.finished = False

    def mpi_request(self) -> MPI.Request:
        return self.request

    def Wait(self) -> None:
        self.comm._post_sends(block=True)
        status = MPI.Status()
        self.request.Wait(status)
        self.finish(status)

    def Test(self) -> bool:
        self.comm._post_sends(block=False)
        status = MPI.Status()
        if self.request.Test(status):
            self.finish(status)
            return True
        return False

    def finish(self, status: MPI.Status | None) -> None:
        if not self.finished:  # once: a completed request tests complete ever after
            self.finished = True
            count = status.Get_count(MPI.BYTE) if status is not None else nbytes(self.out)
            self.comm._copy_in(self.mirror, self.out, count, self.head)

    def complete(self) -> bool:
        return not self.request

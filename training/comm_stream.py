"""The communication stream: collectives run in the order they were submitted, on a
thread of their own, as a CUDA communication stream does.

Every rank submits in the same order (FSDP's and DDP's schedules are deterministic), so
MPI sees matching collectives. On a GPU the thread works on the caller's device, on a
CUDA stream of its own, ordered by events: each call waits for an event recorded on the
caller's stream at submission (the gradients written before it), and a wait makes the
caller's stream wait for the call's completion event, not the host for the device.

The training thread's waits on it are timed: that is the *exposed* communication. A
``recorder`` (training/trace_capture.py), when set, records each submission and wait
with the compute before it: the trace of the step.
"""

from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist


class Ticket:
    """One submitted collective: done when the stream has run it."""

    __slots__ = ("event", "error", "result", "run_s", "ready", "done")

    def __init__(self):
        self.event = threading.Event()
        self.ready = None  # CUDA event on the caller's stream at submission
        self.done = None  # CUDA event on the communication stream after the call
        self.error: BaseException | None = None
        self.result = None
        self.run_s = 0.0  # the collective's own time, wherever it ran


class CommStream:
    """Collectives run one after another on a communication thread, in submission order.

    ``overlap=False`` runs every call inline on the caller's thread instead (nothing is
    hidden behind compute). ``waited_s`` adds up the time the training thread spent
    waiting on communication (inline calls included); ``busy`` the time the collectives
    themselves took, per kind.

    ``device``: the model's device; on a CUDA device the thread sets it and orders its
    work on events (``cuda``: the torch.cuda calls, a seam for tests without a GPU).
    """

    def __init__(self, overlap: bool = True, device=None, cuda=None):
        self.overlap = overlap
        on_gpu = device is not None and getattr(device, "type", "cpu") == "cuda"
        self.device = device if on_gpu else None
        self._cuda = (cuda or torch.cuda) if on_gpu and overlap else None
        self.waited_s = 0.0
        self.busy: dict[str, float] = {}
        self._pending: list[Ticket] = []
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._callback_queued = False
        self.recorder = None  # training.trace_capture.Recorder while a trace is captured
        if overlap:
            self._thread = threading.Thread(target=self._loop, name="ccbench-comm", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        cuda, side, failed = self._cuda, None, None
        if cuda is not None:
            try:
                cuda.set_device(self.device)  # a new thread starts on device 0
                side = cuda.Stream(device=self.device)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting call
                failed = exc
        while (item := self._work.get()) is not None:
            call, kind, ticket = item
            t0 = time.perf_counter()
            try:
                if failed is not None:
                    raise failed
                if side is None:
                    ticket.result = call()
                else:
                    side.wait_event(ticket.ready)
                    with cuda.stream(side):
                        ticket.result = call()
                    done = cuda.Event()
                    done.record(side)
                    ticket.done = done
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                ticket.error = exc
            ticket.run_s = time.perf_counter() - t0
            self.busy[kind] = self.busy.get(kind, 0.0) + ticket.run_s
            ticket.event.set()

    def submit(
        self, call, kind: str = "other", tensor=None, label: str = "", blocking: bool = False
    ) -> Ticket:
        """Run ``call()`` on the stream (inline without overlap); returns its ticket.
        ``kind`` (allgather, reduce_scatter, allreduce) files its time in ``busy``;
        ``tensor`` (the whole vector: allgather's output, the others' input), ``label``
        and ``blocking`` (the caller waits at once) describe the call to a recorder."""
        ticket = Ticket()
        recorder = self.recorder
        if recorder is not None:
            recorder.before(ticket)
        if not self.overlap:
            t0 = time.perf_counter()
            ticket.result = call()
            ticket.run_s = elapsed = time.perf_counter() - t0
            self.busy[kind] = self.busy.get(kind, 0.0) + elapsed
            self.waited_s += elapsed
            ticket.event.set()
        else:
            if self._cuda is not None:  # what the caller's stream has queued so far
                ticket.ready = self._cuda.Event()
                ticket.ready.record(self._cuda.current_stream(self.device))
            self._pending.append(ticket)
            self._work.put((call, kind, ticket))
        if recorder is not None:
            recorder.called(ticket, kind, tensor, label, blocking or not self.overlap)
        return ticket

    def wait(self, ticket: Ticket):
        """Block until ``ticket`` is done (timed as exposed communication)."""
        recorder = self.recorder
        if recorder is not None:
            recorder.before(ticket)
        t0 = time.perf_counter()
        if not ticket.event.is_set():
            ticket.event.wait()
            self.waited_s += time.perf_counter() - t0
        if ticket.done is not None:  # the caller's stream, not the host, waits for it
            self._cuda.current_stream(self.device).wait_event(ticket.done)
        if recorder is not None:
            recorder.waited(ticket, time.perf_counter() - t0)
        if ticket.error is not None:
            raise ticket.error
        return ticket.result

    def drain(self) -> None:
        """Wait for everything submitted so far."""
        pending, self._pending = self._pending, []
        recorder, self.recorder = self.recorder, None  # one drain, not a wait per call
        t0 = time.perf_counter()
        try:
            if recorder is not None and pending:
                recorder.before(None)
            for ticket in pending:
                self.wait(ticket)
        finally:
            self.recorder = recorder
        if recorder is not None and pending:
            recorder.drained(pending, time.perf_counter() - t0)

    def drain_after_backward(self) -> None:
        """Queue, once per backward, an autograd-engine callback that drains the stream
        when backward ends (before DDP's reducer reads its buckets)."""
        if self._callback_queued or not self.overlap:
            return
        self._callback_queued = True

        def callback():
            self._callback_queued = False
            self.drain()

        torch.autograd.Variable._execution_engine.queue_callback(callback)

    def reset_counters(self) -> None:
        self.waited_s = 0.0
        self.busy = {}

    def close(self) -> None:
        if self._thread is not None:
            self._work.put(None)
            self._thread.join()
            self._thread = None


class StreamWork(dist.Work):
    """A ``dist.Work`` for a collective on the stream (FSDP waits on it)."""

    def __init__(self, stream: CommStream, ticket: Ticket):
        super().__init__()
        self.stream, self.ticket = stream, ticket

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - torch's signature
        self.stream.wait(self.ticket)
        return True

    def is_completed(self) -> bool:
        return self.ticket.event.is_set()

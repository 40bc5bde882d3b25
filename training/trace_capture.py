"""Capture the collective sequence of real training steps (``ccbench trace capture``).

Everything FSDP2, DDP and MG-WFBP hand to ccbench goes through one ``CommStream``
(training/comm_stream.py): FSDP's custom all-gather and reduce-scatter, DDP's comm hook,
MG-WFBP's gradient-ready hooks. A ``Recorder`` set on the stream sees, on the training
thread, every submission and every wait: the collective, its tensor (elements, dtype),
its label (the FSDP module, the DDP bucket, the MG-WFBP group), whether the caller
waits at once, and the compute since the previous event, as wall time and as the
thread's CPU time. The collective's own time on the stream and each wait's time are
kept as measurements. ``Recorder.wrap(trainer)`` brackets every step.

Each rank records its own steps; ``gather`` checks that every rank saw the same
sequence and keeps, per event, the mean over ranks of its compute gap, and per step the
mean over ranks of its measurements (as the training benchmark's step times are means
over ranks).
"""

from __future__ import annotations

import time

import numpy as np

from ccbench.collectives.trace import Event, Step, Trace
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import dtype_name


class Recorder:
    """The events of each step on the training thread (set as ``CommStream.recorder``)."""

    def __init__(self):
        self.steps: list[Step] = []
        self.active = False
        self._events: list[Event] = []
        self._calls: dict[int, tuple] = {}  # id(ticket) -> (ticket, event)
        self._last = (0.0, 0.0)
        self._gap = (0.0, 0.0)
        self._at = 0.0
        self._t0 = 0.0

    # ------------------------------------------------------------------ the step's frame
    def begin_step(self) -> None:
        self._events, self._calls = [], {}
        self._t0 = time.perf_counter()
        self._last = (self._t0, time.thread_time())
        self.active = True

    def end_step(self, record=None) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        for ticket, event in self._calls.values():
            event.run_us = ticket.run_s * 1e6
        measured = {}
        if record is not None:
            measured = {
                k: float(getattr(record, k))
                for k in ("step_us", "comm_us", "compute_us", "comm_busy_us")
            }
        self.steps.append(
            Step(
                events=self._events,
                tail_us=(now - self._last[0]) * 1e6,
                tail_cpu_us=(cpu - self._last[1]) * 1e6,
                number=len(self.steps) + 1,
                measured=measured,
            )
        )
        self.active = False

    def wrap(self, trainer) -> None:
        """Record every step of ``trainer`` (a StreamTrainer) from now on."""
        trainer.stream.recorder = self
        step = trainer.step

        def recorded(loss_fn):
            self.begin_step()
            record = step(loss_fn)
            self.end_step(record)
            return record

        trainer.step = recorded

    # ------------------------------------------------------------------ the stream's calls
    def _mark(self) -> None:
        self._last = (time.perf_counter(), time.thread_time())

    def before(self, ticket) -> None:  # noqa: ARG002 - the stream's hook signature
        """A compute gap ends: a submission or a wait begins."""
        if not self.active:
            return
        now, cpu = time.perf_counter(), time.thread_time()
        self._gap = ((now - self._last[0]) * 1e6, (cpu - self._last[1]) * 1e6)
        self._at = (now - self._t0) * 1e6

    def called(self, ticket, kind: str, tensor, label: str, blocking: bool) -> None:
        if not self.active:
            return
        if tensor is None:
            raise RuntimeError(f"a {kind} was submitted without its tensor: cannot record it")
        event = Event(
            op="call",
            gap_us=self._gap[0],
            gap_cpu_us=self._gap[1],
            id=len(self._calls),
            collective=kind,
            count=int(tensor.numel()),
            dtype=dtype_name(tensor),
            label=label,
            blocking=blocking,
            start_us=self._at,
        )
        if blocking and ticket.event.is_set():  # ran inline: its time was exposed
            event.waited_us = ticket.run_s * 1e6
        self._calls[id(ticket)] = (ticket, event)
        self._events.append(event)
        self._mark()

    def waited(self, ticket, seconds: float) -> None:
        if not self.active:
            return
        found = self._calls.get(id(ticket))
        if found is not None and found[1].blocking:  # the blocking call's own wait
            found[1].waited_us = (found[1].waited_us or 0.0) + seconds * 1e6
        elif found is not None:
            self._events.append(
                Event(
                    op="wait",
                    gap_us=self._gap[0],
                    gap_cpu_us=self._gap[1],
                    id=found[1].id,
                    start_us=self._at,
                    waited_us=seconds * 1e6,
                )
            )
        self._mark()

    def drained(self, tickets, seconds: float) -> None:
        if not self.active:
            return
        if any(id(t) in self._calls and not self._calls[id(t)][1].blocking for t in tickets):
            self._events.append(
                Event(
                    op="drain",
                    gap_us=self._gap[0],
                    gap_cpu_us=self._gap[1],
                    start_us=self._at,
                    waited_us=seconds * 1e6,
                )
            )
        self._mark()


def _signature(step: Step) -> list:
    return [(e.op, e.id, e.collective, e.count, e.dtype, e.blocking) for e in step.events]


def gather(comm, recorder: Recorder, source: dict, skip: int, overlap: bool) -> Trace | None:
    """The trace of the recorded steps after the first ``skip``, on rank 0 (None
    elsewhere): rank 0's sequence, each gap the mean over ranks. Collective."""
    steps = recorder.steps[skip:] or recorder.steps[-1:]
    signatures = comm.gather_obj([_signature(s) for s in steps], root=0)
    fields = ("gap_us", "gap_cpu_us", "run_us", "waited_us")
    local = np.array(
        [[getattr(e, f) or 0.0 for f in fields] for s in steps for e in s.events]
        + [[s.tail_us, s.tail_cpu_us or 0.0, 0.0, 0.0] for s in steps],
        dtype=float,
    ).reshape(-1, len(fields))
    same = comm.bcast_obj(
        all(s == signatures[0] for s in signatures) if comm.rank == 0 else None, root=0
    )
    if not same:
        raise UsageError(
            "the ranks issued different collective sequences; a trace "
            "describes SPMD training, where every rank issues the same"
        )
    mean = comm.allreduce_array(local, "sum") / comm.size
    # the step's own measurements as a mean over ranks too, so that they and the gaps
    # describe the same mean rank (rank 0's alone can be shorter than the mean compute)
    measured = np.array([list(s.measured.values()) for s in steps], dtype=float)
    measured_mean = comm.allreduce_array(measured, "sum") / comm.size
    if comm.rank != 0:
        return None
    rows = iter(mean)
    for s in steps:
        for e in s.events:
            row = next(rows)
            for f, value in zip(fields, row, strict=True):
                if getattr(e, f) is not None:
                    setattr(e, f, float(value))
    for s in steps:
        row = next(rows)
        s.tail_us, s.tail_cpu_us = float(row[0]), float(row[1])
    for s, values in zip(steps, measured_mean, strict=True):
        s.measured = dict(zip(s.measured, map(float, values), strict=True))
    for n, s in enumerate(steps):
        s.number = skip + n + 1
    return Trace(ranks=comm.size, steps=steps, source=source, overlap=overlap)

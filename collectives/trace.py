"""Collective traces: the communication of training steps, as a replay reads it.

A trace is the sequence of collectives one rank issues in each step of a data-parallel
training, with the compute between them, so that the step can be replayed through any
variant and codec (benchmarks/trace_replay.py). Every rank issues the same sequence
(FSDP's and DDP's schedules are deterministic), so one rank's sequence describes the job.
This module holds what a trace is (`Trace`, `Step`, `Event`) and `check`, which refuses a
trace a replay could not run; collectives/trace_files.py reads and writes trace files in
ccbench's format (docs/traces.md), and collectives/trace_param.py converts PARAM's comms
trace (a JSON list of records), so traces from PARAM users replay here and ours replay in
PARAM.

A step is a list of *events* on the training thread, each after a compute gap:

- ``call``: a collective is issued (``async``: it runs on the communication stream while
  compute goes on, and a later ``wait`` or ``drain`` waits for it; else it blocks);
- ``wait``: the training thread waits for one earlier call (FSDP's ``Work.wait()``);
- ``drain``: the training thread waits for every call issued so far (the end of
  backward, where FSDP and DDP wait for their reduce-scatters and allreduces).

``gap_us`` is the compute on the training thread since the previous event ended (or the
step began); ``tail_us`` the compute after the last event (the optimizer). Captured
traces also carry ``gap_cpu_us``, the thread's CPU time over the same span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import COLLECTIVES, DTYPES, itemsize

OPS = ("call", "wait", "drain")
WORLD = 0  # the group of every rank


@dataclass
class Event:
    """One event of a step (see the module's docstring)."""

    op: str
    gap_us: float = 0.0
    gap_cpu_us: float | None = None
    id: int | None = None  # the call's order in its step; a wait names the call it waits on
    collective: str = ""
    count: int = 0  # elements of the whole vector: allgather's output, the others' input
    dtype: str = "float32"
    group: int = WORLD
    blocking: bool = False
    label: str = ""  # the FSDP module, DDP bucket or MG-WFBP group
    sparse: bool = False  # a sparse tensor: sparse streaming may send its non-zeros only
    density: float | None = None  # fraction of non-zero values, where known
    start_us: float | None = None  # measured at capture, from the step's start
    run_us: float | None = None  # measured at capture: the collective's own time
    waited_us: float | None = None  # measured at capture: the wait's time (exposed)

    @property
    def nbytes(self) -> int:
        return self.count * itemsize(self.dtype) if self.op == "call" else 0


@dataclass
class Step:
    events: list[Event]
    tail_us: float = 0.0
    tail_cpu_us: float | None = None
    number: int | None = None
    measured: dict = field(default_factory=dict)  # capture: step_us, comm_us, ...

    @property
    def calls(self) -> list[Event]:
        return [e for e in self.events if e.op == "call"]

    @property
    def compute_us(self) -> float:
        return sum(e.gap_us for e in self.events) + self.tail_us

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.events)


@dataclass
class Trace:
    ranks: int
    steps: list[Step]
    source: dict = field(default_factory=dict)  # how the trace was made
    groups: dict[int, list[int] | None] = field(default_factory=lambda: {WORLD: None})
    overlap: bool = True  # async calls run on a communication thread

    @property
    def has_cpu_times(self) -> bool:
        return (
            all(e.gap_cpu_us is not None for s in self.steps for e in s.events)
            and all(s.tail_cpu_us is not None for s in self.steps)
            and bool(self.steps)
        )

    def describe(self) -> str:
        kind = self.source.get("kind", "")
        what = " ".join(str(self.source[k]) for k in ("model", "framework") if self.source.get(k))
        return (
            f"{kind} trace of {what or 'a training'} on {self.ranks} ranks, "
            f"{len(self.steps)} step(s)"
        )


# ----------------------------------------------------------------------------- checks


def bad_trace(where: str, why: str) -> UsageError:
    """The refusal of a trace: where in it (file, step, call) and why."""
    return UsageError(f"{where}: {why}")


def check_number(value, where: str, name: str, minimum: float = 0.0) -> float:
    """`value` as a float, refused unless a finite number of at least `minimum`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
    ):
        raise bad_trace(where, f"{name} must be a number >= {minimum:g}, not {value!r}")
    return float(value)


def check(trace: Trace, where: str = "trace") -> Trace:
    """Refuse a trace a replay could not run: every event well formed, every wait on an
    earlier async call of its step, every call waited for by the step's end."""
    if not isinstance(trace.ranks, int) or trace.ranks < 1:
        raise bad_trace(where, f"ranks must be a positive integer, not {trace.ranks!r}")
    if not trace.steps:
        raise bad_trace(where, "no steps")
    for s, step in enumerate(trace.steps):
        at = f"{where}: step {step.number if step.number is not None else s + 1}"
        check_number(step.tail_us, at, "tail_us")
        issued: dict[int, Event] = {}
        waited: set[int] = set()
        for event in step.events:
            _check_event(event, issued, waited, trace, at)
        open_calls = [i for i, e in issued.items() if not e.blocking and i not in waited]
        if open_calls:
            raise bad_trace(at, f"call {open_calls[0]} is never waited for (add a wait or a drain)")
    return trace


def _check_event(event: Event, issued: dict, waited: set, trace: Trace, at: str) -> None:
    if event.op not in OPS:
        raise bad_trace(at, f"unknown op {event.op!r}; one of {', '.join(OPS)}")
    check_number(event.gap_us, at, "gap_us")
    if event.op == "drain":
        waited.update(issued)
        return
    if not isinstance(event.id, int) or isinstance(event.id, bool):
        raise bad_trace(at, f"a {event.op} needs an integer id")
    if event.op == "wait":
        if event.id not in issued or issued[event.id].blocking:
            raise bad_trace(at, f"wait on {event.id}, which is no earlier async call")
        waited.add(event.id)
        return
    where = f"{at}, call {event.id}"
    if event.id in issued:
        raise bad_trace(where, "two calls with one id")
    if event.collective not in COLLECTIVES:
        raise bad_trace(
            where, f"collective {event.collective!r}; replayed are {', '.join(COLLECTIVES)}"
        )
    if event.dtype not in DTYPES:
        raise bad_trace(where, f"dtype {event.dtype!r}; one of {', '.join(DTYPES)}")
    if not isinstance(event.count, int) or isinstance(event.count, bool) or event.count < 0:
        raise bad_trace(where, f"count must be a non-negative integer, not {event.count!r}")
    if event.group not in trace.groups:
        raise bad_trace(where, f"process group {event.group} is not in the trace's groups")
    if event.density is not None and not 0 < event.density <= 1:
        raise bad_trace(where, f"density must be in (0, 1], not {event.density}")
    issued[event.id] = event

"""Collective traces: the communication of training steps, as a replay reads it.

A trace is the sequence of collectives one rank issues in each step of a data-parallel
training, with the compute between them, so that the step can be replayed through any
variant and codec (benchmarks/trace_replay.py). Every rank issues the same sequence
(FSDP's and DDP's schedules are deterministic), so one rank's sequence describes the job.
The format is documented in docs/traces.md; this module reads, checks and writes it, and
reads and writes PARAM's comms trace (a JSON list of records), so traces from PARAM users
replay here and ours replay in PARAM.

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

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.collectives.spec import SPECS, spec
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import COLLECTIVES, DTYPES, itemsize

FORMAT = "ccbench-trace"
VERSION = 1
OPS = ("call", "wait", "drain")
WORLD = 0  # the group of every rank

# PARAM's names of the collectives replayed here (its paramToCommName folds spellings to
# these; collectives/spec.py lists them), and of its dtypes.
PARAM_COLLECTIVES = {param: s.name for s in SPECS.values() for param in s.param_names}
PARAM_NAME = {s.name: s.param_names[0] for s in SPECS.values()}
PARAM_DTYPES = {
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "double": "float64",
    "float64": "float64",
    "byte": "int8",
    "char": "int8",
    "int8": "int8",
}
PARAM_DTYPE_NAME = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float64": "double",
    "int8": "char",
}


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


def _bad(where: str, why: str) -> UsageError:
    return UsageError(f"{where}: {why}")


def _number(value, where: str, name: str, minimum: float = 0.0) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
    ):
        raise _bad(where, f"{name} must be a number >= {minimum:g}, not {value!r}")
    return float(value)


def check(trace: Trace, where: str = "trace") -> Trace:
    """Refuse a trace a replay could not run: every event well formed, every wait on an
    earlier async call of its step, every call waited for by the step's end."""
    if not isinstance(trace.ranks, int) or trace.ranks < 1:
        raise _bad(where, f"ranks must be a positive integer, not {trace.ranks!r}")
    if not trace.steps:
        raise _bad(where, "no steps")
    for s, step in enumerate(trace.steps):
        at = f"{where}: step {step.number if step.number is not None else s + 1}"
        _number(step.tail_us, at, "tail_us")
        issued: dict[int, Event] = {}
        waited: set[int] = set()
        for event in step.events:
            _check_event(event, issued, waited, trace, at)
        open_calls = [i for i, e in issued.items() if not e.blocking and i not in waited]
        if open_calls:
            raise _bad(at, f"call {open_calls[0]} is never waited for (add a wait or a drain)")
    return trace


def _check_event(event: Event, issued: dict, waited: set, trace: Trace, at: str) -> None:
    if event.op not in OPS:
        raise _bad(at, f"unknown op {event.op!r}; one of {', '.join(OPS)}")
    _number(event.gap_us, at, "gap_us")
    if event.op == "drain":
        waited.update(issued)
        return
    if not isinstance(event.id, int) or isinstance(event.id, bool):
        raise _bad(at, f"a {event.op} needs an integer id")
    if event.op == "wait":
        if event.id not in issued or issued[event.id].blocking:
            raise _bad(at, f"wait on {event.id}, which is no earlier async call")
        waited.add(event.id)
        return
    where = f"{at}, call {event.id}"
    if event.id in issued:
        raise _bad(where, "two calls with one id")
    if event.collective not in COLLECTIVES:
        raise _bad(where, f"collective {event.collective!r}; replayed are {', '.join(COLLECTIVES)}")
    if event.dtype not in DTYPES:
        raise _bad(where, f"dtype {event.dtype!r}; one of {', '.join(DTYPES)}")
    if not isinstance(event.count, int) or isinstance(event.count, bool) or event.count < 0:
        raise _bad(where, f"count must be a non-negative integer, not {event.count!r}")
    if event.group not in trace.groups:
        raise _bad(where, f"process group {event.group} is not in the trace's groups")
    if event.density is not None and not 0 < event.density <= 1:
        raise _bad(where, f"density must be in (0, 1], not {event.density}")
    issued[event.id] = event


# ----------------------------------------------------------------------------- ccbench JSON


def _event_json(e: Event) -> dict:
    out: dict = {"op": e.op}
    if e.op != "drain":
        out["id"] = e.id
    if e.op == "call":
        out.update(
            collective=e.collective,
            bytes=e.nbytes,
            count=e.count,
            dtype=e.dtype,
            group=e.group,
            **{"async": not e.blocking},
        )
        if e.label:
            out["label"] = e.label
        if e.sparse:
            out["sparse"] = True
        if e.density is not None:
            out["density"] = e.density
    out["gap_us"] = round(e.gap_us, 3)
    for name in ("gap_cpu_us", "start_us", "run_us", "waited_us"):
        value = getattr(e, name)
        if value is not None:
            out[name] = round(value, 3)
    return out


def to_json(trace: Trace) -> dict:
    groups = [
        {"id": g, "ranks": "all" if r is None else list(r)} for g, r in sorted(trace.groups.items())
    ]
    steps = []
    for s in trace.steps:
        step = {
            "step": s.number,
            "events": [_event_json(e) for e in s.events],
            "tail_us": round(s.tail_us, 3),
        }
        if s.tail_cpu_us is not None:
            step["tail_cpu_us"] = round(s.tail_cpu_us, 3)
        if s.measured:
            step["measured"] = {k: round(v, 3) for k, v in s.measured.items()}
        steps.append(step)
    return {
        "format": FORMAT,
        "version": VERSION,
        "ranks": trace.ranks,
        "overlap": trace.overlap,
        "source": trace.source,
        "groups": groups,
        "steps": steps,
    }


def _event_from(raw, at: str) -> Event:
    if not isinstance(raw, dict):
        raise _bad(at, "an event must be a JSON object")
    known = {
        "op",
        "id",
        "collective",
        "bytes",
        "count",
        "dtype",
        "group",
        "async",
        "label",
        "sparse",
        "density",
        "gap_us",
        "gap_cpu_us",
        "start_us",
        "run_us",
        "waited_us",
    }
    unknown = set(raw) - known
    if unknown:
        raise _bad(at, f"unknown event field(s) {', '.join(sorted(unknown))}")
    event = Event(
        op=raw.get("op", ""), id=raw.get("id"), gap_us=_number(raw.get("gap_us", 0.0), at, "gap_us")
    )
    for name in ("gap_cpu_us", "start_us", "run_us", "waited_us", "density"):
        if raw.get(name) is not None:
            setattr(event, name, _number(raw[name], at, name))
    if event.op == "call":
        event.collective = raw.get("collective", "")
        event.count, event.dtype = raw.get("count", 0), raw.get("dtype", "float32")
        event.group, event.blocking = raw.get("group", WORLD), not raw.get("async", False)
        event.label, event.sparse = str(raw.get("label", "")), bool(raw.get("sparse", False))
        if (
            "bytes" in raw
            and event.dtype in DTYPES
            and isinstance(event.count, int)
            and raw["bytes"] != event.count * itemsize(event.dtype)
        ):
            raise _bad(at, f"bytes {raw['bytes']} is not count x {itemsize(event.dtype)}")
    return event


def from_json(document, where: str) -> Trace:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise _bad(where, f'not a {FORMAT} document (no "format": "{FORMAT}")')
    version = document.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise _bad(
            where, f"{FORMAT} version {version!r}: this ccbench reads up to version {VERSION}"
        )
    groups: dict[int, list[int] | None] = {}
    for g in document.get("groups", [{"id": WORLD, "ranks": "all"}]):
        ranks = g.get("ranks") if isinstance(g, dict) else None
        if (
            not isinstance(g, dict)
            or not isinstance(g.get("id"), int)
            or not (ranks == "all" or isinstance(ranks, list))
        ):
            raise _bad(where, 'each group needs an integer id and ranks ("all" or a list)')
        groups[g["id"]] = None if ranks == "all" else [int(r) for r in ranks]
    steps = []
    raw_steps = document.get("steps")
    if not isinstance(raw_steps, list):
        raise _bad(where, "steps must be a list")
    for n, raw in enumerate(raw_steps):
        at = f"{where}: step {n + 1}"
        if not isinstance(raw, dict) or not isinstance(raw.get("events"), list):
            raise _bad(at, "a step needs a list of events")
        steps.append(
            Step(
                events=[_event_from(e, at) for e in raw["events"]],
                tail_us=_number(raw.get("tail_us", 0.0), at, "tail_us"),
                tail_cpu_us=None
                if raw.get("tail_cpu_us") is None
                else _number(raw["tail_cpu_us"], at, "tail_cpu_us"),
                number=raw.get("step"),
                measured=dict(raw.get("measured", {})),
            )
        )
    trace = Trace(
        ranks=document.get("ranks"),
        steps=steps,
        source=dict(document.get("source", {})),
        groups=groups,
        overlap=bool(document.get("overlap", True)),
    )
    return check(trace, where)


# ----------------------------------------------------------------------------- PARAM


def _param_name(name) -> str:
    """PARAM's folding of a collective's spelling ("allGather", "_allgather_base")."""
    text = "".join(c for c in str(name).lower() if c.isalpha())
    aliases = {
        "allreduce": "all_reduce",
        "allgather": "all_gather",
        "allgatherbase": "all_gather_base",
        "reducescatter": "reduce_scatter",
        "reducescatterbase": "reduce_scatter_base",
        "reducescattertensor": "reduce_scatter",
        "allgatherintotensor": "all_gather",
    }
    return aliases.get(text, text)


def from_param(records, where: str, ranks: int | None = None) -> Trace:
    """PARAM's comms trace (one rank's JSON list of records). Gaps come from successive
    ``startTime_ns``; a record written by ccbench carries its own gap (``ccbench``)."""
    if not isinstance(records, list):
        raise _bad(where, "a PARAM comms trace is a JSON list of records")
    waited = {
        r.get("req")
        for r in records
        if isinstance(r, dict) and _param_name(r.get("comms")) == "wait"
    }
    groups: dict[int, list[int] | None] = {}
    steps: dict[int, Step] = {}
    requests: dict = {}  # PARAM req -> (step, call id)
    world, previous_ns, carry = ranks, None, 0.0
    for n, record in enumerate(records):
        at = f"{where}: record {n}"
        if isinstance(record, dict) and "compute" in record and "comms" not in record:
            continue  # its time lies between the start times around it
        if not isinstance(record, dict) or "comms" not in record:
            raise _bad(at, 'a record needs "comms"')
        name = _param_name(record["comms"])
        own = record.get("ccbench") if isinstance(record.get("ccbench"), dict) else {}
        if record.get("world_size") and not world:
            world = int(record["world_size"])
        if name == "init":
            groups[int(record.get("pg_id") or 0)] = record.get("global_ranks") or None
            continue
        start = record.get("startTime_ns")
        gap = own.get("gap_us")
        if gap is None:
            gap = (
                0.0
                if start is None or previous_ns is None
                else max(0.0, (float(start) - previous_ns) / 1e3)
            )
        if start is not None:
            previous_ns = float(start)
        number = int(own.get("step", 1))
        step = steps.setdefault(number, Step(events=[], number=number))
        step.tail_us = float(own.get("tail_us", step.tail_us))
        gap, carry = float(gap) + carry, 0.0
        if name == "barrier":
            carry = gap  # nothing moves; its time stays in the next gap
            continue
        if name == "wait":
            found = requests.pop(record.get("req"), None)
            if found is None or found[0] is not step:
                carry = gap  # a wait on a call of another step: the step's end waited
                continue
            if own.get("drain_part") and step.events and step.events[-1].op == "drain":
                continue
            op = "drain" if own.get("drain") else "wait"
            step.events.append(
                Event(
                    op=op,
                    gap_us=gap,
                    gap_cpu_us=own.get("gap_cpu_us"),
                    id=None if op == "drain" else found[1],
                    waited_us=own.get("waited_us"),
                )
            )
            continue
        if name not in PARAM_COLLECTIVES:
            raise _bad(
                at,
                f"PARAM collective {record['comms']!r} is not replayed here "
                f"(replayed: {', '.join(sorted(PARAM_COLLECTIVES))})",
            )
        collective = PARAM_COLLECTIVES[name]
        dtype = PARAM_DTYPES.get(str(record.get("dtype", "float")).lower())
        if dtype is None:
            raise _bad(
                at,
                f"PARAM dtype {record.get('dtype')!r} is not one of "
                f"{', '.join(sorted(PARAM_DTYPES))}",
            )
        sizes = (record.get("in_msg_size"), record.get("out_msg_size"))
        if not all(isinstance(s, int) and s >= 0 for s in sizes):
            raise _bad(at, "in_msg_size and out_msg_size must be element counts")
        pg = int(record.get("pg_id") or 0)
        groups.setdefault(pg, record.get("global_ranks") or None)
        markers = [str(m) for m in record.get("markers") or [] if not str(m).startswith("step ")]
        event = Event(
            op="call",
            gap_us=gap,
            gap_cpu_us=own.get("gap_cpu_us"),
            id=len(step.calls),
            collective=collective,
            count=spec(collective).whole_count(*sizes),
            dtype=dtype,
            group=pg,
            label=" / ".join(markers),
            sparse=bool(own.get("sparse", False)),
            density=own.get("density"),
            run_us=own.get("run_us"),
        )
        event.blocking = record.get("req") is None or record["req"] not in waited
        if not event.blocking:
            requests[record["req"]] = (step, event.id)
        step.events.append(event)
    if not steps:
        raise _bad(where, "no collectives to replay")
    world = world or max((len(r) for r in groups.values() if r), default=1)
    for pg, members in list(groups.items()):
        if members is not None and sorted(members) == list(range(world)):
            groups[pg] = None  # every rank: the world
    groups.setdefault(WORLD, None)
    ordered = [steps[k] for k in sorted(steps)]
    for step in ordered:  # a call its step never waits for: the step's end waits for it
        waits = {e.id for e in step.events if e.op == "wait"}
        drained = any(e.op == "drain" for e in step.events)
        if not drained and any(not e.blocking and e.id not in waits for e in step.calls):
            step.events.append(Event(op="drain"))
    trace = Trace(
        ranks=world,
        steps=ordered,
        groups=groups,
        source={"kind": "param", "file": Path(where).name},
    )
    return check(trace, where)


def to_param(trace: Trace) -> list[dict]:
    """PARAM's comms trace (basic format) of a trace: an init record per group, then the
    steps laid end to end on one timeline (``startTime_ns``); each record keeps ccbench's
    own fields under ``ccbench`` (PARAM ignores them) so the round trip is exact."""
    world = list(range(trace.ranks))
    out = [
        {
            "comms": "init",
            "pg_id": g,
            "req": -1,
            "world_size": trace.ranks,
            "global_ranks": world if r is None else list(r),
        }
        for g, r in sorted(trace.groups.items())
    ]
    clock, req = 0.0, 0
    for step in trace.steps:
        number = step.number if step.number is not None else len(out)
        open_reqs: dict[int, int] = {}
        for e in step.events:
            clock += e.gap_us
            own = {"step": number, "gap_us": e.gap_us, "tail_us": step.tail_us}
            for name in ("gap_cpu_us", "run_us", "waited_us", "density"):
                if getattr(e, name) is not None:
                    own[name] = getattr(e, name)
            if e.sparse:
                own["sparse"] = True
            base = {
                "startTime_ns": int(round(clock * 1e3)),
                "ccbench": own,
                "markers": [f"step {number}"] + ([e.label] if e.label else []),
            }
            if e.op == "call":
                size_in, size_out = spec(e.collective).counts_of_whole(e.count, trace.ranks)
                out.append(
                    {
                        **base,
                        "comms": PARAM_NAME[e.collective],
                        "req": req,
                        "pg_id": e.group,
                        "world_size": trace.ranks,
                        "global_ranks": world
                        if trace.groups.get(e.group) is None
                        else trace.groups[e.group],
                        "in_msg_size": size_in,
                        "out_msg_size": size_out,
                        "dtype": PARAM_DTYPE_NAME[e.dtype],
                    }
                )
                if not e.blocking:
                    open_reqs[e.id] = req
                req += 1
                clock += (e.run_us or 0.0) if e.blocking else 0.0
                continue
            ids = [e.id] if e.op == "wait" else list(open_reqs)
            for i, call in enumerate(ids):
                record = (
                    dict(base)
                    if i == 0
                    else {
                        **base,
                        "ccbench": {
                            "step": number,
                            "gap_us": 0.0,
                            "tail_us": step.tail_us,
                            "drain_part": True,
                        },
                    }
                )
                if e.op == "drain" and i == 0:
                    record["ccbench"] = {**own, "drain": True}
                out.append({**record, "comms": "wait", "req": open_reqs.pop(call), "pg_id": WORLD})
            clock += e.waited_us or 0.0
        clock += step.tail_us
    return out


# ----------------------------------------------------------------------------- files


def read(path) -> Trace:
    """A trace file: ccbench's format, or PARAM's comms trace (a JSON list)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such trace") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc})") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not JSON ({exc})") from None
    if isinstance(document, list):
        return from_param(document, str(path))
    return from_json(document, str(path))


def write(trace: Trace, path, param: bool = False) -> None:
    """Write a trace (atomically): ccbench's format, or PARAM's with ``param``."""
    import os
    import tempfile

    check(trace)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_param(trace) if param else to_json(trace), indent=1)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

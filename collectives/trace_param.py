"""PARAM's comms trace: reading it into a ccbench trace and writing one out in it.

PARAM (facebookresearch/param) records one rank's collectives as a JSON list of records:
an ``init`` per process group, then each collective with its element counts, dtype,
request and ``startTime_ns``, and a ``wait`` per awaited request. `from_param` turns such
a list into a `Trace` (collectives/trace.py): gaps from successive start times, a call
async when a wait names its request, barriers folded into the next gap, a drain at a
step's end for the calls it never waits for. `to_param` lays a trace's steps end to end
on one timeline and keeps ccbench's own fields under ``ccbench`` (PARAM ignores them), so
the round trip is exact. The collectives' PARAM names come from collectives/spec.py.
"""

from __future__ import annotations

from pathlib import Path

from ccbench.collectives.spec import SPECS, spec
from ccbench.collectives.trace import WORLD, Event, Step, Trace, bad_trace, check

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
        raise bad_trace(where, "a PARAM comms trace is a JSON list of records")
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
            raise bad_trace(at, 'a record needs "comms"')
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
            raise bad_trace(
                at,
                f"PARAM collective {record['comms']!r} is not replayed here "
                f"(replayed: {', '.join(sorted(PARAM_COLLECTIVES))})",
            )
        collective = PARAM_COLLECTIVES[name]
        dtype = PARAM_DTYPES.get(str(record.get("dtype", "float")).lower())
        if dtype is None:
            raise bad_trace(
                at,
                f"PARAM dtype {record.get('dtype')!r} is not one of "
                f"{', '.join(sorted(PARAM_DTYPES))}",
            )
        sizes = (record.get("in_msg_size"), record.get("out_msg_size"))
        if not all(isinstance(s, int) and s >= 0 for s in sizes):
            raise bad_trace(at, "in_msg_size and out_msg_size must be element counts")
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
        raise bad_trace(where, "no collectives to replay")
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

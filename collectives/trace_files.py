"""Trace files: ccbench's trace format (docs/traces.md) as JSON, and reading and writing
trace files in it or in PARAM's comms trace.

`to_json` and `from_json` turn a `Trace` (collectives/trace.py) into ccbench's JSON
document and back, refusing unknown fields, a newer version and byte counts that do not
match their element counts; `read` takes either format (a JSON list is PARAM's, converted
by collectives/trace_param.py), and `write` checks a trace and writes it atomically, in
ccbench's format or PARAM's. Every trace read is checked (`trace.check`) before it is
returned.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ccbench.collectives.trace import WORLD, Event, Step, Trace, bad_trace, check, check_number
from ccbench.collectives.trace_param import from_param, to_param
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import DTYPES, itemsize

FORMAT = "ccbench-trace"
VERSION = 1


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
        raise bad_trace(at, "an event must be a JSON object")
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
        raise bad_trace(at, f"unknown event field(s) {', '.join(sorted(unknown))}")
    event = Event(
        op=raw.get("op", ""),
        id=raw.get("id"),
        gap_us=check_number(raw.get("gap_us", 0.0), at, "gap_us"),
    )
    for name in ("gap_cpu_us", "start_us", "run_us", "waited_us", "density"):
        if raw.get(name) is not None:
            setattr(event, name, check_number(raw[name], at, name))
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
            raise bad_trace(at, f"bytes {raw['bytes']} is not count x {itemsize(event.dtype)}")
    return event


def from_json(document, where: str) -> Trace:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise bad_trace(where, f'not a {FORMAT} document (no "format": "{FORMAT}")')
    version = document.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise bad_trace(
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
            raise bad_trace(where, 'each group needs an integer id and ranks ("all" or a list)')
        groups[g["id"]] = None if ranks == "all" else [int(r) for r in ranks]
    steps = []
    raw_steps = document.get("steps")
    if not isinstance(raw_steps, list):
        raise bad_trace(where, "steps must be a list")
    for n, raw in enumerate(raw_steps):
        at = f"{where}: step {n + 1}"
        if not isinstance(raw, dict) or not isinstance(raw.get("events"), list):
            raise bad_trace(at, "a step needs a list of events")
        steps.append(
            Step(
                events=[_event_from(e, at) for e in raw["events"]],
                tail_us=check_number(raw.get("tail_us", 0.0), at, "tail_us"),
                tail_cpu_us=None
                if raw.get("tail_cpu_us") is None
                else check_number(raw["tail_cpu_us"], at, "tail_cpu_us"),
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


def trace_id(trace: Trace) -> str:
    """The trace's identity in result rows: a hash of its document (the same steps, the
    same id)."""
    text = json.dumps(to_json(trace), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


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

"""A step's calls as the step runs them (docs/advise.md, "Calls in a step"): through
training's path, in turn with the step's other collectives, handed between threads.

A harness row times one collective, repeated, on buffers bound once. A step of FSDP runs
its calls through the gradient communicator on the communication thread, its
all-gathers back to back in the forward pass and in turn with reduce-scatters in the
backward pass. `turn_trace` is the part that measures the difference: one trace step per
collective (its main call of the step, `TURN_CALLS` times, each waited), then one step
of the collectives in turn (`TURN_CALLS` rounds), replayed with no compute
(`trace_replay --compute-scale 0`). `step_factors` reads those replays: per collective,
its call alone over the harness parts' call (path) and its call in turn over its call
alone (in turn); per option, the time outside the calls per call (the stream's round
trip).
"""

from __future__ import annotations

import math

import numpy as np

from ccbench.collectives import compression_model as cm
from ccbench.collectives.trace import WORLD, Event, Step, Trace
from ccbench.collectives.trace_files import trace_id
from ccbench.kernels.vocabulary import itemsize
from ccbench.scripts.advise.parts import (
    Input,
    Tables,
    _number,
    _row_ranks_per_node,
    _row_variant,
    _where,
    row_is_hierarchical,
    row_is_leaders,
)

TURN_CALLS = 8  # calls of each collective per trace step
SOURCE_KIND = "turns"  # the part trace's `source.kind`, the replay rows' `source`
NAME = "in turn"  # the inputs: "in turn allgather", ...
PATH = "path"  # the inputs: "path allgather", ... (through training's path)
HANDOFF = "stream round trip s"  # the input: a call's hand-offs between threads


def main_calls(step: Step) -> dict:
    """Collective -> (count, dtype) of its calls that carry the most bytes in ``step``
    (ties: the larger call), in the order the step first calls each collective."""
    carried: dict = {}
    for call in step.calls:
        key = (call.count, call.dtype)
        by = carried.setdefault(call.collective, {})
        by[key] = by.get(key, 0) + call.nbytes
    return {c: max(by, key=lambda k: (by[k], k[0])) for c, by in carried.items()}


def turn_trace(step: Step, ranks: int) -> Trace | None:
    """The part trace of ``step``'s collectives in turn (module docstring); None where the
    step calls one collective only."""
    chosen = main_calls(step)
    if len(chosen) < 2:
        return None

    def calls(order: list[str], number: int) -> Step:
        events = []
        for k, collective in enumerate(order):
            count, dtype = chosen[collective]
            events.append(
                Event("call", id=k, collective=collective, count=count, dtype=dtype, group=WORLD)
            )
            events.append(Event("wait", id=k))
        return Step(events=events, number=number)

    names = list(chosen)
    steps = [calls([c] * TURN_CALLS, i + 1) for i, c in enumerate(names)]
    steps.append(calls(names * TURN_CALLS, len(names) + 1))
    return Trace(
        ranks=ranks,
        steps=steps,
        source={"kind": SOURCE_KIND, "collectives": names, "calls": TURN_CALLS},
    )


def _option_of(row: dict) -> str:
    """The option label a replay row ran (its variant, codec and design)."""
    variant = _row_variant(row)
    codec = row.get("codec") or "none"
    flat = variant if codec == "none" else f"{variant}:{codec}"
    return flat + cm.NODE_MARK if row_is_hierarchical(row) else flat


def undiluted(measured: float, calls: int = TURN_CALLS) -> float:
    """The factor f of a call in turn from ``measured``, the mean call in turn over the
    mean call of an alone step whose first call follows another collective's (the trace's
    steps run back to back): measured = calls x f / (calls - 1 + f)."""
    return (calls - 1) * measured / (calls - measured)


def _factor(rows: list[dict], collective: str, alone: int, together: int) -> tuple:
    """(factor in turn, mean call alone in seconds, per-round factors) of one collective
    from one option's timed step rows: the mean of its calls in turn over the mean of its
    calls alone, undiluted (nan where missing)."""
    column = f"{collective}_us"
    mine = [_number(r, column) for r in rows if int(_number(r, "trace_step")) == alone]
    turn = [_number(r, column) for r in rows if int(_number(r, "trace_step")) == together]
    mine = [v for v in mine if math.isfinite(v) and v > 0]
    turn = [v for v in turn if math.isfinite(v) and v > 0]
    if not mine or not turn:
        return math.nan, math.nan, ()
    rounds = tuple(undiluted(t / a) for t, a in zip(turn, mine, strict=False))
    factor = undiluted(float(np.mean(turn) / np.mean(mine)))
    # an alone step's calls: TURN_CALLS - 1 alone and its first in turn
    alone_s = float(np.mean(mine)) * 1e-6 / (TURN_CALLS - 1 + factor)
    return factor, alone_s, rounds


def _handoff_s(rows: list[dict]) -> float:
    """Seconds per call that the timed steps of the part trace spent outside their calls
    (step less the stream's busy time, over the calls): the round trip between the
    training thread and the stream's, since every call there is issued to an idle stream
    and waited (nan where no rows)."""
    outside = [_number(r, "step_us") - _number(r, "comm_busy_us") for r in rows]
    calls = [_number(r, "calls") for r in rows]
    pairs = [(o, c) for o, c in zip(outside, calls, strict=True) if math.isfinite(o + c) and c > 0]
    if not pairs:
        return math.nan
    return max(0.0, sum(o for o, _ in pairs) / sum(c for _, c in pairs)) * 1e-6


def _rows_of(tables: Tables, tid: str, ranks: int, link_gbps: float, ranks_per_node: int):
    """Option label -> [(path, row)]: the timed step rows of the part trace ``tid``
    replayed with no compute at ``ranks``, on the link rate asked (within 5%), a
    hierarchical option's with ``ranks_per_node``."""
    rows: dict = {}
    for path, r in tables.of("replay"):
        if (
            r.get("row") == "step"
            and r.get("trace_id") == tid
            and _number(r, "compute_scale") == 0
            and int(np.nan_to_num(_number(r, "ranks"))) == ranks
            and not row_is_leaders(r)
            and _number(r, "step") > _number(r, "warmup_steps")
            and abs(_number(r, "link_gbps") - link_gbps) <= 0.05 * link_gbps
            and (not row_is_hierarchical(r) or _row_ranks_per_node(r) == ranks_per_node)
        ):
            rows.setdefault(_option_of(r), []).append((path, r))
    return rows


def step_factors(
    tables: Tables,
    options: list,
    step: Step,
    ranks: int,
    link_gbps: float,
    network: cm.Network,
    share: float = 1.0,
) -> tuple[dict, list[Input], list[str]]:
    """(label -> {"path": {collective: factor}, "in_turn": {...}}, the inputs, the labels
    lacking a measured factor) from the replays of ``step``'s part trace (`turn_trace`)
    with no compute (`_rows_of`). Per collective: `path`, its call alone through
    training's path over the option's call at that size from the harness parts
    (``options``' efficiencies, on ``network``); `in_turn`, its call after the other
    collective over its call alone. A label without them takes the largest factors any
    option measured of that collective, assumed (never better than the worst measured);
    where none was measured, a call costs what the harness parts say, one input that
    says so. None for a step of one collective."""
    trace = turn_trace(step, ranks)
    if trace is None:
        return {}, [], []
    tid, names = trace_id(trace), trace.source["collectives"]
    chosen = main_calls(step)
    rows = _rows_of(tables, tid, ranks, link_gbps, network.ranks_per_node)
    factors: dict = {}
    inputs: list[Input] = []
    worst: dict = {}  # (kind, collective) -> (largest measured, its option)
    for option in options:
        label, found = option.label, rows.get(option.label, [])
        paths = sorted({p for p, _ in found})
        where = "; ".join(_where(p, [r for q, r in found if q == p]) for p in paths)
        handoff = _handoff_s([r for _, r in found])
        if math.isfinite(handoff):
            factors.setdefault(label, {"path": {}, "in_turn": {}})["handoff_s"] = handoff
            inputs.append(
                Input(
                    label,
                    HANDOFF,
                    handoff,
                    f"{where} (the part trace's steps less their calls, per call: each "
                    "call issued to an idle stream and waited)",
                )
            )
            if handoff > worst.get((HANDOFF, ""), (-1.0, ""))[0]:
                worst[HANDOFF, ""] = (handoff, label)
        for i, collective in enumerate(names):
            timed = [r for _, r in found]
            turn, alone_s, rounds = _factor(timed, collective, i + 1, len(names) + 1)
            count, dtype = chosen[collective]
            size = cm.osu_size(collective, count * itemsize(dtype), ranks)
            parts = cm.call_seconds(option, network, collective, size, ranks, share)["time"]
            path = alone_s / float(parts) if parts > 0 else math.nan
            if not (math.isfinite(turn) and math.isfinite(path)):
                continue
            mine = factors.setdefault(label, {"path": {}, "in_turn": {}})
            mine["path"][collective], mine["in_turn"][collective] = path, turn
            spread = f"{min(rounds):.3f}-{max(rounds):.3f}" if rounds else "?"
            others = ", ".join(n for n in names if n != collective)
            inputs += [
                Input(
                    label,
                    f"{PATH} {collective}",
                    path,
                    f"{where} (its {collective} of {size:.0f} B alone, {alone_s * 1e3:.3f} ms "
                    f"through the gradient communicator with no compute, over "
                    f"{float(parts) * 1e3:.3f} ms from the harness parts)",
                ),
                Input(
                    label,
                    f"{NAME} {collective}",
                    turn,
                    f"{where} (its {collective} after {others} over after itself, "
                    f"{TURN_CALLS} calls each, {len(rounds)} rounds: {spread}; no compute, "
                    "through the gradient communicator)",
                ),
            ]
            for kind, value in (("path", path), ("in_turn", turn)):
                if value > worst.get((kind, collective), (0.0, ""))[0]:
                    worst[kind, collective] = (value, label)
    if not worst:
        inputs.append(
            Input(
                "",
                f"{PATH}, {NAME}, {HANDOFF}",
                1.0,
                "assumed: a call in a step costs what the harness parts say, with no "
                "hand-off between threads (no replay of the step's collectives through "
                "training's path: `advise --measure`)",
                True,
            )
        )
        return {}, inputs, [o.label for o in options]
    lacking = []
    for option in options:
        for collective in names:
            if collective in factors.get(option.label, {}).get("path", {}):
                continue
            lacking.append(option.label)
            mine = factors.setdefault(option.label, {"path": {}, "in_turn": {}})
            if "handoff_s" not in mine:
                value, by = worst.get((HANDOFF, ""), (0.0, "none"))
                mine["handoff_s"] = value
                inputs.append(
                    Input(
                        option.label,
                        HANDOFF,
                        value,
                        f"assumed: not measured here; the worst measured, {by}'s",
                        True,
                    )
                )
            for kind, name in (("path", PATH), ("in_turn", NAME)):
                value, by = worst.get((kind, collective), (1.0, "none"))
                mine[kind][collective] = value
                inputs.append(
                    Input(
                        option.label,
                        f"{name} {collective}",
                        value,
                        f"assumed: not measured here; the worst measured of {collective}, {by}'s",
                        True,
                    )
                )
    return factors, inputs, sorted(set(lacking))

"""`ccbench advise` prices a step's calls as the step runs them (docs/advise.md, "Calls
in a step"): a call after one of another collective takes its option's factor in turn;
every call, its factor through training's path; a thread that wakes, half the stream's
round trip; all three read from replays, with no compute, of a part trace of the step's
main calls. Every expected value is worked by
hand from the rows and steps built here."""

from __future__ import annotations

import argparse

import pytest

from ccbench.benchmarks.options import non_negative_float
from ccbench.benchmarks.results import REPLAY, SCHEMA
from ccbench.collectives import compression_model as cm
from ccbench.collectives.trace import Event, Step
from ccbench.collectives.trace_files import trace_id
from ccbench.scripts.advise import measure, turns
from ccbench.scripts.advise.parts import Tables

MIB = 1 << 20
# an all-gather of a 4 MiB gathered buffer (1 MiB a rank) and a reduce-scatter of a 4 MiB
# input on 4 ranks: each ring sends 3 MiB, 25.165824 ms at 1 Gbit/s with no step cost
CALL_MS = 25.165824
NET = cm.Network(1e9, 0.0)


def call(k, collective, count=MIB, blocking=True):
    return Event("call", 0.0, id=k, collective=collective, count=count, blocking=blocking)


def step_of(*collectives):
    return Step(events=[call(k, c) for k, c in enumerate(collectives)], number=1)


def test_a_call_after_another_collective_takes_its_factor_in_turn():
    step = step_of("allgather", "allgather", "reduce_scatter", "allgather")
    plain = cm.predict_step(cm.Option(cm.RING), NET, step, 4)
    assert plain.step_s == pytest.approx(4 * CALL_MS * 1e-3, rel=1e-12)
    turned = cm.Option(cm.RING, in_turn={"allgather": 1.5, "reduce_scatter": 2.0})
    got = cm.predict_step(turned, NET, step, 4)
    # steps run back to back: call 0 follows call 3 (an all-gather), 1; call 1, 1; call 2
    # after an all-gather, 2; call 3 after a reduce-scatter, 1.5
    assert got.step_s == pytest.approx((1 + 1 + 2 + 1.5) * CALL_MS * 1e-3, rel=1e-12)
    assert got.busy_s == pytest.approx(got.step_s, rel=1e-12)  # blocking: nothing overlaps


def test_the_first_call_follows_the_last_call_of_the_step_before():
    step = step_of("reduce_scatter", "allgather")
    option = cm.Option(cm.RING, in_turn={"allgather": 1.5, "reduce_scatter": 2.0})
    # both calls follow the other collective: the reduce-scatter follows the all-gather
    # that ended the step before
    got = cm.predict_step(option, NET, step, 4)
    assert got.step_s == pytest.approx((2.0 + 1.5) * CALL_MS * 1e-3, rel=1e-12)


def test_every_call_takes_its_factor_through_trainings_path():
    step = step_of("allgather", "allgather", "reduce_scatter", "allgather")
    option = cm.Option(
        cm.RING, path={"allgather": 1.1}, in_turn={"allgather": 1.5, "reduce_scatter": 2.0}
    )
    got = cm.predict_step(option, NET, step, 4)
    expected = 1.1 * 1 + 1.1 * 1 + 1.0 * 2 + 1.1 * 1.5
    assert got.step_s == pytest.approx(expected * CALL_MS * 1e-3, rel=1e-12)
    # the path is part of the call's efficiency: a single call carries it too
    one = cm.call_seconds(option, NET, "allgather", MIB, 4)
    assert float(one["time"]) == pytest.approx(1.1 * CALL_MS * 1e-3, rel=1e-12)


def test_a_hand_off_between_threads_costs_half_a_round_trip_where_a_thread_wakes():
    # as tests/test_compression_model.py's timeline, with a round trip of 0.4 ms: call 0
    # issued at 1 ms finds the stream idle, starts at 1.2, ends 4.2; call 1 (3 ms) at 2 ms
    # queues behind it (no wake), ends 7.2; wait(0) at 2 ms sleeps, wakes at 4.4; 2 ms of
    # compute -> 6.4; the drain finds call 1 running, wakes at 7.4; tail 1 -> 8.4 ms
    step = Step(
        events=[
            Event("call", 1000, id=0, collective="allgather", count=4),
            Event("call", 1000, id=1, collective="allgather", count=4),
            Event("wait", 0, id=0),
            Event("drain", 2000),
        ],
        tail_us=1000,
    )
    assert cm.step_timeline(step, [3e-3, 3e-3], handoff_s=0.4e-3) == pytest.approx(8.4e-3)
    # a drain that finds the stream done wakes no one: call 1 of 1 ms ends 5.2, before 6.4
    assert cm.step_timeline(step, [3e-3, 1e-3], handoff_s=0.4e-3) == pytest.approx(7.4e-3)
    # every call blocking: each pays the whole round trip
    blocking = step_of("allgather", "allgather")
    option = cm.Option(cm.RING, handoff_s=0.4e-3)
    got = cm.predict_step(option, NET, blocking, 4)
    assert got.step_s == pytest.approx(2 * (CALL_MS + 0.4) * 1e-3, rel=1e-12)


def test_the_part_trace_runs_each_main_call_alone_then_the_collectives_in_turn():
    # all-gathers: 2 of 4 MiB (8 MiB carried) and 3 of 2 MiB (6 MiB): the 4 MiB one
    events = [call(0, "allgather", MIB), call(1, "allgather", MIB)]
    events += [call(k, "allgather", MIB // 2) for k in (2, 3, 4)]
    events += [call(5, "reduce_scatter", MIB // 2)]
    trace = turns.turn_trace(Step(events=events, number=1), 4)
    assert trace.source["collectives"] == ["allgather", "reduce_scatter"]
    n = turns.TURN_CALLS
    assert len(trace.steps) == 3
    alone_ag, alone_rs, together = (s.calls for s in trace.steps)
    assert [(c.collective, c.count) for c in alone_ag] == [("allgather", MIB)] * n
    assert [(c.collective, c.count) for c in alone_rs] == [("reduce_scatter", MIB // 2)] * n
    assert [c.collective for c in together] == ["allgather", "reduce_scatter"] * n
    # every call waited before the next is issued
    for s in trace.steps:
        ops = [(e.op, e.id) for e in s.events]
        assert ops == [x for k in range(len(s.calls)) for x in (("call", k), ("wait", k))]
    assert turns.turn_trace(step_of("allgather", "allgather"), 4) is None


def test_a_diluted_factor_is_recovered():
    # 8 calls alone, the first in turn at f = 1.1: measured 8 x 1.1 / (7 + 1.1)
    assert turns.undiluted(8 * 1.1 / 8.1, 8) == pytest.approx(1.1, rel=1e-12)
    assert turns.undiluted(1.0, 8) == pytest.approx(1.0, rel=1e-12)


HANDOFF_US = 500.0  # outside the calls, per call, in the replay rows built here


def replay_row(tid, label_algorithm, trace_step, step, ag_us, rs_us, **extra):
    calls = 2 * turns.TURN_CALLS if trace_step == 3 else turns.TURN_CALLS
    row = dict.fromkeys(REPLAY.names, "")
    row.update(
        {
            SCHEMA: REPLAY.tag,
            "run_id": "turnrun",
            "row": "step",
            "trace_id": tid,
            "variant": "baseline",
            "algorithm": label_algorithm,
            "codec": "none",
            "compute_scale": "0",  # as the CSV holds it
            "ranks": 4,
            "nodes": 4,
            "link_gbps": 1.0,
            "warmup_steps": 3,
            "step": step,
            "trace_step": trace_step,
            "allgather_us": ag_us,
            "reduce_scatter_us": rs_us,
            "comm_busy_us": ag_us + rs_us,
            "step_us": ag_us + rs_us + calls * HANDOFF_US,
            "calls": calls,
        }
    )
    row.update(extra)
    return row


def test_factors_come_from_the_replays_of_the_part_trace():
    step = step_of("allgather", "reduce_scatter")
    tid = trace_id(turns.turn_trace(step, 4))
    n = turns.TURN_CALLS
    # the ring: an all-gather alone 30 ms, in turn 1.2 x; a reduce-scatter 20 ms both ways.
    # An alone step's first call follows the other collective: (n - 1) x a + 1.2 x a.
    ag_alone, ag_turn = ((n - 1) * 30 + 1.2 * 30) * 1e3, n * 36 * 1e3
    rs = n * 20 * 1e3
    rows = [
        replay_row(tid, "ring", 1, 4, ag_alone, 0.0),
        replay_row(tid, "ring", 2, 5, 0.0, rs),
        replay_row(tid, "ring", 3, 6, ag_turn, rs),
        # ignored: a warm-up step, a replay with compute, another trace, another link
        replay_row(tid, "ring", 3, 3, 9 * ag_turn, rs),
        replay_row(tid, "ring", 3, 7, 9 * ag_turn, rs, compute_scale=1.0),
        replay_row("other", "ring", 3, 8, 9 * ag_turn, rs),
        replay_row(tid, "ring", 3, 9, 9 * ag_turn, rs, link_gbps=10.0),
    ]
    tables = Tables({"replay": [(turns_path(), r) for r in rows]})
    options = [cm.Option(cm.RING), cm.Option(cm.LIBRARY)]
    factors, inputs, lacking = turns.step_factors(tables, options, step, 4, 1.0, NET)
    ring = factors["ring"]
    assert ring["in_turn"] == pytest.approx({"allgather": 1.2, "reduce_scatter": 1.0})
    # the harness parts: none, so the call at its floor (efficiency 1)
    assert ring["path"] == pytest.approx(
        {"allgather": 30 / CALL_MS, "reduce_scatter": 20 / CALL_MS}, rel=1e-9
    )
    assert ring["handoff_s"] == pytest.approx(HANDOFF_US * 1e-6, rel=1e-12)
    # the library measured nothing: the worst measured, assumed, and it is set apart
    assert factors["library"] == factors["ring"]
    assert lacking == ["library"]
    library = [i for i in inputs if i.option == "library"]
    assert library and all(i.assumed for i in library)
    assert not any(i.assumed for i in inputs if i.option == "ring")


def test_with_no_replay_every_call_costs_what_the_parts_say_and_says_so():
    step = step_of("allgather", "reduce_scatter")
    factors, inputs, lacking = turns.step_factors(
        Tables({}), [cm.Option(cm.RING)], step, 4, 1.0, NET
    )
    assert factors == {}
    assert lacking == ["ring"]
    assert [(i.option, i.assumed) for i in inputs] == [("", True)]
    # a step of one collective has nothing to turn
    one = step_of("allgather")
    assert turns.step_factors(Tables({}), [cm.Option(cm.RING)], one, 4, 1.0, NET) == ({}, [], [])


def turns_path():
    from pathlib import Path

    return Path("turns.csv")


def test_measure_replays_the_part_trace_with_no_compute(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(measure, "_run", lambda command, what: launched.append(command))
    step = step_of("allgather", "reduce_scatter")
    measure.measure_turns("tl", 4, ["library@node", "coll_compressed:fp16"], step, tmp_path)
    assert len(launched) == 2
    for command, label in zip(launched, ["library@node", "coll_compressed:fp16"], strict=True):
        replay = command[command.index("ccbench.benchmarks.trace_replay") + 1 :]
        assert replay[0] == str(tmp_path / "turns-trace.json")
        assert replay[replay.index("--compute-scale") + 1] == "0"
        # three trace steps: one untimed pass, five timed
        assert replay[replay.index("--warmup") + 1] == "3"
        assert replay[replay.index("--steps") + 1] == "15"
        assert ("--hierarchy" in replay) == label.endswith("@node")
    assert (tmp_path / "turns-trace.json").exists()
    launched.clear()
    measure.measure_turns("tl", 4, ["library"], step_of("allgather"), tmp_path / "one")
    assert launched == []


def test_a_compute_scale_of_zero_is_accepted_and_a_negative_one_refused():
    assert non_negative_float("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError):
        non_negative_float("-1")

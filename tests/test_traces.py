"""Traces without MPI: the format and its checks, PARAM's comms trace read and written,
traces built from model configurations on the meta device, the merge of allreduces, the
replay rows in the results model, compare and the plots. Replays on real ranks:
tests/test_trace_replay.py."""

from __future__ import annotations

import json

import pytest

from ccbench.benchmarks.results import REPLAY, point_identity, schema_of
from ccbench.collectives.trace import Event, Step, Trace, check
from ccbench.collectives.trace_files import from_json, read, to_json, write
from ccbench.collectives.trace_param import from_param, to_param
from ccbench.kernels.errors import UsageError
from tests.helpers.cli import ccbench


def fsdp_like() -> Trace:
    """Two all-gathers (the second prefetched), a reduce-scatter, a drain."""
    events = [
        Event("call", 10.0, 8.0, 0, "allgather", 4096, label="root"),
        Event("wait", 1.0, 1.0, 0, waited_us=3.0),
        Event("call", 2.0, 2.0, 1, "allgather", 8192, label="blocks.0"),
        Event("wait", 30.0, 25.0, 1),
        Event("call", 50.0, 45.0, 2, "reduce_scatter", 8192, label="blocks.0"),
        Event("call", 5.0, 4.0, 3, "allreduce", 100, blocking=True, run_us=7.0),
        Event("drain", 1.5, 1.0),
    ]
    return Trace(
        ranks=2,
        steps=[Step(events, tail_us=20.0, tail_cpu_us=18.0, number=4, measured={"step_us": 130.0})],
        source={"kind": "captured", "model": "m", "framework": "fsdp"},
    )


def signature(trace: Trace) -> list:
    return [
        [
            (
                e.op,
                e.id,
                e.collective,
                e.count,
                e.dtype,
                e.blocking,
                e.label,
                round(e.gap_us, 3),
                e.gap_cpu_us,
            )
            for e in s.events
        ]
        for s in trace.steps
    ]


# ------------------------------------------------------------------------ the format


def test_the_format_round_trips_through_json(tmp_path):
    trace = fsdp_like()
    path = tmp_path / "t.json"
    write(trace, path)
    again = read(path)
    assert signature(again) == signature(trace)
    assert again.steps[0].tail_us == 20.0 and again.steps[0].measured == {"step_us": 130.0}
    document = json.loads(path.read_text())
    assert document["format"] == "ccbench-trace" and document["version"] == 1
    call = document["steps"][0]["events"][1 - 1]
    assert call["bytes"] == 4096 * 4 and call["async"] is True
    assert again.has_cpu_times and again.steps[0].nbytes == (4096 + 8192 * 2 + 100) * 4


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda e: e.insert(0, Event("wait", 0.0, id=7)), "no earlier async call"),
        (lambda e: e.pop(), "never waited for"),
        (lambda e: setattr(e[0], "collective", "alltoall"), "collective 'alltoall'"),
        (lambda e: setattr(e[0], "dtype", "int32"), "dtype 'int32'"),
        (lambda e: setattr(e[0], "gap_us", -1.0), "gap_us must be"),
        (lambda e: setattr(e[2], "id", 0), "two calls with one id"),
    ],
)
def test_check_refuses_what_a_replay_could_not_run(edit, message):
    trace = fsdp_like()
    edit(trace.steps[0].events)
    with pytest.raises(UsageError, match=message):
        check(trace)


def test_a_document_of_another_format_or_version_is_refused():
    with pytest.raises(UsageError, match="not a ccbench-trace document"):
        from_json({"steps": []}, "x.json")
    document = to_json(fsdp_like())
    document["version"] = 99
    with pytest.raises(UsageError, match="reads up to version 1"):
        from_json(document, "x.json")
    document = to_json(fsdp_like())
    document["steps"][0]["events"][0]["bytes"] = 3
    with pytest.raises(UsageError, match="bytes 3 is not count x 4"):
        from_json(document, "x.json")


# ------------------------------------------------------------------------ PARAM


def test_param_round_trip_keeps_every_event():
    trace = fsdp_like()
    records = to_param(trace)
    assert records[0]["comms"] == "init" and records[0]["world_size"] == 2
    comms = [r["comms"] for r in records[1:]]
    assert comms == [
        "all_gather",
        "wait",
        "all_gather",
        "wait",
        "reduce_scatter",
        "all_reduce",
        "wait",
    ]
    gather = records[1]
    assert (gather["in_msg_size"], gather["out_msg_size"], gather["dtype"]) == (2048, 4096, "float")
    scatter = records[5]
    assert (scatter["in_msg_size"], scatter["out_msg_size"]) == (8192, 4096)
    again = from_param(json.loads(json.dumps(records)), "t.json")
    assert signature(again) == signature(trace)
    assert again.steps[0].tail_us == 20.0


def test_a_plain_param_trace_replays_by_its_start_times():
    """PARAM's basic comms trace: gaps from startTime_ns, async from the waits."""
    records = [
        {"comms": "init", "pg_id": 0, "req": -1, "global_ranks": [0, 1, 2, 3], "world_size": 4},
        {
            "comms": "all_gather",
            "req": 1,
            "in_msg_size": 256,
            "out_msg_size": 1024,
            "dtype": "Float",
            "pg_id": 0,
            "startTime_ns": 1_000_000,
            "markers": ["fwd"],
        },
        {"comms": "barrier", "req": 2, "startTime_ns": 1_500_000},
        {"comms": "wait", "req": 1, "startTime_ns": 2_000_000},
        {"compute": "gemm", "count": 1, "mm_dim": 64, "dtype": "float"},
        {
            "comms": "allReduce",
            "req": 3,
            "in_msg_size": 64,
            "out_msg_size": 64,
            "dtype": "half",
            "startTime_ns": 5_000_000,
        },
        {
            "comms": "reduce_scatter_base",
            "req": 4,
            "in_msg_size": 1024,
            "out_msg_size": 256,
            "dtype": "bfloat16",
            "startTime_ns": 5_500_000,
        },
    ]
    trace = from_param(records, "param.json")
    assert trace.ranks == 4 and trace.source["kind"] == "param"
    ops = [(e.op, e.collective, e.count, e.dtype, e.blocking) for e in trace.steps[0].events]
    assert ops == [
        ("call", "allgather", 1024, "float32", False),
        ("wait", "", 0, "float32", False),
        ("call", "allreduce", 64, "float16", True),
        ("call", "reduce_scatter", 1024, "bfloat16", True),
    ]
    gaps = [e.gap_us for e in trace.steps[0].events]
    assert gaps == [0.0, 1000.0, 3000.0, 500.0]  # the barrier's time stays in the next gap
    assert trace.steps[0].events[0].label == "fwd"


@pytest.mark.parametrize(
    "record,message",
    [
        (
            {"comms": "all_to_allv", "in_msg_size": 1, "out_msg_size": 1, "dtype": "float"},
            "'all_to_allv' is not replayed",
        ),
        (
            {"comms": "all_reduce", "in_msg_size": 1, "out_msg_size": 1, "dtype": "complex"},
            "dtype 'complex'",
        ),
        (
            {"comms": "all_reduce", "in_msg_size": 1.5, "out_msg_size": 1, "dtype": "float"},
            "element counts",
        ),
        ({"nothing": 1}, 'needs "comms"'),
    ],
)
def test_param_records_ccbench_cannot_replay_are_named(record, message):
    with pytest.raises(UsageError, match=message):
        from_param([record], "p.json")


# ------------------------------------------------------------------------ built traces


@pytest.mark.parametrize(
    "name,params",
    [
        ("gpt2-small", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("llama-1b", 1_235_814_400),
        ("llama-7b", 6_738_415_616),
    ],
)
def test_published_configurations_have_their_parameter_counts_on_the_meta_device(name, params):
    import torch

    from ccbench.training.trace_build import models

    with torch.device("meta"):
        model = models()[name].build()
    assert all(p.is_meta for p in model.parameters())  # no weight was allocated
    assert sum(p.numel() for p in model.parameters()) == params


def test_gpt2_small_fsdp_trace_has_fsdp2s_schedule():
    from ccbench.training.trace_build import build_trace, fsdp_count

    trace = build_trace("gpt2-small", "fsdp", ranks=8)
    step = trace.steps[0]
    calls = step.calls
    kinds = [e.collective for e in calls]
    assert kinds.count("allgather") == 1 + 12 + 12 and kinds.count("reduce_scatter") == 13
    # every parameter once per reduce-scatter, padded to the ranks
    assert sum(e.count for e in calls if e.collective == "reduce_scatter") >= 124_439_808
    assert calls[0].label == "root" and calls[-1].label == "root"
    assert step.events[-1].op == "drain"
    # the FLOP rate: an A100 at 40% of its peak
    assert trace.source["flop_rate"] == pytest.approx(0.4 * 312e12)
    compute = step.compute_us
    assert compute == pytest.approx(
        trace.source["flops_per_step"] / 124.8e12 * 1e6 + 124_439_808 / 8 * 28 / 1.555e12 * 1e6,
        rel=1e-6,
    )
    from torch import nn

    assert fsdp_count([nn.Parameter(__import__("torch").empty(5, 3, device="meta"))], 4) == 24


def test_llama_7b_ddp_trace_marks_its_embedding_sparse():
    from ccbench.training.trace_build import build_trace

    trace = build_trace("llama-7b", "ddp", ranks=64, batch=1, sequence=512)
    sparse = [e for e in trace.steps[0].calls if e.sparse]
    assert len(sparse) == 1 and 0 < sparse[0].density < 1
    # 512 uniformly drawn tokens touch at most 1 - (1 - 1/32000)^512 of the rows
    assert sparse[0].density <= 1 - (1 - 1 / 32000) ** 512 + 1e-3
    buckets = [e.nbytes for e in trace.steps[0].calls]
    assert buckets[0] >= 1 << 20 and all(b > 0 for b in buckets)


def test_flop_rate_and_profile_options_are_checked():
    from ccbench.training.trace_build import build_trace, flop_rate

    assert flop_rate("125T", 0.4)[0] == 125e12
    assert flop_rate("h100", 0.5)[0] == pytest.approx(989e12 * 0.5)
    with pytest.raises(UsageError, match="--flop-rate"):
        flop_rate("fast", 0.4)
    with pytest.raises(UsageError, match="unknown model"):
        build_trace("gpt5", "fsdp")
    with pytest.raises(UsageError, match="its gradients are not this model's"):
        build_trace("lm-tiny", "ddp", ranks=2, profile="results/profiles/bert.csv")


# ------------------------------------------------------------------------ merging


def test_merging_regroups_consecutive_allreduces_and_keeps_the_waits():
    from ccbench.training.replay import merge_allreduces

    events = [Event("call", 5.0, None, i, "allreduce", 10 * (i + 1)) for i in range(4)]
    events.append(Event("wait", 2.0, None, 1))
    events.append(Event("wait", 1.0, None, 2))
    events.append(Event("drain", 0.5))
    step = Step(events, tail_us=3.0)
    merged = merge_allreduces(step, lambda nbytes, gaps: [(0, 2), (2, 4)])
    calls = merged.calls
    assert [(e.id, e.count, e.gap_us) for e in calls] == [(0, 30, 10.0), (1, 70, 10.0)]
    ops = [(e.op, e.id) for e in merged.events]
    assert ops == [("call", 0), ("call", 1), ("wait", 0), ("wait", 1), ("drain", None)]
    check(Trace(ranks=2, steps=[merged]))
    assert merged.compute_us == pytest.approx(step.compute_us)
    single = merge_allreduces(step, lambda nbytes, gaps: [(0, 4)])
    assert [e.op for e in single.events] == ["call", "wait", "drain"]
    assert single.events[2].gap_us == pytest.approx(0.5 + 1.0)  # the second wait's compute


# ------------------------------------------------------------------------ rows


def test_replay_rows_are_their_own_kind_and_compare_reads_their_summary():
    from ccbench.scripts.comparisons.rounds import unsized_points
    from tests.plot_training_rows import replay_rows

    rows = replay_rows()
    header = list(REPLAY.names)
    schema, version = schema_of(header, rows[0])
    assert schema is REPLAY and version == 2
    identities = {point_identity(r, REPLAY, header) for r in rows}
    assert len(identities) == len(rows)  # every step and summary is its own point
    points = unsized_points("trace_replay", rows[: len(rows) // 3])
    assert [(p, n) for p, _, n in points] == [((0, "step"), 4)]


def test_the_local_sweep_replays_the_gpt2_trace():
    from ccbench.scripts.sweeps.tasks import load_spec

    spec = load_spec("sweeps/local.toml")
    replays = [t for t in spec.tasks if t.variant == "trace_replay"]
    assert len(replays) == 2 and all(not t.sizes for t in replays)
    assert all("model:gpt2-small:fsdp" in t.args for t in replays)
    assert {"coll_compressed", "baseline"} <= {a for t in replays for a in t.args}


# ------------------------------------------------------------------------ command line


def test_show_and_convert_read_both_formats(tmp_path):
    path = tmp_path / "t.json"
    write(fsdp_like(), path)
    shown = ccbench("trace", "show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "2 allgather, 1 allreduce, 1 reduce_scatter" in shown.stdout
    converted = ccbench("trace", "convert", str(path), str(tmp_path / "p.json"))
    assert converted.returncode == 0 and "param's format" in converted.stdout
    assert isinstance(json.loads((tmp_path / "p.json").read_text()), list)
    back = ccbench("trace", "convert", str(tmp_path / "p.json"), str(tmp_path / "c.json"))
    assert back.returncode == 0
    assert signature(read(tmp_path / "c.json")) == signature(fsdp_like())


@pytest.mark.parametrize(
    "args,message",
    [
        (["trace", "show", "no-such.json"], "no-such.json: no such trace"),
        (["trace", "build", "--model", "gpt5", "-o", "x.json"], "unknown model 'gpt5'"),
        (["trace", "frobnicate"], "unknown action 'frobnicate'"),
        (["trace", "capture", "--model", "lm-tiny"], "give the trace's path"),
        (
            ["trace", "replay", "model:lm-tiny", "--variant", "torch", "--hierarchy", "node"],
            "the variant torch has none to run across nodes",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message, tmp_path):
    proc = ccbench(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_non_json_trace_is_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    proc = ccbench("trace", "show", str(tmp_path / "bad.json"))
    assert proc.returncode == 2 and "not JSON" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

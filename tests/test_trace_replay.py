"""Traces on 2 real ranks: captured from FSDP2, DDP and MG-WFBP steps, built traces with
the same collectives, sizes and order, and replays through every variant that run,
validate and write consistent rows. Never a time. Cases: tests/drivers/trace_cases.py."""

from __future__ import annotations

import json

import pytest

from tests.drivers.trace_cases import REPLAYS, STEPS, WARMUP
from tests.mpirun import mpirun

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("traces")
    proc = mpirun(
        2, ["-m", "tests.drivers.trace_cases"], timeout=600, env={"CCBENCH_TRACE_DIR": str(folder)}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            case = json.loads(line)
            cases[case["case"]] = case
    return folder, cases, proc.stderr


def number(row, column) -> float:
    return float(row[column]) if row.get(column) not in ("", None) else 0.0


def signature(trace) -> list:
    return [
        (e.op, e.id, e.collective, e.count, e.dtype, e.blocking, e.label)
        for e in trace.steps[0].events
    ]


@pytest.mark.timeout(660)
@pytest.mark.parametrize("framework", ["fsdp", "ddp", "mgwfbp"])
def test_capture_records_every_step_after_warmup(run, framework):
    from ccbench.collectives.trace_files import read

    folder, cases, _ = run
    assert cases[f"capture-{framework}"]["status"] == 0
    trace = read(folder / f"{framework}.json")
    assert trace.source["kind"] == "captured" and trace.ranks == 2
    assert [s.number for s in trace.steps] == [3, 4]  # the steps after --warmup 2
    kinds = {e.collective for s in trace.steps for e in s.calls}
    assert kinds == ({"allgather", "reduce_scatter"} if framework == "fsdp" else {"allreduce"})
    for step in trace.steps:
        assert step.measured["step_us"] > 0 and trace.has_cpu_times
        assert all(e.run_us is not None and e.run_us >= 0 for e in step.calls)
        # a captured step is its events' compute, their waits and the rest of the step
        assert step.compute_us <= step.measured["step_us"] * 1.001


@pytest.mark.timeout(660)
@pytest.mark.parametrize("framework,options", [("fsdp", {}), ("ddp", {"bucket_mb": 0.1})])
def test_a_built_trace_has_the_captured_collectives_sizes_and_order(run, framework, options):
    from ccbench.collectives.trace_files import read
    from ccbench.training.trace_build import build_trace

    folder, _, _ = run
    captured = read(folder / f"{framework}.json")
    built = build_trace("lm-tiny", framework, ranks=2, **options)
    assert signature(built) == signature(captured)


@pytest.mark.timeout(660)
@pytest.mark.parametrize("case", [c for c in REPLAYS if c != "subgroup"])
def test_replays_run_validate_and_their_rows_agree(run, case):
    from ccbench.benchmarks.results import REPLAY

    _, cases, _ = run
    got = cases[case]
    assert got["status"] == 0
    rows = got["rows"]
    assert list(rows[0]) == list(REPLAY.names)
    steps = [r for r in rows if r["row"] == "step"]
    summary = rows[-1]
    assert len(steps) == STEPS + WARMUP and summary["row"] == "summary"
    assert summary["validation"] == "Pass"
    for r in steps:
        assert number(r, "step_us") == pytest.approx(number(r, "compute_us") + number(r, "comm_us"))
        assert number(r, "comm_us") >= 0 and number(r, "emulated_us") > 0
        assert number(r, "max_step_us") >= number(r, "step_us") * 0.999
    timed = steps[WARMUP:]
    assert number(summary, "step_us") == pytest.approx(
        sum(number(r, "step_us") for r in timed) / len(timed)
    )
    assert (
        number(summary, "step_ci_low_us")
        <= number(summary, "step_us")
        <= number(summary, "step_ci_high_us")
    )
    compressed = summary["codec"] != "none"
    assert (number(summary, "codec_us") > 0) == compressed
    expected = {
        "fsdp-coll-bfp-cpu": "busy-cpu",
        "fsdp-torch-sleep": "sleep",
        "built-ring": "sleep",
        "sparse-omnireduce": "sleep",
        "param-ring": "sleep",
    }
    assert summary["compute_wait"] == expected.get(case, "busy")


@pytest.mark.timeout(660)
def test_compression_shows_in_the_bytes_on_the_wire(run):
    _, cases, _ = run

    def wire(case):
        return number(cases[case]["rows"][-1], "wire_bytes_per_rank")

    assert wire("fsdp-baseline-mpi") == 0  # the library moves its own bytes: not counted
    ring = wire("fsdp-baseline-ring")
    assert ring > 0
    assert wire("fsdp-coll-fp16") == pytest.approx(ring / 2, rel=0.02)
    assert wire("fsdp-p2p-fp16") == pytest.approx(ring / 2, rel=0.02)
    assert wire("fsdp-coll-bfp-cpu") < ring / 3


@pytest.mark.timeout(660)
def test_hierarchical_replays_name_their_design(run):
    _, cases, _ = run
    node, leader = cases["fsdp-coll-fp16-node"]["rows"][-1], cases["fsdp-ring-leader"]["rows"][-1]
    assert node["algorithm"] == "hierarchical-ring" and leader["algorithm"] == "leaders-ring"
    # one rank per node: the collective across nodes is the flat one, byte for byte
    flat = cases["fsdp-coll-fp16"]["rows"][-1]
    assert number(node, "wire_bytes_per_rank") == number(flat, "wire_bytes_per_rank")


@pytest.mark.timeout(660)
def test_merging_regroups_the_gradient_allreduces(run):
    _, cases, _ = run
    traced = number(cases["ddp-sparse"]["rows"][-1], "calls")
    assert traced > 2  # the 0.1 MB buckets of lm-tiny
    assert number(cases["ddp-coll-single"]["rows"][-1], "calls") == 1
    merged = number(cases["ddp-ring-mgwfbp"]["rows"][-1], "calls")
    assert 1 <= merged <= traced
    assert cases["ddp-coll-single"]["rows"][-1]["merge"] == "single"
    # the PARAM conversion of the DDP trace replays the same calls
    assert number(cases["param-ring"]["rows"][-1], "calls") == traced


@pytest.mark.timeout(660)
def test_sparse_calls_go_through_omnireduce(run):
    _, cases, _ = run
    sparse = cases["sparse-omnireduce"]["rows"][-1]
    assert sparse["algorithm"] == "omnireduce" and sparse["validation"] == "Pass"
    # 10% of the sparse call's blocks travel: far less than the dense ring's 2 (P-1)/P
    assert 0 < number(sparse, "wire_bytes_per_rank") < (4096 + 65536) * 4 * 0.5


@pytest.mark.timeout(660)
def test_a_process_group_of_some_ranks_is_refused_in_one_line(run):
    _, cases, stderr = run
    assert cases["subgroup"]["status"] == 2 and cases["subgroup"]["rows"] == []
    assert (
        "runs on process group 1 (ranks [0]); the replay runs collectives over every "
        "rank only" in stderr
    )
    assert "Traceback" not in stderr


def test_check_options_follow_the_training():
    from ccbench.scripts.tracing.check import replay_options, without_variant

    training = [
        "--model",
        "lm-tiny",
        "--framework",
        "fsdp",
        "--variant",
        "baseline",
        "--algorithm",
        "ring",
        "--steps",
        "12",
        "--warmup",
        "3",
    ]
    assert replay_options(training) == [
        "--variant",
        "baseline",
        "--algorithm",
        "ring",
        "--steps",
        "9",
        "--warmup",
        "1",
    ]
    assert without_variant(training) == [
        "--model",
        "lm-tiny",
        "--framework",
        "fsdp",
        "--steps",
        "12",
        "--warmup",
        "3",
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--", "--model", "lm-tiny"], "with --framework fsdp, ddp or mgwfbp"),
        (["--rounds", "1", "--", "--framework", "ddp"], "--rounds at least 2"),
        (["--", "--framework", "ddp", "--trace", "x.json"], "--trace after --"),
        (["--variant=--codec fp16", "--", "--framework", "ddp"], "a variant and its options"),
    ],
)
def test_check_bad_input_is_one_line(args, message):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", "trace", "check", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.one_mpi  # its verdicts over many rounds; the other tests launch under Open MPI
@pytest.mark.timeout(600)
def test_check_runs_its_rounds_and_writes_compare_rows(tmp_path):
    import subprocess
    import sys

    from ccbench.benchmarks.results import COMPARE, read_rows

    csv = tmp_path / "check.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ccbench.scripts.cli",
            "trace",
            "check",
            "-n",
            "2",
            "--rounds",
            "2",
            "--variant",
            "coll_compressed --codec fp16",
            "--csv",
            str(csv),
            "--",
            "--model",
            "lm-tiny",
            "--framework",
            "ddp",
            "--algorithm",
            "ring",
            "--steps",
            "3",
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, rows = read_rows(csv)
    assert header == list(COMPARE.names) and len(rows) == 4
    assert [r["config"] for r in rows] == [
        "the replay of its trace",
        "the replay against the run it captured",
        "real saving of coll_compressed --codec fp16",
        "replayed saving of coll_compressed --codec fp16",
    ]
    for r in rows:
        assert r["rounds"] == "2" and float(r["ratio"]) > 0
        assert float(r["ratio_low"]) <= float(r["ratio"]) <= float(r["ratio_high"])
    assert "within 10% of the real step" in proc.stdout

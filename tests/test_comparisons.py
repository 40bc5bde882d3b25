"""`ccbench compare`'s arithmetic and order, without launching ranks: a round is the
geometric mean of its turns and the interval spans rounds (by hand, with scipy's t); the
alternation that makes a comparison fair, seen by recording fakes (which side runs first
in each turn of a launch, A B then B A, and in each round of separate launches, every
comparison taking round k before round k + 1); what each benchmark's rows give as a time;
and bad input. The launches themselves: tests/test_comparisons_runs.py.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.helpers.cli import ccbench

# runs `ccbench compare` (on bad input; the rule is per module): the Open MPI leg runs it too
pytestmark = pytest.mark.mpi


def record(a_turns, b_turns, size=4096) -> dict:
    """A paired launch's record with these turn times (us) of one point."""
    return {
        "collective": "allgather",
        "ranks": 2,
        "link_gbps": None,
        "points": {
            f"{size}|": {
                "size_bytes": size,
                "config": {},
                "iterations": {"A": 10, "B": 10},
                "times": {"A": {"avg_us": list(a_turns)}, "B": {"avg_us": list(b_turns)}},
            }
        },
    }


def test_a_round_is_the_geometric_mean_of_its_turns_and_the_interval_spans_rounds():
    from ccbench.scripts.comparisons.rounds import IN_LAUNCH, Comparison, Side

    comparison = Comparison(
        Side("A", ["baseline"]), Side("B", ["baseline"]), "avg", 0.03, IN_LAUNCH
    )
    # round 1: A 100, 400 (geometric mean 200), B 50, 200 (100): B/A 0.5
    # round 2: A 300, 300, B 240, 240: B/A 0.8
    comparison.add_paired(record([100, 400], [50, 200]))
    comparison.add_paired(record([300, 300], [240, 240]))
    (point,) = comparison.points()
    assert comparison.times[point] == {
        "A": pytest.approx([200, 300]),
        "B": pytest.approx([100, 240]),
    }
    r = comparison.ratio(point)
    logs = np.log([0.5, 0.8])
    half = stats.t.ppf(0.975, 1) * logs.std(ddof=1) / math.sqrt(2)
    assert r.ratio == pytest.approx(math.sqrt(0.5 * 0.8))
    assert (r.low, r.high) == pytest.approx(
        (math.exp(logs.mean() - half), math.exp(logs.mean() + half))
    )
    assert r.rounds == 2  # the interval's degrees of freedom come from launches, not turns


def test_a_compare_row_says_which_barrier_each_side_timed_behind():
    from ccbench.scripts.comparisons.rounds import IN_LAUNCH, Comparison, Side, result_rows

    def sides():
        return Side("A", ["baseline"]), Side("B", ["baseline"])

    same = Comparison(*sides(), "avg", 0.03, IN_LAUNCH)
    for _ in range(2):
        behind = record([100], [50])
        behind["points"]["4096|"]["barriers"] = {"A": "yielding", "B": "yielding"}
        same.add_paired(behind)
    (point,) = same.points()
    assert same.barrier(point) == "yielding"
    # separate launches of two revisions, one from before the yielding barrier
    apart = Comparison(*sides(), "avg", 0.03)
    for a, b in (("blocking", "yielding"), ("blocking", "yielding")):
        apart.add(
            apart.a, [{"size_bytes": "4096", "avg_us": "100", "iterations": "5", "barrier": a}]
        )
        apart.add(
            apart.b, [{"size_bytes": "4096", "avg_us": "90", "iterations": "5", "barrier": b}]
        )
    (point,) = apart.points()
    assert apart.barrier(point) == "A: blocking, B: yielding"
    unsaid = Comparison(*sides(), "avg", 0.03, IN_LAUNCH)
    unsaid.add_paired(record([100], [50]))  # a record from before barriers were kept
    assert unsaid.barrier(unsaid.points()[0]) == ""
    rows = result_rows(apart, 2, {})
    assert [r["barrier"] for r in rows] == ["A: blocking, B: yielding"]


def test_widest_interval_is_the_largest_half_width_in_log_terms():
    from ccbench.scripts.comparisons.rounds import IN_LAUNCH, Comparison, Side

    comparison = Comparison(
        Side("A", ["baseline"]), Side("B", ["baseline"]), "avg", 0.03, IN_LAUNCH
    )
    assert comparison.widest() == math.inf  # nothing measured yet
    comparison.add_paired(record([100], [50]))
    assert comparison.widest() == math.inf  # one round: no interval
    comparison.add_paired(record([100], [80]))
    logs = np.log([0.5, 0.8])
    half = stats.t.ppf(0.975, 1) * logs.std(ddof=1) / math.sqrt(2)
    # sqrt(high / low) - 1 = exp(half) - 1
    assert comparison.widest() == pytest.approx(math.exp(half) - 1)


# ------------------------------------------------------------ the order of sides


# 4 turns or rounds, worked by hand: A B | B A | A B | B A
ALTERNATING = ["A", "B", "B", "A", "A", "B", "B", "A"]


class RecordingLauncher:
    """Stands in for compare.Launcher: logs (job, side) per launch, returns one row."""

    log: list = []

    def __init__(self, ranks=2, cluster=None, bind=True, timeout=0.0):
        self.bind = bind

    def run(self, side, common, csv, env=None):
        RecordingLauncher.log.append((common[0], side.label))
        return [
            {
                "size_bytes": "4096",
                "avg_us": "12" if side.label == "B" else "10",
                "iterations": "5",
                "collective": "allgather",
                "ranks": "2",
            }
        ]

    def run_paired(self, a, b, common, turns, out, env=None, first="A"):
        raise AssertionError("separate launches were asked for")


class PairedRecordingLauncher(RecordingLauncher):
    """Logs which side each in-launch round starts with."""

    def run_paired(self, a, b, common, turns, out, env=None, first="A"):
        RecordingLauncher.log.append(first)
        return {
            "collective": "allgather",
            "ranks": 2,
            "points": {
                "4096|": {
                    "size_bytes": 4096,
                    "config": {},
                    "iterations": {"A": 5, "B": 5},
                    "times": {"A": {"avg_us": [10.0] * turns}, "B": {"avg_us": [12.0] * turns}},
                }
            },
        }


def test_rounds_alternate_the_first_side_and_interleave_comparisons(tmp_path):
    from ccbench.scripts.comparisons.rounds import Comparison, Side, run_rounds

    RecordingLauncher.log = []
    jobs = [
        (Comparison(Side("A", ["baseline"]), Side("B", ["baseline"]), "avg", 0.03), [job])
        for job in ("job0", "job1")
    ]
    run_rounds(jobs, RecordingLauncher(), 4, tmp_path)
    expected = []
    for k in range(4):  # round k of every job before round k + 1 of any
        order = ["A", "B"] if k % 2 == 0 else ["B", "A"]
        expected += [(job, side) for job in ("job0", "job1") for side in order]
    assert RecordingLauncher.log == expected
    assert [side for job, side in RecordingLauncher.log if job == "job0"] == ALTERNATING
    for comparison, _ in jobs:
        assert comparison.times[(4096, "")] == {"A": [10.0] * 4, "B": [12.0] * 4}


def test_compare_with_separate_launches_alternates_across_rounds(tmp_path, monkeypatch, capsys):
    from ccbench.scripts.comparisons import compare

    RecordingLauncher.log = []
    monkeypatch.setattr(compare, "Launcher", RecordingLauncher)
    out = tmp_path / "cmp.csv"
    monkeypatch.setenv("CCBENCH_STATE", str(tmp_path / "state"))
    assert (
        compare.main(
            [
                "baseline",
                "baseline --algorithm ring",
                "--rounds",
                "4",
                "--separate-launches",
                "-m",
                "4K",
                "--csv",
                str(out),
            ]
        )
        == 0
    )
    assert [side for _, side in RecordingLauncher.log] == ALTERNATING
    assert "launches" in out.read_text()


def test_turns_inside_a_launch_alternate_and_keep_each_sides_times(tmp_path, monkeypatch):
    """benchmarks/paired.py on one rank, its timing replaced by a fake that logs which side
    it times and returns the call's number: A's times are then the numbers of A's turns."""
    from mpi4py import MPI

    from ccbench.benchmarks import paired
    from ccbench.collectives.comm import Communicator

    log: list[str] = []
    real_prepare = paired.prepare_case

    def prepare(variant, ctx, case):  # tag each side's call with its side
        prepared = real_prepare(variant, ctx, case)
        inner = prepared.run

        def run():
            inner()

        run.side = "A" if ctx.opts.algorithm == "mpi" else "B"
        prepared.run = run
        return prepared

    def measure(comm, run, iterations, warmup, timing, **_):
        log.append(run.side)
        n = float(len(log))
        return {
            "iterations": iterations,
            "avg_us": n,
            "fastest_us": n,
            "p50_us": n,
            "timer": "python",
            "barrier": "yielding",
        }

    monkeypatch.setattr(paired, "prepare_case", prepare)
    monkeypatch.setattr(paired, "measure", measure)
    out = tmp_path / "pairs.json"
    status = paired.run_pairs(
        [
            "--a",
            "baseline --algorithm mpi",
            "--b",
            "baseline --algorithm ring",
            "--turns",
            "4",
            "--json",
            str(out),
            "--",
            "--collective",
            "allgather",
            "-m",
            "4K,8K",
            "-i",
            "2",
            "-x",
            "0",
        ],
        Communicator(MPI.COMM_SELF),
    )
    assert status == 0
    assert log == ALTERNATING * 2  # the 4 KiB point's turns, then the 8 KiB point's
    points = json.loads(out.read_text())["points"]
    assert {p["barriers"]["A"] + p["barriers"]["B"] for p in points.values()} == {"yielding" * 2}
    # calls 1-8 time the first point, 9-16 the second: A was timed in calls 1, 4, 5, 8
    for size, first in ((4096, 0), (8192, 8)):
        (point,) = [p for p in points.values() if p["size_bytes"] == size]
        a = [first + n for n in (1, 4, 5, 8)]
        b = [first + n for n in (2, 3, 6, 7)]
        for key in ("avg_us", "fastest_us", "p50_us"):
            assert point["times"]["A"][key] == pytest.approx(a)
            assert point["times"]["B"][key] == pytest.approx(b)


def test_in_launch_rounds_alternate_which_side_starts(tmp_path, monkeypatch):
    """With an odd number of turns A would start more turns than B; the rounds alternate
    which side starts the launch, so across rounds each side starts as often."""
    from ccbench.scripts.comparisons import compare

    RecordingLauncher.log = []
    monkeypatch.setattr(compare, "Launcher", PairedRecordingLauncher)
    monkeypatch.setenv("CCBENCH_STATE", str(tmp_path / "state"))
    assert (
        compare.main(
            ["baseline", "baseline --algorithm ring", "--rounds", "4", "--turns", "3", "-m", "4K"]
        )
        == 0
    )
    assert RecordingLauncher.log == ["A", "B", "A", "B"]


def test_a_paired_launch_started_by_b_times_b_first(tmp_path, monkeypatch):
    from mpi4py import MPI

    from ccbench.benchmarks import paired
    from ccbench.collectives.comm import Communicator

    log: list[str] = []
    real_prepare = paired.prepare_case

    def prepare(variant, ctx, case):
        prepared = real_prepare(variant, ctx, case)
        prepared.run.side = "A" if ctx.opts.algorithm == "mpi" else "B"
        return prepared

    def measure(comm, run, iterations, warmup, timing, **_):
        log.append(run.side)
        return {
            "iterations": iterations,
            "avg_us": 1.0,
            "fastest_us": 1.0,
            "p50_us": 1.0,
            "timer": "python",
            "barrier": "blocking",
        }

    monkeypatch.setattr(paired, "prepare_case", prepare)
    monkeypatch.setattr(paired, "measure", measure)
    status = paired.run_pairs(
        [
            "--a",
            "baseline --algorithm mpi",
            "--b",
            "baseline --algorithm ring",
            "--turns",
            "3",
            "--first",
            "B",
            "--json",
            str(tmp_path / "p.json"),
            "--",
            "-m",
            "4K:4K",
            "-i",
            "2",
            "-x",
            "0",
        ],
        Communicator(MPI.COMM_SELF),
    )
    assert status == 0
    assert log == ["B", "A", "A", "B", "B", "A"]  # B A | A B | B A


# ------------------------------------------------------------ what each benchmark gives as a time


def test_compare_reads_unsized_benchmarks_from_their_own_rows():
    """Training compares on its summary row's mean step time, MG-WFBP per strategy."""
    from ccbench.scripts.comparisons.rounds import Comparison, Side

    a, b = Side("A", ["training"]), Side("B", ["training", "--variant", "coll_compressed"])
    comparison = Comparison(a, b, "avg", 0.03)
    for ta, tb in [(100.0, 50.0), (200.0, 100.0)]:
        steps = [{"row": "step", "step_us": "999"}, {"row": "step", "step_us": "1"}]
        comparison.add(a, [*steps, {"row": "summary", "step_us": str(ta), "steps": "20"}])
        comparison.add(b, [*steps, {"row": "summary", "step_us": str(tb), "steps": "20"}])
    (point,) = comparison.points()
    assert point == (0, "step")
    r = comparison.ratio(point)
    assert (r.ratio, r.low, r.high) == pytest.approx((0.5, 0.5, 0.5))

    mg = Comparison(Side("A", ["merged_gradient"]), Side("B", ["merged_gradient"]), "avg", 0.03)
    for side in (mg.a, mg.b):
        mg.add(
            side,
            [
                {"strategy": "wfbp", "measured_us": "10", "iterations": "5"},
                {"strategy": "mgwfbp", "measured_us": "8", "iterations": "5"},
            ],
        )
    assert [p[1] for p in mg.points()] == ["strategy=mgwfbp", "strategy=wfbp"]


def test_compare_reads_codec_throughput_as_time_per_call_of_each_step():
    """A rate becomes a time per call: 4 MB at 8 GB/s is 500 us, at 4 GB/s 1000 us; a
    doubled encode reads B/A = 2 on its own point, and a missing rate is no point."""
    from ccbench.scripts.comparisons.rounds import Comparison, Side
    from ccbench.scripts.launchers import Launcher

    a, b = Side("A", ["codec_throughput"]), Side("B", ["codec_throughput"])
    comparison = Comparison(a, b, "p50", 0.03)

    def row(encode_gbps):
        return {
            "codec": "bfp:rate=8",
            "kernels": "fused",
            "data": "gradient-like",
            "size_bytes": "4000000",
            "repeats": "10",
            "encode_gbps": str(encode_gbps),
            "decode_gbps": "4",
            "hop_gbps": "",
        }

    for _ in range(2):
        comparison.add(a, [row(8)])
        comparison.add(b, [row(4)])
    where = "codec=bfp:rate=8,kernels=fused,data=gradient-like"
    encode, decode = (4_000_000, f"{where},step=encode"), (4_000_000, f"{where},step=decode")
    assert comparison.times[encode] == {"A": [500.0, 500.0], "B": [1000.0, 1000.0]}
    assert comparison.ratio(encode).ratio == pytest.approx(2.0)
    assert comparison.ratio(decode).ratio == pytest.approx(1.0)
    assert comparison.ratio((4_000_000, f"{where},step=hop")) is None  # no hop rate
    # one process, not an MPI launch of the gate's ranks (each rank would write the CSV)
    command = Launcher(2).command(a, ["-m", "4M:4M"], Path("out.csv"))
    assert command[:3] == [sys.executable, "-m", "ccbench.benchmarks.codec_throughput"]


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "args, words",
    [
        (["nosuch"], "unknown variant"),
        (["baseline"], "give two commands"),
        (["baseline", "baseline", "--rounds", "1"], "at least 2"),
        (["baseline", "baseline --csv x.csv"], "set by ccbench compare"),
    ],
)
def test_compare_bad_input_exits_2(args, words):
    proc = ccbench("compare", *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["--ci-target", "0"], "positive percentage"),
        (["--ci-target", "2", "--rounds", "4", "--max-rounds", "3"], "at least --rounds"),
        (["--turns", "0"], "--turns must be at least 1"),
    ],
)
def test_compare_bad_rounds_exit_2(args, words):
    proc = ccbench("compare", "baseline", "baseline --algorithm ring", *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr

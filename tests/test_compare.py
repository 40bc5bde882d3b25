"""`ccbench compare` with both sides in one launch (benchmarks/paired.py): the turns, the
rounds and the interval across rounds, checked against a computation of their own."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from scipy import stats

from tests.helpers.cli import ccbench
from tests.mpirun import mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


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


def test_in_launch_compare_end_to_end(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline --algorithm mpi",
        "baseline --algorithm ring",
        "-m",
        "4K,64K",
        "--rounds",
        "2",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "--collective",
        "allgather",
        "-i",
        "20",
        "-x",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 turns in one launch" in proc.stdout
    rows = list(csv.DictReader(out.open()))
    assert [r["size_bytes"] for r in rows] == ["4096", "65536"]
    (run,) = json.loads((tmp_path / "cmp.csv.json").read_text())["runs"].values()
    for r in rows:
        assert (r["pairing"], r["turns"], r["rounds"]) == ("in-launch", "2", "2")
        assert r["a_iterations"] == r["b_iterations"] == "20"
        # the ring cannot be timed by the C loop, so the library's call is not either
        assert (r["timer"], r["validation"]) == ("python", "")
        # the ratio and interval again, from the turn times the sidecar keeps
        turns = run["turn_times"][f"{r['size_bytes']}|"]
        assert [len(t) for t in turns["A"]] == [2, 2] and len(turns["B"]) == 2
        logs = [
            np.mean(np.log(b)) - np.mean(np.log(a))
            for a, b in zip(turns["A"], turns["B"], strict=True)
        ]
        half = stats.t.ppf(0.975, 1) * np.std(logs, ddof=1) / math.sqrt(2)
        assert float(r["ratio"]) == pytest.approx(math.exp(np.mean(logs)), rel=1e-9)
        assert float(r["ratio_low"]) == pytest.approx(math.exp(np.mean(logs) - half), rel=1e-9)
        assert float(r["ratio_high"]) == pytest.approx(math.exp(np.mean(logs) + half), rel=1e-9)


def test_separate_launches_are_recorded_as_such(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--separate-launches",
        "--timer",
        "python",
        "--csv",
        str(out),
        "--",
        "--collective",
        "allgather",
        "-i",
        "10",
        "-x",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert (row["pairing"], row["turns"], row["timer"]) == ("launches", "1", "python")


def test_separate_launches_refuse_two_timing_loops(tmp_path):
    """The library's collective alone is timed by the C loop, the ring by Python's: a
    ratio of the two would measure the loops too, so compare refuses, in one line."""
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--separate-launches",
        "--csv",
        str(out),
        "--",
        "--collective",
        "allgather",
        "-i",
        "10",
        "-x",
        "1",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "A was timed by the c loop and B by the python loop" in lines[0]
    assert not out.exists()


def test_one_launch_times_two_library_collectives_by_the_c_loop(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline -T int8",
        "baseline",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "-i",
        "10",
        "-x",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert row["timer"] == "c"


def test_paired_launch_times_every_turn_of_both_sides(tmp_path):
    out = tmp_path / "pairs.json"
    proc = mpirun(
        2,
        [
            *variant_module("paired"),
            "--turns",
            "3",
            "--a",
            "baseline",
            "--b",
            "p2p_compressed --codec fp16",
            "--json",
            out,
            "--",
            "--collective",
            "reduce_scatter",
            "-m",
            "8K:16K",
            "-i",
            "5",
            "-x",
            "1",
            "-c",
        ],
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert (data["turns"], data["ranks"], data["collective"]) == (3, 2, "reduce_scatter")
    assert sorted(p["size_bytes"] for p in data["points"].values()) == [8192, 16384]
    for point in data["points"].values():
        assert point["iterations"] == {"A": 5, "B": 5}
        # one loop for both sides (p2p is no library call), and both -c passes recorded
        assert point["timers"] == {"A": "python", "B": "python"}
        assert point["validation"] == {"A": "Pass", "B": "Pass"}
        for side in ("A", "B"):
            times = point["times"][side]
            assert len(times["avg_us"]) == len(times["p50_us"]) == 3
            # both over each call's slowest rank: the fastest call is at most the median
            assert all(
                0 < f <= m for f, m in zip(times["fastest_us"], times["p50_us"], strict=True)
            )


@pytest.mark.parametrize(
    "a, b, needle",
    [
        ("training", "baseline", "no message sizes to pair"),
        ("nosuch", "baseline", "unknown variant"),
        # a density per row on one side, none on the other: no point in common
        ("baseline --collective allreduce", "sparse_streaming", "share no message size"),
    ],
)
def test_paired_bad_input_is_one_line_from_rank_0(tmp_path, a, b, needle):
    proc = mpirun(
        2,
        [
            *variant_module("paired"),
            "--a",
            a,
            "--b",
            b,
            "--json",
            tmp_path / "p.json",
            "--",
            "-m",
            "4K",
            "-i",
            "2",
        ],
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "p.json").exists()


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


# 1e300: met by any interval two rounds give, however noisy the host
@pytest.mark.parametrize("target, rounds", [("1e-9", 3), ("1e300", 2)])
def test_ci_target_adds_rounds_until_met_or_max_rounds(tmp_path, target, rounds):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--turns",
        "2",
        "--ci-target",
        target,
        "--max-rounds",
        "3",
        "--csv",
        str(out),
        "--",
        "--collective",
        "allgather",
        "-i",
        "10",
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert row["rounds"] == str(rounds) and float(row["ci_target_pct"]) == float(target)


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

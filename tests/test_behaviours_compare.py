"""The alternation that makes a comparison fair, seen by recording fakes: which side runs
first in each turn of a launch (A B, then B A) and in each round of separate launches
(A B in even rounds, B A in odd ones), every comparison taking round k before round k + 1.
"""

from __future__ import annotations

import json

import pytest

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

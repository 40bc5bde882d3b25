"""`ccbench compare` end to end on real ranks: both sides in one launch
(benchmarks/paired.py) or in separate launches, their turns, rounds and interval checked
against a computation of their own; the exit status and the side marked when one fails
validation (on a throw-away clone with a broken ring); an interrupted compare resumes.
The arithmetic and the order of sides without launches: tests/test_comparisons.py.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ccbench.scripts.comparisons.revisions import link_rooms
from tests.helpers.cli import ccbench
from tests.helpers.repo import interruptible
from tests.mpirun import REPO, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


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


# ------------------------------------------------------------ exit status and resuming


def tree_of(clone: Path, tmp_path: Path) -> dict:
    """The environment that runs ccbench from the clone's working tree."""

    root = link_rooms(clone, tmp_path / "import")
    return {"PYTHONPATH": str(root), "CCBENCH_STATE": str(tmp_path / "state")}


@pytest.mark.timeout(300)
def test_compare_exits_1_and_marks_the_side_that_fails_validation(clone, tmp_path):
    ring = clone / "collectives" / "ring.py"
    text = ring.read_text()
    broken = text.replace(
        # the gather phase's walk of the ring the baseline runs (ring_collective)
        "    ring_allgather_inplace(comm, recvbuf, bounds, phase)\n",
        "    ring_allgather_inplace(comm, recvbuf, bounds, phase)\n    recvbuf[0] += 1\n",
        1,
    )
    assert broken != text
    ring.write_text(broken)
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline --algorithm mpi",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "-c",
        "-i",
        "5",
        "-x",
        "1",
        cwd=clone,
        env=tree_of(clone, tmp_path),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert row["validation"] == "Fail: B"
    assert "(validation Fail: B)" in proc.stdout
    assert "validation failed at 1 of 1 points" in proc.stderr


@pytest.mark.timeout(300)
def test_compare_records_pass_when_both_sides_validate(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline --algorithm mpi",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "-c",
        "-i",
        "5",
        "-x",
        "1",
        env={"CCBENCH_STATE": str(tmp_path / "state")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert row["validation"] == "Pass"


@pytest.mark.timeout(300)
def test_an_interrupted_compare_keeps_its_rounds_and_resumes(tmp_path):
    state = {"CCBENCH_STATE": str(tmp_path / "state")}
    out = tmp_path / "cmp.csv"
    command = [
        sys.executable,
        "-m",
        "ccbench.scripts.cli",
        "compare",
        "baseline",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "5",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "-i",
        "400",
        "-x",
        "1",
    ]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **state},
        stdin=subprocess.DEVNULL,
        preexec_fn=interruptible,
    )
    checkpoints = Path(state["CCBENCH_STATE"])
    deadline = time.monotonic() + 200
    while not list(checkpoints.glob("compare-*.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        r"ccbench compare: interrupted after [1-4] of 5 rounds; the [1-4] finished kept: "
        r"run the same command to resume",
        lines[0],
    ), err
    assert not out.exists()
    again = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **state},
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert again.returncode == 0, again.stderr
    assert re.search(r"^# resuming: [1-4] round\(s\) already measured", again.stdout, re.M)
    (row,) = list(csv.DictReader(out.open()))
    assert row["rounds"] == "5"


@pytest.mark.timeout(300)
def test_compare_two_variants_writes_ratios(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline --algorithm mpi",
        "baseline --algorithm ring",
        "-m",
        "4K,64K",
        "--rounds",
        "2",
        "--csv",
        str(out),
        "--",
        "--collective",
        "allreduce",
        "-i",
        "20",
        "-x",
        "2",
        env={"CCBENCH_STATE": str(tmp_path / "state")},
    )
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["size_bytes"] for r in rows] == ["4096", "65536"]
    for r in rows:
        # the geometric means of the rounds and their ratio agree with each other
        assert float(r["ratio"]) == pytest.approx(float(r["b_us"]) / float(r["a_us"]), rel=1e-9)
        assert float(r["ratio_low"]) <= float(r["ratio"]) <= float(r["ratio_high"])
        assert r["verdict"] in ("faster", "slower", "no difference")
        assert r["a"] == "baseline --algorithm mpi" and r["b"] == "baseline --algorithm ring"

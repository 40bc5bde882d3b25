"""ccbench osu-check: the baseline against OSU's binaries. OSU itself is not built in CI, so
the binaries here are stand-ins that print OSU's table (rank 0 only, as OSU does) and
record how they were called; ccbench's side is the real baseline on real ranks."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.scripts.comparisons.osu_check import Point, osu_latency, table
from tests.mpirun import REPO

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

# OSU's own output (osu_allgather -m 4096:4096 -T mpi_float, 7.4), for the parser
OSU_OUTPUT = """
# OSU MPI Allgather Latency Test v7.4
# Datatype: MPI_FLOAT.
# Size       Avg Latency(us)
4096                    3.71
"""

FAKE_LATENCY_US = 1.0e12  # far above any real call: no point can agree

FAKE_OSU = f"""#!{sys.executable}
import os, sys
rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
if rank == "0":
    args = sys.argv[1:]
    size = args[args.index("-m") + 1].split(":")[0]
    with open(os.path.join(os.path.dirname(__file__), "calls.log"), "a") as log:
        log.write(os.path.basename(__file__) + " " + " ".join(args) + "\\n")
    print("# OSU MPI Latency Test v7.4")
    print("# Size       Avg Latency(us)")
    print(f"{{size:<10}}{FAKE_LATENCY_US:>20.2f}")
"""


def fake_osu(directory: Path) -> Path:
    directory.mkdir()
    for name in ("osu_allgather", "osu_reduce_scatter", "osu_allreduce"):
        path = directory / name
        path.write_text(FAKE_OSU)
        path.chmod(0o755)
    return directory


def osu_check(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))}
    return subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", "osu-check", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_osu_latency_reads_the_average_of_the_size_asked():
    assert osu_latency(OSU_OUTPUT, 4096) == 3.71
    with pytest.raises(ValueError, match="no line for size 8"):
        osu_latency(OSU_OUTPUT, 8)


def test_the_table_by_hand():
    """ccbench/OSU is the median of the per-round ratios, its interval the 1st and 6th of
    6 sorted ratios (P(Binomial(6, 1/2) = 0) = 1/64 <= 0.025, P(X <= 1) = 7/64 is not).
    OSU takes 10 us in every round; ccbench 10 us times the ratios below."""
    ratios = {
        Point("allgather", 4096): [1.0, 1.02, 1.04, 1.06, 1.08, 1.5],  # median 1.05
        Point("allreduce", 4096): [1.2, 1.25, 1.3, 1.3, 1.35, 1.4],  # all above
        Point("reduce_scatter", 4096): [0.8, 1.0, 1.15, 1.2, 1.3, 1.4],  # 1.175
        Point("allgather", 65536): [1.0, 1.0, 1.0, 1.0, 1.0, 3.0],
    }  # one spoiled
    times = {p: ([10.0] * 6, [10.0 * r for r in rs]) for p, rs in ratios.items()}
    header, agree, differ, unsure, spoiled = table(times, 0.10)
    assert header.split() == [
        "Collective",
        "Size",
        "OSU(us)",
        "ccbench(us)",
        "ccbench/OSU",
        "CI95",
        "low",
        "CI95",
        "high",
        "Verdict",
    ]
    assert agree.split() == ["allgather", "4096", "10.00", "10.50", "1.050", "1", "1.5", "agrees"]
    assert differ.split() == [
        "allreduce",
        "4096",
        "10.00",
        "13.00",
        "1.300",
        "1.2",
        "1.4",
        "differs",
    ]
    assert unsure.split() == [
        "reduce_scatter",
        "4096",
        "10.00",
        "11.75",
        "1.175",
        "0.8",
        "1.4",
        "inconclusive",
    ]
    # the geometric mean, 3^(1/6) = 1.20, would call this round's spell a difference
    assert spoiled.split() == ["allgather", "65536", "10.00", "10.00", "1.000", "1", "3", "agrees"]


def test_both_sides_run_the_same_calls_and_a_differing_point_exits_1(tmp_path):
    osu = fake_osu(tmp_path / "osu")
    proc = osu_check(
        "--osu",
        str(osu),
        "-n",
        "2",
        "-m",
        "1,4096",
        "--rounds",
        "6",
        "--collective",
        "allgather,reduce_scatter",
        "-i",
        "3",
        "-x",
        "1",
    )
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "2 ranks, 6 interleaved rounds" in out and "load average" in out
    assert "Reduce-Scatter at 1 B left out: 1 B is fewer than one element per rank" in out
    rows = [
        line.split()
        for line in out.splitlines()
        if line.startswith(("allgather", "reduce_scatter"))
    ]
    assert [(r[0], r[1]) for r in rows] == [
        ("allgather", "1"),
        ("allgather", "4096"),
        ("reduce_scatter", "4096"),
    ]
    for row in rows:
        assert float(row[2]) == FAKE_LATENCY_US  # OSU's column is what OSU printed
        assert 0 < float(row[3]) < FAKE_LATENCY_US / 100  # ccbench's real calls
        # 1e-12 of OSU: differs, or, when a loaded host scatters rounds of 3 calls by
        # orders of magnitude, inconclusive; never agrees, and either one exits 1
        assert row[-1] in ("differs", "inconclusive"), out
    calls = [shlex.split(line) for line in (osu / "calls.log").read_text().splitlines()]
    # one OSU launch per point and round, with the calls, warm-ups and element type that
    # ccbench ran: float32 as MPI_FLOAT, one byte as OSU's default MPI_CHAR
    assert sorted(" ".join(c) for c in calls) == sorted(
        6
        * [
            "osu_allgather -m 1:1 -i 3 -x 1",
            "osu_allgather -m 4096:4096 -i 3 -x 1 -T mpi_float",
            "osu_reduce_scatter -m 4096:4096 -i 3 -x 1 -T mpi_float",
        ]
    )


def test_a_missing_osu_binary_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = osu_check("--osu", str(tmp_path / "empty"), "--collective", "allreduce")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no executable osu_allreduce" in proc.stderr
    assert proc.stdout == ""


def test_fewer_rounds_than_a_median_interval_needs_is_one_line_and_exit_2(tmp_path):
    osu = fake_osu(tmp_path / "osu")
    proc = osu_check("--osu", str(osu), "--collective", "allreduce", "--rounds", "5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ccbench osu-check: error: --rounds must be at least 6 "
        "(a median's 95% interval needs that many)"
    )
    assert proc.stdout == "" and not (osu / "calls.log").exists()

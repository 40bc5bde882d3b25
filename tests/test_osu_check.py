"""ccbench osu-check: the baseline against OSU's binaries. OSU itself is not built in CI, so
the binaries here are stand-ins that print OSU's table (rank 0 only, as OSU does) and
record how they were called; ccbench's side is the real baseline on real ranks."""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from ccbench.scripts.osu_check import Point, osu_latency, table
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
    return subprocess.run([sys.executable, "-m", "ccbench.scripts.cli", "osu-check", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_osu_latency_reads_the_average_of_the_size_asked():
    assert osu_latency(OSU_OUTPUT, 4096) == 3.71
    with pytest.raises(ValueError, match="no line for size 8"):
        osu_latency(OSU_OUTPUT, 8)


def test_the_table_by_hand():
    """ccbench/OSU is the geometric mean of the per-round ratios: 1.05 twice is 1.05,
    1.2 and 1.2 is 1.2; with a 10% tolerance the first agrees and the second differs.
    Rounds of 1.4 and 1.0 give sqrt(1.4) = 1.183, outside the tolerance, but two rounds
    that far apart give an interval (t with 1 degree of freedom: 12.7 standard errors)
    that reaches 1: inconclusive."""
    times = {Point("allgather", 4096): ([10.0, 20.0], [10.5, 21.0]),
             Point("allreduce", 4096): ([10.0, 20.0], [12.0, 24.0]),
             Point("reduce_scatter", 4096): ([10.0, 10.0], [14.0, 10.0])}
    header, agree, differ, unsure = table(times, 0.10)
    assert header.split() == ["Collective", "Size", "OSU(us)", "ccbench(us)", "ccbench/OSU",
                              "CI95", "low", "CI95", "high", "Verdict"]
    assert agree.split() == ["allgather", "4096", "15.00", "15.75", "1.050", "1.05", "1.05",
                             "agrees"]
    assert differ.split() == ["allreduce", "4096", "15.00", "18.00", "1.200", "1.2", "1.2",
                              "differs"]
    fields = unsure.split()
    assert fields[:5] == ["reduce_scatter", "4096", "10.00", "12.00", "1.183"]
    se = abs(math.log(1.4)) / 2  # the standard error of the mean of ln(1.4) and ln(1)
    low = math.exp(math.log(1.4) / 2 - stats.t.ppf(0.975, 1) * se)
    assert float(fields[5]) == pytest.approx(low, rel=1e-2) and low < 0.9
    assert fields[-1] == "inconclusive"


def test_both_sides_run_the_same_calls_and_a_differing_point_exits_1(tmp_path):
    osu = fake_osu(tmp_path / "osu")
    proc = osu_check("--osu", str(osu), "-n", "2", "-m", "1,4096", "--rounds", "2",
                     "--collective", "allgather,reduce_scatter", "-i", "3", "-x", "1")
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "2 ranks, 2 interleaved rounds" in out and "load average" in out
    assert "Reduce-Scatter at 1 B left out: 1 B is fewer than one element per rank" in out
    rows = [line.split() for line in out.splitlines()
            if line.startswith(("allgather", "reduce_scatter"))]
    assert [(r[0], r[1]) for r in rows] == [("allgather", "1"), ("allgather", "4096"),
                                            ("reduce_scatter", "4096")]
    for row in rows:
        assert float(row[2]) == FAKE_LATENCY_US  # OSU's column is what OSU printed
        assert 0 < float(row[3]) < FAKE_LATENCY_US / 100  # ccbench's real calls
        # 1e-12 of OSU: differs, or, when a loaded host scatters 2 rounds of 3 calls by
        # orders of magnitude, inconclusive; never agrees, and either one exits 1
        assert row[-1] in ("differs", "inconclusive"), out
    calls = [shlex.split(line) for line in (osu / "calls.log").read_text().splitlines()]
    # one OSU launch per point and round, with the calls, warm-ups and element type that
    # ccbench ran: float32 as MPI_FLOAT, one byte as OSU's default MPI_CHAR
    assert sorted(" ".join(c) for c in calls) == sorted(2 * [
        "osu_allgather -m 1:1 -i 3 -x 1",
        "osu_allgather -m 4096:4096 -i 3 -x 1 -T mpi_float",
        "osu_reduce_scatter -m 4096:4096 -i 3 -x 1 -T mpi_float",
    ])


def test_a_missing_osu_binary_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = osu_check("--osu", str(tmp_path / "empty"), "--collective", "allreduce")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no executable osu_allreduce" in proc.stderr
    assert proc.stdout == ""

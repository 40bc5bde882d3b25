"""ccbench osu-check: the baseline against OSU's binaries. OSU itself is not built in CI, so
the binaries here are stand-ins that print OSU's table (rank 0 only, as OSU does) and
record how they were called; ccbench's side is the real baseline on real ranks.

Its rounds and verdicts with a scripted runner that agrees, differs and is inconclusive
(no launch): each side's time per round is set here, so the verdict and exit status are
worked by hand; the order of the two sides in every round is recorded. Also what each
side's number is (OSU prints its average: ccbench's must be its average too) and times
of zero, which no ratio can use.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ccbench.benchmarks.results import COMMON_COLUMNS, write_csv_atomic
from ccbench.benchmarks.statistics import median_ratio_interval
from ccbench.scripts.comparisons import osu_check
from ccbench.scripts.comparisons.osu_check import Point, osu_latency, table
from tests.mpirun import REPO

# @pytest.mark.mpi: the test launches MPI ranks (the Open MPI leg runs it too)


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


def run_osu_check(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))}
    return subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", "osu-check", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.mpi
def test_osu_latency_reads_the_average_of_the_size_asked():
    assert osu_latency(OSU_OUTPUT, 4096) == 3.71
    with pytest.raises(ValueError, match="no line for size 8"):
        osu_latency(OSU_OUTPUT, 8)


@pytest.mark.mpi
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


@pytest.mark.mpi
def test_both_sides_run_the_same_calls_and_a_differing_point_exits_1(tmp_path):
    osu = fake_osu(tmp_path / "osu")
    proc = run_osu_check(
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


@pytest.mark.mpi
def test_a_missing_osu_binary_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_osu_check("--osu", str(tmp_path / "empty"), "--collective", "allreduce")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no executable osu_allreduce" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.mpi
def test_fewer_rounds_than_a_median_interval_needs_is_one_line_and_exit_2(tmp_path):
    osu = fake_osu(tmp_path / "osu")
    proc = run_osu_check("--osu", str(osu), "--collective", "allreduce", "--rounds", "5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ccbench osu-check: error: --rounds must be at least 6 "
        "(a median's 95% interval needs that many)"
    )
    assert proc.stdout == "" and not (osu / "calls.log").exists()


# ------------------------------------------------------------ rounds and verdicts


# ccbench/OSU per round (OSU 10 us in every round), 6 rounds
AGREES = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0]  # median 1.0: within 10%


DIFFERS = [1.3, 1.25, 1.35, 1.3, 1.28, 1.32]  # all above 1.1


UNSURE = [0.8, 1.0, 1.15, 1.2, 1.3, 1.4]  # median 1.175, interval [0.8, 1.4]


class ScriptedRunner:
    """Stands in for both launches of a point: the set times, every launch recorded."""

    ratios: dict = {}
    log: list = []

    def __init__(self, opts, scratch):
        self.done = {}

    def _next(self, side, point):
        k = self.done.get((side, point), 0)
        self.done[(side, point)] = k + 1
        self.log.append((side, point.size, k))
        return 10.0 if side == "osu" else 10.0 * self.ratios[point.size][k]

    def osu(self, point):
        return self._next("osu", point)

    def ccbench(self, point):
        return self._next("ccbench", point)


def check(tmp_path, monkeypatch, capsys, ratios: dict) -> tuple[int, list[str]]:
    ScriptedRunner.ratios, ScriptedRunner.log = ratios, []
    monkeypatch.setattr(osu_check, "Runner", ScriptedRunner)
    osu = fake_osu(tmp_path / "osu")
    sizes = ",".join(str(s) for s in ratios)
    sizes = f"{sizes}:{sizes}" if len(ratios) == 1 else sizes  # one size, not 1:MAX
    status = osu_check.main(
        ["--osu", str(osu), "--collective", "allreduce", "-m", sizes, "--rounds", "6", "--no-bind"]
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("allreduce")]
    return status, lines


@pytest.mark.parametrize(
    "ratios, verdict, status",
    [(AGREES, "agrees", 0), (DIFFERS, "differs", 1), (UNSURE, "inconclusive", 1)],
)
def test_the_verdict_and_exit_status_of_a_point(
    tmp_path, monkeypatch, capsys, ratios, verdict, status
):
    got, (line,) = check(tmp_path, monkeypatch, capsys, {4096: ratios})
    assert got == status
    fields = line.split()
    assert fields[-1] == verdict
    assert float(fields[4]) == pytest.approx(float(np.median(ratios)), abs=5e-4)


def test_one_inconclusive_point_among_agreeing_ones_exits_1(tmp_path, monkeypatch, capsys):
    got, lines = check(tmp_path, monkeypatch, capsys, {4096: AGREES, 65536: UNSURE})
    assert [line.split()[-1] for line in lines] == ["agrees", "inconclusive"]
    assert got == 1


def test_the_first_side_alternates_from_round_to_round(tmp_path, monkeypatch, capsys):
    check(tmp_path, monkeypatch, capsys, {4096: AGREES, 65536: AGREES})
    log = ScriptedRunner.log
    assert len(log) == 6 * 2 * 2
    for size in (4096, 65536):
        launches = [(side, k) for side, s, k in log if s == size]
        first = [side for side, _ in launches[::2]]
        assert first == ["osu", "ccbench"] * 3, launches
        # each round pairs the two sides' k-th launches
        assert [k for _, k in launches] == [k for k in range(6) for _ in (0, 1)]


def test_ccbench_side_is_its_average_as_osus_is(tmp_path, monkeypatch):
    """OSU's table gives its average latency; ccbench's row gives the average (avg_us)
    and the median (p50_us): the average is compared."""
    runner = osu_check.Runner(
        osu_check.build_parser().parse_args(
            ["--osu", str(tmp_path), "--no-bind", "-i", "3", "-x", "1"]
        ),
        tmp_path,
    )

    def launch(program, what):
        out = program[program.index("--csv") + 1]
        rows = [
            {**dict.fromkeys(COMMON_COLUMNS, ""), "size_bytes": s, "avg_us": a, "p50_us": p}
            for s, a, p in (("4096", "12.5", "9.0"), ("8192", "30.0", "20.0"))
        ]
        write_csv_atomic(out, rows, COMMON_COLUMNS)

    monkeypatch.setattr(runner, "_launch", launch)
    assert runner.ccbench(osu_check.Point("allreduce", 4096)) == 12.5


@pytest.mark.parametrize(
    "a, b", [([0.0] + [10.0] * 5, [10.0] * 6), ([10.0] * 6, [10.0] * 5 + [0.0])]
)
def test_a_time_of_zero_has_no_ratio(a, b):
    """A printed latency of 0.00 (a parse of the wrong column, a size OSU rounds away)
    would make a ratio of 0 or inf: refused, not ranked."""
    with pytest.raises(ValueError, match="positive"):
        median_ratio_interval(a, b)

"""ccbench osu-check's rounds and verdicts with a stand-in that agrees, differs and is
inconclusive: each side's time per round is set here, so the verdict and exit status are
worked by hand; the order of the two sides in every round is recorded. Also what each
side's number is (OSU prints its average: ccbench's must be its average too) and times of
zero, which no ratio can use."""

from __future__ import annotations

import numpy as np
import pytest

from ccbench.benchmarks.results import COMMON_COLUMNS, write_csv_atomic
from ccbench.benchmarks.statistics import median_ratio_interval
from ccbench.scripts.comparisons import osu_check
from tests.test_osu_check import fake_osu

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

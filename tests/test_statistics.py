"""Timing statistics, intervals, ratios and verdicts; where ranks run and what is recorded.

The formulas are checked against hand-worked cases and known distributions; the harness
is checked on real ranks with a clock the test controls (tests/drivers/statistics_cases.py).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from ccbench.benchmarks import statistics as st
from tests.helpers.drivers import failed_checks
from tests.mpirun import case_results, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

# Student t, 0.975 quantile, from a printed table (not from scipy)
T975 = {1: 12.7062047362, 2: 4.3026527297, 9: 2.2621571628, 19: 2.0930240544}


def test_summarize_hand_worked():
    times = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # seconds, [rank, call]
    s = st.summarize(times)
    assert s["avg_us"] == pytest.approx(3.5e6)  # means 2 and 5
    assert s["min_us"] == pytest.approx(2e6)
    assert s["max_us"] == pytest.approx(5e6)
    assert s["fastest_us"] == pytest.approx(4e6)  # calls end at 4, 5, 6
    assert s["p50_us"] == pytest.approx(5e6)
    # per-call averages 2.5, 3.5, 4.5: sd 1, n 3
    half = T975[2] * 1.0 / math.sqrt(3) * 1e6
    assert s["ci_low_us"] == pytest.approx(3.5e6 - half, rel=1e-9)
    assert s["ci_high_us"] == pytest.approx(3.5e6 + half, rel=1e-9)


@pytest.mark.parametrize("n", [2, 3, 10, 20])
def test_t_quantile_matches_the_table(n):
    assert st.t_quantile(n) == pytest.approx(T975[n - 1], rel=1e-8)


def test_interval_covers_the_true_mean_95_percent_of_the_time():
    """Normal samples of 10: the interval must hold the mean in 95% of 4000 draws.

    Binomial sd of the coverage is 0.0034; the bounds are 3.5 sd wide.
    """
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(4000):
        _, low, high = st.mean_interval(rng.normal(5.0, 2.0, 10))
        hits += low <= 5.0 <= high
    assert 0.938 <= hits / 4000 <= 0.962


def test_ratio_interval_covers_a_known_ratio():
    """Per-round times with lognormal noise around a true B/A of 1.25."""
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(2000):
        a = 100.0 * np.exp(rng.normal(0, 0.1, 8))
        b = 125.0 * np.exp(rng.normal(0, 0.1, 8))
        r = st.ratio_interval(a, b)
        hits += r.low <= 1.25 <= r.high
    assert 0.935 <= hits / 2000 <= 0.965


@pytest.mark.parametrize("n, j", [(6, 1), (12, 3), (20, 6)])
def test_median_ratio_interval_is_the_binomial_order_statistics(n, j):
    """From a binomial table, n rounds, p = 1/2: P(X <= j - 1) <= 0.025 < P(X <= j):
    n=6: 1/64 = 0.016 < 7/64; n=12: 79/4096 = 0.019 < 299/4096; n=20: 0.0207 < 0.0577.
    Ratios 1..n (B = 1..n, A = 1): the interval is [j, n + 1 - j]."""
    r = st.median_ratio_interval(np.ones(n), np.arange(1.0, n + 1))
    assert (r.ratio, r.low, r.high, r.rounds) == ((n + 1) / 2, j, n + 1 - j, n)


def test_median_ratio_needs_six_rounds_for_an_interval_and_ignores_one_spoiled_round():
    r = st.median_ratio_interval(np.ones(5), np.arange(1.0, 6))  # even [min, max]: 94%
    assert r.ratio == 3.0 and math.isnan(r.low) and math.isnan(r.high)
    r = st.median_ratio_interval([10.0] * 6, [10.0] * 5 + [40.0])
    assert (r.ratio, r.low, r.high) == (1.0, 1.0, 4.0)


def test_median_ratio_interval_covers_a_known_ratio_under_heavy_tails():
    """Round ratios around 1.25 with one round in five spoiled (x2 on either side): the
    interval must hold the true median ratio at least as often as it promises."""
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(2000):
        noise = np.exp(rng.normal(0, 0.1, 12))
        spoil = np.where(rng.random(12) < 0.2, rng.choice([0.5, 2.0], 12), 1.0)
        r = st.median_ratio_interval(np.full(12, 100.0), 125.0 * noise * spoil)
        hits += r.low <= 1.25 <= r.high
    assert hits / 2000 >= 0.95


def test_ratio_is_the_geometric_mean_of_round_ratios():
    r = st.ratio_interval([1.0, 2.0, 4.0], [2.0, 2.0, 2.0])
    assert r.ratio == pytest.approx((2.0 * 1.0 * 0.5) ** (1 / 3))
    assert r.rounds == 3
    exact = st.ratio_interval([1.0, 3.0], [2.0, 6.0])
    assert (exact.ratio, exact.low, exact.high) == pytest.approx((2.0, 2.0, 2.0))


@pytest.mark.parametrize(
    "low, high, verdict",
    [
        (0.50, 0.90, st.FASTER),
        (0.90, 0.969, st.FASTER),  # below 1/1.03 = 0.9709
        (0.95, 0.975, st.SAME),  # reaches into the margin
        (0.98, 1.02, st.SAME),
        (1.031, 1.2, st.SLOWER),
        (1.02, 1.5, st.SAME),  # not all of it beyond the margin
        (0.8, 1.3, st.SAME),  # wide: cannot tell
        (math.nan, math.nan, st.SAME),  # one round: no interval
    ],
)
def test_verdict_rule(low, high, verdict):
    assert st.verdict(low, high, margin=0.03) == verdict


def test_verdict_margin_zero_is_the_interval_excluding_one():
    assert st.verdict(0.99, 0.999, margin=0.0) == st.FASTER
    assert st.verdict(1.001, 1.01, margin=0.0) == st.SLOWER


def test_bad_ratio_inputs():
    with pytest.raises(ValueError):
        st.ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        st.ratio_interval([1.0, 0.0], [1.0, 1.0])


# ------------------------------------------------------------------ on real ranks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["per-call-6", "per-call-9", "target-met", "budget-spent"])
def test_harness_statistics_with_known_times(case):
    """Ranks whose calls take known, different times: every column as the formula says."""
    result = case_results("tests.drivers.statistics_cases", 3, timeout=100).get(case)
    assert failed_checks(result) == [], json.dumps(result)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bind", ["1", "0"])
def test_sidecar_records_placement(tmp_path, bind):
    out = tmp_path / "p.csv"
    proc = mpirun(
        2,
        [*variant_module("baseline"), "-m", "64:64", "-i", "3", "-x", "1", "--csv", out],
        env={"CCBENCH_BIND": bind},
    )
    assert proc.returncode == 0, proc.stderr
    run = next(iter(json.loads(out.with_name("p.csv.json").read_text())["runs"].values()))
    affinity = run["affinity"]
    assert sorted(affinity) == ["0", "1"]
    mine = sorted(os.sched_getaffinity(0))  # what an unbound rank inherits from here
    if bind == "1":
        assert all(len(cpus) == 1 and cpus[0] in mine for cpus in affinity.values())
        assert run["bound"] is True
        if len(mine) >= 2:
            assert affinity["0"] != affinity["1"]
    else:
        assert all(cpus == mine for cpus in affinity.values())
        assert run["bound"] is (len(mine) == 1)
    ((host, facts),) = run["hosts"].items()
    assert facts["ranks"] == 2 and facts["cores"] == os.cpu_count()
    assert len(facts["load_average"]) == 3
    # two ranks share cores only where they may run on one between them
    assert run["oversubscribed"] is (2 > len(mine))


@pytest.mark.timeout(120)
def test_oversubscription_warns_once(tmp_path):
    ranks = os.cpu_count() + 1
    if ranks > 8:
        pytest.skip("a host with many cores: oversubscribing it would take too many ranks")
    proc = mpirun(
        ranks,
        [
            *variant_module("baseline"),
            "--collective",
            "allreduce",
            "-m",
            "64:64",
            "-i",
            "2",
            "-x",
            "1",
        ],
    )
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"{ranks} ranks" in warnings[0], proc.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tool", [["sweep", "sweeps/ci.toml", "--list"], ["cluster", "status"]])
def test_tools_that_launch_ranks_refuse_to_run_inside_a_launch(tool):
    proc = mpirun(2, ["-m", "ccbench.scripts.cli", *tool], timeout=50)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "launches its own MPI ranks" in lines[0], proc.stderr


def test_a_time_interval_never_reaches_below_zero():
    """Five calls, one of them 50 times the others: the t interval of the mean reaches
    below zero; the interval of a time does not, and still holds the mean. Where the t
    interval is positive it is kept as it is."""
    from ccbench.benchmarks.statistics import mean_interval, time_interval

    times = [1.0, 1.0, 1.0, 1.0, 50.0]  # mean 10.8, s = 21.9: t half-width 27.2
    _, t_low, _ = mean_interval(times)
    assert t_low < 0
    mean, low, high = time_interval(times)
    assert mean == 10.8 and 1.0 <= low < mean < high <= 50.0
    # the bootstrap of a mean of five draws from {1 x4, 50}: low is the all-ones mean
    assert low == 1.0
    steady = [10.0, 11.0, 9.0, 10.5, 9.5]
    assert time_interval(steady) == mean_interval(steady)
    assert time_interval(times) == time_interval(times)  # seeded: the same every time

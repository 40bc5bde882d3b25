"""Statistics of timings: OSU's columns, the fastest call, intervals, ratios and verdicts.

Pure functions of arrays, so every number in a row can be checked by hand.

* A timed run gives `times[rank, call]`, seconds. OSU's columns: each rank's mean over
  calls, then the average / min / max of those means across ranks. A call ends when its
  slowest rank does, so the percentiles and the fastest call are taken over
  `max over ranks` of each call.
* The 95% confidence interval of the mean is Student's t interval over the per-call
  averages across ranks (whose mean is exactly `avg`): mean +- t(0.975, n-1) s / sqrt(n).
  It assumes the calls are independent; a drifting host breaks that, which is why
  comparisons are made in interleaved rounds (`ratio_interval`). Where the t interval
  would reach below zero (few calls, one of them long), a percentile bootstrap of the
  mean is used instead: a time's interval never holds a negative time.
* A comparison of A and B in R interleaved rounds gives one time per round for each;
  the ratio B/A is the geometric mean of the per-round ratios, with the t interval of
  the mean of log(B/A) across rounds, turned back into a ratio. Rounds pair A and B
  measured minutes apart, so a load that comes and goes hits both. Where a few rounds
  are spoiled outright (a launch that meets a spell of the host's), the median of the
  per-round ratios, with the order-statistic interval of a median, follows the typical
  round instead (`median_ratio_interval`; ccbench osu-check uses it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats  # imported with the module: never inside a timed budget

CONFIDENCE = 0.95
# A ratio within [1/(1+m), 1+m] is "no difference" (m = DEFAULT_MARGIN): differences this
# small are below what a shared host can tell apart run after run.
DEFAULT_MARGIN = 0.03
FASTER, SLOWER, SAME = "faster", "slower", "no difference"


def t_quantile(n: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student t quantile for a mean of n values (n - 1 degrees of freedom)."""
    return float(stats.t.ppf(0.5 + confidence / 2, n - 1))


def mean_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high) of the t interval of the mean; one value gives (v, nan, nan)."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    half = t_quantile(x.size, confidence) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


BOOTSTRAP_RESAMPLES = 4000


def time_interval(
    values, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high) for the mean of positive, skewed times: the t interval where it
    stays above zero, else (few calls, one of them long) a percentile bootstrap of the
    mean, which never leaves the range of the times themselves. Seeded: a row's interval
    is the same every time it is computed from the same times."""
    x = np.asarray(values, dtype=np.float64)
    mean, low, high = mean_interval(x, confidence)
    if not (math.isfinite(low) and low <= 0):
        return mean, low, high
    rng = np.random.default_rng(seed)
    # resampled means in batches: memory stays small for long runs
    means = np.concatenate(
        [
            rng.choice(x, size=(min(500, BOOTSTRAP_RESAMPLES - i), x.size)).mean(axis=1)
            for i in range(0, BOOTSTRAP_RESAMPLES, 500)
        ]
    )
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return mean, float(low), float(high)


def summarize(times) -> dict:
    """OSU's statistics and ccbench's additions from `times[rank, call]` in seconds;
    the result in microseconds."""
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 2 or t.shape[1] == 0:
        raise ValueError("times must be [ranks, calls] with at least one call")
    per_rank = t.mean(axis=1)
    slowest = t.max(axis=0)  # each call ends with its slowest rank
    mean, low, high = time_interval(t.mean(axis=0))
    us = 1e6
    return {
        "avg_us": float(per_rank.mean()) * us,
        "min_us": float(per_rank.min()) * us,
        "max_us": float(per_rank.max()) * us,
        "p50_us": float(np.percentile(slowest, 50)) * us,
        "p99_us": float(np.percentile(slowest, 99)) * us,
        "fastest_us": float(slowest.min()) * us,
        "ci_low_us": low * us,
        "ci_high_us": high * us,
        "samples": int(t.shape[1]),
    }


def relative_halfwidth(stats: dict) -> float:
    """Half the interval's width over the mean (inf when there is no interval)."""
    low, high, mean = stats["ci_low_us"], stats["ci_high_us"], stats["avg_us"]
    if not (math.isfinite(low) and math.isfinite(high)) or mean <= 0:
        return math.inf
    return (high - low) / 2 / mean


@dataclass(frozen=True)
class Ratio:
    """B's time over A's, from paired rounds: the estimate and its interval."""

    ratio: float
    low: float
    high: float
    rounds: int

    def verdict(self, margin: float = DEFAULT_MARGIN) -> str:
        return verdict(self.low, self.high, margin)


def ratio_interval(a, b, confidence: float = CONFIDENCE) -> Ratio:
    """B/A from paired per-round times (same length, all positive)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("a and b need the same, non-zero number of rounds")
    if np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("times must be positive")
    mean, low, high = mean_interval(np.log(b / a), confidence)
    return Ratio(
        math.exp(mean),
        math.exp(low) if math.isfinite(low) else math.nan,
        math.exp(high) if math.isfinite(high) else math.nan,
        int(a.size),
    )


def median_ratio_interval(a, b, confidence: float = CONFIDENCE) -> Ratio:
    """B/A from paired per-round times, robust to a few rounds that a shared host spoiled:
    the median of the per-round ratios, with the distribution-free interval of a median
    (order statistics j and n+1-j of the sorted ratios, j the largest with
    P(Binomial(n, 1/2) < j) <= (1 - confidence)/2). No interval below 6 rounds, where
    even the widest, [min, max], covers less than 95%."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("a and b need the same, non-zero number of rounds")
    if np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("times must be positive")
    ratios = np.sort(b / a)
    n = ratios.size
    level = (1 - confidence) / 2
    j = int(stats.binom.ppf(level, n, 0.5))  # the smallest k with P(X <= k) >= level
    if stats.binom.cdf(j, n, 0.5) <= level:
        j += 1
    low, high = (ratios[j - 1], ratios[n - j]) if j >= 1 else (math.nan, math.nan)
    return Ratio(float(np.median(ratios)), float(low), float(high), int(n))


def verdict(low: float, high: float, margin: float = DEFAULT_MARGIN) -> str:
    """What an interval of B/A says: B is faster, slower, or no different from A.

    Faster when the whole interval lies below 1/(1+margin), slower when it lies above
    1+margin; anything else (an interval that reaches into the margin, or no interval) is
    no difference that this measurement can show.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return SAME
    if high < 1 / (1 + margin):
        return FASTER
    if low > 1 + margin:
        return SLOWER
    return SAME

"""What a note states, as data: the claim beside the text, for the page check.

A note that quotes a ratio of two series' times carries a `RatioClaim`: which series (A,
B), where (the panel's setting and x), the ratio with its interval, whether it is the
interleaved comparison or the ratio of the separately launched points drawn, the points
the panel drew for A and B, and the line of text that states it. plots/page_check.py
compares each claim with the points drawn (and with the rows they come from) rather than
reading numbers back out of prose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

INTERLEAVED, SEPARATE_LAUNCHES = "interleaved", "separate"


@dataclass(frozen=True)
class Point:
    """A drawn point: the value and its interval (NaN bounds when it has none)."""

    value: float
    low: float = math.nan
    high: float = math.nan


@dataclass(frozen=True)
class RatioClaim:
    """B's time over A's at one x of one panel, as a note states it."""

    figure: str  # the figure's name (its file stem)
    panel: str  # the panel's title
    a: tuple[str, ...]  # (variant, algorithm, codec) of A, the reference
    b: tuple[str, ...]  # ... of B
    x: float  # the message size (bytes), or 0 where the panel has no x (training steps)
    ratio: float
    low: float
    high: float
    source: str  # INTERLEAVED or SEPARATE_LAUNCHES
    text: str  # the note's line that states it
    drawn_a: Point | None = None  # what the panel drew for A and B at x
    drawn_b: Point | None = None
    # an interleaved claim whose drawn separate launches point the other way: the note
    # says so, with the separate launches' ratio (ratio, low, high)
    differs: tuple[float, float, float] | None = None
    where: dict = field(default_factory=dict)  # collective, ranks, link (for the rows)


def percent(value: float) -> str:
    """A change in percent, signed, never '-0': '+12', '-3', '-0.4', '0'."""
    if not math.isfinite(value):
        return "+inf" if value > 0 else "-inf"
    text = f"{value:+.0f}"
    if text in ("+0", "-0"):
        text = f"{value:+.1f}"
    return "0" if text in ("+0.0", "-0.0") else text


def change_text(ratio: float, low: float, high: float) -> str:
    """A ratio of times as a latency change with its interval: '-45% [-50, -39]'."""
    text = f"{percent(100 * (ratio - 1))}%"
    if math.isfinite(low) and not math.isnan(high):
        upper = percent(100 * (high - 1)) if math.isfinite(high) else "+inf"
        text += f" [{percent(100 * (low - 1))}, {upper}]"
    return text


def separate_ratio(a: Point, b: Point) -> tuple[float, float, float]:
    """B/A of two separately measured points and the widest ratio their intervals allow:
    [b_low / a_high, b_high / a_low]; NaN bounds when either interval is missing, an
    unbounded side (0 or inf) when an interval reaches below zero."""
    ratio = b.value / a.value
    if not all(math.isfinite(v) for v in (a.low, a.high, b.low, b.high)):
        return ratio, math.nan, math.nan
    low = max(b.low, 0.0) / a.high if a.high > 0 else math.inf
    high = b.high / a.low if a.low > 0 else math.inf
    return ratio, low, high


# Two ratios point the same way unless they lie on opposite sides of 1 by more than this.
SIDE_TOLERANCE = 0.01


def side(ratio: float) -> int:
    """-1: B faster, +1: B slower, 0: within SIDE_TOLERANCE of equal."""
    if not math.isfinite(ratio) or abs(ratio - 1) <= SIDE_TOLERANCE:
        return 0
    return -1 if ratio < 1 else 1


def opposite(first: float, second: float) -> bool:
    return side(first) * side(second) < 0


def differs_text(separate: tuple[float, float, float]) -> str:
    """The line a note adds when the separate launches drawn point the other way from the
    interleaved comparison it quotes: why the two differ. Three short lines: one long
    line widens the figure until its panel has no room (the note sits under a panel)."""
    return (
        f"  the separate launches drawn: {change_text(*separate)}, the other way:\n"
        "    launched apart under the host's load; the interleaved rounds\n"
        "    alternate A and B (the measurement to trust)"
    )

"""The page check: does every sentence of the page agree with the rows it draws?

Each note that quotes a ratio carries its claim (plots/claims.py); the check compares it
with the points the panel drew and with the rows those points come from: the number the
text prints, the sign, the interval, and, for an interleaved comparison, whether the
separately launched points drawn beside it point the other way without the note saying
why. Free text that states a fact about the run (a rate, who wins, how every number was
measured, what a curve can show) is read for the facts the page is known to state and
compared with the rows; a headline whose interval stayed wider than its target (its
round cap reached) must say so. `ccbench plot` runs the check on every page it draws and
prints what it finds; CI runs it on a small stored page.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ccbench.plots.base import Headline, link_of, newest_per, rows, time_bounds
from ccbench.plots.claims import (
    INTERLEAVED,
    SEPARATE_LAUNCHES,
    Point,
    RatioClaim,
    change_text,
    opposite,
    separate_ratio,
)
from ccbench.plots.section_text import busbw_span


@dataclass(frozen=True)
class Contradiction:
    where: str  # the figure, section or headline
    text: str  # what the page says
    why: str  # what the rows say instead

    def line(self) -> str:
        return f"{self.where}: {self.text!r}: {self.why}"


# A signed zero the page must never print: "-0%", "+0", "-0.0".
SIGNED_ZERO = re.compile(r"(?<![\d.])[-+]0(?:\.0+)?(?![\d.])")


def _close(first: float, second: float, rel: float = 1e-6) -> bool:
    if not (math.isfinite(first) and math.isfinite(second)):
        return (math.isnan(first) and math.isnan(second)) or first == second
    return abs(first - second) <= rel * max(abs(first), abs(second), 1e-12)


def check_claim(claim: RatioClaim) -> list[Contradiction]:
    """A note's ratio against its own text and the points drawn."""
    where = f"{claim.figure} [{claim.panel}]"
    found = []

    def say(why):
        found.append(Contradiction(where, claim.text, why))

    if SIGNED_ZERO.search(claim.text):
        say("prints a signed zero")
    if change_text(claim.ratio, claim.low, claim.high) not in claim.text:
        say(f"the claim is {change_text(claim.ratio, claim.low, claim.high)}, not what it prints")
    if math.isfinite(claim.low) and math.isfinite(claim.high):
        if not claim.low <= claim.ratio <= claim.high:
            say("its ratio lies outside its own interval")
    a, b = claim.drawn_a, claim.drawn_b
    if claim.source == SEPARATE_LAUNCHES:
        if a is None or b is None:
            say("a ratio of separate launches with no point drawn for one side")
        elif not all(
            _close(x, y)
            for x, y in zip((claim.ratio, claim.low, claim.high), separate_ratio(a, b), strict=True)
        ):
            drawn = change_text(*separate_ratio(a, b))
            say(f"the points drawn give {drawn}")
    elif claim.source == INTERLEAVED and a is not None and b is not None:
        drawn = separate_ratio(a, b)
        if opposite(claim.ratio, drawn[0]) and claim.differs is None:
            say(
                f"the points drawn show B {change_text(*drawn)} against A (separate "
                "launches), the other way, and the note does not say why they differ"
            )
    return found


def drawn_from_rows(data, claim: RatioClaim, series: tuple) -> Point | None:
    """The point a latency panel draws for `series` at the claim's size, from the rows
    (the newest row of that series and size; its 95% interval)."""
    where = claim.where
    if not {"collective", "ranks", "link"} <= set(where) or claim.x <= 0:
        return None
    variant, algorithm, codec = series
    frame = rows(
        data,
        "harness",
        collective=where["collective"],
        variant=variant,
        algorithm=algorithm,
        codec=codec,
    )
    frame = frame[
        (frame["ranks"].astype(int) == int(where["ranks"]))
        & (link_of(frame) == float(where["link"]))
        & (frame["size_bytes"].astype(float) == claim.x)
    ]
    if frame.empty:
        return None
    frame = newest_per(frame, ["variant", "algorithm", "codec", "size_bytes"])
    low, high, _ = time_bounds(frame)
    return Point(float(frame["avg_us"].iloc[-1]), float(low[-1]), float(high[-1]))


def check_against_rows(data, claim: RatioClaim) -> list[Contradiction]:
    """The claim's drawn points are the rows' (latency notes, whose rows are harness rows)."""
    found = []
    for series, drawn, side in ((claim.a, claim.drawn_a, "A"), (claim.b, claim.drawn_b, "B")):
        row = drawn_from_rows(data, claim, series)
        if row is None or drawn is None:
            continue
        pairs = zip(
            (row.value, row.low, row.high), (drawn.value, drawn.low, drawn.high), strict=True
        )
        if not all(_close(x, y) for x, y in pairs):
            found.append(
                Contradiction(
                    f"{claim.figure} [{claim.panel}]",
                    claim.text,
                    f"{side}'s point is not its row's ({drawn.value:.4g} us drawn, "
                    f"{row.value:.4g} us in the rows)",
                )
            )
    return found


RATE = re.compile(r"(tens|hundreds|[\d.]+(?:\s*(?:-|to)\s*[\d.]+)?)\s+(?:of\s+)?GB/s")
WORDS = {"tens": (10.0, 100.0), "hundreds": (100.0, 1000.0)}
NEVER_WINS = re.compile(r"(cannot|can't|never|does not) win", re.IGNORECASE)
ALL_INTERLEAVED = re.compile(
    r"every (?:number|note)[^.]*?(?:is|are) (?:an )?interleaved", re.IGNORECASE
)
ERROR_GROWS = re.compile(r"error can grow with the rank count", re.IGNORECASE)


def check_text(
    where: str, text: str, data, claims: list[RatioClaim], page_claims: list[RatioClaim]
) -> list[Contradiction]:
    """Free text (a section's opening, a caption, the page's footer) against the rows:
    rates, who wins, how the numbers were measured, what the curves show."""
    found = []
    for sentence in re.split(r"(?<=[.:;])\s+", text):
        for match in RATE.finditer(sentence):
            span = busbw_span(data)
            if span is None:
                continue
            said = match.group(1)
            if said in WORDS:
                low, high = WORDS[said]
            else:
                parts = [float(p) for p in re.split(r"\s*(?:-|to)\s*", said)]
                low, high = min(parts), max(parts)
            # a stated range holds the drawn one, to the rounding it is printed with
            if not (low * 0.9 <= span[0] * 1.001 and span[1] <= high * 1.1 + 0.01):
                found.append(
                    Contradiction(
                        where,
                        sentence,
                        f"the bus bandwidth drawn is {span[0]:.3g}-{span[1]:.3g} GB/s",
                    )
                )
        if NEVER_WINS.search(sentence):
            wins = [c for c in claims if c.a[0] == "baseline" and c.high < 1]
            if wins:
                found.append(
                    Contradiction(
                        where,
                        sentence,
                        f"{len(wins)} note(s) show compression faster than the baseline "
                        f"(e.g. {wins[0].text})",
                    )
                )
        if ALL_INTERLEAVED.search(sentence):
            apart = [c for c in page_claims if c.source == SEPARATE_LAUNCHES]
            if apart:
                found.append(
                    Contradiction(
                        where,
                        sentence,
                        f"{len(apart)} note(s) quote ratios of separate launches "
                        f"(e.g. {apart[0].text})",
                    )
                )
        if ERROR_GROWS.search(sentence) and identical_errors(data):
            found.append(
                Contradiction(
                    where,
                    sentence,
                    "point-to-point and collective-level errors are identical at every point drawn",
                )
            )
        if SIGNED_ZERO.search(sentence) and "%" in sentence:
            found.append(Contradiction(where, sentence, "prints a signed zero"))
    return found


def identical_errors(data) -> bool:
    """Whether point-to-point and collective-level compression's max relative errors are
    equal at every (collective, ranks, link, codec, size) both measured."""
    frame = rows(data, "harness", variant=("p2p_compressed", "coll_compressed"))
    if frame.empty or "max_rel_err" not in frame.columns:
        return False
    frame = frame.assign(_link=link_of(frame))
    keys = ["collective", "ranks", "_link", "codec", "size_bytes"]
    table = frame.pivot_table(index=keys, columns="variant", values="max_rel_err", aggfunc="last")
    if not {"p2p_compressed", "coll_compressed"} <= set(table.columns):
        return False
    both = table.dropna()
    return not both.empty and bool(
        np.allclose(both["p2p_compressed"], both["coll_compressed"], rtol=1e-12, atol=0)
    )


def check_headline(where: str, headline: Headline) -> list[Contradiction]:
    """A headline whose interval is wider than its target says the round cap was reached."""
    if not (math.isfinite(headline.half_width_pct) and math.isfinite(headline.target_pct)):
        return []
    if headline.half_width_pct > headline.target_pct and "round cap" not in headline.samples:
        return [
            Contradiction(
                where,
                headline.samples,
                f"its interval is +-{headline.half_width_pct:.0f}%, wider than its "
                f"+-{headline.target_pct:g}% target, and it does not say the rounds stopped "
                "at their cap",
            )
        ]
    return []


def check_section(
    where: str,
    data,
    intro: str,
    figures: list,
    headlines: list[Headline],
    page_claims: list[RatioClaim],
) -> list[Contradiction]:
    """One section of the page: its opening text, each figure's caption and claims (with
    the rows they come from) and its headlines."""
    claims = [c for f in figures for c in f.claims]
    found = check_text(where, intro, data, claims, page_claims)
    for figure in figures:
        found += check_text(figure.name, figure.caption, data, figure.claims, page_claims)
        for claim in figure.claims:
            found += check_claim(claim)
            found += check_against_rows(data, claim)
        for _, lines in getattr(figure, "notes", []):
            for line in lines:
                if SIGNED_ZERO.search(line):
                    found.append(Contradiction(figure.name, line, "prints a signed zero"))
    for headline in headlines:
        found += check_headline(f"{where}: headline {headline.claim}", headline)
    return found


def check_page(sections, footer: str) -> list[Contradiction]:
    """Every section ((heading, data, intro, figures, headlines)) and the footer."""
    page_claims = [c for _, _, _, figures, _ in sections for f in figures for c in f.claims]
    found = []
    for heading, data, intro, figures, headlines in sections:
        found += check_section(heading, data, intro, figures, headlines, page_claims)
    if sections:
        found += check_text("footer", footer, sections[0][1], [], page_claims)
    return list(dict.fromkeys(found))

"""The page check (plots/page_check.py): it finds each kind of contradiction between the
page and its rows when given rows that make one, and none on consistent rows.

The contradictions are the ones a fresh main job showed: an interleaved note over drawn
points that say the opposite (seed 000's Reduce-Scatter at 16 MiB, the FSDP step), a
section that says shared memory runs at tens of GB/s and compression cannot win there, a
footer that calls every number interleaved above notes of separate launches, a '-0', a
caption that says p2p's error can grow where it equals coll's, a headline that stopped
at its round cap without saying so. Rows are built here with their answer known."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ccbench.plots.base import Headline
from ccbench.plots.claims import INTERLEAVED, SEPARATE_LAUNCHES, Point, RatioClaim, percent
from ccbench.plots.data import load
from ccbench.plots.headlines import compare_headlines
from ccbench.plots.page_check import (
    check_against_rows,
    check_claim,
    check_headline,
    check_page,
    check_text,
)
from ccbench.plots.section_text import footer_text, section_intro
from tests.plot_benchmark_rows import compare_row, modelled_row, seed000_rows
from tests.plot_fixtures import draw, note_lines, write

pytestmark = pytest.mark.usefixtures("close_figures")

MIB16 = 1 << 24
P2P = "p2p_compressed --codec bfp:rate=8"
COLL = "coll_compressed --codec bfp:rate=8"


def inverted_rows() -> list[dict]:
    """Seed 000's Reduce-Scatter at 16 MiB as the main job measured it under load: the
    separate launches drawn put collective-level (62.3 ms [56.8, 67.7]) above
    point-to-point (46.1 ms [39.0, 53.1]); baseline 130 ms."""

    def row(variant, algorithm, codec, ms, low, high):
        return modelled_row(
            "run-a",
            variant,
            algorithm,
            "reduce_scatter",
            codec,
            4,
            MIB16,
            ms * 1e3,
            1.0,
            ci_low_us=low * 1e3,
            ci_high_us=high * 1e3,
        )

    return [
        row("baseline", "mpi", "none", 130.0, 125.0, 135.0),
        row("p2p_compressed", "ring", "bfp:rate=8", 46.1, 39.0, 53.1),
        row("coll_compressed", "ring", "bfp:rate=8", 62.3, 56.8, 67.7),
    ]


@pytest.fixture(scope="module")
def inverted(tmp_path_factory):
    """The rows above and the interleaved comparison that measured coll 19% faster."""
    root = tmp_path_factory.mktemp("inverted")
    write(root / "h.csv", inverted_rows())
    compare = compare_row("c9", P2P, COLL, "reduce_scatter", MIB16, 0.81, 0.78, 0.84, "faster")
    write(root / "c.csv", [dict(compare, a_us=50e3, b_us=40.5e3)])
    return load([root])


def p2p_claim(figure) -> RatioClaim:
    return next(c for c in figure.claims if c.a[0] == "p2p_compressed")


def test_an_interleaved_note_over_points_that_say_the_opposite_is_found(inverted, style):
    (figure,) = draw("seed000_reduce_scatter_latency", inverted, style)
    claim = p2p_claim(figure)
    assert claim.source == INTERLEAVED and claim.ratio == pytest.approx(0.81)
    # the note as it was: -19% over points drawn +35% apart: a contradiction
    found = check_claim(replace(claim, differs=None))
    assert len(found) == 1 and "the other way" in found[0].why
    # the note as it is: it says why the two differ, with the drawn points' own ratio
    assert check_claim(claim) == []
    assert claim.differs[0] == pytest.approx(62.3 / 46.1)
    lines = note_lines(figure.fig.axes[0])
    assert any("separate launches drawn: +35% [+7, +74], the other way" in x for x in lines)
    # the interleaved rounds are drawn too: stars at the compare row's mean times (ms)
    stars = [ln for ln in figure.fig.axes[0].get_lines() if ln.get_marker() == "*"]
    assert sorted(float(s.get_ydata()[0]) for s in stars) == pytest.approx([40.5, 50.0])


def test_a_claims_points_are_its_rows(inverted, style):
    (figure,) = draw("seed000_reduce_scatter_latency", inverted, style)
    claim = p2p_claim(figure)
    assert check_against_rows(inverted, claim) == []
    moved = replace(claim, drawn_b=Point(50e3, 45e3, 55e3))
    (found,) = check_against_rows(inverted, moved)
    assert "B's point is not its row's" in found.why


def claim(**fields) -> RatioClaim:
    base = dict(
        figure="f",
        panel="p",
        a=("p2p_compressed", "ring", "fp16"),
        b=("coll_compressed", "ring", "fp16"),
        x=0.0,
        ratio=0.89,
        low=0.8,
        high=0.98,
        source=INTERLEAVED,
        text="fp16: -11% [-20, -2] vs p2p",
        drawn_a=Point(100.0, 95.0, 105.0),
        drawn_b=Point(110.0, 104.0, 116.0),
    )
    return RatioClaim(**{**base, **fields})


def test_a_training_note_under_bars_drawn_the_other_way_is_found():
    # the FSDP step: coll's bar 10% above p2p's under a note of -11% (interleaved)
    (found,) = check_claim(claim())
    assert "+10%" in found.why
    assert check_claim(claim(differs=(1.1, 0.99, 1.22))) == []
    # the same bars under a note that agrees with them: nothing to say
    assert check_claim(claim(ratio=1.08, low=1.02, high=1.15, text="+8% [+2, +15]")) == []


def test_a_separate_ratio_must_be_the_drawn_points_and_print_its_numbers():
    a, b = Point(100.0, 95.0, 105.0), Point(80.0, 76.0, 84.0)
    ratio, low, high = 0.8, 76 / 105, 84 / 95
    good = claim(source=SEPARATE_LAUNCHES, ratio=ratio, low=low, high=high, drawn_a=a, drawn_b=b)
    good = replace(good, text="fp16: -20% [-28, -12] vs p2p")
    assert check_claim(good) == []
    (stale,) = check_claim(replace(good, drawn_b=Point(90.0, 85.0, 95.0)))
    assert "the points drawn give -10%" in stale.why
    (misprinted,) = check_claim(replace(good, text="fp16: -2% [-28, -12] vs p2p"))
    assert "not what it prints" in misprinted.why


def test_a_signed_zero_is_found_and_never_printed():
    assert [percent(v) for v in (-0.3, 0.02, -0.04, 0.6, -12.4)] == ["-0.3", "0", "0", "+1", "-12"]
    zero = claim(ratio=0.9996, low=0.98, high=1.02, text="fp16: -0% [-2, +2] vs p2p")
    zero = replace(zero, drawn_a=None, drawn_b=None)
    assert any("signed zero" in c.why for c in check_claim(zero))
    assert check_claim(replace(zero, text="fp16: 0% [-2, +2] vs p2p")) == []


def shm_rows() -> list[dict]:
    """Shared memory as the main job drew it: 0.09-0.45 GB/s of bus bandwidth."""
    out = []
    for size, busbw in ((1 << 16, 0.09), (1 << 20, 0.45)):
        out.append(
            modelled_row(
                "r", "baseline", "mpi", "allgather", "none", 2, size, 100.0, 0, busbw_gbps=busbw
            )
        )
    return out


def test_a_rate_the_rows_refute_and_a_winner_they_contradict_are_found(tmp_path):
    data = load([write(tmp_path / "shm.csv", shm_rows())])
    wins = [claim(a=("baseline", "mpi", "none"), ratio=0.56, low=0.5, high=0.6)]
    old = (
        "Ranks on one host exchange bytes through shared memory at memory speed, tens of "
        "GB/s: a codec that reads and writes every byte costs about as much as the copy "
        "it saves, so compression cannot win here, and the numbers say by how much it loses."
    )
    found = check_text("shm", old, data, wins, wins)
    assert sorted(c.why.split(" ")[0] for c in found) == ["1", "the"]
    assert any("0.09-0.45 GB/s" in c.why for c in found)
    # the section's text as the page now writes it, from the same rows: nothing found
    intro = section_intro("shm", data, [type("F", (), {"claims": wins})()], [], "-")
    assert "0.09-0.45 GB/s" in intro and "1 faster, 0 slower" in intro
    assert check_text("shm", intro, data, wins, wins) == []


def test_a_footer_calling_every_number_interleaved_above_separate_notes_is_found(tmp_path):
    data = load([write(tmp_path / "shm.csv", shm_rows())])
    apart = [claim(source=SEPARATE_LAUNCHES)]
    old = (
        "Every number measured here is an interleaved comparison (B and A run in "
        "alternating rounds), never a ratio of two separate runs."
    )
    (found,) = check_text("footer", old, data, [], apart)
    assert found.why.startswith("1 note(s) quote ratios of separate launches")
    new = footer_text(apart)
    assert "0 repeat such a comparison ('interleaved') and 1 are ratios" in new
    assert check_text("footer", new, data, [], apart) == []


def test_an_error_that_cannot_grow_where_p2p_equals_coll_is_found(tmp_path, style):
    rows = [
        r
        for r in seed000_rows([1 << 20], ranks=4, link=1.0)
        if r["variant"] != "baseline" or r["algorithm"] == "mpi"
    ]
    for r in rows:  # bit-identical results: the same error both ways
        if r["variant"] != "baseline":
            r["max_rel_err"] = 2.0**-8
    data = load([write(tmp_path / "h.csv", rows)])
    old = (
        "Point-to-point compression recompresses at every hop, so its error can grow "
        "with the rank count."
    )
    (found,) = check_text("seed000_rate_sensitivity", old, data, [], [])
    assert "identical" in found.why
    (figure,) = draw("seed000_rate_sensitivity", data, style)
    assert "the same error at every rate drawn" in figure.caption
    assert check_text("seed000_rate_sensitivity", figure.caption, data, [], []) == []


def test_a_headline_at_its_round_cap_says_so(tmp_path):
    # FSDP's pair: 10 rounds, +-12% against the +-3% target
    row = compare_row(
        "c7",
        "training --framework fsdp --variant p2p_compressed --codec fp16",
        "training --framework fsdp --variant coll_compressed --codec fp16",
        "",
        0,
        0.95,
        0.85,
        1.07,
        "no difference",
        config="step",
        rounds=10,
    )
    data = load([write(tmp_path / "c.csv", [dict(row, ci_target_pct=3.0)])])
    (headline,) = compare_headlines(data)[0]
    width = 100 * (math.sqrt(1.07 / 0.85) - 1)
    assert headline.half_width_pct == pytest.approx(width)
    assert f"round cap reached: interval +-{width:.0f}%, wider than the +-3% target" in (
        headline.samples
    )
    assert check_headline("links", headline) == []
    silent = replace(headline, samples="10 rounds x 100 iterations")
    (found,) = check_headline("links", silent)
    assert "wider than its +-3% target" in found.why
    narrow = Headline("p", "c", "m", "v", "5 rounds", "x", half_width_pct=2.0, target_pct=3.0)
    assert check_headline("links", narrow) == []


def test_a_page_of_inverted_rows_is_consistent_once_its_notes_say_why(inverted, style):
    (figure,) = draw("seed000_reduce_scatter_latency", inverted, style)
    figure.name = "seed000_reduce_scatter_latency"
    sections = [("links", inverted, "", [figure], [])]
    assert check_page(sections, footer_text(figure.claims)) == []
    figure.claims = [replace(c, differs=None) for c in figure.claims]
    assert len(check_page(sections, footer_text(figure.claims))) == 1


def test_the_fsdp_step_note_and_its_interleaved_rounds_on_the_bars(tmp_path, style):
    """FSDP runs whose bars put collective-level fp16 6% under point-to-point (88.8 ms
    against 94.4 ms by the fixture's model), under an interleaved comparison that measured
    it 10% slower: the note says why the two differ, and the rounds' means are drawn as
    stars on the two bars (ms)."""
    from ccbench.benchmarks.training import COLUMNS as TRAINING_COLUMNS
    from tests.plot_training_rows import training_rows

    steps = [dict(r, framework="fsdp") for r in training_rows()]
    write(tmp_path / "t.csv", steps, TRAINING_COLUMNS)
    side = "training --framework fsdp --variant {} --codec fp16"
    compare = compare_row(
        "c8",
        side.format("p2p_compressed"),
        side.format("coll_compressed"),
        "",
        0,
        1.1,
        1.05,
        1.15,
        "slower",
        config="step",
    )
    write(tmp_path / "c.csv", [dict(compare, a_us=90e3, b_us=99e3)])
    (figure,) = draw("seed000_training_step_time", load([tmp_path]), style)
    claim = next(c for c in figure.claims if c.a[0] == "p2p_compressed")
    assert claim.source == INTERLEAVED and claim.ratio == pytest.approx(1.1)
    assert claim.differs is not None and claim.differs[0] < 1
    assert check_claim(claim) == []
    assert len(check_claim(replace(claim, differs=None))) == 1
    stars = [ln for ln in figure.fig.axes[0].get_lines() if ln.get_marker() == "*"]
    assert sorted(float(s.get_ydata()[0]) for s in stars) == pytest.approx([90.0, 99.0])
    from ccbench.plots.figure_check import check_figure

    assert check_figure(figure.fig) == []


def test_the_note_on_launches_that_differ_is_short_lines():
    """The note's explanation of separate launches pointing the other way: lines short
    enough for a note under one panel (a 150-character line widened a 3.5-inch figure
    until its panel collapsed), the drawn ratio in its first line."""
    from ccbench.plots.claims import differs_text

    text = "fp16 vs MPI:" + differs_text((0.79, 0.72, 0.86))
    lines = text.split("\n")
    assert len(lines) == 3 and max(len(line) for line in lines) <= 80, lines
    assert "-21% [-28, -14]" in lines[0]

"""The figure checks (plots/figure_check.py): each finds its kind of defect in a figure
built here to have it, and none in every figure the plotting stage draws from the test
fixtures (tests/plot_fixtures.py), one page per regime as `ccbench plot` draws it."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ccbench.plots import cli  # noqa: E402
from ccbench.plots.base import Skip  # noqa: E402
from ccbench.plots.figure_check import (  # noqa: E402
    check_figure,
    colour_meanings,
    empty_panels,
    hidden_series,
    legend_not_drawn,
    mixed_units,
    off_axis,
    squeezed_panels,
)

pytestmark = pytest.mark.usefixtures("close_figures")

BLUE, ORANGE = "#1f66b4", "#e6770b"


def panels(n=2):
    fig, axes = plt.subplots(1, n, squeeze=False)
    return fig, list(axes.flat)


def test_an_empty_panel_is_found():
    fig, (full, empty) = panels()
    full.plot([1, 2], [3, 4], marker="o", label="a")
    empty.axhline(1.0)  # a reference line is not data
    empty.set_title("Allreduce, fp16")
    assert empty_panels(fig) == ["panel 'Allreduce, fp16' is empty"]
    empty.bar([0], [1.0])
    assert empty_panels(fig) == []


def test_a_legend_for_a_marker_or_a_hollowness_not_drawn_is_found():
    fig, (ax, _) = panels()
    ax.plot([1, 2], [1, 2], color=ORANGE, marker="s", label="p2p")  # filled squares
    _.plot([1], [1])
    hollow = Line2D([], [], color=ORANGE, marker="s", markerfacecolor="none")
    diamond = Line2D([], [], color="0.3", marker="D", linestyle="none")
    fig.legend([hollow, diamond], ["p2p compressed (hollow markers)", "bf16"])
    found = legend_not_drawn(fig)
    assert found == [
        "legend 'p2p compressed (hollow markers)': says hollow, but its markers are filled",
        "legend 'bf16': marker 'D' is not drawn",
    ]
    ax.lines[0].set_markerfacecolor("none")
    ax.plot([1], [3], color="k", marker="D")
    assert legend_not_drawn(fig) == []
    fig.legends[0].remove()
    fig.legend([Patch(color="#f2c12e")], ["encode"])  # no bar of that colour
    assert legend_not_drawn(fig) == ["legend 'encode': no bar of its colour #f2c12e is drawn"]


def test_a_series_hidden_under_one_at_the_same_points_is_found():
    fig, (ax, other) = panels()
    other.plot([1], [1])
    ax.set_title("rate")
    ax.plot([4, 8], [0.1, 0.01], color=ORANGE, marker="^", label="p2p compressed, bfp")
    ax.plot([4, 8], [0.1, 0.01], color=BLUE, marker="^", label="collective compressed, bfp")
    assert hidden_series(fig) == [
        "panel 'rate': 'p2p compressed, bfp' is hidden under 'collective compressed, bfp' "
        "(the same points)"
    ]
    # drawn see-through and on top, the one below shows through it
    ax.lines[0].set_markerfacecolor("none")
    ax.lines[0].set_zorder(3)
    assert hidden_series(fig) == []


def test_one_quantity_in_two_units_is_found():
    fig, (a, b) = panels()
    for ax, unit in ((a, "s"), (b, "ms")):
        ax.plot([1, 2], [1, 2])
        ax.set_ylabel(f"Allreduce time ({unit})")
    assert mixed_units(fig) == ["'allreduce time' in ms and s across panels"]
    b.set_ylabel("Allreduce time (s)")
    assert mixed_units(fig) == []


def test_a_series_off_its_axis_is_found():
    fig, (ax, other) = panels()
    other.plot([1], [1])
    ax.set_title("4 ranks")
    ax.plot([1, 2, 3], [10.0, 20.0, 0.5], marker="o", label="floor")
    ax.set_ylim(1, 100)
    assert off_axis(fig) == ["panel '4 ranks': 1 point(s) of 'floor' off the axis"]
    ax.set_ylim(0.4, 100)
    assert off_axis(fig) == []


def test_a_panel_squeezed_by_the_text_beside_it_is_found():
    # two panels in 10 inches; a note of one 150-character line in 10-point type (about
    # 11 inches) beside the second, in a constrained layout, takes the width the panels
    # needed (the main job's page had one). The type is given: other tests set the rc.
    fig, axes = plt.subplots(1, 2, figsize=(10, 3), layout="constrained")
    for ax, title in zip(axes, ("allgather", "reduce-scatter"), strict=True):
        ax.plot([1, 2], [1, 2])
        ax.set_title(title, fontsize=10)
    assert squeezed_panels(fig) == []
    note = "separate launches that point the other way: " + "x" * 106
    (handle,) = axes[1].plot([1], [1], label=note)
    beside = {"loc": "center left", "bbox_to_anchor": (1, 0.5), "fontsize": 10}
    axes[1].legend(handles=[handle], **beside)
    found = squeezed_panels(fig)
    assert found and all("'reduce-scatter'" in f or "'allgather'" in f for f in found)
    assert any("squeezed by the text beside it" in f or "past its edge" in f for f in found)
    # the same note in three short lines leaves the panels their width
    axes[1].get_legend().remove()
    handle.set_label("\n".join([note[:50], note[50:100], note[100:]]))
    axes[1].legend(handles=[handle], **beside)
    assert squeezed_panels(fig) == []


def test_one_colour_meaning_two_things_across_a_page_is_found():
    fig1, (a, _) = panels(1 + 1)
    a.plot([1, 2], [1, 2], color=BLUE, marker="o")
    fig1.legend([Line2D([], [], color=BLUE)], ["collective compressed"])
    fig2, (b, _) = panels()
    b.bar([0], [1.0], color=BLUE)
    fig2.legend([Patch(color=BLUE)], ["encode"])
    assert colour_meanings([("latency", fig1), ("codecs", fig2)]) == [
        "colour #1f66b4 means 2 things: 'collective compressed' (latency); 'encode' (codecs)"
    ]
    # a model of a series in its colour, another codec of it: still one meaning
    fig2.legends[0].remove()
    fig2.legend(
        [Line2D([], [], color=BLUE), Line2D([], [], color=BLUE)],
        ["model: collective compressed, floor", "collective compressed, zfp:rate=8"],
    )
    assert colour_meanings([("latency", fig1), ("codecs", fig2)]) == []


@pytest.fixture(scope="module")
def page(results):
    """Every figure of the fixtures' page, by regime, as `ccbench plot` draws them."""
    from ccbench.plots.data import load

    drawn = []
    for key, subset in load([results]).regimes():
        style = cli.make_style(subset)
        for spec in cli.all_figures():
            if any(not subset.has(k) for k in spec.needs):
                continue
            try:
                drawn += [(f"{f.name}_{key}", f.fig) for f in spec.draw(subset, style)]
            except Skip:
                continue
    yield drawn
    plt.close("all")


def test_every_figure_of_the_fixture_page_passes_every_check(page):
    names = {name for name, _ in page}
    # the figures the issue found at fault are among those checked
    for name in (
        "seed000_breakdown_links",
        "seed000_breakdown_shm",
        "seed000_rate_sensitivity_links",
        "general_ratio_vs_accuracy_links",
        "seed001_block_size_fusion_links",
        "seed001_wire_bytes_links",
        "seed002_iteration_time_links",
    ):
        assert name in names
    assert {name: check_figure(fig) for name, fig in page if check_figure(fig)} == {}
    assert colour_meanings(page) == []


def test_the_advice_map_colours_mean_what_they_mean_on_the_page():
    """Blue is collective-level, orange point-to-point, black the library, grey the ring,
    as on every figure; a variant's further codecs are lighter shades, none alike."""
    from matplotlib.colors import to_hex

    from ccbench.collectives import compression_model as cm
    from ccbench.plots.advise_map import option_label, page_colours

    def codec(spec, ratio):
        return cm.CodecRates(spec, ratio, 1e9, 1e9, 5e8)

    options = [
        cm.Option(cm.P2P, codec("bfp:rate=4", 8)),
        cm.Option(cm.LIBRARY),
        cm.Option(cm.COLL, codec("bfp:rate=4", 8)),
        cm.Option(cm.RING),
        cm.Option(cm.COLL, codec("fp16", 2)),
    ]
    colours = [to_hex(c) for c in page_colours(options)]
    assert colours[1] == "#000000" and colours[3] == "#7f7f7f"
    # fp16 comes first among the page's codecs: it takes the variant's own blue
    assert colours[4] == BLUE and colours[0] == ORANGE
    assert colours[2] not in (BLUE, "#ffffff") and len(set(colours)) == len(colours)
    assert option_label(options[2]) == "collective compressed, bfp:rate=4"
    assert option_label(options[1]) == "library (MPI)"
    # only the uncompressed options (nothing compressed measured): one colour each
    plain = [to_hex(c) for c in page_colours([cm.Option(cm.LIBRARY), cm.Option(cm.RING)])]
    assert plain == ["#000000", "#7f7f7f"]


def test_the_breakdown_says_only_what_it_draws(tmp_path, style):
    """No p2p rows: the bars are named 'MPI, coll'; shared memory has no floor: no tick
    is described; the reproduction's codecs come first, fp16 among them."""
    from ccbench.plots.data import load
    from tests.plot_benchmark_rows import seed000_rows
    from tests.plot_fixtures import draw, write

    rows = [
        r
        for r in seed000_rows([1 << 16, 1 << 20], ranks=2, link=0)
        if r["variant"] != "p2p_compressed"
    ]
    (figure,) = draw("seed000_breakdown", load([write(tmp_path / "h.csv", rows)]), style)
    axes = [ax for ax in figure.fig.axes if ax.get_visible()]
    assert {ax.get_xlabel() for ax in axes} == {"Message size (bytes); bars: MPI, coll"}
    assert [ax.get_title() for ax in axes[:3]] == [
        "Allgather, fp16",
        "Allgather, bfp:rate=8",
        "Allgather, zfp:rate=8",
    ]
    assert "tick" not in figure.caption and "point-to-point" not in figure.caption
    assert check_figure(figure.fig) == []

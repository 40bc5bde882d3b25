"""What a single figure marks: the style (byte labels, a glyph for every codec and
rate), a point or bar measured below its floor flagged in red and named in the caption,
a lossless codec's caption saying only what its points show, whole-number step ticks,
and a single point drawn as a point."""

from __future__ import annotations

import pytest

from ccbench.plots.data import load
from ccbench.plots.style import Style, format_bytes
from tests.plot_benchmark_rows import modelled_row, seed000_rows
from tests.plot_fixtures import draw, write

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("close_figures")]


def test_byte_labels():
    assert [format_bytes(v) for v in (1, 512, 1024, 1536, 1 << 20, 1 << 30)] == [
        "1",
        "512",
        "1K",
        "1.5K",
        "1M",
        "1G",
    ]


def test_style_gives_every_codec_and_rate_a_glyph_of_its_own():
    codecs = [
        "zfp:rate=8",
        "zfp:rate=4",
        "zfp:rate=16",
        "bfp:rate=4",
        "bfp:rate=8",
        "bfp:rate=16",
        "fp16",
        "weird:x=1",
    ]
    style = Style(codecs=codecs)
    glyphs = [style.marker(c)["marker"] for c in [*codecs, "none"]]
    assert len(set(glyphs)) == len(glyphs)  # 9 codecs, 9 glyphs
    assert {style.marker(c)["fillstyle"] for c in codecs} == {"full"}  # hollow is p2p's
    # rate 8 keeps the family's marker (CODEC_MARKERS: bfp "^", zfp "v") in any report
    assert style.marker("bfp:rate=8")["marker"] == "^"
    assert Style(codecs=["zfp:rate=8"]).marker("zfp:rate=8")["marker"] == "v"
    assert style.marker("fp16")["marker"] == "s"
    assert style.marker("weird:x=1") == Style(codecs=["weird:x=1"]).marker("weird:x=1")


def test_a_point_below_its_lower_bound_is_flagged(tmp_path, style):
    """The dashed model is a lower bound; a measured point under it (here a time halved
    by hand) is marked with a red x and named in the caption."""
    rows = seed000_rows([1 << 20, 1 << 22], ranks=4, link=1.0)
    for row in rows:
        row["link_ceiling_gbps"], row["link_burst_bytes"] = 1.0, 125000
        if (row["variant"], row["codec"], row["size_bytes"]) == (
            "coll_compressed",
            "fp16",
            1 << 22,
        ):
            row["avg_us"] = 0.2 * row["wire_bytes_per_rank"] * 8 / 1e3
    write(tmp_path / "rows.csv", rows)
    figures = draw("seed000_allgather_latency", load([tmp_path]), style)
    caption = figures[0].caption
    assert "1 point(s) (red x) measured BELOW their floor" in caption
    crosses = [
        line for ax in figures[0].fig.axes for line in ax.get_lines() if line.get_marker() == "x"
    ]
    assert len(crosses) == 1 and len(crosses[0].get_xdata()) == 1


def test_a_bar_below_its_floor_is_marked_red_with_the_reason(tmp_path, style):
    """The breakdown's tick is the one floor (plots/base.py floor_us); a collective-level
    call measured under it (here by hand: 1 MB on the wire past a 125 kB burst at
    0.95 Gbit/s plus 3 steps of 200 us is 7,968 us; the call took 7,000) gets a red tick
    and a red x, and the caption names it and says why it matters."""
    rows = []
    for size, call in ((1 << 20, 7000.0), (1 << 22, 36000.0)):
        rows.append(
            modelled_row(
                "run-a", "baseline", "mpi", "reduce_scatter", "none", 4, size, 40000.0, 1.0
            )
        )
        rows.append(
            modelled_row(
                "run-a",
                "coll_compressed",
                "ring",
                "reduce_scatter",
                "bfp:rate=8",
                4,
                size,
                call,
                1.0,
                wire_bytes_per_rank=1_000_000 * (size >> 20),
                call_us=call,
                encode_us=0.1 * call,
                decode_us=0.1 * call,
                reduce_us=0.1 * call,
                wait_us=0.6 * call,
                idle_us=0.1 * call,
                codec_floor_us=1000.0,
                link_ceiling_gbps=0.95,
                link_burst_bytes=125000,
                link_step_us=200.0,
            )
        )
    write(tmp_path / "rows.csv", rows)
    (figure,) = draw("seed000_breakdown", load([tmp_path]), style)
    assert (
        "1 call(s) (Reduce-Scatter bfp:rate=8 at 1M; red tick and x) measured BELOW "
        "their floor" in figure.caption
    ), figure.caption
    red = [
        line for ax in figure.fig.axes for line in ax.get_lines() if line.get_color() == "#c0392b"
    ]
    assert len(red) == 2 and {line.get_marker() for line in red} == {"x", "None"}
    # the black tick of the 4 MiB bar, over MPI's 40,000 us, by hand:
    # (4e6 - 125e3) x 8 / 0.95e3 + 600 = 33,231.6 us
    ticks = [
        line
        for ax in figure.fig.axes
        for line in ax.get_lines()
        if line.get_color() == "black" and line.get_linestyle() == "-"
    ]
    assert [y * 40000.0 for line in ticks for y in line.get_ydata()] == pytest.approx(
        [(4e6 - 125e3) * 8 / 0.95e3 + 600] * 2
    )


def test_a_lossless_codecs_caption_says_only_what_its_points_show(tmp_path, style):
    """zstd's allgather is exact; its reduce-scatter carries the float32 sums' rounding
    (2.8e-8): the caption says exactly 0 for the one and names the other's error."""
    rows = [
        dict(
            r,
            codec="zstd",
            compression_ratio=1.19,
            rel_l2_err=0.0 if r["collective"] == "allgather" else 2.8e-8,
        )
        for r in seed000_rows([1 << 20], ranks=2, link=0)
        if r["variant"] == "coll_compressed"
        and r["codec"] == "fp16"
        and r["collective"] in ("allgather", "reduce_scatter")
    ]
    write(tmp_path / "r.csv", rows)
    (figure,) = draw("general_ratio_vs_accuracy", load([tmp_path]), Style(codecs=["zstd"]))
    assert (
        "zstd (lossless): error exactly 0 in the Allgather, drawn on the bottom edge"
        in figure.caption
    )
    assert (
        "zstd (lossless) in the Reduce-Scatter: an error of 2.8e-08 or more, the "
        "float32 sums' order of addition" in figure.caption
    )
    assert "exactly 0 in the Allgather, Reduce-Scatter" not in figure.caption


def test_step_axes_have_whole_number_ticks(data, style):
    (figure,) = draw("seed000_training_loss", data, style)
    for ax in figure.fig.axes:
        if not ax.get_visible():
            continue
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_a_single_point_is_drawn_as_a_point():
    import matplotlib.pyplot as plt
    import pandas as pd

    from ccbench.plots.base import draw_series

    fig, ax = plt.subplots()
    one = pd.DataFrame({"size_bytes": [1024], "v": [3.0]})
    line, _ = draw_series(ax, one, "size_bytes", "v", color="k")
    assert line.get_linestyle() == "None" and line.get_marker() == "o"
    two = pd.DataFrame({"size_bytes": [1024, 2048], "v": [3.0, 4.0]})
    line, _ = draw_series(ax, two, "size_bytes", "v", color="k", marker="s")
    assert line.get_linestyle() == "-" and line.get_marker() == "s"
    plt.close(fig)

"""Plotting stage: every figure renders from small CSV fixtures built here, with the
right axes, labels and series; missing data skips only the figures that need it; bad
CSVs are named and do not stop the other figures; output is byte-for-byte repeatable.

The fixtures follow the producers' schemas (benchmarks.results.COMMON_COLUMNS plus the
variant columns) with timings from a simple link-bound model, so the figures look like
real runs and the numbers are known in advance. Every fixture row belongs to one sweep
(its sweep_id column, or for files without one the JSON sidecar the producers write);
tests of several runs build their own.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from ccbench.benchmarks.results import MGWFBP_COLUMNS as SIMULATE_COLUMNS
from ccbench.benchmarks.training import COLUMNS as TRAINING_COLUMNS
from ccbench.plots import cli, compression
from ccbench.plots.data import load
from ccbench.plots.style import Style, place_notes
from tests.plot_benchmark_rows import (
    CODEC_US_PER_BYTE,
    SWEEP,
    US_PER_BYTE_1G,
    codec_rows,
    seed000_rows,
    seed001_rows,
)
from tests.plot_fixtures import draw, legend_labels, note_lines, sidecar, write
from tests.plot_training_rows import seed002_rows, training_rows

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("close_figures")]


# ---------------------------------------------------------------- loading


def test_every_kind_is_recognised_by_its_columns(data):
    kinds = {r.path.name: r.kind for r in data.files}
    assert kinds == {
        "seed000_link.csv": "harness",
        "seed000_shm.csv": "harness",
        "sparse.csv": "harness",
        "resnet50.csv": "profile",
        "bert.csv": "profile",
        "costfit.csv": "costfit",
        "mgwfbp.csv": "mgwfbp",
        "simulate.csv": "mgwfbp",
        "codecs.csv": "codec",
        "training.csv": "training",
        "training-mgwfbp.csv": "training",
        "compare.csv": "compare",
        "replay.csv": "replay",
    }
    assert not data.bad_files
    # one run: rows name their sweep, or their launch's entry in the JSON sidecar does
    assert [r.label for r in data.runs()] == [f"sweep {SWEEP}"]


def test_kind_does_not_depend_on_file_name(tmp_path):
    write(tmp_path / "profile.csv", codec_rows())  # a codec CSV under a misleading name
    loaded = load([tmp_path])
    assert loaded.files[0].kind == "codec"


def test_repeated_point_keeps_latest_row_of_the_run_and_says_so(tmp_path):
    old = seed000_rows([1 << 20], ranks=2, link=0, run="old")
    new = seed000_rows([1 << 20], ranks=2, link=0, run="new")  # the same sweep, resumed
    for row in new:
        row["timestamp"] = "2025-02-01T00:00:00"
        row["avg_us"] = float(row["avg_us"]) * 2
    write(tmp_path / "a.csv", new)
    write(tmp_path / "b.csv", old)  # read second, but older
    loaded = load([tmp_path])
    frame = loaded.get("harness")
    assert len(frame) == len(new)
    assert set(frame["run_id"]) == {"new"}
    assert any("later in the same run; the latest is drawn" in note for note in loaded.notes)


def two_sweeps(root: Path) -> tuple[str, str]:
    """The issue's case: the baseline from one sweep, compressed rows from another."""
    first, second = "ci-20250101T000000-aaaaaa", "local-20250102T000000-bbbbbb"
    rows_a = seed000_rows([1 << 20], ranks=2, link=0, run="r1", sweep=first)
    rows_b = seed000_rows([1 << 20], ranks=2, link=0, run="r2", sweep=second)
    for row in rows_b:
        row["avg_us"] = float(row["avg_us"]) * 5  # a slower machine
    write(root / "ci" / "base.csv", [r for r in rows_a if r["variant"] == "baseline"])
    write(root / "local" / "coll.csv", [r for r in rows_b if r["variant"] != "baseline"])
    return first, second


def test_several_runs_of_distinct_points_are_drawn_together_never_paired(tmp_path, capsys, style):
    """Three hand runs of three variants are one figure, each curve named with its run;
    the note that pairs collective level with the baseline refuses rows of two runs."""
    first, second = two_sweeps(tmp_path / "results")
    out = tmp_path / "out"
    status = cli.main(
        [
            str(tmp_path / "results"),
            "-o",
            str(out),
            "--format",
            "png",
            "--only",
            "allgather",
            "--dpi",
            "40",
        ]
    )
    printed = capsys.readouterr().out
    assert status == 0 and "2 runs drawn together" in printed
    index = (out / "index.html").read_text()
    assert f"sweep {first}" in index and f"sweep {second}" in index
    (figure,) = draw("seed000_allgather_latency", load([tmp_path / "results"]), style)
    assert f"baseline mpi: sweep {first}" in figure.caption
    assert f"coll_compressed ring fp16: sweep {second}" in figure.caption
    notes = [
        t.get_text()
        for ax in figure.fig.axes
        for legend in [ax.get_legend()]
        if legend is not None
        for t in legend.get_texts()
    ]
    codec_notes = [n for n in notes if n.startswith("fp16:")]
    # MPI is the other run's: not paired; p2p is the same run's: paired
    assert codec_notes == ["fp16: MPI is another run's, not paired; 0% [-7, +7] vs p2p"]


def test_several_runs_of_the_same_points_are_refused_with_one_line(tmp_path, capsys):
    root = tmp_path / "results"
    write(root / "a.csv", seed000_rows([1 << 20], ranks=2, link=0, run="r1", sweep="s-a"))
    write(root / "b.csv", seed000_rows([1 << 20], ranks=2, link=0, run="r2", sweep="s-b"))
    status = cli.main([str(root), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert err[0].startswith(
        "ccbench plot: the inputs hold 2 runs that measured the same "
        "point (micro-benchmark (harness) rows: "
    )
    assert "--run ID" in err[0] and "--each-run" in err[0]
    assert not (tmp_path / "out").exists()


def test_run_draws_only_that_runs_rows(tmp_path, style):
    first, _ = two_sweeps(tmp_path / "results")
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                str(tmp_path / "results"),
                "-o",
                str(out),
                "--run",
                "ci-2025",
                "--format",
                "png",
                "--only",
                "allgather",
                "--dpi",
                "40",
            ]
        )
        == 0
    )
    index = (out / "index.html").read_text()
    assert f"comes from one run: <b>sweep {first}</b>" in index
    assert re.search(
        r"local/coll.csv</code></td><td class='note'>[^<]*another run&#x27;s, "
        r"not drawn here",
        index,
    )
    assert not re.search(r"ci/base.csv</code></td><td class='note'>", index)
    # the baseline alone: no collective-level series, so no ratio note
    data = load([tmp_path / "results"]).only(f"sweep {first}")
    (figure,) = draw("seed000_allgather_latency", data, style)
    assert set(data.get("harness")["variant"]) == {"baseline"}
    assert not figure.fig.axes[0].get_legend()


def test_run_latest_is_the_run_with_the_newest_row(tmp_path):
    first, second = two_sweeps(tmp_path / "results")
    for path in (tmp_path / "results" / "local" / "coll.csv",):  # the second sweep: older
        path.write_text(path.read_text().replace("2025-01-01T00:00:00", "2024-12-31T00:00:00"))
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                str(tmp_path / "results"),
                "-o",
                str(out),
                "--run",
                "latest",
                "--format",
                "png",
                "--only",
                "allgather",
                "--dpi",
                "40",
            ]
        )
        == 0
    )
    assert f"<b>sweep {first}</b>" in (out / "index.html").read_text()


def test_run_that_matches_nothing_is_a_usage_error(tmp_path, capsys):
    two_sweeps(tmp_path / "results")
    assert (
        cli.main([str(tmp_path / "results"), "-o", str(tmp_path / "out"), "--run", "nightly"]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ccbench plot: --run nightly matches no run")


def test_each_run_is_drawn_apart(tmp_path):
    first, second = two_sweeps(tmp_path / "results")
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                str(tmp_path / "results"),
                "-o",
                str(out),
                "--each-run",
                "--format",
                "png",
                "--only",
                "allgather",
                "--dpi",
                "40",
            ]
        )
        == 0
    )
    top = (out / "index.html").read_text()
    for run in (first, second):
        assert f"href='{run}/index.html'" in top
        assert f"<b>sweep {run}</b>" in (out / run / "index.html").read_text()
        assert (out / run / "seed000_allgather_latency.png").exists()
    assert not (out / "seed000_allgather_latency.png").exists()


def test_training_rows_take_their_sweep_from_the_sidecar(tmp_path):
    path = write(tmp_path / "t.csv", training_rows(steps=6), TRAINING_COLUMNS)
    assert [r.label for r in load([path]).runs()] == [
        "run baseline",
        "run coll_compressed",
        "run p2p_compressed",
    ]  # no sidecar: 3 runs
    sidecar(path, {"baseline": SWEEP, "p2p_compressed": SWEEP, "coll_compressed": SWEEP})
    assert [r.label for r in load([path]).runs()] == [f"sweep {SWEEP}"]


def test_mixed_code_versions_are_flagged_in_the_caption(tmp_path, style):
    rows = seed000_rows([1 << 16, 1 << 20], ranks=2, link=0)
    for row in rows:
        if row["size_bytes"] == 1 << 20:
            row["git_sha"] = "def456"
    write(tmp_path / "a.csv", rows)
    (figure,) = draw("seed000_allgather_latency", load([tmp_path]), style)
    assert "Mixed data: 2 code versions." in figure.caption


# ---------------------------------------------------------------- figures


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_latency_figure_series_axes_and_model(collective, data, style):
    (figure,) = draw(f"seed000_{collective}_latency", data, style)
    # one legend entry per variant (colour) and per codec (marker), not per combination
    labels = legend_labels(figure.fig)
    assert labels == [
        "baseline (mpi)",
        "baseline (ring)",
        "p2p compressed (hollow markers)",
        "collective compressed",
        "uncompressed",
        "fp16",
        "bfp:rate=8",
        "zfp:rate=16",
        "zfp:rate=8",
        "model: the floor",
    ] + (["interleaved rounds (ccbench compare), mean"] if collective == "allgather" else [])
    # (the fixture's compare rows measured Allgather only: their rounds are drawn there)
    # at most four codecs: the reproduction sweep's three first, the rest named
    assert "left out for legibility: zfp:rate=4" in figure.caption
    axes = figure.fig.axes
    assert [ax.get_title() for ax in axes] == ["4 ranks, 1 Gbit/s links", "2 ranks, shared memory"]
    ax = axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "Message size (bytes)"
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert "64K" in ticks and "16M" in ticks
    assert ax.get_ylabel().startswith("Latency (")
    # measured lines: 2 baselines + 4 codecs x 2 compressed variants; model lines dashed
    solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(solid) == 10 and len(dashed) == 1 + 4
    assert {"p2p compressed, fp16", "collective compressed, zfp:rate=8"} <= {
        ln.get_label() for ln in solid
    }
    # the link-bound model of the baseline at 16M: (n-1) blocks x 8 us/KB
    hops = {"allgather": 3, "reduce_scatter": 3, "allreduce": 6}[collective]
    block = (1 << 24) if collective == "allgather" else (1 << 24) / 4
    expected_us = hops * block * US_PER_BYTE_1G
    base_model = next(ln for ln in dashed if ln.get_color() == "#000000")
    scale = {"us": 1, "ms": 1e3, "s": 1e6}[ax.get_ylabel().split("(")[1][:-1].replace("µs", "us")]
    assert base_model.get_ydata()[-1] * scale == pytest.approx(expected_us, rel=1e-9)
    # allgather's fp16 claims were compared in interleaved rounds, the rest not
    source = "see each line" if collective == "allgather" else "separate launches"
    assert note_lines(ax)[0] == f"collective-level latency change at 16M [{source}]"
    assert "Error bars: the 95% t interval of the mean" in figure.caption
    # the caption quotes the paper's numbers for its own collective only
    quoted = {
        "allgather": ("83.6%", "30.3%"),
        "reduce_scatter": ("88.1%", "40.6%"),
        "allreduce": (),
    }[collective]
    for number in ("83.6%", "30.3%", "88.1%", "40.6%"):
        assert (number in figure.caption) == (number in quoted), number


def test_notes_sit_outside_the_axes(data, style):
    (figure,) = draw("seed000_allgather_latency", data, style)
    fig = figure.fig
    place_notes(fig)  # as saving does
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        note = ax.get_legend().get_window_extent(renderer)
        decorations = ax.xaxis.get_tightbbox(renderer)
        assert note.y1 <= ax.get_window_extent(renderer).y0  # below the data area
        assert note.y1 <= decorations.y0 + 0.5  # and below the tick labels and x label


def test_reduction_numbers_match_the_fixture_model(data):
    frame = data.get("harness").query(
        "collective == 'allgather' and ranks == 4 and variant != 'sparse_streaming'"
    )
    entries = compression.reductions(compression.drawn_points(frame))
    fp16 = next(e for e in entries if e["codec"] == "fp16")
    size, upb = 1 << 24, US_PER_BYTE_1G
    base = 20 + 3 * size * upb
    coll = 20 + 3 * size * upb / 2 + 2 * size * CODEC_US_PER_BYTE["fp16"]
    p2p = 20 + 3 * size * upb / 2 + 2 * 3 * size * CODEC_US_PER_BYTE["fp16"]
    assert fp16["size"] == size and fp16["baseline"] == "MPI"
    # the fixture's intervals are [0.97, 1.04] x the mean: the bounds follow by hand
    assert fp16["vs_baseline"]["ratio"] == pytest.approx(
        (coll / base, 0.97 * coll / (1.04 * base), 1.04 * coll / (0.97 * base))
    )
    assert fp16["vs_p2p"]["ratio"] == pytest.approx(
        (coll / p2p, 0.97 * coll / (1.04 * p2p), 1.04 * coll / (0.97 * p2p))
    )


def test_rate_sensitivity(data, style):
    (figure,) = draw("seed000_rate_sensitivity", data, style)
    axes = figure.fig.axes
    assert len(axes) == 6  # latency and error for three collectives
    assert axes[0].get_xlabel() == "Rate (bits per value)"
    assert axes[3].get_ylabel() == "Max relative error" and axes[3].get_yscale() == "log"
    labels = legend_labels(figure.fig)
    assert "collective compressed, zfp" in labels and "uncompressed baseline" in labels
    zfp = next(ln for ln in axes[0].get_lines() if ln.get_label() == "collective compressed, zfp")
    assert list(zfp.get_xdata()) == [4.0, 8.0, 16.0]
    assert axes[0].collections  # the error bars


def test_mgwfbp_training_figure(data, style):
    (fig,) = draw("seed002_training_strategies", data, style)
    ax = fig.fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["wfbp", "ddp:25MB", "mgwfbp"]
    assert len(ax.collections) == 3  # an interval on each measured bar
    assert "model: planner's prediction (hatched)" in legend_labels(fig.fig)
    assert "*" not in "".join(t.get_text() for t in ax.texts)  # no unqualified "fastest"


def test_training_figures(data, style):
    (loss,) = draw("seed000_training_loss", data, style)
    top, _, diff, _ = loss.fig.axes  # two settings: loss above, difference below
    assert top.get_ylabel() == "Training loss" and diff.get_xlabel() == "Step"
    assert len(top.get_lines()) == 3 and len(top.get_lines()[0].get_xdata()) == 30
    assert diff.get_title() == "minus baseline (mpi)"
    # the runs that coincide above are apart below: compressed runs 0.01 over the baseline
    below = [
        ln
        for ln in diff.get_lines()
        if not ln.get_label().startswith("_") and len(ln.get_xdata()) == 30
    ]
    assert len(below) == 2 and all(np.allclose(ln.get_ydata(), 0.01) for ln in below)
    assert set(legend_labels(loss.fig)) >= {"baseline (mpi)", "collective compressed, fp16"}
    (steps,) = draw("seed000_training_step_time", data, style)
    ax = steps.fig.axes[0]
    assert ax.get_ylabel() == "Time per step (ms)"
    assert len(ax.collections) == 3  # error bars on the three runs
    assert "95% t interval of the mean over the timed steps" in steps.caption


def test_sparse_figures(data, style):
    (sparsity,) = draw("seed001_time_vs_sparsity", data, style)
    ax = sparsity.fig.axes[0]
    assert ax.get_xlabel() == "Density (share of non-zero blocks; log scale)"
    assert ax.get_xscale() == "log" and ax.get_xlim()[0] > ax.get_xlim()[1]  # sparser: right
    assert {"omnireduce", "dense", "allgather-sparse"} <= set(legend_labels(sparsity.fig))
    omni = next(ln for ln in ax.get_lines() if ln.get_label() == "omnireduce")
    assert list(omni.get_xdata()) == pytest.approx([0.02, 0.1, 0.4, 1.0])
    # ticks at the paper's nine densities (and none else: the fixture's are among them)
    assert sorted(ax.get_xticks()) == pytest.approx(
        [0.01, 0.02, 0.04, 0.08, 0.1, 0.2, 0.4, 0.8, 1.0]
    )
    assert "Not measured here: 0.8, 0.2, 0.08, 0.04, 0.01" in sparsity.caption
    assert "block size 256" in sparsity.caption and "fusion 1" in sparsity.caption
    (workers,) = draw("seed001_time_vs_workers", data, style)
    assert workers.fig.axes[0].get_xlabel() == "Workers (ranks)"
    assert [t.get_text() for t in workers.fig.axes[0].get_xticklabels()] == ["2", "4"]
    (blocks,) = draw("seed001_block_size_fusion", data, style)
    assert set(legend_labels(blocks.fig)) == {"omnireduce, no fusion", "omnireduce, fusion 8"}
    (wire,) = draw("seed001_wire_bytes", data, style)
    assert "model: OmniReduce's minimum (from the inputs' block bitmaps)" in legend_labels(wire.fig)
    assert wire.fig.axes[0].get_ylabel() == "Wire bytes per rank (MiB)"


def test_the_value_held_fixed_is_the_reproduction_setups(tmp_path, style):
    """Where rows were run with several fusions, the figure holds the reproduction's
    (papers.OMNIREDUCE_SETUP: 1024 blocks per message), though fusion 1 rows are as many."""
    default = 1024
    rows = [r for r in seed001_rows(ranks_list=(2,)) if r["block_size"] == 256]
    more = [
        dict(r, fusion=default, avg_us=float(r["avg_us"]) / 2) for r in rows if r["fusion"] == 1
    ]
    write(tmp_path / "s.csv", rows + more)
    (figure,) = draw("seed001_time_vs_sparsity", load([tmp_path]), style)
    assert f"fusion {default}" in figure.caption


def test_mgwfbp_figures(data, style):
    profiles = draw("seed002_profile", data, style)
    assert sorted(f.name for f in profiles) == ["seed002_profile_bert", "seed002_profile_resnet50"]
    size_ax, time_ax = profiles[1].fig.axes
    assert len(size_ax.patches) == 24 and time_ax.get_ylabel() == "Backward time (µs)"
    assert size_ax.get_legend() is None and time_ax.get_legend() is None  # nothing on bars
    (fit,) = draw("seed002_allreduce_fit", data, style)
    # the fit CSV carries no link rate: nothing else is borrowed to supply one
    assert [ax.get_title() for ax in fit.fig.axes] == [
        "2 ranks, shared memory, mpi (resnet50 sizes)",
        "4 ranks, shared memory, mpi (resnet50 sizes)",
    ]
    line = next(ln for ln in fit.fig.axes[1].get_lines() if ln.get_label().startswith("model"))
    assert line.get_linestyle() == "--"
    x, y = line.get_xdata(), line.get_ydata()
    unit = {"µs": 1, "ms": 1e3}[fit.fig.axes[1].get_ylabel().split("(")[1][:-1]]
    assert y[-1] * unit == pytest.approx(90 + 4e-3 * x[-1])
    (iteration,) = draw("seed002_iteration_time", data, style)
    ax = iteration.fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["bert", "resnet50"]
    # points, not bars from zero: models x strategies, measured (filled) and predicted
    filled = [
        ln
        for ln in ax.get_lines()
        if ln.get_marker() == "o" and ln.get_markerfacecolor() != "white"
    ]
    hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "white"]
    assert len(filled) == len(hollow) == 2 * 6 and not ax.patches
    assert ax.get_ylim()[0] > 0  # the axis spans the values, so a few percent show
    assert "model: planner's prediction (hollow)" in legend_labels(iteration.fig)
    (scaling,) = draw("seed002_scaling_efficiency", data, style)
    ax = scaling.fig.axes[0]
    assert ax.get_ylabel() == "Scaling efficiency (simulated)" and ax.get_ylim()[1] <= 1.1
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "2048"
    assert all(ln.get_linestyle() == "--" for ln in ax.get_lines())  # a model throughout


def test_fit_without_fit_csv_is_fitted_to_the_harness_points_it_is_drawn_with(tmp_path, style):
    """The line is fitted to the points drawn with it (the fixture's MPI Allreduce, exactly
    a line: 20 us + 6/4 size x 8 ns/B, so the fit is that line and R² is 1); the MG-WFBP
    run's own alpha and beta (90 us, 4 ns/B) are only quoted in the note."""
    _, iteration, _ = seed002_rows()
    write(tmp_path / "mgwfbp.csv", iteration, SIMULATE_COLUMNS)
    write(tmp_path / "base.csv", seed000_rows([1 << 16, 1 << 20, 1 << 24], ranks=4, link=1.0))
    (fit,) = draw("seed002_allreduce_fit", load([tmp_path]), style)
    assert [ax.get_title() for ax in fit.fig.axes] == [
        "4 ranks, 1 Gbit/s links, mpi (at the bert run's ranks)",
        "4 ranks, 1 Gbit/s links, mpi (at the resnet50 run's ranks)",
    ]
    ax = fit.fig.axes[1]
    points = next(ln for ln in ax.get_lines() if ln.get_label().startswith("baseline MPI"))
    unit = {"µs": 1, "ms": 1e3, "s": 1e6}[ax.get_ylabel().split("(")[1][:-1]]
    expected = 20 + 6 * (1 << 24) / 4 * US_PER_BYTE_1G  # the fixture's MPI allreduce
    assert points.get_ydata()[-1] * unit == pytest.approx(expected)
    line = next(ln for ln in ax.get_lines() if ln.get_label().startswith("model"))
    assert line.get_ydata()[-1] * unit == pytest.approx(expected)
    note = note_lines(ax)
    assert (
        note[0] == f"alpha = 20.0 µs, beta = {1.5 * US_PER_BYTE_1G * 1e3:.4g} µs/KB "
        f"({8e-3 / (1.5 * US_PER_BYTE_1G):.2f} Gbit/s)"
    )
    assert note[1] == "R² = 1.0000 (log times) against the points drawn"
    assert note[2] == "resnet50 run's own fit: alpha = 90.0 µs, beta = 4 µs/KB"
    assert "No fit CSV was given" in fit.caption


def test_general_figures(data, style):
    (busbw,) = draw("general_busbw", data, style)
    axes = busbw.fig.axes
    assert len(axes) == 2 * 3  # two (ranks, link) settings x three collectives
    assert [ax.get_title() for ax in axes[:3]] == ["Allgather", "Reduce-Scatter", "Allreduce"]
    assert axes[0].get_ylabel() == "4 ranks, 1 Gbit/s links\nBus bandwidth (GB/s)"
    assert axes[3].get_ylabel() == "2 ranks, shared memory\nBus bandwidth (GB/s)"
    assert all(ax.get_ylabel() == "Bus bandwidth (GB/s)" for ax in axes[1:3] + axes[4:])
    label = "model: link rate (ceiling)"
    ceiling = [ln for ln in axes[0].get_lines() if ln.get_label() == label]
    assert len(ceiling) == 1 and ceiling[0].get_ydata()[0] == pytest.approx(1 / 8)
    assert ceiling[0].get_linestyle() == "--"
    assert not any(ln.get_label() == label for ln in axes[3].get_lines())
    (codecs,) = draw("general_codec_throughput", data, style)
    ax = codecs.fig.axes[0]
    assert ax.get_title() == "grad:lm-small data" and ax.get_xscale() == "linear"
    # rows of version 1 ran before the fused kernels: the reference kernels, named
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "fp16 [reference] (2x)",
        "bf16 [reference] (1.3x)",
        "bfp:rate=8 [reference] (4x)",
        "zfp:rate=8 [reference] (4x)",
        "zstd (lossless) [reference] (1.3x)",
    ]
    assert len(ax.patches) == 2 * 5  # encode and decode bars
    assert "plain copy" in legend_labels(codecs.fig)


def test_ratio_vs_accuracy_is_skipped_without_its_columns(tmp_path, capsys):
    rows = seed000_rows([1 << 16], ranks=2, link=0)
    columns = [c for c in rows[0] if c not in ("data", "rel_l2_err", "psnr_db")]
    write(tmp_path / "r.csv", rows, columns)
    assert (
        cli.main(
            [
                str(tmp_path / "r.csv"),
                "-o",
                str(tmp_path / "out"),
                "--format",
                "png",
                "--only",
                "ratio_vs_accuracy",
            ]
        )
        == 0
    )
    assert (
        "skipped [general] Compression ratio against accuracy on real gradients: the "
        "harness rows carry no data kind and accuracy columns" in capsys.readouterr().out
    )
    assert (
        "Not drawn: <b>Compression ratio against accuracy on real gradients</b>"
        in (tmp_path / "out" / "index.html").read_text()
    )


def test_lossless_codecs_say_so_in_legends(tmp_path, style):
    rows = [
        r
        for r in seed000_rows([1 << 16, 1 << 20], ranks=2, link=0)
        if r["codec"] in ("none", "fp16")
    ]
    rows += [
        dict(r, codec="zstd", compression_ratio=1.1)
        for r in rows
        if r["variant"] == "coll_compressed"
    ]
    write(tmp_path / "r.csv", rows)
    (figure,) = draw("seed000_allgather_latency", load([tmp_path]), Style(codecs=["zstd"]))
    assert "zstd (lossless)" in legend_labels(figure.fig)
    assert "fp16 (lossless)" not in legend_labels(figure.fig)

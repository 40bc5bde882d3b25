"""Every annotation a figure prints, and every headline number, equals a recomputation
from the CSV it was drawn from.

The recomputations here read the fixture CSVs with the csv module and do the arithmetic
by hand (means, Student t intervals from scipy, ratios of interval ends); they never call
the plotting code's helpers. The fixture (tests/plot_fixtures.py) gives every point an
interval, so each bound is checked, not just each estimate.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer
from scipy import stats

from ccbench.plots import cli
from tests.plot_fixtures import note_lines

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("close_figures")]
ROOT = Path(__file__).resolve().parents[1]


def draw(name: str, data, style):
    spec = next(s for s in cli.all_figures() if s.name == name)
    return spec.draw(data, style)


def read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(row: dict, column: str) -> float:
    value = row.get(column, "")
    return float(value) if value not in ("", None) else math.nan


def t_interval(values) -> tuple[float, float, float]:
    x = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def pct(ratio: float) -> str:
    """Whole percents; a change under 0.5% in tenths; never '-0' or '+0'."""
    text = f"{100 * (ratio - 1):+.0f}"
    if text in ("+0", "-0"):
        text = f"{100 * (ratio - 1):+.1f}"
    return "0" if text in ("+0.0", "-0.0") else text


def change(b: dict, a: dict) -> str:
    """B's latency against A's with the bounds the two intervals allow, by hand."""
    ratio = num(b, "avg_us") / num(a, "avg_us")
    low = num(b, "ci_low_us") / num(a, "ci_high_us")
    high = num(b, "ci_high_us") / num(a, "ci_low_us")
    return f"{pct(ratio)}% [{pct(low)}, {pct(high)}]"


# ---------------------------------------------------------------- seed 000


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_latency_notes_equal_the_csv(collective, results, data, style):
    (figure,) = draw(f"seed000_{collective}_latency", data, style)
    rows = [
        r
        for f in ("seed000_link.csv", "seed000_shm.csv")
        for r in read(results / f)
        if r["collective"] == collective
    ]
    drawn = {
        label.split(", ", 1)[1]
        for ax in figure.fig.axes
        for line in ax.get_lines()
        if (label := line.get_label()).startswith("collective compressed, ")
    }
    for ax, ranks in zip(figure.fig.axes, ("4", "2"), strict=True):
        mine = [r for r in rows if r["ranks"] == ranks]
        base = {
            int(r["size_bytes"]): r
            for r in mine
            if r["variant"] == "baseline" and r["algorithm"] == "mpi"
        }
        # fixture compare rows c1 and c2 measured fp16's allgather claims on the link:
        # B/A 0.3 [0.25, 0.36] against MPI; p2p/coll 1.5 [1.3, 1.7] -> 1/1.5 [1/1.7, 1/1.3]
        compared = collective == "allgather" and ranks == "4"
        expected = []
        for codec in sorted(drawn):
            if compared and codec == "fp16":
                expected.append(
                    "fp16: -70% [-75, -64] vs MPI; -33% [-41, -23] vs p2p (interleaved)"
                )
                continue
            coll = {
                int(r["size_bytes"]): r
                for r in mine
                if r["variant"] == "coll_compressed" and r["codec"] == codec
            }
            p2p = {
                int(r["size_bytes"]): r
                for r in mine
                if r["variant"] == "p2p_compressed" and r["codec"] == codec
            }
            size = max(set(coll) & set(base))
            text = f"{codec}: {change(coll[size], base[size])} vs MPI"
            text += f"; {change(coll[size], p2p[size])} vs p2p"
            expected.append(text + (" (separate)" if compared else ""))
        lines = note_lines(ax)
        top = max(int(r["size_bytes"]) for r in mine)
        source = "see each line" if compared else "separate launches"
        assert lines[0] == f"collective-level latency change at {top >> 20}M [{source}]"
        assert sorted(lines[1:]) == sorted(expected)


def test_latency_error_bars_are_the_rows_intervals(results, data, style):
    (figure,) = draw("seed000_allgather_latency", data, style)
    ax = figure.fig.axes[0]  # 4 ranks, 1 Gbit/s
    scale = {"µs": 1.0, "ms": 1e3, "s": 1e6}[ax.get_ylabel().split("(")[1][:-1]]
    rows = [r for r in read(results / "seed000_link.csv") if r["collective"] == "allgather"]
    for container in ax.containers:
        label = container.get_label()
        variant, _, codec = label.partition(", ")
        want = {
            "baseline (mpi)": ("baseline", "mpi"),
            "baseline (ring)": ("baseline", "ring"),
            "p2p compressed": ("p2p_compressed", None),
            "collective compressed": ("coll_compressed", None),
        }[variant]
        mine = sorted(
            (
                r
                for r in rows
                if r["variant"] == want[0]
                and (want[1] is None or r["algorithm"] == want[1])
                and r["codec"] == (codec or "none")
            ),
            key=lambda r: int(r["size_bytes"]),
        )
        segments = container.lines[2][0].get_segments()
        assert len(segments) == len(mine) > 0, label
        for segment, row in zip(segments, mine, strict=True):
            assert segment[0][0] == pytest.approx(int(row["size_bytes"]))
            low, high = sorted((segment[0][1], segment[1][1]))
            assert low * scale == pytest.approx(num(row, "ci_low_us"), rel=1e-9)
            assert high * scale == pytest.approx(num(row, "ci_high_us"), rel=1e-9)


def training_launches(results) -> dict[str, list[dict]]:
    steps: dict[str, list[dict]] = {}
    for name in ("training.csv", "training-mgwfbp.csv"):
        for row in read(results / name):
            if row["row"] == "step":
                steps.setdefault(row["run_id"], []).append(row)
    return {k: sorted(v, key=lambda r: int(r["step"])) for k, v in steps.items()}


WARMUP, WINDOW = 3, 10  # how the fixture's summary rows were made (tests/plot_training_rows.py)


def test_training_loss_note_equals_the_csv(results, data, style):
    (figure,) = draw("seed000_training_loss", data, style)
    launches = training_launches(results)
    labels = {
        "baseline": "baseline (mpi)",
        "p2p_compressed": "p2p compressed, fp16",
        "coll_compressed": "collective compressed, fp16",
        "mg": "baseline (mpi) [strategies rotated]",
    }
    notes = [line for ax in figure.fig.axes for line in note_lines(ax)]
    for run, label in labels.items():
        # one range of steps for every run drawn together: the last WINDOW steps all ran
        end = min(int(r["step"]) for r in launches[run][-1:])
        losses = [num(r, "loss") for r in launches[run] if end - WINDOW < int(r["step"]) <= end]
        mean, low, high = t_interval(losses)
        assert (
            f"{label}: {mean:.3f} [{low:.3f}, {high:.3f}] (steps {end - WINDOW + 1}-{end})" in notes
        ), notes


def test_loss_notes_of_runs_of_different_lengths_cover_the_same_steps():
    """A run of 32 steps beside runs of 30: every note is over steps 21-30, so the longer
    run is not shown as further trained."""
    import pandas as pd

    from ccbench.plots.steps import Launch
    from ccbench.plots.training_runs import loss_notes

    def launch(steps: int, loss) -> Launch:
        frame = pd.DataFrame(
            {"step": range(1, steps + 1), "loss": [loss(k) for k in range(1, steps + 1)]}
        )
        return Launch(
            key=(),
            setting=(),
            steps=frame,
            summaries=pd.DataFrame(),
            warmup=3,
            window=10,
            inferred=False,
        )

    short, long = launch(30, lambda k: 100.0 - k), launch(32, lambda k: 100.0 - k)
    a, b = loss_notes([short, long], ["a", "b"])[:2]
    # steps 21-30 of 100 - k: mean 74.5, for both
    assert a.startswith("a: 74.500 [") and b.startswith("b: 74.500 [")
    assert a.endswith("(steps 21-30)") and b.endswith("(steps 21-30)")
    # the longer run also gets its summary's number: steps 23-32 of 100 - k, mean 72.5
    (summary,) = loss_notes([short, long], ["a", "b"])[2:]
    assert summary.startswith("  its summary: 72.500 [") and summary.endswith("(steps 23-32)")


def step_interval(rows: list[dict], value=lambda r: num(r, "step_us")):
    return t_interval([value(r) for r in rows if int(r["step"]) > WARMUP])


def test_step_time_note_equals_the_csv(results, data, style):
    (figure,) = draw("seed000_training_step_time", data, style)
    launches = training_launches(results)
    base, p2p, coll = (
        step_interval(launches[k]) for k in ("baseline", "p2p_compressed", "coll_compressed")
    )

    def bounded(b, a):
        return f"{pct(b[0] / a[0])}% [{pct(b[1] / a[2])}, {pct(b[2] / a[1])}]"

    ax = next(ax for ax in figure.fig.axes if ax.get_title().startswith("tiny-lm"))
    assert note_lines(ax) == [
        "collective-level step time change [separate launches]",
        f"fp16: {bounded(coll, base)} vs baseline; {bounded(coll, p2p)} vs p2p",
    ]
    # each bar's error bar: centred on the run's mean, spanning its interval
    scale = 1e3  # ms
    drawn = sorted(
        (
            float(c.lines[0].get_ydata()[0]) * scale,
            *sorted(c.lines[2][0].get_segments()[0][:, 1] * scale),
        )
        for c in ax.containers
        if isinstance(c, ErrorbarContainer)
    )
    assert len(drawn) == 3
    for got, want in zip(drawn, sorted((base, p2p, coll)), strict=True):
        assert got == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- seed 001


def test_sparsity_note_equals_the_csv(results, data, style):
    (figure,) = draw("seed001_time_vs_sparsity", data, style)
    assert "block size 256" in figure.caption and "fusion 1" in figure.caption
    rows = [
        r for r in read(results / "sparse.csv") if r["block_size"] == "256" and r["fusion"] == "1"
    ]
    for ax, ranks in zip(figure.fig.axes, ("2", "4"), strict=True):
        mine = [r for r in rows if r["ranks"] == ranks]
        size = max(int(r["size_bytes"]) for r in mine)
        densities = sorted(
            {float(r["density"]) for r in mine}, key=lambda d: abs(math.log10(d) - math.log10(0.1))
        )
        density = densities[0]

        def at(algorithm, mine=mine, size=size, density=density):
            return next(
                r
                for r in mine
                if r["algorithm"] == algorithm
                and int(r["size_bytes"]) == size
                and float(r["density"]) == density
            )

        if ranks == "4":  # the fixture's compare c4 measured this one: dense/omni 1/0.5
            assert note_lines(ax) == [
                f"OmniReduce over dense at density {density:g}:",
                "speed-up 2.00x [1.67, 2.50] [interleaved]",
            ]
            continue
        omni, dense = at("omnireduce"), at("dense")
        speed = num(dense, "avg_us") / num(omni, "avg_us")
        low = num(dense, "ci_low_us") / num(omni, "ci_high_us")
        high = num(dense, "ci_high_us") / num(omni, "ci_low_us")
        assert note_lines(ax) == [
            f"OmniReduce over dense at density {density:g}:",
            f"speed-up {speed:.2f}x [{low:.2f}, {high:.2f}] [separate launches]",
        ]


def test_wire_note_equals_the_csv(results, data, style):
    (figure,) = draw("seed001_wire_bytes", data, style)
    rows = [
        r
        for r in read(results / "sparse.csv")
        if r["block_size"] == "256" and r["fusion"] == "1" and r["algorithm"] == "omnireduce"
    ]
    for ax, ranks in zip(figure.fig.axes, ("2", "4"), strict=True):
        mine = [r for r in rows if r["ranks"] == ranks]
        over = {
            float(r["density"]): num(r, "wire_bytes_per_rank") / num(r, "wire_min_bytes_per_rank")
            for r in mine
        }
        worst = max(over, key=over.get)
        assert note_lines(ax) == [
            f"OmniReduce: at most {100 * (over[worst] - 1):.1f}% over "
            f"its minimum (at density {worst:g})"
        ]


# ---------------------------------------------------------------- seed 002


def test_fit_note_equals_the_csv(results, data, style):
    (figure,) = draw("seed002_allreduce_fit", data, style)
    rows = read(results / "costfit.csv")
    for ax, ranks in zip(figure.fig.axes, ("2", "4"), strict=True):
        mine = [r for r in rows if r["ranks"] == ranks]
        sizes = np.array([num(r, "size_bytes") for r in mine])
        fitted = np.array([num(r, "fitted_us") for r in mine])
        measured = np.array([num(r, "measured_us") for r in mine])
        (alpha, beta), *_ = np.linalg.lstsq(
            np.column_stack([np.ones_like(sizes), sizes]), fitted, rcond=None
        )
        # R² in log times: the figure's axis is logarithmic
        lm, lf = np.log(measured), np.log(fitted)
        r2 = 1 - ((lm - lf) ** 2).sum() / ((lm - lm.mean()) ** 2).sum()
        assert note_lines(ax) == [
            f"alpha = {alpha:.1f} µs, beta = {beta * 1e3:.4g} µs/KB ({8e-3 / beta:.2f} Gbit/s)",
            f"R² = {r2:.4f} (log times) against the points drawn",
        ]


def test_strategy_labels_equal_the_csv(results, data, style):
    (figure,) = draw("seed002_training_strategies", data, style)
    ax = figure.fig.axes[0]
    rows = training_launches(results)["mg"]
    names = [t.get_text() for t in ax.get_xticklabels()]
    labels = [t.get_text() for t in ax.texts]
    for name, label in zip(names, labels, strict=True):
        mine = [r for r in rows if r["strategy"] == name]
        mean, _, _ = step_interval(mine, lambda r: num(r, "step_us") - num(r, "optimizer_us"))
        predicted = num(mine[0], "predicted_us")
        assert label == f"{100 * (predicted / mean - 1):+.0f}%"


# ---------------------------------------------------------------- general


def test_ratio_vs_accuracy_points_equal_the_csv(results, data, style):
    (figure,) = draw("general_ratio_vs_accuracy", data, style)
    ax = figure.fig.axes[0]  # Allgather, relative L2 error
    rows = [
        r
        for f in ("seed000_link.csv", "seed000_shm.csv")
        for r in read(results / f)
        if r["collective"] == "allgather" and r["data"].startswith("grad:")
    ]
    largest = {}
    for r in rows:
        key = (r["variant"], r["codec"])
        if key not in largest or int(r["size_bytes"]) >= int(largest[key]["size_bytes"]):
            largest[key] = r
    drawn = sorted(
        (float(x), float(y))
        for line in ax.get_lines()
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)
    )
    expected = sorted((num(r, "compression_ratio"), num(r, "rel_l2_err")) for r in largest.values())
    assert len(drawn) == len(expected)
    for got, want in zip(drawn, expected, strict=True):
        assert got == pytest.approx(want)


# ---------------------------------------------------------------- headline table


def test_headlines_are_the_interleaved_comparisons(results, data):
    headlines, notes, problems = cli.collect_headlines(data)
    assert not problems
    table = {(h.claim, h.where.split(", ")[0]): h for h in headlines}
    compare = {(r["compare_id"], r["size_bytes"]): r for r in read(results / "compare.csv")}

    def interval(ratio, low, high):
        return (
            f"{100 * (ratio - 1):+.1f}% (95% interval {100 * (low - 1):+.1f}% to "
            f"{100 * (high - 1):+.1f}%)"
        )

    row = compare[("c1", str(1 << 24))]  # the largest size compared
    h = table[
        ("Allgather latency, collective-level compression vs the uncompressed baseline", "fp16")
    ]
    assert h.measured == interval(num(row, "ratio"), num(row, "ratio_low"), num(row, "ratio_high"))
    assert h.verdict == "faster (B is collective-level)"
    assert h.samples == "6 rounds x 100 iterations"
    assert "ccbench compare c1" in h.where and "size 16M" in h.where
    # written the other way round (A = collective-level): the ratio is inverted
    row = compare[("c2", str(1 << 24))]
    h = table[("Allgather latency, collective-level vs point-to-point compression", "fp16")]
    assert h.measured == interval(
        1 / num(row, "ratio"), 1 / num(row, "ratio_high"), 1 / num(row, "ratio_low")
    )
    assert h.samples == "6 rounds x 8 turns x 80 (A) / 100 (B) iterations"
    assert h.verdict == "faster (B is collective-level)"
    row = compare[("c4", str(1 << 22))]
    h = next(h for h in headlines if h.claim == "OmniReduce allreduce against dense allreduce")
    assert h.measured == (
        f"{1 / num(row, 'ratio'):.2f}x (95% interval "
        f"{1 / num(row, 'ratio_high'):.2f}x to "
        f"{1 / num(row, 'ratio_low'):.2f}x)"
    )
    assert h.where.startswith("density=0.1, size 4M")
    # the lossless codec compresses real gradients 1.3x in the codec rows: left out
    assert not any("zstd" in h.where for h in headlines)
    assert any(
        n.startswith(
            "zstd (lossless) left out of the headline table: its "
            "compression ratio on real gradients is 1.30"
        )
        for n in notes
    )
    # a comparison that matches no claim is not a headline; unmeasured claims say so
    assert not any("ccbench compare c5" in h.where for h in headlines)
    unmeasured = {h.claim for h in headlines if h.verdict == "not measured"}
    assert unmeasured == {
        "Reduce-Scatter latency, collective-level compression vs the uncompressed baseline",
        "Reduce-Scatter latency, collective-level vs point-to-point compression",
        "FSDP training time, collective-level compression vs the baseline",
        "FSDP training time, collective-level vs point-to-point compression",
    }


def test_rotation_headline_pairs_the_strategies_turn_by_turn(results, data):
    headlines, _, _ = cli.collect_headlines(data)
    rows = [r for r in training_launches(results)["mg"] if int(r["step"]) > WARMUP]
    order = ["mgwfbp", "ddp:25MB", "wfbp"]  # the fixture's rotation
    rounds: dict[int, dict] = {}
    for r in rows:
        rounds.setdefault((int(r["step"]) - 1) // 3, {})[r["strategy"]] = num(r, "step_us") - num(
            r, "optimizer_us"
        )
    for other in order[1:]:
        logs = [
            math.log(v["mgwfbp"] / v[other])
            for v in rounds.values()
            if "mgwfbp" in v and other in v
        ]
        mean, low, high = t_interval(logs)
        h = next(h for h in headlines if h.claim.endswith(f": against {other}"))
        assert h.measured == (
            f"{100 * (math.exp(mean) - 1):+.1f}% (95% interval "
            f"{100 * (math.exp(low) - 1):+.1f}% to "
            f"{100 * (math.exp(high) - 1):+.1f}%)"
        )
        # the interval's half-width in log space, against the 3% target: over it, the
        # run's steps ran out before the interval was narrow enough, and it says so
        width = 100 * (math.exp((high - low) / 2) - 1)
        cap = (
            f"; round cap reached (the run's steps): interval +-{width:.0f}%, wider than "
            "the +-3% target"
            if width > 3
            else ""
        )
        assert h.samples == f"{len(logs)} rounds x 1 step each{cap}"
        verdict = (
            "faster"
            if math.exp(high) < 1 / 1.03
            else ("slower" if math.exp(low) > 1.03 else "no difference")
        )
        assert h.verdict == f"{verdict} (B is MG-WFBP)"


def doc_numbers() -> dict[str, set[str]]:
    """The numbers docs/references.md quotes, per seed section, from its tables."""
    found: dict[str, set[str]] = {}
    section = None
    for line in (ROOT / "docs" / "references.md").read_text().splitlines():
        if line.startswith("## Seed "):
            section = "seed " + line.split()[2].rstrip(":")
        elif section and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 3 and cells[2] != "where stated":
                found.setdefault(section, set()).update(re.findall(r"\d+(?:\.\d+)?", cells[1]))
    return found


def test_headline_paper_numbers_are_those_docs_references_cites(data):
    headlines, _, _ = cli.collect_headlines(data)
    documented = doc_numbers()
    assert documented["seed 000"] >= {"83.6", "30.3", "88.1", "40.6", "31.7", "12.5"}
    quoted: dict[str, set[str]] = {}
    for h in headlines:
        # the number itself, before the citation in parentheses
        value = h.published.rsplit(" (", 1)[0]
        quoted.setdefault(h.paper, set()).update(re.findall(r"\d+(?:\.\d+)?", value))
        assert h.published.endswith(", abstract)"), h.published
    for paper, numbers in quoted.items():
        assert numbers <= documented[paper], (paper, numbers - documented[paper])
    # and every number the seed 000 section cites is in the table
    assert documented["seed 000"] <= quoted["seed 000"]


def test_legend_of_the_fixture_has_no_unlabelled_model(data, style):
    """Every dashed line in a legend says it is a model. A figure may skip this fixture
    (Skip, with its reason); any other exception fails the test."""
    import matplotlib.pyplot as plt

    from ccbench.plots.base import Skip

    dashed = []
    for spec in cli.all_figures():
        try:
            figures = spec.draw(data, style)
        except Skip:
            continue
        for figure in figures:
            for legend in figure.fig.legends:
                for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
                    if getattr(handle, "get_linestyle", lambda: "-")() == "--":
                        dashed.append((figure.name, text.get_text()))
            plt.close(figure.fig)  # every figure of the fixture drawn: one open at a time
    assert dashed, "the fixture draws no model line: the check saw nothing"
    for name, label in dashed:
        assert label.startswith("model"), (name, label)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")

"""Seed 002 figures: MG-WFBP, merging gradients into fewer allreduces.

Per-layer gradient sizes and backward times, iteration time per strategy (measured next
to predicted, from the merged-gradient benchmark and from a real backward pass) and the
simulated scaling efficiency from a few to thousands of ranks; and the list of seed
002's figures (`FIGURES`), in the order they are drawn. The measured allreduce cost with
its fitted alpha-beta line is drawn by plots/allreduce_cost.py.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ccbench.benchmarks.statistics import t_quantile
from ccbench.plots import papers
from ccbench.plots.allreduce_cost import allreduce_fit
from ccbench.plots.base import (
    Figure,
    FigureSpec,
    Skip,
    link_of,
    panel_title,
    rows,
    runs_note,
)
from ccbench.plots.steps import interval, launches, training_frame
from ccbench.plots.style import (
    COLUMN_WIDTH,
    FULL_WIDTH,
    ROLE_COLORS,
    Style,
    figure,
    format_bytes,
    legend_below,
    size_axis,
    tidy_log_axis,
    time_unit,
)

STRATEGY_ORDER = ("wfbp", "single", "fixed", "ddp", "mgwfbp", "optimal")


def strategy_key(strategy: str):
    family = str(strategy).split(":", 1)[0].lower()
    rank = STRATEGY_ORDER.index(family) if family in STRATEGY_ORDER else len(STRATEGY_ORDER)
    return (rank, str(strategy))


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("_") or "model"


def layer_profiles(data, style: Style) -> list[Figure]:
    frame = rows(data, "profile")
    figures = []
    for model, sub in frame.groupby("model", sort=True):
        sub = sub.sort_values("order")
        fig, (ax_size, ax_time) = figure(
            2, ncols=1, width=COLUMN_WIDTH, panel_height=1.45, sharex=True
        )
        index = sub["order"].to_numpy()
        ax_size.bar(index, sub["bytes"], width=1.0, color=ROLE_COLORS["bytes"], linewidth=0)
        ax_size.set_yscale("log", base=2)
        size_axis(ax_size, sub["bytes"], axis="y", label="Gradient size (bytes)")
        ax_time.bar(index, sub["backward_us"], width=1.0, color=ROLE_COLORS["time"], linewidth=0)
        ax_time.set_ylabel("Backward time (µs)")
        ax_time.set_xlabel("Gradient tensor, in backward order (0 = last layer)")
        ax_time.set_xlim(index.min() - 1, index.max() + 1)
        total = sub["bytes"].sum()
        ax_size.set_title(f"{model}: {len(sub)} tensors, {format_bytes(total)}B in total")
        ax_time.set_title(f"backward {sub['backward_us'].sum() / 1e3:.1f} ms in total")
        caption = (
            f"Layer profile of {model}: gradient size of each parameter tensor "
            "(top, log scale) and the backward time between one gradient and the "
            "next (bottom), measured with gradient hooks and averaged after warm-up "
            "(the profile keeps no spread, so no interval); tensors in the order "
            "backward produces them."
        )
        details = []
        for column, text, scale in (
            ("batch", "batch {:g}", 1),
            ("width", "width x{:g}", 1),
            ("forward_us", "forward pass {:.1f} ms", 1e3),
        ):
            value = pd.to_numeric(sub[column], errors="coerce").iloc[0] if column in sub else np.nan
            if pd.notna(value):
                details.append(text.format(float(value) / scale))
        if "device" in sub and sub["device"].notna().any():
            details.append(f"on {sub['device'].iloc[0]}")
        if details:
            caption += " Profiled with " + ", ".join(details) + "."
        figures.append(Figure(f"seed002_profile_{safe_name(model)}", fig, caption))
    return figures


def mean_bounds(mean: float, std: float, n) -> tuple[float, float]:
    """The 95% t interval of a mean from a standard deviation over n values."""
    if not (np.isfinite(std) and np.isfinite(n) and n >= 2):
        return np.nan, np.nan
    half = t_quantile(int(n)) * std / np.sqrt(n)
    return mean - half, mean + half


def iteration_time(data, style: Style) -> list[Figure]:
    frame = rows(data, "iteration")
    frame = frame.assign(_link=link_of(frame))
    groups = list(frame.groupby(["ranks", "_link", "transport"], sort=True))
    groups.sort(key=lambda g: (g[0][1] <= 0, -g[0][1], g[0][0], str(g[0][2])))
    shown = groups[:2]
    models = sorted(frame["model"].astype(str).unique())
    width = min(FULL_WIDTH, max(COLUMN_WIDTH, 1.3 + 1.5 * len(models)))
    fig, axes = figure(len(shown), ncols=1, width=width, panel_height=2.2)
    handles, labels, bounded, logged = [], [], False, False
    for ax, ((ranks, link, transport), sub) in zip(axes, shown, strict=True):
        strategies = sorted(sub["strategy"].astype(str).unique(), key=strategy_key)
        scale, unit = time_unit(sub[["measured_us", "predicted_us"]].to_numpy().ravel())
        slot = 0.8 / max(1, len(strategies))
        values, centres = [], []
        for m, model in enumerate(models):
            part = sub[sub["model"].astype(str) == model]
            if part.empty:
                continue
            for i, strategy in enumerate(strategies):
                row = part[part["strategy"].astype(str) == strategy]
                if row.empty:
                    continue
                row = row.iloc[-1]
                x = m - 0.4 + slot * (i + 0.5)
                color = style.strategy_color(strategy)
                mean = float(row["measured_us"])
                low, high = mean_bounds(
                    mean,
                    float(row.get("measured_std_us", np.nan)),
                    float(row.get("iterations", np.nan)),
                )
                yerr = None
                if np.isfinite(low):
                    yerr = [[(mean - low) / scale], [(high - mean) / scale]]
                    bounded = True
                # points, not bars from zero: strategies differ by percents, which an
                # axis from zero hides
                bar = ax.errorbar(
                    x - slot / 6,
                    mean / scale,
                    yerr=yerr,
                    color=color,
                    marker="o",
                    markersize=5,
                    linestyle="none",
                    elinewidth=0.8,
                    capsize=2,
                    label=strategy,
                )
                ax.plot(
                    x + slot / 6,
                    float(row["predicted_us"]) / scale,
                    marker="o",
                    markersize=5,
                    linestyle="none",
                    markerfacecolor="white",
                    markeredgecolor=color,
                )
                values += [mean, float(row["predicted_us"]), low, high]
                centres += [mean, float(row["predicted_us"])]
                handles.append(bar.lines[0])
                labels.append(strategy)
        ax.set_xticks(range(len(models)), models)
        ax.set_xlim(-0.5, len(models) - 0.5)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(f"Iteration time ({unit})")
        shown_values = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
        points = np.asarray([v for v in centres if np.isfinite(v) and v > 0], dtype=float)
        if shown_values.size:
            low, high = shown_values.min(), shown_values.max()
            # one slow strategy (not one wide error bar) would flatten the rest
            if points.size and points.max() > 3 * points.min() and low > 0:
                logged = True
                ax.set_yscale("log")
                ax.set_ylim(low / 1.15 / scale, high * 1.15 / scale)
                tidy_log_axis(ax)
            else:
                pad = 0.08 * (high - low) if high > low else 0.05 * high
                ax.set_ylim((low - pad) / scale, (high + pad) / scale)
        ax.set_title(panel_title(ranks, link) + (f", {transport}" if transport else ""))
    proxy = Line2D(
        [],
        [],
        color="0.3",
        marker="o",
        markerfacecolor="white",
        linestyle="none",
        label="predicted",
    )
    handles.append(proxy)
    labels.append("model: planner's prediction (hollow)")
    legend_below(fig, handles, labels, ncol=min(4, len(set(labels))))
    caption = (
        "Iteration time per merge strategy and model: measured (filled) next to a "
        "model, the planner's prediction from the layer profile and the fitted "
        "alpha-beta model (hollow, same colour). The axis does not start at zero: "
        "it spans the values drawn, so differences of a few percent show"
        + (" (log scale where the values span more than 3x)" if logged else "")
        + ". The "
        "strategies ran one after another, not interleaved: compare them by their "
        "intervals, and see the headline table for interleaved comparisons."
    )
    caption += (
        " Error bars: the 95% t interval of the mean iteration, from "
        "measured_std_us over the run's iterations."
        if bounded
        else " No interval: the rows carry no measured_std_us."
    )
    if len(groups) > len(shown):
        caption += " Not shown: " + ", ".join(panel_title(*k[:2]) for k, _ in groups[2:])
        caption += "."
    return [Figure("seed002_iteration_time", fig, caption + runs_note(frame))]


def strategy_bars(launch) -> list[dict]:
    """Per strategy of a rotated MG-WFBP run: the measured iteration (step time minus the
    optimizer) over its timed steps with the 95% t interval, and the planner's
    prediction."""
    out = []
    for strategy in launch.strategies:
        timed = launch.timed(strategy)
        measured = timed["step_us"] - timed["optimizer_us"].fillna(0.0)
        mean, low, high, n = interval(measured)
        predicted = (
            float(timed["predicted_us"].dropna().iloc[-1])
            if timed["predicted_us"].notna().any()
            else np.nan
        )
        out.append(
            {
                "strategy": strategy,
                "mean": mean,
                "low": low,
                "high": high,
                "n": n,
                "predicted": predicted,
            }
        )
    return out


def training_strategies(data, style: Style) -> list[Figure]:
    """MG-WFBP on a real backward pass (benchmarks.training --framework mgwfbp): the
    measured iteration (step minus optimizer) of each strategy next to its prediction."""
    frame = training_frame(data)
    if "predicted_us" not in frame.columns:
        raise Skip("no --framework mgwfbp training rows")
    runs = [la for la in launches(frame[frame["framework"] == "mgwfbp"]) if la.strategies]
    if not runs:
        raise Skip("no --framework mgwfbp training rows")
    shown = runs[:2]
    fig, axes = figure(len(shown), ncols=1, panel_height=2.2)
    handles, labels = [], []
    for ax, launch in zip(axes, shown, strict=True):
        model, ranks, link = launch.setting
        bars = sorted(strategy_bars(launch), key=lambda b: strategy_key(b["strategy"]))
        scale, unit = time_unit(
            [v for b in bars for v in (b["high"], b["predicted"]) if np.isfinite(v)]
            or [b["mean"] for b in bars]
        )
        for i, bar in enumerate(bars):
            color = style.strategy_color(bar["strategy"])
            mean = bar["mean"]
            yerr = (
                [[(mean - bar["low"]) / scale], [(bar["high"] - mean) / scale]]
                if np.isfinite(bar["low"])
                else None
            )
            patch = ax.bar(
                i - 0.18,
                mean / scale,
                0.36,
                color=color,
                linewidth=0,
                yerr=yerr,
                error_kw={"elinewidth": 0.6, "capsize": 1.5},
            )
            ax.bar(
                i + 0.18,
                bar["predicted"] / scale,
                0.36,
                color="white",
                edgecolor=color,
                hatch="/////",
                linewidth=0.6,
            )
            error = 100 * (bar["predicted"] / mean - 1)
            top = max(bar["high"] if np.isfinite(bar["high"]) else mean, bar["predicted"])
            ax.text(i, top / scale, f"{error:+.0f}%", ha="center", va="bottom", fontsize=5.8)
            handles.append(patch)
            labels.append(bar["strategy"])
        ax.set_xticks(range(len(bars)), [b["strategy"] for b in bars], fontsize=6)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(f"Iteration time ({unit})")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # room for the labels above the bars
        variant, codec = launch.key[1], launch.key[3]
        transport = variant if codec in ("", "none") else f"{variant}, {codec}"
        ax.set_title(f"{model}, {panel_title(ranks, link)}, {transport}")
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="/////"))
    labels.append("model: planner's prediction (hatched)")
    legend_below(fig, handles, labels, ncol=min(4, len(set(labels))))
    caption = (
        "MG-WFBP driven by a real backward pass: gradient-ready hooks launch each "
        "merged group's allreduce while backward goes on. Measured iteration (step "
        "time minus the optimizer, the mean over the strategy's timed steps; the "
        "strategies take turns step by step in one run) with the 95% t interval over "
        "those steps, next to a model, the planner's prediction from the model's own "
        "profile and the measured alpha-beta fit (hatched); the label is the "
        "prediction's error against the measured mean drawn. The headline table "
        "pairs the strategies' steps turn by turn for an interleaved comparison."
    )
    return [Figure("seed002_training_strategies", fig, caption + runs_note(frame))]


SIM_SETTING = ("link_gbps", "hop_latency_us", "algorithm", "compute_speedup")


def simulation_setting(frame: pd.DataFrame) -> tuple[pd.DataFrame, str, int]:
    """Rows of the most common network setting; its description; how many others."""
    keys = [k for k in SIM_SETTING if k in frame.columns]
    if not keys:
        return frame, "", 0
    filled = frame[keys].astype(str)
    counts = filled.value_counts(sort=True)
    best = counts.index[0]
    chosen = frame[(filled == pd.Series(best, index=keys)).all(axis=1)]
    first = chosen.iloc[0]
    parts = []
    if "link_gbps" in keys and np.isfinite(first["link_gbps"]):
        parts.append(f"{first['link_gbps']:g} Gbit/s links")
    if "hop_latency_us" in keys and np.isfinite(first["hop_latency_us"]):
        parts.append(f"{first['hop_latency_us']:g} µs per hop")
    if "algorithm" in keys and str(first["algorithm"]) not in ("", "nan"):
        parts.append(f"{first['algorithm']} allreduce")
    if (
        "compute_speedup" in keys
        and np.isfinite(first["compute_speedup"])
        and first["compute_speedup"] != 1
    ):
        parts.append(f"compute {first['compute_speedup']:g}x faster than profiled")
    return chosen, ", ".join(parts), len(counts) - 1


def scaling_efficiency(data, style: Style) -> list[Figure]:
    frame, setting, others = simulation_setting(rows(data, "simulation"))
    models = sorted(frame["model"].astype(str).unique())[:4]
    fig, axes = figure(len(models), sharey=True)
    handles, labels = [], []
    coincide: dict[str, list[str]] = {}  # "fixed:64MB = single" -> models
    for ax, model in zip(axes, models, strict=True):
        sub = frame[frame["model"].astype(str) == model]
        drawn: dict[str, pd.DataFrame] = {}
        for strategy in sorted(sub["strategy"].astype(str).unique(), key=strategy_key):
            series = sub[sub["strategy"].astype(str) == strategy]
            series = series.groupby("ranks", as_index=False)["scaling_efficiency"].mean()
            kw = {**style.strategy_line(strategy), "linestyle": "--", "markersize": 3.2}
            under = next(
                (
                    name
                    for name, other in drawn.items()
                    if list(other["ranks"]) == list(series["ranks"])
                    and np.allclose(
                        other["scaling_efficiency"], series["scaling_efficiency"], rtol=1e-3
                    )
                ),
                None,
            )
            if under is not None:  # on top of a curve it equals: a larger hollow ring
                coincide.setdefault(f"{strategy} = {under}", []).append(model)
                kw.update(markersize=5.5, fillstyle="none", zorder=4)
            drawn[strategy] = series
            (line,) = ax.plot(
                series["ranks"], series["scaling_efficiency"], label=f"model: {strategy}", **kw
            )
            handles.append(line)
            labels.append(line.get_label())
        ranks = sorted(sub["ranks"].unique())
        ax.set_xscale("log", base=2)
        step = max(1, int(np.ceil(len(ranks) / 6)))
        ticks = ranks[::-1][::step][::-1]  # counted from the largest, which is labelled
        ax.set_xticks(ticks, [str(int(r)) for r in ticks])
        ax.minorticks_off()
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("Ranks (simulated)")
        ax.set_ylabel("Scaling efficiency (simulated)")
        ax.set_title(model)
    legend_below(fig, handles, labels, ncol=min(6, len(set(labels))))
    caption = (
        "Trace-based simulation, a model throughout (dashed): scaling efficiency per "
        "strategy as the rank count grows, from the measured layer profile and a "
        "ring-allreduce network model"
        + (f" ({setting})" if setting else "")
        + ". No interval: a simulation is "
        f"deterministic. The paper ({papers.PAPERS['seed 002'].short}, abstract) "
        f"simulates {papers.MGWFBP_SIMULATED_GPUS[0]} to "
        f"{papers.MGWFBP_SIMULATED_GPUS[1]} GPUs and finds MG-WFBP scales much "
        "better than existing methods."
    )
    if coincide:
        caption += (
            " Curves that coincide, the second drawn as larger hollow markers on "
            "the first: "
            + "; ".join(f"{pair} ({', '.join(where)})" for pair, where in coincide.items())
            + "."
        )
    if others:
        caption += f" {others} other network setting(s) in the data are not shown."
    return [Figure("seed002_scaling_efficiency", fig, caption + runs_note(frame))]


FIGURES = [
    FigureSpec(
        "seed002_profile",
        "seed 002",
        "Per-layer gradient size and backward time",
        ("profile",),
        layer_profiles,
    ),
    FigureSpec(
        "seed002_allreduce_fit",
        "seed 002",
        "Allreduce cost and alpha-beta fit",
        (),
        allreduce_fit,
        alternatives="an allreduce cost-model fit, or MG-WFBP "
        "measured iterations with baseline MPI Allreduce rows",
    ),
    FigureSpec(
        "seed002_iteration_time",
        "seed 002",
        "Iteration time per strategy",
        ("iteration",),
        iteration_time,
    ),
    FigureSpec(
        "seed002_scaling_efficiency",
        "seed 002",
        "Simulated scaling efficiency",
        ("simulation",),
        scaling_efficiency,
    ),
    FigureSpec(
        "seed002_training_strategies",
        "seed 002",
        "MG-WFBP on a real backward pass: measured and predicted per strategy",
        ("training",),
        training_strategies,
    ),
]

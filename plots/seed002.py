"""Seed 002 figures: MG-WFBP, merging gradients into fewer allreduces.

Per-layer gradient sizes and backward times, the measured allreduce cost with its fitted
alpha-beta line, iteration time per strategy (measured next to predicted) and the
simulated scaling efficiency from a few to thousands of ranks.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from ccbench.plots.base import (
    Figure,
    FigureSpec,
    Headline,
    Skip,
    link_of,
    panel_title,
    rows,
    runs_note,
)
from ccbench.plots.style import (
    COLUMN_WIDTH,
    FULL_WIDTH,
    Style,
    figure,
    format_bytes,
    legend_below,
    panel_note,
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
        fig, (ax_size, ax_time) = figure(2, ncols=1, width=COLUMN_WIDTH, panel_height=1.45,
                                         sharex=True)
        index = sub["order"].to_numpy()
        ax_size.bar(index, sub["bytes"], width=1.0, color="#1f66b4", linewidth=0)
        ax_size.set_yscale("log", base=2)
        size_axis(ax_size, sub["bytes"], axis="y", label="Gradient size (bytes)")
        ax_time.bar(index, sub["backward_us"], width=1.0, color="#e6770b", linewidth=0)
        ax_time.set_ylabel("Backward time (µs)")
        ax_time.set_xlabel("Gradient tensor, in backward order (0 = last layer)")
        ax_time.set_xlim(index.min() - 1, index.max() + 1)
        total = sub["bytes"].sum()
        panel_note(ax_size, f"{len(sub)} tensors, {format_bytes(total)}B in total",
                   "upper left")
        panel_note(ax_time, f"backward {sub['backward_us'].sum() / 1e3:.1f} ms", "upper left")
        ax_size.set_title(f"{model}")
        caption = (f"Layer profile of {model}: gradient size of each parameter tensor "
                   "(top, log scale) and the backward time between one gradient and the "
                   "next (bottom), measured with gradient hooks and averaged after warm-up; "
                   "tensors in the order backward produces them.")
        details = []
        for column, text, scale in (("batch", "batch {:g}", 1), ("width", "width x{:g}", 1),
                                    ("forward_us", "forward pass {:.1f} ms", 1e3)):
            value = pd.to_numeric(sub[column], errors="coerce").iloc[0] \
                if column in sub else np.nan
            if pd.notna(value):
                details.append(text.format(float(value) / scale))
        if "device" in sub and sub["device"].notna().any():
            details.append(f"on {sub['device'].iloc[0]}")
        if details:
            caption += " Profiled with " + ", ".join(details) + "."
        figures.append(Figure(f"seed002_profile_{safe_name(model)}", fig, caption))
    return figures


def fit_settings(data) -> list[tuple[tuple, pd.DataFrame, dict]]:
    """Fit points per (model, ranks, transport) run, with what the iteration rows of the
    same run add: the link rate and the fit's R^2."""
    frame = rows(data, "costfit")
    runs = rows(data, "iteration")
    out = []
    for key, sub in frame.groupby(["model", "ranks", "transport"], sort=True):
        model, ranks, transport = key
        own = float(link_of(sub).max())  # the fit CSV's own link_gbps, 0 when absent
        extra = {"link": own}
        if not runs.empty:
            same = runs[(runs["model"] == model) & (runs["ranks"] == ranks)
                        & (runs["transport"] == transport)]
            if not same.empty:
                if own <= 0:  # older fit files carry no link rate: the run's rows do
                    extra["link"] = float(link_of(same).iloc[-1])
                if "fit_r2" in same and same["fit_r2"].notna().any():
                    extra["r2"] = float(same["fit_r2"].iloc[-1])
        out.append((key, sub.sort_values("size_bytes"), extra))
    return out


def fit_from_harness(data) -> list[tuple[tuple, pd.DataFrame, dict]]:
    """Without a fit CSV: the alpha and beta that MG-WFBP runs fitted (in their iteration
    rows) next to the baseline's MPI Allreduce measured by the harness at the same rank
    count and link; the fitted line is stored as `fitted_us` at the harness sizes."""
    runs = rows(data, "iteration")
    base = rows(data, "harness", variant="baseline", algorithm="mpi", collective="allreduce")
    if runs.empty or base.empty or "alpha_us" not in runs:
        return []
    runs = runs.assign(_link=link_of(runs)).dropna(subset=["alpha_us", "beta_us_per_byte"])
    base = base.assign(_link=link_of(base))
    out = []
    for (_, ranks, link, transport), sub in runs.groupby(["model", "ranks", "_link",
                                                         "transport"]):
        points = base[(base["ranks"] == ranks) & (base["_link"] == link)]
        points = points.groupby("size_bytes", as_index=False)["avg_us"].min()
        if len(points) < 2:
            continue
        last = sub.iloc[-1]
        points = points.rename(columns={"avg_us": "measured_us"}).assign(
            fitted_us=last["alpha_us"] + last["beta_us_per_byte"] * points["size_bytes"])
        extra = {"link": float(link), "harness": True}
        if "fit_r2" in sub and np.isfinite(last["fit_r2"]):
            extra["r2"] = float(last["fit_r2"])
        out.append(((str(last["model"]), ranks, transport), points, extra))
    return out


def allreduce_fit(data, style: Style) -> list[Figure]:
    settings = fit_settings(data) if data.has("costfit") else fit_from_harness(data)
    if not settings:
        raise Skip("needs the --fit-csv output of benchmarks.merged_gradient, or MG-WFBP "
                   "iteration rows and baseline (mpi) allreduce rows at the same rank count")
    from_harness = any(extra.get("harness") for _, _, extra in settings)
    shown = settings[:4]
    fig, axes = figure(len(shown))
    handles, labels = [], []
    for ax, ((model, ranks, transport), sub, extra) in zip(axes, shown, strict=True):
        sizes = sub["size_bytes"].to_numpy(dtype=float)
        # the fitted line is stored at each size: its two coefficients, exactly
        beta, alpha = np.polyfit(sizes, sub["fitted_us"].to_numpy(dtype=float), 1)
        scale, unit = time_unit(sub["measured_us"])
        label = "baseline MPI Allreduce (harness)" if extra.get("harness") else \
            "measured allreduce"
        (meas,) = ax.plot(sizes, sub["measured_us"] / scale, "o", color="black",
                          label=label)
        grid = np.geomspace(sizes.min(), sizes.max(), 100)
        (fit,) = ax.plot(grid, (alpha + beta * grid) / scale, "-", color="#1f66b4",
                         label="fit: alpha + beta x size")
        handles += [meas, fit]
        labels += [meas.get_label(), fit.get_label()]
        size_axis(ax, sizes)
        ax.set_yscale("log")
        tidy_log_axis(ax)
        ax.set_ylabel(f"Allreduce time ({unit})")
        where = panel_title(ranks, extra["link"])
        ax.set_title(f"{where}" + (f", {transport}" if transport else "")
                     + (f" ({model} run's fit)" if extra.get("harness")
                        else f" ({model} sizes)" if model else ""))
        text = f"alpha = {alpha:.1f} µs"
        if beta > 0:
            text += f"\nbeta = {beta * 1024:.3g} µs/KiB\n({8e-3 / beta:.2f} Gbit/s)"
        if "r2" in extra:
            text += f"\nR² = {extra['r2']:.4f}"
        panel_note(ax, text, "best")
    legend_below(fig, handles, labels)
    caption = ("Allreduce time against size on the communicator in use (OSU-style timing, "
               "mean over ranks), with the fitted cost model t(s) = alpha + beta s that "
               "the MG-WFBP planner uses; alpha and beta are measured, never assumed. The "
               "Gbit/s figure is 8/beta, the rate the whole allreduce moves data at.")
    if from_harness:
        caption += (" No fit CSV was given: the points are the harness's baseline MPI "
                    "Allreduce at the same rank count and link, the line the alpha and beta "
                    "the MG-WFBP run fitted (its iteration rows), so the two measurements "
                    "check each other.")
    if len(settings) > len(shown):
        caption += f" {len(settings) - len(shown)} more fit(s) not shown."
    return [Figure("seed002_allreduce_fit", fig, caption + runs_note(rows(data, "costfit")))]


def iteration_time(data, style: Style) -> list[Figure]:
    frame = rows(data, "iteration")
    frame = frame.assign(_link=link_of(frame))
    groups = list(frame.groupby(["ranks", "_link", "transport"], sort=True))
    groups.sort(key=lambda g: (g[0][1] <= 0, -g[0][1], g[0][0], str(g[0][2])))
    shown = groups[:2]
    models = sorted(frame["model"].astype(str).unique())
    width = min(FULL_WIDTH, max(COLUMN_WIDTH, 1.3 + 1.5 * len(models)))
    fig, axes = figure(len(shown), ncols=1, width=width, panel_height=2.2)
    handles, labels = [], []
    for ax, ((ranks, link, transport), sub) in zip(axes, shown, strict=True):
        strategies = sorted(sub["strategy"].astype(str).unique(), key=strategy_key)
        scale, unit = time_unit(sub[["measured_us", "predicted_us"]].to_numpy().ravel())
        slot = 0.8 / max(1, len(strategies))
        for m, model in enumerate(models):
            part = sub[sub["model"].astype(str) == model]
            if part.empty:
                continue
            fastest = part["measured_us"].min()
            for i, strategy in enumerate(strategies):
                row = part[part["strategy"].astype(str) == strategy]
                if row.empty:
                    continue
                row = row.iloc[-1]
                x = m - 0.4 + slot * (i + 0.5)
                color = style.strategy_color(strategy)
                measured = float(row["measured_us"]) / scale
                spread = row.get("measured_std_us", np.nan)
                spread = float(spread) / scale if np.isfinite(spread) else None
                bar = ax.bar(x - slot / 4, measured, slot / 2, color=color, label=strategy,
                             linewidth=0, yerr=spread, error_kw={"elinewidth": 0.6,
                                                                 "capsize": 1.2})
                ax.bar(x + slot / 4, float(row["predicted_us"]) / scale, slot / 2,
                       color="white", edgecolor=color, hatch="/////", linewidth=0.6)
                if row["measured_us"] == fastest:
                    ax.text(x - slot / 4, measured + (spread or 0), "*", ha="center",
                            va="bottom", fontsize=7)
                handles.append(bar)
                labels.append(strategy)
        ax.set_xticks(range(len(models)), models)
        ax.set_xlim(-0.5, len(models) - 0.5)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(f"Iteration time ({unit})")
        ax.set_ylim(bottom=0)
        ax.set_title(panel_title(ranks, link) + (f", {transport}" if transport else ""))
    proxy = Patch(facecolor="white", edgecolor="0.3", hatch="/////", label="predicted")
    handles.append(proxy)
    labels.append("predicted (hatched)")
    legend_below(fig, handles, labels, ncol=min(4, len(set(labels))))
    caption = ("Iteration time per merge strategy and model: measured (solid, error bar: "
               "one standard deviation over iterations) next to the planner's prediction "
               "from the layer profile and the fitted alpha-beta model (hatched, same "
               "colour); * marks the fastest measured strategy of each model.")
    if len(groups) > len(shown):
        caption += " Not shown: " + ", ".join(panel_title(*k[:2]) for k, _ in groups[2:])
        caption += "."
    return [Figure("seed002_iteration_time", fig, caption + runs_note(frame))]


def training_strategies(data, style: Style) -> list[Figure]:
    """MG-WFBP on a real backward pass (benchmarks.training --framework mgwfbp): the
    measured iteration (step minus optimizer) of each strategy next to its prediction."""
    frame = rows(data, "training")
    if "framework" not in frame.columns or "predicted_us" not in frame.columns:
        raise Skip("no --framework mgwfbp training rows")
    frame = frame[(frame["framework"] == "mgwfbp") & (frame["row"] == "summary")]
    frame = frame[frame["predicted_us"].notna() & frame["strategy"].notna()]
    if frame.empty:
        raise Skip("no --framework mgwfbp training rows")
    frame = frame.assign(_link=link_of(frame),
                         _measured=frame["step_us"] - frame["optimizer_us"].fillna(0.0))
    settings = list(frame.groupby(["model", "ranks", "_link", "variant", "codec"], sort=True))
    shown = settings[:2]
    fig, axes = figure(len(shown), ncols=1, panel_height=2.2)
    handles, labels = [], []
    for ax, ((model, ranks, link, variant, codec), sub) in zip(axes, shown, strict=True):
        sub = sub.drop_duplicates("strategy", keep="last")
        strategies = sorted(sub["strategy"].astype(str), key=strategy_key)
        scale, unit = time_unit(sub[["_measured", "predicted_us"]].to_numpy().ravel())
        fastest = sub["_measured"].min()
        for i, strategy in enumerate(strategies):
            row = sub[sub["strategy"].astype(str) == strategy].iloc[-1]
            color = style.strategy_color(strategy)
            measured = float(row["_measured"]) / scale
            bar = ax.bar(i - 0.18, measured, 0.36, color=color, linewidth=0)
            ax.bar(i + 0.18, float(row["predicted_us"]) / scale, 0.36, color="white",
                   edgecolor=color, hatch="/////", linewidth=0.6)
            err = 100 * (float(row["predicted_us"]) / float(row["_measured"]) - 1)
            ax.text(i, max(measured, float(row["predicted_us"]) / scale),
                    f"{err:+.0f}%" + (" *" if row["_measured"] == fastest else ""),
                    ha="center", va="bottom", fontsize=5.8)
            handles.append(bar)
            labels.append(strategy)
        ax.set_xticks(range(len(strategies)), strategies, fontsize=6)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(f"Iteration time ({unit})")
        ax.set_ylim(bottom=0)
        transport = variant if codec in ("", "none") else f"{variant}, {codec}"
        ax.set_title(f"{model}, {panel_title(ranks, link)}, {transport}")
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="/////"))
    labels.append("predicted (hatched)")
    legend_below(fig, handles, labels, ncol=min(4, len(set(labels))))
    caption = ("MG-WFBP driven by a real backward pass: gradient-ready hooks launch each "
               "merged group's allreduce while backward goes on. Measured iteration (step "
               "time minus the optimizer, mean over the strategy's steps; the strategies "
               "take turns step by step in one run) next to the planner's prediction from "
               "the model's own profile and the measured alpha-beta fit (hatched); the "
               "label is the prediction's error, * the fastest strategy.")
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
    if "compute_speedup" in keys and np.isfinite(first["compute_speedup"]) \
            and first["compute_speedup"] != 1:
        parts.append(f"compute {first['compute_speedup']:g}x faster than profiled")
    return chosen, ", ".join(parts), len(counts) - 1


def scaling_efficiency(data, style: Style) -> list[Figure]:
    frame, setting, others = simulation_setting(rows(data, "simulation"))
    models = sorted(frame["model"].astype(str).unique())[:4]
    fig, axes = figure(len(models), sharey=True)
    handles, labels = [], []
    for ax, model in zip(axes, models, strict=True):
        sub = frame[frame["model"].astype(str) == model]
        for strategy in sorted(sub["strategy"].astype(str).unique(), key=strategy_key):
            series = sub[sub["strategy"].astype(str) == strategy]
            series = series.groupby("ranks", as_index=False)["scaling_efficiency"].mean()
            (line,) = ax.plot(series["ranks"], series["scaling_efficiency"],
                              markersize=3.2, label=strategy,
                              **style.strategy_line(strategy))
            handles.append(line)
            labels.append(strategy)
        ranks = sorted(sub["ranks"].unique())
        ax.set_xscale("log", base=2)
        step = max(1, int(np.ceil(len(ranks) / 6)))
        ticks = ranks[::-1][::step][::-1]  # counted from the largest, which is labelled
        ax.set_xticks(ticks, [str(int(r)) for r in ticks])
        ax.minorticks_off()
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("Ranks (simulated)")
        ax.set_ylabel("Scaling efficiency")
        ax.set_title(model)
    legend_below(fig, handles, labels, ncol=min(6, len(set(labels))))
    caption = ("Trace-based simulation: scaling efficiency per strategy as the rank count "
               "grows, from the measured layer profile and a ring-allreduce network model"
               + (f" ({setting})" if setting else "") + ". The paper simulates 4 to 2048 "
               "GPUs and finds MG-WFBP scales better than WFBP and single merge.")
    if others:
        caption += f" {others} other network setting(s) in the data are not shown."
    return [Figure("seed002_scaling_efficiency", fig, caption + runs_note(frame))]


def headlines(data) -> list[Headline]:
    out = []
    sim, setting, _ = simulation_setting(rows(data, "simulation"))
    if not sim.empty:
        top = sim["ranks"].max()
        at_top = sim[sim["ranks"] == top]
        for model, sub in at_top.groupby("model", sort=True):
            values = {s: float(sub.loc[sub["strategy"] == s, "scaling_efficiency"].mean())
                      for s in ("mgwfbp", "wfbp", "single") if (sub["strategy"] == s).any()}
            if "mgwfbp" not in values:
                continue
            text = ", ".join(f"{k} {v:.2f}" for k, v in values.items())
            out.append(Headline("seed 002", f"Simulated scaling efficiency at {int(top)} "
                                f"ranks ({model})", text,
                                "MG-WFBP scales better than WFBP and single merge",
                                setting))
    it = rows(data, "iteration")
    if not it.empty:
        it = it.assign(_link=link_of(it))
        for (model, ranks, link), sub in it.groupby(["model", "ranks", "_link"], sort=True):
            mine = sub[sub["strategy"] == "mgwfbp"]
            others = sub[~sub["strategy"].isin(("mgwfbp", "optimal"))]
            if mine.empty or others.empty:
                continue
            best = others.loc[others["measured_us"].idxmin()]
            gain = 100.0 * (1.0 - float(mine["measured_us"].iloc[-1]) / best["measured_us"])
            error = 100.0 * (mine["predicted_us"].iloc[-1] / mine["measured_us"].iloc[-1] - 1)
            verdict = "faster" if gain >= 0 else "slower"
            out.append(Headline(
                "seed 002", f"MG-WFBP measured iteration time against the best other "
                f"strategy ({model})", f"{abs(gain):.1f}% {verdict} than {best['strategy']} "
                f"(prediction {error:+.1f}% off)", "MG-WFBP fastest of the strategies",
                panel_title(ranks, link)))
    return out


FIGURES = [
    FigureSpec("seed002_profile", "seed 002", "Per-layer gradient size and backward time",
               ("profile",), layer_profiles),
    FigureSpec("seed002_allreduce_fit", "seed 002", "Allreduce cost and alpha-beta fit",
               (), allreduce_fit, alternatives="an allreduce cost-model fit, or MG-WFBP "
               "measured iterations with baseline MPI Allreduce rows"),
    FigureSpec("seed002_iteration_time", "seed 002", "Iteration time per strategy",
               ("iteration",), iteration_time),
    FigureSpec("seed002_scaling_efficiency", "seed 002", "Simulated scaling efficiency",
               ("simulation",), scaling_efficiency),
    FigureSpec("seed002_training_strategies", "seed 002",
               "MG-WFBP on a real backward pass: measured and predicted per strategy",
               ("training",), training_strategies),
]

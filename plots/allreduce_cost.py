"""Seed 002's cost-model figure: the measured allreduce and its fitted alpha-beta line.

MG-WFBP's planner decides which gradients to merge from a cost model, t(s) = alpha +
beta s, fitted to measured allreduce times. This module draws that fit: the points
measured at each size (the fit CSV of benchmarks.merged_gradient, or without one the
harness's baseline MPI Allreduce at an MG-WFBP run's rank count and link, with a line
fitted here to those very points), the fitted line through them, and its alpha, beta
and R² in the panel's note. The other MG-WFBP figures, and the figure's entry in the
list of figures, are plots/gradient_merging.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ccbench.plots.base import (
    Figure,
    Skip,
    draw_series,
    interval_caption,
    link_of,
    newest_per,
    panel_title,
    rows,
    runs_note,
    time_bounds,
)
from ccbench.plots.style import (
    ROLE_COLORS,
    Style,
    figure,
    legend_below,
    panel_note,
    size_axis,
    tidy_log_axis,
    time_unit,
)


def fit_settings(data) -> list[tuple[tuple, pd.DataFrame, dict]]:
    """Fit points per (model, ranks, transport, link) in the fit CSV."""
    frame = rows(data, "costfit")
    frame = frame.assign(_link=link_of(frame))
    out = []
    for key, sub in frame.groupby(["model", "ranks", "transport", "_link"], sort=True):
        model, ranks, transport, link = key
        sub = sub.sort_values("size_bytes").assign(_lo=np.nan, _hi=np.nan)
        out.append(((model, ranks, transport), sub, {"link": float(link)}))
    return out


def fit_from_harness(data) -> list[tuple[tuple, pd.DataFrame, dict]]:
    """Without a fit CSV: the baseline's MPI Allreduce measured by the harness at the rank
    count and link of an MG-WFBP run, with a line fitted here to those very points (a
    line is only drawn with the points it was fitted to); the run's own alpha and beta,
    fitted on its own sweep, go into the note for comparison."""
    runs = rows(data, "iteration")
    base = rows(data, "harness", variant="baseline", algorithm="mpi", collective="allreduce")
    if runs.empty or base.empty or "alpha_us" not in runs:
        return []
    runs = runs.assign(_link=link_of(runs)).dropna(subset=["alpha_us", "beta_us_per_byte"])
    base = base.assign(_link=link_of(base))
    out = []
    for (_, ranks, link, transport), sub in runs.groupby(["model", "ranks", "_link", "transport"]):
        points = base[(base["ranks"] == ranks) & (base["_link"] == link)]
        points = newest_per(points, ["size_bytes"]).sort_values("size_bytes")
        if len(points) < 2:
            continue
        low, high, _ = time_bounds(points)
        last = sub.iloc[-1]
        sizes = points["size_bytes"].to_numpy(dtype=float)
        measured = points["avg_us"].to_numpy(dtype=float)
        beta, alpha = np.polyfit(sizes, measured, 1)
        points = pd.DataFrame(
            {
                "size_bytes": sizes,
                "measured_us": measured,
                "_lo": low,
                "_hi": high,
                "fitted_us": alpha + beta * sizes,
            }
        )
        out.append(
            (
                (str(last["model"]), ranks, transport),
                points,
                {
                    "link": float(link),
                    "harness": True,
                    "run_fit": (float(last["alpha_us"]), float(last["beta_us_per_byte"])),
                },
            )
        )
    return out


def r_squared(measured, fitted, log: bool = True) -> float:
    """1 - SS_res / SS_tot of a line against the points it is drawn with, in the space the
    figure is read in (log axes: log times, so a small size weighs as a large one)."""
    measured, fitted = np.asarray(measured, float), np.asarray(fitted, float)
    if log:
        keep = (measured > 0) & (fitted > 0)
        measured, fitted = np.log(measured[keep]), np.log(fitted[keep])
    total = float(np.sum((measured - measured.mean()) ** 2))
    return 1.0 - float(np.sum((measured - fitted) ** 2)) / total if total > 0 else 1.0


def allreduce_fit(data, style: Style) -> list[Figure]:
    settings = fit_settings(data) if data.has("costfit") else fit_from_harness(data)
    if not settings:
        raise Skip(
            "needs the --fit-csv output of benchmarks.merged_gradient, or MG-WFBP "
            "iteration rows and baseline (mpi) allreduce rows at the same rank count"
        )
    from_harness = any(extra.get("harness") for _, _, extra in settings)
    shown = settings[:4]
    fig, axes = figure(len(shown), panel_height=2.6)
    handles, labels, kinds = [], [], set()
    for ax, ((model, ranks, transport), sub, extra) in zip(axes, shown, strict=True):
        sizes = sub["size_bytes"].to_numpy(dtype=float)
        fitted = sub["fitted_us"].to_numpy(dtype=float)
        # the fitted line is stored at each size: its two coefficients, exactly
        beta, alpha = np.polyfit(sizes, fitted, 1)
        scale, unit = time_unit(sub["measured_us"])
        label = "baseline MPI Allreduce (harness)" if extra.get("harness") else "measured allreduce"
        meas, kind = draw_series(
            ax,
            sub,
            "size_bytes",
            "measured_us",
            scale,
            low="_lo",
            high="_hi",
            color="black",
            marker="o",
            linestyle="none",
            label=label,
        )
        kinds.add(kind)
        grid = np.geomspace(sizes.min(), sizes.max(), 100)
        (fit,) = ax.plot(
            grid,
            (alpha + beta * grid) / scale,
            "--",
            color=ROLE_COLORS["model"],
            label="model: alpha + beta x size (fitted)",
        )
        handles += [meas, fit]
        labels += [meas.get_label(), fit.get_label()]
        size_axis(ax, sizes)
        ax.set_yscale("log")
        tidy_log_axis(ax)
        ax.set_ylabel(f"Allreduce time ({unit})")
        where = panel_title(ranks, extra["link"])
        ax.set_title(
            f"{where}"
            + (f", {transport}" if transport else "")
            + (
                f" (at the {model} run's ranks)"
                if extra.get("harness")
                else f" ({model} sizes)"
                if model
                else ""
            )
        )
        text = f"alpha = {round(alpha, 1) + 0.0:.1f} µs, beta = {beta * 1e3:.4g} µs/KB"
        if beta > 0:
            text += f" ({8e-3 / beta:.2f} Gbit/s)"
        text += (
            f"\nR² = {r_squared(sub['measured_us'], fitted):.4f} (log times) against "
            "the points drawn"
        )
        if extra.get("run_fit"):
            run_alpha, run_beta = extra["run_fit"]
            text += (
                f"\n{model} run's own fit: alpha = {run_alpha:.1f} µs, "
                f"beta = {run_beta * 1e3:.4g} µs/KB"
            )
        panel_note(ax, text)
    legend_below(fig, handles, labels)
    caption = (
        "Allreduce time against size on the communicator in use (OSU-style timing, "
        "mean over ranks), with the fitted cost model t(s) = alpha + beta s (dashed) "
        "that the MG-WFBP planner uses; alpha and beta are measured, never assumed. "
        "KB = 1000 bytes, as the command line prints it; the Gbit/s figure is 8/beta, "
        "the rate the whole allreduce moves data at. The line is fitted to the "
        "points drawn with it, and R² is that of the line against them in log times, "
        "as the log axis shows them."
    )
    if from_harness:
        caption += (
            " No fit CSV was given: the points are the harness's baseline MPI "
            "Allreduce at the rank count and link of an MG-WFBP run, the line fitted "
            "here to them; the note gives the run's own alpha and beta, fitted on its "
            "own sweep, to compare."
        )
    caption += interval_caption(kinds)
    fits = rows(data, "costfit")
    if not from_harness and "_run" in fits.columns and (fits["_run"] == "").all():
        caption += (
            " The fit file names no run (it has no run_id column), so it is drawn "
            "as it is, beside whichever run is shown."
        )
    if len(settings) > len(shown):
        caption += f" {len(settings) - len(shown)} more fit(s) not shown."
    return [Figure("seed002_allreduce_fit", fig, caption + runs_note(rows(data, "costfit")))]

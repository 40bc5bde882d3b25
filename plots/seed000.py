"""Seed 000 figures: compression-assisted Allgather / Reduce-Scatter (and Allreduce).

Latency against message size for the uncompressed baseline, point-to-point compression
and collective-level compression; sensitivity to the fixed rate; the training run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ccbench.plots.base import (
    Figure,
    FigureSpec,
    Headline,
    Skip,
    draw_series,
    finite,
    has_spread,
    held_text,
    hold_configuration,
    link_bound_us,
    link_of,
    main_codecs,
    panel_title,
    panels,
    rows,
    runs_note,
    series_keys,
)
from ccbench.plots.style import (
    COLLECTIVE_LABELS,
    Style,
    codec_family,
    codec_rate,
    codec_sort_key,
    figure,
    format_bytes,
    legend_below,
    model_handle,
    panel_note,
    series_label,
    size_axis,
    tidy_log_axis,
    time_unit,
    variant_codec_handles,
)

VARIANTS = ("baseline", "p2p_compressed", "coll_compressed")
MAX_PANELS = 4


def baseline_reference(frame: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """The baseline the paper compares with: the MPI library's collective, else the ring."""
    base = frame[frame["variant"] == "baseline"]
    for algorithm in ("mpi", "ring"):
        chosen = base[base["algorithm"] == algorithm]
        if not chosen.empty:
            return algorithm.upper() if algorithm == "mpi" else "ring", chosen
    return "", base


def reductions(frame: pd.DataFrame) -> list[dict]:
    """Latency reduction of collective-level compression at the largest common size.

    One entry per (ranks, link, codec): percent lower than the baseline and than
    point-to-point compression with the same codec (the paper's two headline numbers).
    """
    found = []
    if frame.empty:
        return found
    for (ranks, link), sub in panels(frame):
        base_name, base = baseline_reference(sub)
        coll = sub[sub["variant"] == "coll_compressed"]
        for codec in sorted(coll["codec"].unique(), key=codec_sort_key):
            mine = coll[coll["codec"] == codec].groupby("size_bytes")["avg_us"].min()
            p2p = sub[(sub["variant"] == "p2p_compressed") & (sub["codec"] == codec)]
            p2p = p2p.groupby("size_bytes")["avg_us"].min()
            ref = base.groupby("size_bytes")["avg_us"].min() if not base.empty else None
            sizes = set(mine.index)
            if ref is not None:
                sizes &= set(ref.index)
            if not sizes:
                continue
            size = max(sizes)
            entry = {"ranks": ranks, "link": link, "codec": codec, "size": size,
                     "baseline": base_name, "vs_baseline": None, "vs_p2p": None}
            if ref is not None:
                entry["vs_baseline"] = 100.0 * (1.0 - mine[size] / ref[size])
            if size in p2p.index:
                entry["vs_p2p"] = 100.0 * (1.0 - mine[size] / p2p[size])
            found.append(entry)
    return found


def percent(value) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{value:.0f}% lower" if value >= 0 else f"{-value:.0f}% higher"


def change(reduction: float | None) -> str:
    """A reduction in percent as the latency change it means: 45 -> '-45%'."""
    return "n/a" if reduction is None else f"{-reduction:+.0f}%"


def reduction_text(entries: list[dict]) -> str:
    if not entries:
        return ""
    size = format_bytes(entries[0]["size"])
    base = entries[0]["baseline"] or "baseline"
    lines = [f"collective-level at {size}:", f"vs {base} / vs p2p"]
    lines += [f"{e['codec']}: {change(e['vs_baseline'])} / {change(e['vs_p2p'])}"
              for e in entries]
    return "\n".join(lines)


def draw_model_lines(ax, sub: pd.DataFrame, style: Style, scale: float) -> bool:
    """Link-bound time (wire bytes / link rate) next to the baseline and collective-level
    measurements; returns whether anything was drawn (only emulated-link rows have it)."""
    drawn = False
    _, base = baseline_reference(sub)
    coll = sub[sub["variant"] == "coll_compressed"]
    candidates = [(base, "baseline")] + [(coll[coll["codec"] == c], "coll_compressed")
                                         for c in sorted(coll["codec"].unique(), key=str)]
    for frame, variant in candidates:
        if frame.empty:
            continue
        frame = frame.assign(_model=link_bound_us(frame)).dropna(subset=["_model"])
        frame = frame.groupby("size_bytes", as_index=False)["_model"].min()
        if frame.empty:
            continue
        algorithm = base["algorithm"].iloc[0] if variant == "baseline" else None
        ax.plot(frame["size_bytes"], frame["_model"] / scale, linestyle="--", linewidth=0.8,
                color=style.color(variant, algorithm), alpha=0.75, zorder=1)
        drawn = True
    return drawn


def latency_vs_size(data, style: Style, collective: str) -> list[Figure]:
    frame = rows(data, "harness", collective=collective, variant=VARIANTS)
    if frame.empty:
        raise Skip(f"no {collective} rows from the baseline, p2p_compressed or "
                   "coll_compressed variants")
    codecs, left_out = main_codecs(frame)
    frame = frame[frame["codec"].isin(["none", *codecs])]
    frame, held = hold_configuration(frame)
    groups = panels(frame)
    shown, omitted = groups[:MAX_PANELS], groups[MAX_PANELS:]
    fig, axes = figure(len(shown))
    keys, modelled = [], False
    for ax, ((ranks, link), sub) in zip(axes, shown, strict=True):
        scale, unit = time_unit(sub["avg_us"])
        for variant, algorithm, codec in series_keys(sub):
            series = sub[(sub["variant"] == variant) & (sub["algorithm"] == algorithm)
                         & (sub["codec"] == codec)]
            draw_series(ax, series, "size_bytes", "avg_us", scale,
                        color=style.color(variant, algorithm),
                        label=series_label(variant, algorithm, codec), **style.marker(codec))
            keys.append((variant, algorithm, codec))
        if link > 0:
            modelled |= draw_model_lines(ax, sub, style, scale)
        size_axis(ax, sub["size_bytes"])
        ax.set_yscale("log")
        tidy_log_axis(ax)
        ax.set_ylabel(f"Latency ({unit})")
        ax.set_title(panel_title(ranks, link))
        text = reduction_text(reductions(sub))
        if text:
            panel_note(ax, text, "best")
    handles, labels = variant_codec_handles(style, keys)
    if modelled:
        proxy = model_handle("link-bound model: wire bytes / link rate")
        handles.append(proxy)
        labels.append(proxy.get_label())
    legend_below(fig, handles, labels)
    name = COLLECTIVE_LABELS.get(collective, collective)
    caption = (f"{name} latency (average over ranks, log scale) against message size "
               "(OSU convention: per-rank send size for Allgather, whole buffer "
               "otherwise). Colour: variant; marker: codec. The box gives the "
               "collective-level variant's latency change at the largest size against the "
               "uncompressed baseline and against point-to-point compression with the "
               "same codec (the paper: Allgather 83.6% / 30.3% lower, Reduce-Scatter "
               "88.1% / 40.6%).")
    if modelled:
        caption += (" Dashed: link-bound model, the bytes each rank puts on the wire "
                    "divided by the emulated link rate.")
    if any(has_spread(sub) for _, sub in shown):
        caption += (" Error bars: the fastest and slowest rank's average (min_us, max_us; "
                    "OSU prints them with -f).")
    if omitted:
        caption += " Not shown: " + ", ".join(panel_title(*k) for k, _ in omitted) + "."
    if left_out:
        caption += (f" Also measured, left out for legibility: {', '.join(left_out)} "
                    "(see the rate-sensitivity figure).")
    caption += held_text(held) + runs_note(frame)
    return [Figure(f"seed000_{collective}_latency", fig, caption)]


def rate_sensitivity(data, style: Style) -> list[Figure]:
    frame = rows(data, "harness", variant=("p2p_compressed", "coll_compressed"))
    if frame.empty:
        raise Skip("no rows from the compressed variants")
    frame, held = hold_configuration(frame)
    frame = frame.assign(rate=frame["codec"].map(codec_rate),
                         family=frame["codec"].map(codec_family)).dropna(subset=["rate"])
    if frame["rate"].nunique() < 2:
        raise Skip("needs compressed rows at two or more fixed rates (zfp:rate=R, bfp:rate=R)")
    # One (ranks, link) setting: the one with most rate points.
    groups = panels(frame)
    (ranks, link), sub = max(groups, key=lambda g: g[1]["codec"].nunique())
    collectives = [c for c in COLLECTIVE_LABELS if c in set(sub["collective"])]
    fig, axes = figure(2 * len(collectives), ncols=len(collectives),
                       panel_height=1.9, width=None if len(collectives) > 1 else 3.5)
    handles, labels = [], []
    everything = rows(data, "harness", collective=tuple(collectives))
    everything = everything[(everything["ranks"] == ranks) & (link_of(everything) == link)]
    for col, collective in enumerate(collectives):
        ax_time, ax_err = axes[col], axes[len(collectives) + col]
        part = sub[sub["collective"] == collective]
        counts = part.groupby("size_bytes")["codec"].nunique()
        size = max(counts[counts == counts.max()].index)
        part = part[part["size_bytes"] == size]
        scale, unit = time_unit(part["avg_us"])
        for (variant, family), series in part.groupby(["variant", "family"], sort=True):
            series = series.sort_values("rate")
            marker = style.marker(series["codec"].iloc[0])
            marker["fillstyle"] = "full"
            label = f"{series_label(variant, None)}, {family}"
            kw = dict(color=style.color(variant), label=label, **marker)
            (line,) = ax_time.plot(series["rate"], series["avg_us"] / scale, **kw)
            if "max_rel_err" in series and series["max_rel_err"].notna().any():
                ax_err.plot(series["rate"], series["max_rel_err"], **kw)
            handles.append(line)
            labels.append(label)
        _, base = baseline_reference(everything[(everything["collective"] == collective)
                                                & (everything["size_bytes"] == size)])
        if not base.empty:
            value = base["avg_us"].min() / scale
            line = ax_time.axhline(value, color="black", linestyle=":", linewidth=0.9,
                                   label="uncompressed baseline")
            handles.append(line)
            labels.append("uncompressed baseline")
        ax_time.set_title(f"{COLLECTIVE_LABELS[collective]}, {format_bytes(size)}")
        ax_time.set_ylabel(f"Latency ({unit})")
        ax_time.set_ylim(bottom=0)
        errors = finite(part.get("max_rel_err", pd.Series(dtype=float)))
        if errors.size and (errors > 0).any():
            ax_err.set_yscale("log")
            tidy_log_axis(ax_err)
        ax_err.set_ylabel("Max relative error")
        ax_err.set_xlabel("Rate (bits per value)")
        ax_time.set_xlabel("Rate (bits per value)")
        for ax in (ax_time, ax_err):
            ax.set_xticks(sorted(sub["rate"].unique()))
    fig.suptitle(panel_title(ranks, link), fontsize=7.5)
    legend_below(fig, handles, labels)
    caption = ("Sensitivity to the fixed rate of the lossy codecs: latency (top) and "
               "max relative error against the uncompressed result (bottom) as a "
               "function of the bits per value; the dotted line is the uncompressed "
               "baseline at the same size. Point-to-point compression recompresses at "
               "every hop, so its error can grow with the rank count." + held_text(held)
               + runs_note(sub))
    return [Figure("seed000_rate_sensitivity", fig, caption)]


RUN_KEYS = ("framework", "variant", "algorithm", "codec", "compress", "error_feedback",
            "strategy")
SETTING_KEYS = ("model", "ranks", "link_gbps")
FRAMEWORK_ORDER = {"fsdp": 0, "ddp": 1, "mgwfbp": 2, "own": 3}


def training_frame(data) -> pd.DataFrame:
    frame = rows(data, "training")
    for column in RUN_KEYS + SETTING_KEYS:
        if column not in frame.columns:
            frame = frame.assign(**{column: ""})
    # files from before --framework: the compact trainer
    framework = frame["framework"].astype(object).fillna("").astype(str).replace("", "own")
    frame = frame.assign(link_gbps=frame["link_gbps"].replace("", np.nan).astype(float)
                         .fillna(0.0),
                         framework=framework,
                         strategy=frame["strategy"].astype(object).fillna("").astype(str),
                         compress=frame["compress"].fillna("").astype(str),
                         error_feedback=frame["error_feedback"].fillna(0))
    return frame


def run_label(key: tuple, varied_compress: bool, show_framework: bool = False) -> str:
    framework, variant, algorithm, codec, compress, feedback, strategy = key
    label = series_label(variant, algorithm, codec)
    if variant == "torch":
        label = "torch" + (f" {codec} hook" if codec and codec != "none" else "")
    if varied_compress and compress:
        label += f" ({compress})"
    if feedback not in ("", 0, "0", False) and float(feedback or 0) > 0:
        label += " +EF"
    if strategy:
        label += f" [{strategy}]"
    return f"{framework}: {label}" if show_framework else label


def is_baseline(label: str) -> bool:
    """The uncompressed reference of a panel: ccbench's baseline or torch's collectives."""
    name = label.split(": ", 1)[-1]
    return name.startswith("baseline") or name == "torch"


def training_settings(frame: pd.DataFrame):
    """(model, ranks, link) settings, emulated links first, at most two."""
    groups = list(frame.groupby(list(SETTING_KEYS), sort=True))
    groups.sort(key=lambda g: (g[0][2] <= 0, -g[0][2], str(g[0][0]), g[0][1]))
    return groups


def setting_title(model, ranks, link) -> str:
    return f"{model}, {panel_title(ranks, link)}" if model else panel_title(ranks, link)


def training_loss(data, style: Style) -> list[Figure]:
    frame = training_frame(data)
    steps = frame[(frame["row"] == "step") & frame["step"].notna()]
    if steps.empty:
        raise Skip("no per-step training rows")
    groups = training_settings(steps)[:2]
    fig, axes = figure(len(groups))
    handles, labels = [], []
    for ax, ((model, ranks, link), sub) in zip(axes, groups, strict=True):
        varied = sub.loc[sub["variant"] != "baseline", "compress"].nunique() > 1
        several = sub["framework"].nunique() > 1
        finals = []
        for key, run in sub.groupby(list(RUN_KEYS), sort=False):
            run = run.sort_values("step")
            variant, algorithm, codec = key[1:4]
            label = run_label(key, varied, several)
            marker = style.marker(codec)
            (line,) = ax.plot(run["step"], run["loss"], color=style.color(variant, algorithm),
                              markevery=max(1, len(run) // 8), label=label, linewidth=0.9,
                              **marker)
            handles.append(line)
            labels.append(label)
            window = run["loss"].tail(max(1, min(10, len(run))))
            finals.append((label, float(window.mean())))
        ax.set_xlabel("Step")
        ax.set_ylabel("Training loss")
        ax.set_title(setting_title(model, ranks, link))
        reference = [v for k, v in finals if is_baseline(k)]
        if reference:
            lines = ["final loss vs uncompressed:"] + [
                f"{k}: {100 * (v / reference[0] - 1):+.1f}%" for k, v in finals
                if not is_baseline(k)]
            if len(lines) > 1:
                panel_note(ax, "\n".join(lines), "best")
    legend_below(fig, handles, labels, ncol=2)
    caption = ("Training loss per step (mean over ranks) per (framework, variant, codec): "
               "the compact sharded trainer (own), stock PyTorch FSDP2 / DDP with "
               "ccbench's collectives plugged in, or MG-WFBP from gradient hooks; same "
               "seeds and data for every run. The box compares the final loss (mean of "
               "the last 10 steps) with the first uncompressed run (ccbench's baseline or "
               "torch's own collectives; the paper: similar accuracy).")
    return [Figure("seed000_training_loss", fig, caption + runs_note(steps))]


def training_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its summary row, or the mean of its step rows if none."""
    summary = frame[frame["row"] == "summary"]
    steps = frame[frame["row"] == "step"]
    keys = list(RUN_KEYS + SETTING_KEYS)
    have = set(map(tuple, summary[keys].astype(str).values))
    missing = steps[[tuple(r) not in have for r in steps[keys].astype(str).values]]
    if not missing.empty:
        means = missing.groupby(keys, as_index=False).mean(numeric_only=True)
        summary = pd.concat([summary, means], ignore_index=True)
    return summary


def training_step_time(data, style: Style) -> list[Figure]:
    summary = training_summary(training_frame(data))
    if summary.empty:
        raise Skip("no training rows")
    groups = training_settings(summary)[:2]
    fig, axes = figure(len(groups))
    handles, labels = [], []
    for ax, ((model, ranks, link), sub) in zip(axes, groups, strict=True):
        varied = sub.loc[sub["variant"] != "baseline", "compress"].nunique() > 1
        several = sub["framework"].nunique() > 1
        order = {"torch": -1, "baseline": 0, "p2p_compressed": 1, "coll_compressed": 2}
        sub = sub.assign(_framework=sub["framework"].map(FRAMEWORK_ORDER).fillna(9),
                         _order=sub["variant"].map(order).fillna(9),
                         _codec=sub["codec"].map(codec_sort_key))
        sub = sub.sort_values(["_framework", "_order", "_codec"])
        scale, unit = time_unit(sub["step_us"])
        names = []
        for x, (_, run) in enumerate(sub.iterrows()):
            key = tuple(run[k] for k in RUN_KEYS)
            color = style.color(run["variant"], run["algorithm"])
            compute = run.get("compute_us", np.nan)
            comm = run.get("comm_us", np.nan)
            if np.isfinite(compute) and np.isfinite(comm):
                a = ax.bar(x, compute / scale, 0.6, color="0.8", label="compute")
                b = ax.bar(x, comm / scale, 0.6, bottom=compute / scale, color=color,
                           label="communication")
                rest = run["step_us"] - compute - comm
                if rest > 0.02 * run["step_us"]:
                    ax.bar(x, rest / scale, 0.6, bottom=(compute + comm) / scale,
                           color="white", edgecolor="0.6", linewidth=0.5)
                handles += [a]
                labels += ["compute"]
                del b
            else:
                ax.bar(x, run["step_us"] / scale, 0.6, color=color)
            ax.text(x, run["step_us"] / scale, f"{run['step_us'] / scale:.3g}", ha="center",
                    va="bottom", fontsize=5.8)
            names.append(run_label(key, varied, several).replace("compressed, ", "\n")
                         .replace(": ", ":\n"))
        crowded = len(names) > 5
        ax.set_xticks(range(len(names)), [n.replace("\n", " ") if crowded else n
                                          for n in names],
                      rotation=40 if crowded else 0, ha="right" if crowded else "center",
                      fontsize=5.2 if crowded else 5.8)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(f"Time per step ({unit})")
        ax.set_title(setting_title(model, ranks, link))
        ax.set_ylim(0, 1.4 * float(sub["step_us"].max()) / scale)  # room for the note
        text = step_time_text(sub)
        if text:
            panel_note(ax, text, "upper left")
    from matplotlib.patches import Patch

    handles.append(Patch(facecolor="0.5", label="communication (colour of the variant)"))
    labels.append("communication (colour of the variant)")
    legend_below(fig, handles, labels, ncol=2)
    caption = ("Time per training step (after warm-up), split into compute (grey) and the "
               "communication the step waited for (coloured by variant: all of the "
               "allgather and reduce-scatter in the compact trainer, the part not hidden "
               "behind compute in FSDP, DDP and MG-WFBP); an outlined top is time spent "
               "elsewhere. The box gives the collective-level variant's step time against "
               "the uncompressed baseline and point-to-point compression of the same "
               "framework (the paper, FSDP: 31.7% and 12.5% faster).")
    return [Figure("seed000_training_step_time", fig, caption + runs_note(summary))]


def step_time_changes(sub: pd.DataFrame) -> list[tuple[str, float | None, float | None]]:
    """(label, % faster than the baseline, % faster than p2p) for collective-level runs,
    each against runs of its own framework (FSDP first)."""
    if "framework" not in sub.columns:
        sub = sub.assign(framework="own")
    out = []
    several = sub["framework"].nunique() > 1
    frameworks = sorted(sub["framework"].unique(), key=lambda f: FRAMEWORK_ORDER.get(f, 9))
    for framework in frameworks:
        own = sub[sub["framework"] == framework]
        base = own[own["variant"] == "baseline"]["step_us"]
        for _, run in own[own["variant"] == "coll_compressed"].iterrows():
            p2p = own[(own["variant"] == "p2p_compressed") & (own["codec"] == run["codec"])
                      & (own["compress"] == run["compress"])
                      & (own["error_feedback"] == run["error_feedback"])]["step_us"]
            label = f"{framework} {run['codec']}" if several else run["codec"]
            out.append((label,
                        100 * (1 - run["step_us"] / base.min()) if not base.empty else None,
                        100 * (1 - run["step_us"] / p2p.min()) if not p2p.empty else None))
    return out


def step_time_text(sub: pd.DataFrame) -> str:
    changes = step_time_changes(sub)
    if not changes:
        return ""
    show = lambda v: "n/a" if v is None else f"{-v:+.0f}%"  # noqa: E731
    return "\n".join(["collective-level step time", "vs baseline / vs p2p"]
                     + [f"{c}: {show(b)} / {show(p)}" for c, b, p in changes])


def headlines(data) -> list[Headline]:
    found = []
    claims = {"allgather": ("83.6%", "30.3%"), "reduce_scatter": ("88.1%", "40.6%")}
    for collective, (vs_base, vs_p2p) in claims.items():
        entries = reductions(hold_configuration(
            rows(data, "harness", collective=collective, variant=VARIANTS))[0])
        name = COLLECTIVE_LABELS[collective]
        for key, published, against in (("vs_baseline", vs_base, "the baseline"),
                                         ("vs_p2p", vs_p2p, "point-to-point compression")):
            valid = [e for e in entries if e[key] is not None]
            if not valid:
                continue
            best = max(valid, key=lambda e: e[key])
            found.append(Headline(
                "seed 000", f"{name}: collective-level latency lower than {against}",
                percent(best[key]), f"up to {published} lower",
                f"{best['codec']}, {format_bytes(best['size'])}, "
                f"{panel_title(best['ranks'], best['link'])}"))
    if not data.has("training"):
        return found
    summary = training_summary(training_frame(data))
    changes = []
    for (model, ranks, link), sub in training_settings(summary) if not summary.empty else []:
        changes += [(c, b, p, setting_title(model, ranks, link))
                    for c, b, p in step_time_changes(sub)]
    for index, published, against in ((1, "31.7%", "the baseline"),
                                       (2, "12.5%", "point-to-point compression")):
        valid = [c for c in changes if c[index] is not None]
        if valid:
            best = max(valid, key=lambda c: c[index])
            measured = (f"{best[index]:.1f}% faster" if best[index] >= 0
                        else f"{-best[index]:.1f}% slower")
            found.append(Headline("seed 000", f"Training step time: collective-level "
                                  f"compression against {against}", measured,
                                  f"{published} faster (FSDP)", f"{best[0]}, {best[3]}"))
    return found


FIGURES = [
    FigureSpec("seed000_allgather_latency", "seed 000", "Allgather latency vs message size",
               ("harness",), lambda d, s: latency_vs_size(d, s, "allgather")),
    FigureSpec("seed000_reduce_scatter_latency", "seed 000",
               "Reduce-Scatter latency vs message size",
               ("harness",), lambda d, s: latency_vs_size(d, s, "reduce_scatter")),
    FigureSpec("seed000_allreduce_latency", "seed 000", "Allreduce latency vs message size",
               ("harness",), lambda d, s: latency_vs_size(d, s, "allreduce")),
    FigureSpec("seed000_rate_sensitivity", "seed 000", "Sensitivity to the codec rate",
               ("harness",), rate_sensitivity),
    FigureSpec("seed000_training_loss", "seed 000", "Training loss per step",
               ("training",), training_loss),
    FigureSpec("seed000_training_step_time", "seed 000", "Training time per step",
               ("training",), training_step_time),
]

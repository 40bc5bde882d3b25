"""Seed 000 training figures: loss per step and time per step of the training runs.

Every note beside a panel is computed from the runs drawn in that panel.
"""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from ccbench.kernels import variants
from ccbench.plots import papers
from ccbench.plots.base import (
    SEPARATE,
    Figure,
    FigureSpec,
    Skip,
    change_text,
    link_of,
    panel_title,
    rows,
    runs_note,
)
from ccbench.plots.claims import (
    INTERLEAVED,
    SEPARATE_LAUNCHES,
    Point,
    RatioClaim,
    differs_text,
    opposite,
    separate_ratio,
)
from ccbench.plots.compression_notes import INTERLEAVED_LABEL, interleaved_handle
from ccbench.plots.steps import FRAMEWORK_ORDER, Launch, interval, launches, training_frame
from ccbench.plots.style import (
    FULL_WIDTH,
    Style,
    codec_label,
    codec_sort_key,
    figure,
    legend_below,
    panel_note,
    series_label,
    time_unit,
)


def run_label(launch: Launch, show_framework: bool, varied_compress: bool) -> str:
    framework, variant, algorithm, codec, compress, feedback = launch.key
    label = series_label(variant, algorithm, codec)
    if variant == "torch":
        label = "torch" + (f" {codec} hook" if codec and codec != "none" else "")
    if varied_compress and compress:
        label += f" ({compress})"
    if float(feedback or 0) > 0:
        label += " +EF"
    if len(launch.strategies) > 1:
        label += " [strategies rotated]"
    # the series first: a legend entry's colour stands for its variant, page-wide
    return f"{label}, {framework}" if show_framework else label


def is_uncompressed(launch: Launch) -> bool:
    """ccbench's baseline or torch's own collectives without a compression hook."""
    _, variant, _, codec, _, _ = launch.key
    return variant == "baseline" or (variant == "torch" and codec in ("", "none"))


def training_settings(runs: list[Launch]) -> list[tuple[tuple, list[Launch]]]:
    """(model, ranks, link) settings, emulated links first."""
    settings: dict[tuple, list[Launch]] = {}
    for launch in runs:
        settings.setdefault(launch.setting, []).append(launch)
    return sorted(settings.items(), key=lambda s: (s[0][2] <= 0, -s[0][2], str(s[0][0]), s[0][1]))


def setting_title(model, ranks, link) -> str:
    return f"{model}, {panel_title(ranks, link)}" if model else panel_title(ranks, link)


LINESTYLES = ("-", ":", "-.", (0, (3, 1, 1, 1, 1, 1)))  # dashed is kept for models


def loss_notes(group: list[Launch], labels: list[str]) -> list[str]:
    """Final loss of each run over one range of steps for all (the last steps every run
    reached: a run with more steps would otherwise look further trained): the mean with
    its 95% t interval."""
    end = min(int(launch.steps["step"].max()) for launch in group)
    window = min(launch.window for launch in group)
    lines = []
    for launch, label in zip(group, labels, strict=True):
        steps = launch.steps
        chosen = steps[(steps["step"] > end - window) & (steps["step"] <= end)]
        mean, low, high, n = interval(chosen["loss"].to_numpy(dtype=float))
        bounds = f" [{low:.3f}, {high:.3f}]" if np.isfinite(low) else ""
        lines.append(f"{label}: {mean:.3f}{bounds} (steps {end - n + 1}-{end})")
        own_end = int(steps["step"].max())
        if own_end > end:  # it ran longer: its summary is over its own last steps
            own, own_low, own_high, own_n = interval(launch.final_losses())
            own_bounds = f" [{own_low:.3f}, {own_high:.3f}]" if np.isfinite(own_low) else ""
            lines.append(
                f"  its summary: {own:.3f}{own_bounds} (steps {own_end - own_n + 1}-{own_end})"
            )
    return lines


def training_loss(data, style: Style) -> list[Figure]:
    runs = launches(training_frame(data))
    if not runs:
        raise Skip("no per-step training rows")
    settings = training_settings(runs)[:2]
    fig, axes = figure(
        2 * len(settings),
        ncols=len(settings),
        width=FULL_WIDTH * 0.8,
        panel_height=1.7 + 0.1 * max(len(g) for _, g in settings),
    )
    handles, labels = [], []
    for col, ((model, ranks, link), group) in enumerate(settings):
        ax, ax_diff = axes[col], axes[len(settings) + col]
        several = len({la.key[0] for la in group}) > 1
        varied = len({la.key[4] for la in group if la.key[1] != "baseline"}) > 1
        names = [run_label(la, several, varied) for la in group]
        # the reference: an uncompressed run of the compact trainer, one strategy
        plain = sorted(
            (la for la in group if is_uncompressed(la)),
            key=lambda la: (len(la.strategies) > 1, la.key[0] != "own"),
        )
        reference = plain[0] if plain else None
        ref_loss = reference.steps.set_index("step")["loss"] if reference is not None else None
        for i, (launch, name) in enumerate(zip(group, names, strict=True)):
            steps = launch.steps
            variant, algorithm = launch.key[1:3]
            kw = dict(
                # the variant's colour, as on every figure of the page; runs of one
                # variant apart by line style and marker
                color=style.color(variant, algorithm),
                linestyle=LINESTYLES[i % 4],
                marker="osD^v<>p"[i % 8],
                markersize=2.6,
                linewidth=0.9,
                markevery=(i % 4, max(1, len(steps) // 8)),
                label=name,
            )
            (line,) = ax.plot(steps["step"], steps["loss"], **kw)
            handles.append(line)
            labels.append(name)
            if ref_loss is not None and launch is not reference:
                shared = steps[steps["step"].isin(ref_loss.index)]
                ax_diff.plot(
                    shared["step"],
                    shared["loss"].to_numpy() - ref_loss.loc[shared["step"]].to_numpy(),
                    **kw,
                )
        ax.set_ylabel("Training loss")
        ax.set_title(setting_title(model, ranks, link))
        ax_diff.axhline(0.0, color="0.5", linewidth=0.6)
        for axis in (ax, ax_diff):  # steps are whole numbers
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_diff.set_xlabel("Step")
        ax_diff.set_ylabel("Loss difference")
        ax_diff.set_title(
            "minus " + names[group.index(reference)]
            if reference is not None
            else "no uncompressed run to compare with"
        )
        compared = ref_loss is not None and any(la is not reference for la in group)
        if not compared:  # one run, or none uncompressed: no difference to draw
            ax_diff.set_visible(False)
        panel_note(
            ax_diff if compared else ax,
            "final loss, mean of the last steps [95% "
            "interval]\n" + "\n".join(loss_notes(group, names)),
        )
    legend_below(fig, handles, labels, ncol=2)
    reference_text = (
        "an uncompressed run (ccbench's baseline, the compact trainer's "
        "first; or torch's own collectives), named above the panel"
    )
    caption = (
        "Training loss per step (top; mean over ranks) for each run (framework, "
        "variant, codec): the compact sharded trainer (own), stock PyTorch FSDP2 / "
        "DDP with ccbench's collectives plugged in, or MG-WFBP from gradient hooks "
        "(one run, its strategies rotated step by step); same seeds and data for "
        "every run. Bottom: each run's loss minus that of "
        + reference_text
        + " at the same step, so runs whose curves coincide above stay apart. The "
        "note gives each run's final loss over the last steps every run reached (the "
        "steps named), the mean with the 95% t interval over those steps; a run that "
        "ran longer also gets its summary's final loss, the mean over its own last "
        "steps. The "
        f"paper ({papers.PAPERS['seed 000'].short}, abstract): similar accuracy "
        "with compression."
    )
    steps = training_frame(data)
    return [Figure("seed000_training_loss", fig, caption + runs_note(steps))]


def step_bars(group: list[Launch]) -> list[dict]:
    """One bar per run (per strategy for MG-WFBP runs): the mean time per timed step with
    its 95% t interval, and the mean compute and exposed communication."""
    bars = []
    for launch in group:
        for strategy in launch.strategies or [None]:
            timed = launch.timed(strategy)
            mean, low, high, n = interval(timed["step_us"])
            bars.append(
                {
                    "launch": launch,
                    "strategy": strategy,
                    "step_us": mean,
                    "low": low,
                    "high": high,
                    "n": n,
                    "compute_us": float(timed["compute_us"].mean())
                    if "compute_us" in timed
                    else np.nan,
                    "comm_us": float(timed["comm_us"].mean()) if "comm_us" in timed else np.nan,
                }
            )
    return sorted(
        bars,
        key=lambda b: (
            FRAMEWORK_ORDER.get(b["launch"].key[0], 9),
            variants.order(b["launch"].key[1]),
            codec_sort_key(b["launch"].key[3]),
            str(b["strategy"]),
        ),
    )


def interleaved_step(compares, claim: str, codec: str, ranks, link):
    """((ratio, low, high), {variant: mean step time of its interleaved rounds}) of the
    `ccbench compare` of two FSDP training runs that measured this claim (B = collective
    level) for this codec, rank count and link; or None."""
    from ccbench.plots.headlines import oriented_ratio, parse_side

    if compares is None or compares.empty:
        return None
    for _, row in compares.iloc[::-1].iterrows():  # the newest first
        if (
            str(row.get("config", "")) != "step"
            or int(row["ranks"]) != int(ranks)
            or float(link_of(row.to_frame().T).iloc[0]) != float(link)
        ):
            continue
        got = oriented_ratio(row, claim, codec)
        if got is not None:
            times = {
                parse_side(row[side]).get("variant_option", ""): float(row.get(f"{side}_us"))
                for side in ("a", "b")
            }
            return got, times
    return None


def _bar_point(bar: dict | None) -> Point | None:
    return None if bar is None else Point(bar["step_us"], bar["low"], bar["high"])


def step_time_changes(bars: list[dict], compares=None, ranks=0, link=0.0) -> list[dict]:
    """Per collective-level run, each against bars of its own framework: its label, the
    change over the baseline and over p2p ((ratio, low, high) or None), whether they are
    interleaved, and the bars drawn (A's of each, B's). From the interleaved comparison of
    the same claim where one was measured (FSDP: the number the headline table quotes),
    else from the drawn bars."""
    out = []
    frameworks = list(dict.fromkeys(b["launch"].key[0] for b in bars))
    several = len(frameworks) > 1
    for framework in frameworks:
        own = [b for b in bars if b["launch"].key[0] == framework and b["strategy"] is None]
        base = next((b for b in own if b["launch"].key[1] == "baseline"), None)
        for bar in (b for b in own if b["launch"].key[1] == "coll_compressed"):
            codec, compress, feedback = bar["launch"].key[3:6]
            p2p = next(
                (
                    b
                    for b in own
                    if b["launch"].key[1] == "p2p_compressed"
                    and b["launch"].key[3:6] == (codec, compress, feedback)
                ),
                None,
            )

            def against(a, b=bar):
                return None if a is None else separate_ratio(_bar_point(a), _bar_point(b))

            label = f"{framework} {codec_label(codec)}" if several else codec_label(codec)
            measured = (None, None)
            if framework == "fsdp" and compress in ("", "both"):  # the default, as compared
                measured = tuple(
                    interleaved_step(compares, f"training_vs_{what}", codec, ranks, link)
                    for what in ("baseline", "p2p")
                )
            entry = {"label": label, "base_bar": base, "p2p_bar": p2p, "bar": bar}
            if any(measured):
                times = {k: m[1] for k, m in zip(("base", "p2p"), measured, strict=True) if m}
                out.append(
                    {
                        **entry,
                        "base": measured[0] and measured[0][0],
                        "p2p": measured[1] and measured[1][0],
                        "interleaved": True,
                        "times": times,
                    }
                )
            elif base is not None or p2p is not None:
                out.append(
                    {**entry, "base": against(base), "p2p": against(p2p), "interleaved": False}
                )
    return out


def series_of(bar: dict) -> tuple[str, str, str]:
    _, variant, algorithm, codec = bar["launch"].key[:4]
    return (str(variant), str(algorithm), str(codec))


def step_time_text(
    bars: list[dict], compares=None, ranks=0, link=0.0, panel: str = ""
) -> tuple[str, list[RatioClaim]]:
    """The note and the claims it states."""
    changes = step_time_changes(bars, compares, ranks, link)
    if not changes:
        return "", []
    show = lambda v: "no comparison" if v is None else change_text(*v)  # noqa: E731
    how = {c["interleaved"] for c in changes}
    source = (
        "interleaved, ccbench compare"
        if how == {True}
        else "separate launches"
        if how == {False}
        else "see each line"
    )
    lines, claims, explain = [f"collective-level step time change [{source}]"], [], []
    for c in changes:
        text = f"{c['label']}: {show(c['base'])} vs baseline; {show(c['p2p'])} vs p2p" + (
            "" if len(how) == 1 else " (interleaved)" if c["interleaved"] else " (separate)"
        )
        lines.append(text)
        for key, against in (("base", "baseline"), ("p2p", "p2p")):
            reference = c[f"{key}_bar"]
            if c[key] is None or reference is None:
                continue
            a_drawn, b_drawn = _bar_point(reference), _bar_point(c["bar"])
            differs = None
            if c["interleaved"]:
                separate = separate_ratio(a_drawn, b_drawn)
                if opposite(c[key][0], separate[0]):
                    differs = separate
                    explain.append(f"{c['label']} vs {against}:" + differs_text(separate))
            claims.append(
                RatioClaim(
                    "seed000_training_step_time",
                    panel,
                    series_of(reference),
                    series_of(c["bar"]),
                    0.0,
                    *c[key],
                    INTERLEAVED if c["interleaved"] else SEPARATE_LAUNCHES,
                    text,
                    a_drawn,
                    b_drawn,
                    differs,
                    {"ranks": ranks, "link": link},
                )
            )
    return "\n".join(lines + explain), claims


def draw_interleaved_steps(ax, bars, changes, style: Style, scale: float) -> bool:
    """The interleaved rounds' mean step times on the bars of the two sides."""
    drawn = False
    for c in changes:
        for key, times in c.get("times", {}).items():
            for bar in (c[f"{key}_bar"], c["bar"]):
                us = times.get(bar["launch"].key[1]) if bar is not None else None
                if us is None or not np.isfinite(us):
                    continue
                variant, algorithm = bar["launch"].key[1:3]
                ax.plot(
                    [bars.index(bar)],
                    [us / scale],
                    linestyle="none",
                    marker="*",
                    markersize=7,
                    markeredgecolor="black",
                    markeredgewidth=0.5,
                    color=style.color(variant, algorithm),
                    zorder=4,
                    label="_interleaved",
                )
                drawn = True
                low, high = ax.get_ylim()
                ax.set_ylim(low, max(high, 1.05 * us / scale))  # on the axis
    return drawn


def bar_label(bar: dict, several: bool, varied: bool) -> str:
    label = run_label(bar["launch"], several, varied).replace(" [strategies rotated]", "")
    if bar["strategy"]:
        label += f" [{bar['strategy']}]"
    return label


def training_step_time(data, style: Style) -> list[Figure]:
    runs = launches(training_frame(data))
    if not runs:
        raise Skip("no per-step training rows")
    settings = training_settings(runs)[:2]
    fig, axes = figure(len(settings), panel_height=2.9)
    handles, labels, stated_claims, drawn_series, stars = [], [], [], [], False
    inferred = all(la.inferred for _, group in settings for la in group)
    for ax, ((model, ranks, link), group) in zip(axes, settings, strict=True):
        several = len({la.key[0] for la in group}) > 1
        varied = len({la.key[4] for la in group if la.key[1] != "baseline"}) > 1
        bars = step_bars(group)
        scale, unit = time_unit(
            [b["high"] if np.isfinite(b["high"]) else b["step_us"] for b in bars]
        )
        names = []
        for x, bar in enumerate(bars):
            variant, algorithm = bar["launch"].key[1:3]
            color = style.color(variant, algorithm)
            drawn_series.append((variant, algorithm))
            compute, comm, step = bar["compute_us"], bar["comm_us"], bar["step_us"]
            if np.isfinite(compute) and np.isfinite(comm):
                a = ax.bar(x, compute / scale, 0.6, color="0.8", label="compute")
                ax.bar(x, comm / scale, 0.6, bottom=compute / scale, color=color)
                rest = step - compute - comm
                if rest > 0.02 * step:
                    ax.bar(
                        x,
                        rest / scale,
                        0.6,
                        bottom=(compute + comm) / scale,
                        color="white",
                        edgecolor="0.6",
                        linewidth=0.5,
                    )
                handles.append(a)
                labels.append("compute")
            else:
                ax.bar(x, step / scale, 0.6, color=color)
            if np.isfinite(bar["low"]):
                ax.errorbar(
                    x,
                    step / scale,
                    yerr=[[(step - bar["low"]) / scale], [(bar["high"] - step) / scale]],
                    color="black",
                    capsize=2,
                    elinewidth=0.7,
                    linestyle="none",
                )
            names.append(bar_label(bar, several, varied))
        crowded = len(names) > 4
        ax.set_xticks(
            range(len(names)),
            names,
            rotation=40 if crowded else 0,
            ha="right" if crowded else "center",
            fontsize=5.2 if crowded else 5.8,
        )
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(f"Time per step ({unit})")
        ax.set_title(setting_title(model, ranks, link))
        ax.set_ylim(bottom=0)
        text, stated = step_time_text(
            bars, rows(data, "compare"), ranks, link or 0.0, setting_title(model, ranks, link)
        )
        changes = step_time_changes(bars, rows(data, "compare"), ranks, link or 0.0)
        stars |= draw_interleaved_steps(ax, bars, changes, style, scale)
        stated_claims += stated
        if text:
            panel_note(ax, text)
    from matplotlib.patches import Patch

    for variant, algorithm in dict.fromkeys(drawn_series):
        label = f"{series_label(variant, algorithm)}: communication"
        handles.append(Patch(facecolor=style.color(variant, algorithm), label=label))
        labels.append(label)
    if stars:
        handles.append(interleaved_handle())
        labels.append(INTERLEAVED_LABEL)
    legend_below(fig, handles, labels, ncol=2)
    claims = papers.CLAIMS
    caption = (
        "Time per training step, the mean over the timed steps (after warm-up) of "
        "each run's per-step rows, split into compute (grey) and the communication "
        "the step waited for (coloured by variant: all of the allgather and "
        "reduce-scatter in the compact trainer, the part not hidden behind compute "
        "in FSDP, DDP and MG-WFBP); an outlined top is time spent elsewhere. Error "
        "bars: the 95% t interval of the mean over the timed steps. The note gives "
        "the collective-level run's step time change against the uncompressed "
        "baseline and point-to-point compression of the same framework. "
        + SEPARATE
        + f" The paper ({papers.PAPERS['seed 000'].short}, FSDP, "
        f"{claims['training_vs_baseline'].source}): "
        f"{claims['training_vs_baseline'].value} than the baseline, "
        f"{claims['training_vs_p2p'].value} than point-to-point compression."
    )
    if stars:
        caption += (
            " Stars edged in black: the mean step times of the interleaved rounds the "
            "note quotes (ccbench compare), on the bars of each side; where they and the "
            "bars point different ways the note says so."
        )
    if not inferred:
        caption += " Some runs have no summary row: their warm-up is the training loop's default."
    return [
        Figure(
            "seed000_training_step_time",
            fig,
            caption + runs_note(training_frame(data)),
            stated_claims,
        )
    ]


FIGURES = [
    FigureSpec(
        "seed000_training_loss", "seed 000", "Training loss per step", ("training",), training_loss
    ),
    FigureSpec(
        "seed000_training_step_time",
        "seed 000",
        "Training time per step",
        ("training",),
        training_step_time,
    ),
]

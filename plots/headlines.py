"""The headline table: each paper's number next to an interleaved comparison measured here.

A headline number is a ratio B/A measured in interleaved rounds, with its 95% interval,
the rounds and iterations behind it and its verdict: a `ccbench compare` row, or MG-WFBP
strategies that took turns step by step in one training run. A ratio of two separately
measured rows never becomes a headline; a claim with no interleaved comparison in the
inputs gets a row that says what to run.
"""

from __future__ import annotations

import math
import shlex

import numpy as np

from ccbench.benchmarks.statistics import DEFAULT_MARGIN, FASTER, ratio_interval, verdict
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.inputs import ALIASES
from ccbench.plots import papers
from ccbench.plots.base import Headline, link_of, panel_title, rows
from ccbench.plots.steps import launches, training_frame
from ccbench.plots.style import COLLECTIVE_LABELS, codec_label, format_bytes, is_lossless

REAL_GRADIENT = ALIASES["gradient"]  # the corpus's gradient tensors: data kinds grad:...
# Lossless codecs enter the table only if they compress real gradients better than this.
LOSSLESS_MIN_RATIO = 1.3


def parse_side(text: str) -> dict:
    """'coll_compressed --codec fp16 @ REV' -> {'variant': ..., 'codec': 'fp16', ...}."""
    command = str(text).split(" @ ", 1)[0]
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    side = {"variant": words[0] if words else "", "algorithm": "", "codec": "none"}
    for flag, value in zip(words[1:], words[2:], strict=False):
        if flag.startswith("--") and not value.startswith("-"):
            key = flag[2:].replace("-", "_")
            side["variant_option" if key == "variant" else key] = value
    if side["variant"] == "training":
        side.setdefault("variant_option", "baseline")  # the training script's default
    return side


def oriented_ratio(row, claim: str, codec: str, collective: str = ""):
    """(ratio, low, high) of a `ccbench compare` row that measured `claim` for `codec`,
    oriented as B = collective level; None where the row measured something else."""
    a, b = parse_side(row["a"]), parse_side(row["b"])
    found = claim_of(a, b, collective)
    if found is None or found[0] != claim:
        return None
    coll = a if found[1] else b
    if coll["codec"] != codec or not np.isfinite(float(row["ratio"])):
        return None
    ratio, low, high = (float(row[c]) for c in ("ratio", "ratio_low", "ratio_high"))
    return (1 / ratio, 1 / high, 1 / low) if found[1] else (ratio, low, high)


def claim_of(a: dict, b: dict, collective: str) -> tuple[str, bool] | None:
    """(claim key, whether A and B are swapped relative to the claim) or None."""
    pairs = []
    if f"{collective}_vs_baseline" in papers.CLAIMS:  # the collectives the papers measured
        pairs += [
            (("baseline", None), ("coll_compressed", None), f"{collective}_vs_baseline"),
            (("p2p_compressed", None), ("coll_compressed", None), f"{collective}_vs_p2p"),
        ]
    pairs.append(
        (("sparse_streaming", "dense"), ("sparse_streaming", "omnireduce"), "omnireduce_speedup")
    )
    # FSDP training: `training --framework fsdp --variant V` step times
    if (
        a["variant"] == b["variant"] == "training"
        and a.get("framework") == b.get("framework") == "fsdp"
    ):
        pairs += [
            (("training", "baseline"), ("training", "coll_compressed"), "training_vs_baseline"),
            (("training", "p2p_compressed"), ("training", "coll_compressed"), "training_vs_p2p"),
        ]

    def matches(side, want):
        variant, algorithm = want
        if variant == "training":  # the training script's --variant says what carries it
            return side["variant"] == variant and side.get("variant_option") == algorithm
        return side["variant"] == variant and (algorithm is None or side["algorithm"] == algorithm)

    for first, second, key in pairs:
        same_codec = key.endswith("_vs_p2p")
        if same_codec and a["codec"] != b["codec"]:
            continue
        if matches(a, first) and matches(b, second):
            return key, False
        if matches(b, first) and matches(a, second):
            return key, True
    return None


def real_data_ratios(data) -> dict[str, float]:
    """codec -> median compression ratio measured on real gradients (harness rows of a
    grad:... data kind, and codec throughput rows on them)."""
    found: dict[str, list[float]] = {}
    for kind, column in (("harness", "compression_ratio"), ("codec", "ratio")):
        frame = rows(data, kind)
        if frame.empty or "data" not in frame or column not in frame:
            continue
        real = frame[frame["data"].astype(str).str.split(":").str[0] == REAL_GRADIENT]
        for codec, sub in real.groupby("codec"):
            values = sub[column].to_numpy(dtype=float)
            found.setdefault(str(codec), []).extend(values[np.isfinite(values)])
    return {codec: float(np.median(v)) for codec, v in found.items() if v}


def percent_change(ratio: float, low: float, high: float) -> str:
    """B/A as the change of B's time: '-89% (95% interval -90% to -88%)'."""
    text = f"{100 * (ratio - 1):+.1f}%"
    if math.isfinite(low) and math.isfinite(high):
        text += f" (95% interval {100 * (low - 1):+.1f}% to {100 * (high - 1):+.1f}%)"
    return text


def speedup(ratio: float, low: float, high: float) -> str:
    """A/B as a speed-up of B: '2.10x (95% interval 1.90x to 2.30x)'."""
    text = f"{1 / ratio:.2f}x"
    if math.isfinite(low) and math.isfinite(high):
        text += f" (95% interval {1 / high:.2f}x to {1 / low:.2f}x)"
    return text


def half_width_pct(low: float, high: float) -> float:
    """An interval's relative half-width in percent, as `ccbench compare` measures it
    against its target: sqrt(high / low) - 1 (symmetric in log B/A)."""
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0:
        return math.nan
    return 100 * (math.sqrt(high / low) - 1)


def cap_text(half_width: float, target: float, how: str = "round cap reached") -> str:
    """Said beside a headline's rounds when its interval stayed wider than the target."""
    if not (math.isfinite(half_width) and math.isfinite(target)) or half_width <= target:
        return ""
    return f"; {how}: interval +-{half_width:.0f}%, wider than the +-{target:g}% target"


def samples(rounds, a_iterations, b_iterations, unit: str = "iterations", turns=None) -> str:
    """'5 rounds x 6 turns x 5 iterations': the launches behind a ratio, the turns of
    both sides within each (in-launch comparisons) and the timed calls of each turn."""

    def whole(v):
        return "?" if v is None or not np.isfinite(float(v)) else f"{int(v)}"

    each = (
        whole(a_iterations)
        if whole(a_iterations) == whole(b_iterations)
        else f"{whole(a_iterations)} (A) / {whole(b_iterations)} (B)"
    )
    within = f"{whole(turns)} turns x " if whole(turns) not in ("?", "1") else ""
    return f"{whole(rounds)} rounds x {within}{each} {unit}"


REPRODUCED, NOT_REPRODUCED, NOT_COMPARABLE = "reproduced", "not reproduced", "not comparable"
# The rule, as the page states it under every headline table.
REPRODUCTION_RULE = (
    "Against the paper: <b>reproduced</b> when the measured change goes the paper's way "
    "beyond the margin (the verdict is faster) and the paper's number lies within the 95% "
    "interval widened by the margin on both sides (low / (1 + margin) to high x (1 + "
    "margin)); a claim that states no number is reproduced by its direction alone. "
    "<b>Not reproduced</b> otherwise: no difference shown, the opposite direction, or a "
    "change smaller or larger than the paper's. <b>Not comparable</b> when no measurement "
    "here can reach the paper's number: a saving against the uncompressed baseline beyond "
    "what the codec's compression ratio allows (a ratio r saves at most 1 - 1/r of the "
    "bytes), a paper number of another kind (end-to-end training), or a measurement in "
    "shared memory (every paper measured a network). The margin (3% "
    "unless the row says otherwise) is the one the verdict uses: B is faster when the "
    "whole interval lies below 1 / (1 + margin), slower when it lies above 1 + margin."
)


def margin_text(margin: float) -> str:
    return f"{100 * margin:g}%"


SHARED_MEMORY = (
    "measured in shared memory; the paper measured a network, where bytes "
    "saved can pay for the work that saves them"
)


def against_paper(
    claim_key: str,
    ratio: float,
    low: float,
    high: float,
    margin: float,
    codec: str = "none",
    link: float | None = None,
) -> str:
    """Whether a measured B/A (95% interval) reproduces the paper's claim, by the rule of
    REPRODUCTION_RULE. `link`: the link rate in Gbit/s, 0 for shared memory."""
    claim = papers.CLAIMS[claim_key]
    if claim.not_comparable:
        return f"{NOT_COMPARABLE}: {claim.not_comparable}"
    if link is not None and not link > 0:
        return f"{NOT_COMPARABLE}: {SHARED_MEMORY}"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{NOT_REPRODUCED}: no interval"
    direction = verdict(low, high, margin)
    if claim.ratio is None:
        if direction == FASTER:
            return f"{REPRODUCED} (its direction: the paper states no number)"
        return f"{NOT_REPRODUCED}: {direction} (the paper states no number, only that it is faster)"
    saving = f"{100 * (1 - claim.ratio):.1f}%"
    if claim_key.endswith("_vs_baseline") and codec != "none":
        nominal = parse_codec(codec).nominal_ratio()
        if claim.ratio * (1 + margin) < 1 / nominal:
            return (
                f"{NOT_COMPARABLE}: the paper's {saving} needs a compression ratio of at "
                f"least {1 / claim.ratio:.1f}; {codec_label(codec)} has {nominal:.2f}"
            )
    if direction != FASTER:
        return f"{NOT_REPRODUCED}: {direction}, where the paper has {saving} lower"
    if low / (1 + margin) <= claim.ratio <= high * (1 + margin):
        return REPRODUCED
    which = "smaller" if claim.ratio < low / (1 + margin) else "larger"
    return f"{NOT_REPRODUCED}: a {which} saving than the paper's {saving}"


def compare_headlines(data) -> tuple[list[Headline], list[str]]:
    """Headlines from `ccbench compare` rows: per claim and configuration, the largest
    size compared. Returns (headlines, notes on what was left out)."""
    frame = rows(data, "compare")
    if frame.empty:
        return [], []
    ratios = real_data_ratios(data)
    frame = frame.assign(_link=link_of(frame))
    found, notes, lossless_out = [], [], {}
    groups: dict[tuple, list] = {}
    for _, row in frame.iterrows():
        a, b = parse_side(row["a"]), parse_side(row["b"])
        claim = claim_of(a, b, str(row.get("collective", "")))
        if claim is None:
            continue
        key, swapped = claim
        codec = (a if swapped else b)["codec"]
        if is_lossless(codec):
            ratio = ratios.get(codec)
            if ratio is None or ratio <= LOSSLESS_MIN_RATIO:
                lossless_out[codec] = ratio
                continue
        group = (
            key,
            codec,
            row["ranks"],
            row["_link"],
            row["config"],
            row["a_rev"],
            row["b_rev"],
            row["statistic"],
        )
        groups.setdefault(group, []).append((row, swapped))
    for group, members in sorted(groups.items(), key=lambda g: str(g[0])):
        row, swapped = max(members, key=lambda m: m[0]["size_bytes"])
        key, codec = group[0], group[1]
        ratio, low, high = (float(row[c]) for c in ("ratio", "ratio_low", "ratio_high"))
        margin = float(row["margin"]) if np.isfinite(row.get("margin", np.nan)) else DEFAULT_MARGIN
        a_it, b_it = row.get("a_iterations"), row.get("b_iterations")
        if swapped:  # the claim reads the other way round: invert the ratio and interval
            ratio, low, high = 1 / ratio, 1 / high, 1 / low
            a_it, b_it = b_it, a_it
        claim = papers.CLAIMS[key]
        target = float(row.get("ci_target_pct", np.nan) or np.nan)
        width = half_width_pct(low, high)
        measured = (
            speedup(ratio, low, high)
            if key == "omnireduce_speedup"
            else percent_change(ratio, low, high)
        )
        size = (
            f"size {format_bytes(row['size_bytes'])}"
            if row["config"] != "step"
            else "time per training step"
        )
        where = [size, panel_title(row["ranks"], row["_link"])]
        if codec != "none":
            where.insert(0, codec_label(codec))
        if row["config"] and row["config"] != "step":
            where.insert(0, str(row["config"]))
        where.append(f"ccbench compare {row['compare_id']}")
        found.append(
            Headline(
                claim.paper,
                claim.text,
                measured,
                verdict(low, high, margin)
                + (
                    " (B is collective-level)"
                    if key != "omnireduce_speedup"
                    else " (B is OmniReduce)"
                ),
                samples(row["rounds"], a_it, b_it, turns=row.get("turns"))
                + cap_text(width, target),
                published(claim),
                ", ".join(where),
                margin_text(margin),
                against_paper(key, ratio, low, high, margin, codec, float(row["_link"])),
                width,
                target,
            )
        )
    for codec, ratio in sorted(lossless_out.items()):
        how = (
            f"its compression ratio on real gradients is {ratio:.2f}"
            if ratio is not None
            else "no rows measure its compression ratio on real gradients"
        )
        notes.append(
            f"{codec_label(codec)} left out of the headline table: {how} (a "
            f"lossless codec enters it above {LOSSLESS_MIN_RATIO:g})"
        )
    return found, notes


def rotation_headlines(data) -> list[Headline]:
    """MG-WFBP against each other strategy from a training run that rotated them step by
    step: each rotation is a round; B/A = MG-WFBP's iteration over the other's."""
    frame = training_frame(data)
    if frame.empty or "predicted_us" not in frame.columns:
        return []
    out = []
    for launch in launches(frame[frame["framework"] == "mgwfbp"]):
        order = launch.strategies
        if "mgwfbp" not in order or len(order) < 2:
            continue
        steps = launch.steps[launch.steps["step"] > launch.warmup]
        steps = steps.assign(
            _iteration=steps["step_us"] - steps["optimizer_us"].fillna(0.0),
            _round=(steps["step"] - 1) // len(order),
        )
        table = steps.pivot_table(
            index="_round", columns="strategy", values="_iteration", aggfunc="first"
        )
        model, ranks, link = launch.setting
        for other in order:
            if other == "mgwfbp" or other not in table:
                continue
            pairs = table[["mgwfbp", other]].dropna()
            if len(pairs) < 2:
                continue
            r = ratio_interval(pairs[other].to_numpy(), pairs["mgwfbp"].to_numpy())
            claim = papers.CLAIMS["mgwfbp_fastest"]
            out.append(
                Headline(
                    claim.paper,
                    f"{claim.text}: against {other}",
                    percent_change(r.ratio, r.low, r.high),
                    r.verdict() + " (B is MG-WFBP)",
                    samples(r.rounds, 1, 1, "step each")
                    + cap_text(
                        half_width_pct(r.low, r.high),
                        100 * DEFAULT_MARGIN,
                        "round cap reached (the run's steps)",
                    ),
                    published(claim),
                    f"{model}, {panel_title(ranks, link)}, training run "
                    f"{launch.steps['run_id'].iloc[0]} (strategies rotated step by step)",
                    margin_text(DEFAULT_MARGIN),
                    against_paper(
                        "mgwfbp_fastest",
                        r.ratio,
                        r.low,
                        r.high,
                        DEFAULT_MARGIN,
                        link=float(link)
                        if link not in ("", None) and np.isfinite(float(link))
                        else 0.0,
                    ),
                    half_width_pct(r.low, r.high),
                    100 * DEFAULT_MARGIN,
                )
            )
    return out


NOT_MEASURED = "not measured"
MEASURED_ABOVE = "measured above"  # on the page, in a regime nearer the paper's


def published(claim: papers.Claim) -> str:
    return f"{claim.value} ({papers.PAPERS[claim.paper].short}, {claim.source})"


def missing(claim_key: str, how: str) -> Headline:
    claim = papers.CLAIMS[claim_key]
    return Headline(claim.paper, claim.text, "-", NOT_MEASURED, "-", published(claim), how)


def collect(data) -> tuple[list[Headline], list[str]]:
    """Every headline row, in the papers' order, and notes on what was left out."""
    found, notes = compare_headlines(data)
    found += rotation_headlines(data)
    have = {h.claim.split(": against", 1)[0] for h in found}
    for key, claim in papers.CLAIMS.items():
        if claim.text in have:
            continue
        if key.startswith("training_"):
            how = (
                "needs a ccbench compare of two FSDP training runs (training --framework "
                "fsdp, --variant baseline / p2p_compressed / coll_compressed)"
            )
        elif key == "mgwfbp_fastest":
            how = (
                "needs a training run with --framework mgwfbp rotating mgwfbp and other strategies"
            )
        else:
            name = COLLECTIVE_LABELS.get(key.split("_vs_")[0])
            how = (
                "needs a ccbench compare of the two sides"
                + (f" on {name}" if name else "")
                + ' (a variant = "compare" table in the sweep)'
            )
        found.append(missing(key, how))
    order = list(papers.CLAIMS)
    position = {papers.CLAIMS[k].text: i for i, k in enumerate(order)}
    found.sort(key=lambda h: position.get(h.claim.split(": against", 1)[0], 99))
    return found, notes

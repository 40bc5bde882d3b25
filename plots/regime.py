"""Seed 000's savings against the codec-to-wire ratio: where the paper's numbers live.

Each measured point is one (collective, codec, link rate) of sweeps/regime.toml at 16 MiB
on 4 ranks: its savings are `ccbench compare` rows (the collective level against
point-to-point compression, and against the MPI library's uncompressed call; 1 - B/A with
the 95% interval), its ratio comes from its collective-level harness row (the codec's
round-trip rate per rank from the call's own encode and decode times, over the link's
payload rate). The model's line is collectives/regime_model.py (compression_model's
call_seconds, as `ccbench advise` uses it) across the whole axis, and at every measured
point with that point's own parts, so its error there is shown. The paper's regime is a
band of ratios (docs/references.md, "The paper's regime").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ccbench.collectives import regime_model as rm
from ccbench.collectives.compression_model import COLL, P2P
from ccbench.kernels.vocabulary import HIERARCHY_MARKS
from ccbench.plots import papers
from ccbench.plots.base import Figure, FigureSpec, Skip, link_of, rows
from ccbench.plots.headlines import oriented_ratio
from ccbench.plots.style import COLLECTIVE_LABELS, Style, figure, legend_below, spread

# The paper's codec-to-wire ratio: GPU ZFP fixed-rate (encode and decode each tens to
# hundreds of GB/s: a round trip of about 25-250 GB/s per rank, one rank per GPU) over
# 100-200 Gbit/s InfiniBand (12.5-25 GB/s of payload); docs/references.md derives it.
PAPER_BAND = (1.0, 20.0)
COLLECTIVES = ("allgather", "reduce_scatter")
CLAIMS = ("vs_p2p", "vs_baseline")
CLAIM_WORDS = {
    "vs_p2p": "over point-to-point compression",
    "vs_baseline": "over the uncompressed baseline (MPI)",
}
# the codec judged against the paper's "vs uncompressed" numbers: ZFP rate 4, ratio 8,
# the ratio those savings need; vs point-to-point: the paper's codec at either rate
JUDGED_CODECS = {"vs_p2p": ("zfp:rate=4", "zfp:rate=8"), "vs_baseline": ("zfp:rate=4",)}
MARGIN = 0.03  # the headline table's margin around the interval
CODEC_COLORS = {
    "fp16": "#1f77b4",
    "bfp:rate=4": "#2ca02c",
    "bfp:rate=8": "#17becf",
    "bfp:rate=16": "#9467bd",
    "zfp:rate=4": "#d62728",
    "zfp:rate=8": "#ff7f0e",
}
AXIS = np.logspace(-2, 2.5, 200)  # ratios drawn: 0.01 .. 316


@dataclass
class Point:
    collective: str
    codec: str
    link_gbps: float
    ratio: float  # codec-to-wire, measured
    parts: rm.RegimeParts
    rate_bps: float  # the link's payload rate the model takes
    measured: dict  # claim -> (saving, low, high)
    model: dict  # claim -> the model's saving at this point
    rate_measured: bool = False  # the payload rate from the library's call, else assumed

    def error(self, claim: str) -> float:
        """The model's B/A over the measured B/A, less 1 (nan where not measured)."""
        if claim not in self.measured:
            return math.nan
        return (1 - self.model[claim]) / (1 - self.measured[claim][0]) - 1


def flat_rows(frame):
    """The rows of flat collectives (the regime's points are flat; a hierarchical row
    of the same size and link is another design)."""
    if frame.empty or "algorithm" not in frame.columns:
        return frame
    marked = frame["algorithm"].astype(str).str.startswith(tuple(HIERARCHY_MARKS.values()))
    return frame[~marked]


def _num(row, key, default=math.nan) -> float:
    try:
        value = float(row.get(key, default))
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) else default


def library_seconds(data, size: int, ranks: int) -> dict:
    """(collective, link rate) -> the median time of the MPI library's uncompressed call
    at `size` on `ranks` over that emulated link (sweeps/regime.toml's baseline rows)."""
    base = rows(data, "harness", variant="baseline", ranks=ranks, size_bytes=size)
    if base.empty:
        return {}
    base = base.assign(_link=link_of(base))
    if "algorithm" in base.columns:
        base = base[base["algorithm"].astype(str) == "mpi"]
    found: dict = {}
    for _, b in base[base["_link"] > 0].iterrows():
        if _num(b, "avg_us") > 0:
            key = (str(b["collective"]), float(b["_link"]))
            found.setdefault(key, []).append(_num(b, "avg_us") * 1e-6)
    return {k: float(np.median(v)) for k, v in found.items()}


def p2p_seconds(data, size: int, ranks: int) -> dict:
    """(collective, codec, link rate) -> the median time of point-to-point compression's
    call at `size` on `ranks` over that emulated link (its harness rows)."""
    frame = flat_rows(rows(data, "harness", variant="p2p_compressed", ranks=ranks, size_bytes=size))
    if frame.empty:
        return {}
    frame = frame.assign(_link=link_of(frame))
    found: dict = {}
    for _, r in frame[frame["_link"] > 0].iterrows():
        if _num(r, "avg_us") > 0:
            key = (str(r["collective"]), str(r["codec"]), float(r["_link"]))
            found.setdefault(key, []).append(_num(r, "avg_us") * 1e-6)
    return {k: float(np.median(v)) for k, v in found.items()}


def regime_points(data, size: int = rm.SIZE, ranks: int = rm.RANKS) -> list[Point]:
    """The measured points: a collective-level harness row at `size` on `ranks` over an
    emulated link, with the compare rows of the same collective, codec and link. The
    model takes what was measured where rows give it: the link's payload rate from the
    library's uncompressed call at that link (else the shaper's TCP ceiling, assumed) and
    each compressed variant's overlap efficiency from its own row's call time at that
    point (else 1, assumed)."""
    harness = flat_rows(
        rows(data, "harness", variant="coll_compressed", ranks=ranks, size_bytes=size)
    )
    if harness.empty:
        return []
    harness = harness.assign(_link=link_of(harness))
    library = library_seconds(data, size, ranks)
    p2p = p2p_seconds(data, size, ranks)
    compare = rows(data, "compare", ranks=ranks, size_bytes=size)
    compare = compare.assign(_link=link_of(compare)) if not compare.empty else compare
    out = []
    for _, row in harness[harness["_link"] > 0].iterrows():
        collective, codec, link = str(row["collective"]), str(row["codec"]), float(row["_link"])
        point_key = (collective, codec, link)
        if collective not in COLLECTIVES:
            continue
        step_s = _num(row, "link_step_us", 0.0) * 1e-6
        burst = _num(row, "link_burst_bytes", 0.0)
        measured_rate = (
            rm.payload_rate_bps(collective, size, ranks, library[collective, link], step_s, burst)
            if (collective, link) in library
            else math.nan
        )
        rate_measured = measured_rate > 0 and math.isfinite(measured_rate)
        payload = measured_rate / 1e9 if rate_measured else _num(row, "link_ceiling_gbps", link)
        got = rm.measured_parts(
            collective,
            size,
            ranks,
            _num(row, "encode_us"),
            _num(row, "decode_us"),
            _num(row, "reduce_us", 0.0),
            payload,
        )
        if not (got["ratio"] > 0 and math.isfinite(got["ratio"])):
            continue
        parts = rm.RegimeParts(
            compression=_num(row, "compression_ratio"),
            encode_share=got["encode_share"],
            hop_round_trips=got["hop_round_trips"],
            step_s=step_s,
            burst_bytes=burst,
        )
        # each variant's overlap efficiency: its own row's call time over the model's floor
        efficiency = {}
        for variant, call_s in ((COLL, _num(row, "avg_us") * 1e-6), (P2P, p2p.get(point_key))):
            if call_s is not None and call_s > 0:
                efficiency[variant] = rm.overlap_efficiency(
                    variant, got["ratio"], collective, parts, call_s, payload * 1e9, size, ranks
                )
        parts = replace(parts, efficiency=efficiency)
        measured = {}
        same = (
            compare[(compare["collective"] == collective) & (compare["_link"] == link)]
            if not compare.empty and "collective" in compare.columns
            else compare
        )
        for claim in CLAIMS:
            key = f"{collective}_{claim}"
            for _, c in same.iterrows():
                found = oriented_ratio(c, key, codec, collective)
                if found is not None:
                    ratio, low, high = found
                    measured[claim] = (1 - ratio, 1 - high, 1 - low)
        model = rm.savings(got["ratio"], collective, parts, payload * 1e9, size, ranks)
        out.append(
            Point(
                collective,
                codec,
                link,
                got["ratio"],
                parts,
                payload * 1e9,
                measured,
                model,
                rate_measured,
            )
        )
    return sorted(out, key=lambda p: (p.collective, p.ratio))


def paper_saving(collective: str, claim: str) -> float:
    return 1 - papers.CLAIMS[f"{collective}_{claim}"].ratio


def median_parts(points: list[Point]) -> tuple[rm.RegimeParts, float]:
    """The parts of these measured points (each the median) and their link's payload
    rate: what the model takes away from them, across the axis."""
    efficiency = {
        variant: float(np.median(found))
        for variant in (COLL, P2P)
        if (found := [p.parts.efficiency[variant] for p in points if variant in p.parts.efficiency])
    }
    parts = rm.RegimeParts(
        compression=float(np.median([p.parts.compression for p in points])),
        encode_share=float(np.median([p.parts.encode_share for p in points])),
        hop_round_trips=float(np.median([p.parts.hop_round_trips for p in points])),
        step_s=float(np.median([p.parts.step_s for p in points])),
        burst_bytes=float(np.median([p.parts.burst_bytes for p in points])),
        efficiency=efficiency,
    )
    return parts, float(np.median([p.rate_bps for p in points]))


def model_band(points: list[Point], collective: str, claim: str, band=PAPER_BAND):
    """(least, most) saving the model gives over the band of ratios, with the parts of
    the judged codec's measured points (their median), at their link's payload rate."""
    mine = [p for p in points if p.collective == collective and p.codec in JUDGED_CODECS[claim]]
    if not mine:
        return None
    values = []
    for codec in sorted({p.codec for p in mine}):
        parts, rate = median_parts([p for p in mine if p.codec == codec])
        for ratio in np.logspace(math.log10(band[0]), math.log10(band[1]), 41):
            values.append(rm.savings(float(ratio), collective, parts, rate)[claim])
    return min(values), max(values)


def verdict(points: list[Point], collective: str, claim: str, band=PAPER_BAND) -> str:
    """Words for one claim: reproduced (or not) where a measured point of the judged codec
    sits in the paper's band of ratios; else what the model, its error at the measured
    points shown, puts there and whether the paper's number falls in that band."""
    paper = paper_saving(collective, claim)
    judged = [
        p
        for p in points
        if p.collective == collective and p.codec in JUDGED_CODECS[claim] and claim in p.measured
    ]
    checked = [p for p in points if p.collective == collective and claim in p.measured]
    errors = [abs(p.error(claim)) for p in checked]
    words = f"paper {100 * paper:.1f}% at ratios {band[0]:g}-{band[1]:g}"
    inside = [p for p in judged if band[0] <= p.ratio <= band[1]]
    if inside:
        # the headline table's rule: a saving beyond the margin (the whole interval) and
        # the paper's number within the interval widened by the margin
        hits = [
            p
            for p in inside
            if 1 - p.measured[claim][1] < 1 / (1 + MARGIN)
            and (1 - p.measured[claim][2]) / (1 + MARGIN)
            <= 1 - paper
            <= (1 - p.measured[claim][1]) * (1 + MARGIN)
        ]
        said = "; ".join(
            f"{p.codec} at {p.link_gbps:g} Gbit/s, ratio {p.ratio:.2g}: "
            f"{100 * p.measured[claim][0]:.1f}% ({100 * p.measured[claim][1]:.1f} to "
            f"{100 * p.measured[claim][2]:.1f})"
            for p in inside
        )
        head = "reproduced" if hits else "not reproduced at the paper's ratio"
        if not hits and all(p.measured[claim][1] > paper for p in inside):
            head += " (every interval there saves more than the paper)"
        elif not hits and all(p.measured[claim][2] < paper for p in inside):
            head += " (every interval there saves less than the paper)"
        return f"{head}: {words}; measured {said}"
    span = model_band(points, collective, claim, band)
    if span is None or not errors:
        return f"not measured: {words}; no measured point of {', '.join(JUDGED_CODECS[claim])}"
    worst = max(errors)
    low, high = span
    # the band widened by the model's worst error at the measured points (on B/A)
    wide_low = 1 - (1 - low) * (1 + worst)
    wide_high = min(1.0, 1 - (1 - high) * (1 - worst))  # a saving reaches 100% at most
    falls = "falls inside" if wide_low <= paper <= wide_high else "falls outside"
    ratios = [p.ratio for p in judged] or [p.ratio for p in checked]
    return (
        f"modelled (no measured point of {', '.join(JUDGED_CODECS[claim])} in the band; "
        f"they reach ratios {min(ratios):.2g}-{max(ratios):.2g}): {words}; the model puts "
        f"{100 * low:.1f}% to {100 * high:.1f}% there, {100 * wide_low:.1f}% to "
        f"{100 * wide_high:.1f}% with its largest error at the {len(errors)} measured "
        f"points ({100 * worst:.0f}%, median {100 * float(np.median(errors)):.0f}%); the "
        f"paper's number {falls} that band"
    )


def verdict_rows(data) -> list[tuple[str, str, str]]:
    """(collective, claim words, verdict) for every seed-000 collective-level claim."""
    points = regime_points(data)
    return [
        (COLLECTIVE_LABELS.get(c, c), CLAIM_WORDS[claim], verdict(points, c, claim))
        for c in COLLECTIVES
        for claim in CLAIMS
    ]


def model_inputs(points: list[Point]) -> str:
    """Which of the model's inputs were measured and which assumed, at how many points."""
    n = len(points)
    rate = sum(p.rate_measured for p in points)
    coll = sum(COLL in p.parts.efficiency for p in points)
    p2p = sum(P2P in p.parts.efficiency for p in points)
    assumed = [
        *(
            [f"the shaper's TCP ceiling as the payload rate at the other {n - rate}"]
            if rate < n
            else []
        ),
        *([f"the collective level at its floor at the other {n - coll}"] if coll < n else []),
        *(
            [
                f"point-to-point at its floor at the other {n - p2p} (efficiency 1: each "
                "hop encodes, sends, receives and decodes, nothing overlaps)"
            ]
            if p2p < n
            else []
        ),
    ]
    return (
        "The model's inputs, measured: the codec's rates and compression ratio (the "
        "collective-level row's encode and decode times); the link's payload rate at "
        f"{rate} of {n} points (the MPI library's uncompressed call at that link, less the "
        "ring steps' fixed cost); that fixed cost (cluster selfcheck); the overlap "
        f"efficiency (a call's time over the model's floor, from the variant's own row) of "
        f"the collective level at {coll} of {n} points and of point-to-point at {p2p}. "
        + ("Assumed: " + "; ".join(assumed) + "." if assumed else "Nothing assumed.")
        + " With both efficiencies measured the model at a point is the two variants' own "
        "runs, apart from the interleaved comparison that is its check; across the axis it "
        "takes their medians."
    )


def draw_regime(data, style: Style) -> list[Figure]:
    points = regime_points(data)
    if not any(p.measured for p in points):
        raise Skip(
            "no collective-level rows at 16 MiB on 4 ranks over an emulated link with their "
            "comparisons (sweeps/regime.toml)"
        )
    fig, axes = figure(4, ncols=2, sharex=True)
    axes = np.asarray(axes).reshape(2, 2)
    handles = {}
    for j, collective in enumerate(COLLECTIVES):
        mine = [p for p in points if p.collective == collective]
        for i, claim in enumerate(CLAIMS):
            ax = axes[i, j]
            # the axis holds every measured interval, the model's value at each measured
            # point and at least -100%..100%; the model's
            # line, which falls without bound where the codec is far slower than the wire,
            # is drawn down to that floor
            low = min(
                [-100.0]
                + [
                    100 * min(p.measured[claim][1], p.model[claim])
                    for p in mine
                    if claim in p.measured
                ]
            )
            ax.axvspan(*PAPER_BAND, color="#f3e3b5", zorder=0)
            paper = 100 * paper_saving(collective, claim)
            (h,) = ax.plot(PAPER_BAND, [paper, paper], ls="-", color="#b8860b", lw=2, zorder=1)
            handles["paper's number, in the paper's band of ratios"] = h
            ends = []  # (the line's value at the right edge, its label)
            for r in sorted({round(p.parts.compression, 1) for p in mine}):
                parts, rate = median_parts([p for p in mine if round(p.parts.compression, 1) == r])
                line = np.array(
                    [100 * rm.savings(float(x), collective, parts, rate)[claim] for x in AXIS]
                )
                line[line < low] = np.nan
                (h,) = ax.plot(AXIS, line, ls="--", color="#555555", lw=0.8, zorder=2)
                handles["model (call_seconds), one line per compression ratio"] = h
                if np.isfinite(line[-1]):
                    ends.append((float(line[-1]), f"r={r:g}"))
            # lines of several ratios end together: their labels fan out, each at least
            # 5% of the axis apart
            gap = 0.05 * (105 - (low - 5))
            for y, (_, label) in zip(spread([e[0] for e in ends], gap), ends, strict=True):
                ax.annotate(label, (AXIS[-1], y), fontsize=6, ha="right", va="center")
            for p in mine:
                if claim not in p.measured:
                    continue
                s, lo, hi = (100 * v for v in p.measured[claim])
                h = ax.errorbar(
                    p.ratio,
                    s,
                    yerr=[[s - lo], [hi - s]],
                    ls="none",
                    color=CODEC_COLORS.get(p.codec, "black"),
                    ms=4,
                    **style.marker(p.codec),
                    zorder=3,
                )
                handles[f"{p.codec} (measured, 95% interval)"] = h
                model = 100 * p.model[claim]
                ax.plot([p.ratio, p.ratio], [s, model], color="red", lw=0.8, zorder=2)
                (h,) = ax.plot(p.ratio, model, "x", color="red", ms=4, zorder=3)
                handles["model at the point, its error in red"] = h
                ax.annotate(
                    f"{100 * p.error(claim):+.0f}%", (p.ratio, model), fontsize=5, color="red"
                )
            ax.set_xscale("log")
            ax.set_title(f"{COLLECTIVE_LABELS.get(collective, collective)}, {CLAIM_WORDS[claim]}")
            ax.set_ylabel("saving (%)")
            if i == 1:
                ax.set_xlabel("codec-to-wire ratio")
            ax.set_ylim(low - 5, 105)
    legend_below(fig, list(handles.values()), list(handles))
    lines = [f"{c}, {w}: {v}." for c, w, v in verdict_rows(data)]
    caption = (
        "Seed 000's collective-level saving at 16 MiB on 4 ranks against the codec-to-wire "
        "ratio (log x; the model's line drawn down to -100% or the lowest interval; the "
        "ratio: the codec's round trip per rank as the call saw it, from the "
        "collective-level row's codec times, over the link's payload rate), "
        "from the separate sweep sweeps/regime.toml. Points: interleaved comparisons "
        "(95% intervals); dashed: the model (compression_model.call_seconds, as `ccbench "
        "advise` uses it) across the axis, with the median parts of that compression "
        "ratio's points; red: the model at each measured point with its own parts, its "
        "error on B/A written beside it. " + model_inputs(points) + " Shaded: "
        f"the paper's regime (ratios {PAPER_BAND[0]:g}-{PAPER_BAND[1]:g}, "
        "docs/references.md) with the paper's number. " + " ".join(lines)
    )
    return [Figure("seed000_regime", fig, caption)]


FIGURES = [
    FigureSpec(
        "seed000_regime",
        "seed 000",
        "Saving against the codec-to-wire ratio: where the paper numbers live",
        ("harness", "compare"),
        draw_regime,
    ),
]


def zfp_note(headlines) -> list[str]:
    """Where seed 000's headline pairs hold none of the paper's codec: where they are. ZFP
    is slower than the wire on a core, so its comparisons take minutes each at 1 Gbit/s;
    the main job (30 minutes on 2 idle cores) leaves them to a separate sweep."""
    seed000 = [h for h in headlines if getattr(h, "paper", "") == "seed 000"]
    if not seed000 or any("zfp" in str(getattr(h, "where", "")).lower() for h in seed000):
        return []
    return [
        "<p class='note'>Seed 000's pairs here are fp16 and bfp; the paper's own codec, "
        "ZFP fixed-rate (rates 4 and 8, beside bfp and fp16 at 16 MiB on 4 ranks), is "
        "measured by a separate sweep, sweeps/seed000-tables.toml (`ccbench sweep "
        "sweeps/seed000-tables.toml`, then `ccbench plot` on its output): slower than the "
        "wire on a core, its comparisons take minutes each, more than the main job's time "
        "allows.</p>"
    ]


def page_link(figures, headlines=()) -> list[str]:
    """The headline table's pointers: to the regime figure, where the page draws one, and
    to the ZFP pairs' sweep, where the seed 000 headlines hold none."""
    note = zfp_note(headlines)
    if not any(getattr(f, "name", "") == "seed000_regime" for f in figures):
        return note
    return [
        "<p class='note'>Seed 000's numbers against the codec-to-wire ratio, measured where "
        "this host reaches and modelled beyond, with a verdict per claim: "
        "<a href='#seed000_regime'>the regime figure</a> (its rows come from a separate "
        "sweep, sweeps/regime.toml).</p>",
        *note,
    ]

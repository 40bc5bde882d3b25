"""The two-level cluster: the hierarchical compressed collective against the flat
compressed ring and against the library's collective, at 16 MiB on 2 nodes x 2 ranks with
1 Gbit/s between nodes (sweeps/two-level.toml, a sweep of its own).

Each point is a `ccbench compare` row (interleaved rounds; B, the side with `--hierarchy
node`, over A; the 95% interval across rounds), and the two hierarchical designs against
each other (B through node leaders, `--hierarchy leader`, over A per local rank). The
expected figure beside it is the floors' ratio: the hierarchical harness row's two-level
floor (costmodel.hierarchical_floor, its `floor_us`) over the flat row's `floor_us`, or
over the library's floor on the same link (compression_model.call_seconds, as `ccbench
advise` costs it), or the leaders' row's floor over the per-local-rank row's, or (shared
memory inside the node over MPI's messages) the row's floor over its floor with the
levels in series. The notes quote what is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ccbench.collectives import compression_model as cm
from ccbench.kernels.vocabulary import HIERARCHY_MARKS
from ccbench.plots.base import Figure, FigureSpec, Skip, rows
from ccbench.plots.style import COLLECTIVE_LABELS, Style, figure, legend_below

SIZE = 16 << 20
RANKS = 4
COLLECTIVES = ("allgather", "reduce_scatter")
AGAINST = ("flat", "library", "per-rank", "ring")
AGAINST_WORDS = {
    "flat": "the flat compressed ring",
    "library": "the library (MPI)",
    "per-rank": "per local rank",
    "ring": "MPI's messages inside the node",
}
TICKS = {
    "flat": "vs flat\ncompressed",
    "library": "vs library",
    "per-rank": "leaders vs\nper rank",
    "ring": "shm vs ring\ninside node",
}
NODE = "--hierarchy node"
SHM, RING = "--intra-node shm", "--intra-node ring"
LEADER = "--hierarchy leader"
MARKS = HIERARCHY_MARKS  # each design's mark on its harness rows' `algorithm`
SWEEP = "sweeps/two-level.toml"


@dataclass(frozen=True)
class Point:
    collective: str
    against: str  # "flat" or "library"
    codec: str
    ratio: float  # B/A: hierarchical over the other
    low: float
    high: float
    verdict: str
    expected: float  # the floors' ratio; nan where a harness row is missing
    load: str  # "start -> end"


def _num(row, key) -> float:
    try:
        value = float(row.get(key))
    except (TypeError, ValueError):
        return math.nan
    return value


def _codec_of(side: str) -> str:
    words = side.split()
    return words[words.index("--codec") + 1] if "--codec" in words else ""


def against_of(a: str, b: str) -> str | None:
    """What a compare row set the hierarchical side (B) against: `flat` (A is the same
    compressed variant and codec without --hierarchy), `library` (A is the baseline's
    MPI collective), `per-rank` (B through node leaders, A per local rank, the same
    variant and codec), `ring` (both per local rank, B inside the node through shared
    memory, A over MPI's messages); None for any other pair."""
    if NODE in a and NODE in b and SHM in b and RING in a:
        same = a.split()[:1] == b.split()[:1] and _codec_of(a) == _codec_of(b)
        return "ring" if same else None
    if LEADER in b and NODE in a:
        same = a.split()[:1] == b.split()[:1] and _codec_of(a) == _codec_of(b)
        return "per-rank" if same else None
    if NODE not in b or NODE in a or LEADER in a:
        return None
    if a.split()[:1] == ["baseline"] and "mpi" in a.split():
        return "library"
    if a.split()[:1] == b.split()[:1] and _codec_of(a) == _codec_of(b):
        return "flat"
    return None


def _floor_s(data, collective: str, codec: str, design: str) -> tuple[float, dict]:
    """The newest compressed row's floor (seconds) at SIZE on RANKS of a design (`flat`,
    `node`, `leader`), and the row."""
    found = rows(data, "harness", collective=collective, size_bytes=SIZE, ranks=RANKS)
    found = found[found["codec"].astype(str) == codec] if "codec" in found else found.iloc[0:0]
    if found.empty or "algorithm" not in found:
        return math.nan, {}
    algorithm = found["algorithm"].astype(str)
    if design == "flat":
        found = found[~algorithm.str.startswith(tuple(MARKS.values()))]
    else:
        found = found[algorithm.str.startswith(MARKS[design])]
    if found.empty:
        return math.nan, {}
    row = found.sort_values("timestamp").iloc[-1].to_dict()
    return _num(row, "floor_us") * 1e-6, row


def series_floor_s(row: dict) -> float:
    """A hierarchical row's floor with its levels in series (costmodel.hierarchical_floor):
    the ring inside the node's, where the row ran them overlapped; its own otherwise (one
    floor counts a node's bytes alike, however the node moves them)."""
    if str(row.get("levels")) != "overlapped":
        return _num(row, "floor_us") * 1e-6
    inter = _num(row, "inter_floor_us")
    codec = _num(row, "codec_floor_us")
    across = max(inter, codec) if math.isfinite(codec) else inter
    return (_num(row, "intra_floor_us") + across) * 1e-6


def library_floor_s(row: dict, collective: str) -> float:
    """The library's flat floor on the link a hierarchical row ran on (its payload
    ceiling, step cost and burst): compression_model's call, efficiency 1."""
    rate = _num(row, "floor_link_gbps")
    rate = rate if math.isfinite(rate) else _num(row, "link_gbps")
    if not math.isfinite(rate):
        return math.nan
    network = cm.Network(
        rate * 1e9,
        float(np.nan_to_num(_num(row, "link_step_us"))) * 1e-6,
        float(np.nan_to_num(_num(row, "link_burst_bytes"))),
    )
    return float(cm.call_seconds(cm.Option(cm.LIBRARY), network, collective, SIZE, RANKS)["floor"])


def two_level_points(data) -> list[Point]:
    """The newest comparison of each (collective, against) at SIZE on RANKS over an
    emulated link, with its expected figure."""
    found = rows(data, "compare", size_bytes=SIZE, ranks=RANKS)
    points = {}
    if found.empty:
        return []
    for row in found.sort_values("timestamp").to_dict("records"):
        against = against_of(str(row["a"]), str(row["b"]))
        collective = str(row["collective"])
        if against is None or collective not in COLLECTIVES or not _num(row, "link_gbps") > 0:
            continue
        codec = _codec_of(str(row["b"]))
        hier, hier_row = _floor_s(data, collective, codec, "node")
        if against == "flat":
            other, _ = _floor_s(data, collective, codec, "flat")
        elif against == "per-rank":  # B is the leaders' design, A per local rank
            other = hier
            hier, _ = _floor_s(data, collective, codec, "leader")
        elif against == "ring":  # A: MPI's messages inside the node, levels in series
            other = series_floor_s(hier_row) if hier_row else math.nan
        else:
            other = library_floor_s(hier_row, collective) if hier_row else math.nan
        points[collective, against] = Point(
            collective,
            against,
            codec,
            _num(row, "ratio"),
            _num(row, "ratio_low"),
            _num(row, "ratio_high"),
            str(row.get("verdict", "")),
            hier / other if other > 0 else math.nan,
            f"{row.get('load_start', '?')} -> {row.get('load_end', '?')}",
        )
    return [points[k] for k in sorted(points)]


def note(p: Point) -> str:
    expected = f"{p.expected:.2f}" if math.isfinite(p.expected) else "not known (no harness row)"
    if p.against == "per-rank":
        what = f"through node leaders over {AGAINST_WORDS[p.against]}, {p.codec}"
    elif p.against == "ring":
        what = f"hierarchical {p.codec}, shared memory inside the node over {AGAINST_WORDS['ring']}"
    else:
        what = f"hierarchical {p.codec} over {AGAINST_WORDS[p.against]}"
    return (
        f"{COLLECTIVE_LABELS.get(p.collective, p.collective)}, {what}: expected {expected} "
        "from the floors, measured "
        f"{p.ratio:.3f} [{p.low:.3f}, {p.high:.3f}], {p.verdict} (load {p.load})."
    )


def draw_two_level(data, style: Style) -> list[Figure]:
    points = two_level_points(data)
    if not points:
        raise Skip(
            "no interleaved comparisons of a --hierarchy node side at 16 MiB on 4 ranks over "
            f"an emulated link ({SWEEP})"
        )
    # a panel per collective measured (an empty panel would say nothing was drawn there)
    drawn = [c for c in COLLECTIVES if any(p.collective == c for p in points)]
    fig, axes = figure(len(drawn), ncols=len(drawn), sharey=True)
    axes = np.asarray(axes).ravel()
    handles = {}
    for ax, collective in zip(axes, drawn, strict=True):
        mine = [p for p in points if p.collective == collective]
        for x, against in enumerate(AGAINST):
            p = next((q for q in mine if q.against == against), None)
            if p is None:
                continue
            h = ax.errorbar(
                x,
                p.ratio,
                yerr=[[p.ratio - p.low], [p.high - p.ratio]],
                fmt="o",
                color="black",
                capsize=3,
                zorder=3,
            )
            handles["measured B/A (interleaved, 95% interval)"] = h
            if math.isfinite(p.expected):
                (h,) = ax.plot(x, p.expected, "x", color="red", ms=7, zorder=4)
                handles["model: the floors' ratio (expected)"] = h
        ax.axhline(1.0, color="0.5", lw=0.8, ls="--", zorder=1)
        ax.set_xticks(range(len(AGAINST)), [TICKS[a] for a in AGAINST])
        ax.set_xlim(-0.5, len(AGAINST) - 0.5)
        ax.set_title(COLLECTIVE_LABELS.get(collective, collective))
        ax.set_ylabel("hierarchical / other (B/A)")
    legend_below(fig, list(handles.values()), list(handles))
    caption = (
        "The two-level cluster (2 nodes x 2 ranks, 1 Gbit/s between nodes, shared memory "
        f"inside a node), 16 MiB, from the separate sweep {SWEEP}: the hierarchical "
        "compressed collective (`--hierarchy node`) over the flat compressed ring and "
        "over the library's collective, through node leaders (`--hierarchy leader`) "
        "over per local rank, and the level inside a node through shared memory over "
        "MPI's messages (`--intra-node shm` over `ring`), as interleaved comparisons "
        "(below 1: B is faster), beside "
        "the ratio the floors predict (red). " + " ".join(note(p) for p in points)
    )
    return [Figure("two_level", fig, caption)]


FIGURES = [
    FigureSpec(
        "two_level",
        "general",
        "Two-level cluster: hierarchical compressed against flat and the library",
        ("compare",),
        draw_two_level,
    ),
]


def page_link(figures) -> list[str]:
    """The page's pointer to the two-level figure, where it was drawn."""
    # the drawn figure's name carries its section's suffix where the page has several
    names = [f.name for f in figures if getattr(f, "name", "").startswith("two_level")]
    if not names:
        return []
    return [
        "<p class='note'>Two-level cluster (2 nodes x 2 ranks, 1 Gbit/s between nodes): "
        "hierarchical compressed against flat and the library, with the floors' expected "
        f"figure: <a href='#{names[0]}'>the two-level figure</a> (its rows come from a "
        f"separate sweep, {SWEEP}).</p>"
    ]

"""Should this step compress? The predicted time of a training step's collectives for
each way of running them (the library's collective, ccbench's ring, and the compressed
variants with a codec), from measured parts (docs/advise.md).

Pure functions. Times in seconds, sizes in bytes. The floor of one call is the project's
one floor (costmodel.wire_floor_s, call_floor_s, floor_steps); a call's predicted time
is that floor times the overlap efficiency measured on the emulated cluster (call time
over floor; 1.0 when not measured):

    uncompressed         T = e x wire_floor(W)
    collective level     T = e x max(wire_floor(W / r), codec)      (pipelined)
    point-to-point       T = e x (wire_floor(W / r) + codec)        (a hop at a time)

W is the bytes a rank sends in the ring (spec.ring_wire_bytes), r the codec's ratio on
the user's data, codec the codec's CPU time of one call on this rank times the ranks that
share its core or device. A step is its trace replayed on one communication stream
(step_timeline), as training/replay.py runs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ccbench.collectives.compressed_error import compressions_on_path
from ccbench.collectives.costmodel import (
    OVERLAPPED_LEVELS,
    AlphaBeta,
    call_floor_s,
    floor_steps,
    hierarchical_floor,
    node_link_bytes,
    wire_floor_s,
)
from ccbench.collectives.spec import spec
from ccbench.collectives.trace import Step

# How ccbench runs a collective: the library's own (MPI, NCCL), its ring by hand, or a
# compressed variant of the ring (benchmarks/coll_compressed.py, p2p_compressed.py).
LIBRARY, RING, COLL, P2P = "library", "ring", "coll_compressed", "p2p_compressed"
VARIANTS = (LIBRARY, RING, COLL, P2P)
UNCOMPRESSED = (LIBRARY, RING)

# The label's mark of a hierarchical option (`--hierarchy node`: uncompressed inside a
# node, the variant's collective across nodes per local index)
NODE_MARK = "@node"

# Message-size buckets of a step's calls (upper edges, bytes): the table's columns.
BUCKET_EDGES = (1 << 20, 16 << 20, 64 << 20)
BUCKET_NAMES = ("<1M", "1M-16M", "16M-64M", ">=64M")


@dataclass(frozen=True)
class Network:
    """A homogeneous network: each rank's link carries ``rate_bps`` of payload; each step
    of a collective that waits on the previous one's data costs ``step_s`` beyond its
    bytes (the hop latency plus the transport's per-message cost); ``burst_bytes`` pass
    at once after a pause (the emulated link's token bucket; 0 on a real NIC)."""

    rate_bps: float
    step_s: float
    burst_bytes: float = 0.0
    # two levels: ``ranks_per_node`` consecutive ranks share a node, whose ranks talk at
    # ``intra_rate_bps`` (0: unknown, costed 0) and share one link of ``rate_bps`` out
    ranks_per_node: int = 1
    intra_rate_bps: float = 0.0

    def nodes(self, ranks: int) -> int:
        return max(1, ranks // max(1, self.ranks_per_node))


@dataclass(frozen=True)
class CodecRates:
    """A codec on the user's data: its ratio, its kernels' rates (bytes of uncompressed
    data per second, one core or device) and the relative L2 error of a round trip."""

    spec: str
    ratio: float
    encode_bps: float
    decode_bps: float
    hop_bps: float  # decode, add and re-encode (the reduce-scatter's hop)
    rel_l2: float = 0.0


@dataclass(frozen=True)
class SizedEfficiency:
    """Efficiencies measured at several OSU sizes (call over floor, rows of one link and
    rank count), with the floors they were measured against. A call's time is its floor
    plus an excess (per-call costs that do not scale with its bytes, overlap lost that
    does), so the ratio measured at 1 MiB says little of a 0.8 MB call. Between two
    measured sizes a call takes the excess interpolated linearly in size between theirs;
    below the smallest, the line through the two smallest sizes' excesses (never below
    zero where they are not); above the largest, the largest's efficiency. With one
    size, no floors, or no floor for the call: the efficiency measured nearest its size
    (on a log scale). ``median`` where no size is asked."""

    sizes: tuple
    values: tuple
    median: float
    floors: tuple = ()  # seconds, one per size: the model's floor of the measured call

    @classmethod
    def of(cls, sizes, values, floors=None) -> SizedEfficiency:
        by_size: dict = {}
        floor_at: dict = {}
        for i, (s, v) in enumerate(zip(sizes, values, strict=True)):
            by_size.setdefault(float(s), []).append(float(v))
            if floors is not None:
                floor_at.setdefault(float(s), float(floors[i]))
        ordered = sorted(by_size)
        return cls(
            tuple(ordered),
            tuple(float(np.median(by_size[s])) for s in ordered),
            float(np.median(values)),
            tuple(floor_at[s] for s in ordered) if floors is not None else (),
        )

    def at(self, size=None, floor=None):
        if size is None:
            return self.median
        size = np.asarray(size, dtype=np.float64)
        values = np.asarray(self.values, dtype=np.float64)
        if floor is None or len(self.floors) < 2:
            wanted = np.log(np.maximum(size, 1.0))
            measured = np.log(np.asarray(self.sizes, dtype=np.float64))
            picked = values[np.abs(wanted[..., None] - measured).argmin(axis=-1)]
            return float(picked) if np.ndim(picked) == 0 else picked
        floor = np.broadcast_to(np.asarray(floor, dtype=np.float64), size.shape)
        sizes = np.asarray(self.sizes, dtype=np.float64)
        excess = (values - 1.0) * np.asarray(self.floors, dtype=np.float64)
        slope = (excess[1] - excess[0]) / (sizes[1] - sizes[0])
        below = np.maximum(excess[0] + slope * (size - sizes[0]), min(excess[0], 0.0))
        extra = np.where(size < sizes[0], below, np.interp(size, sizes, excess))
        between = 1.0 + extra / np.where(floor > 0, floor, np.inf)
        picked = np.where(size > sizes[-1], values[-1], between)
        return float(picked) if np.ndim(picked) == 0 else picked


@dataclass(frozen=True)
class Option:
    """One way to run the step's collectives; ``efficiency`` is the measured call time over
    its floor (1.0: at the floor), one for every collective or one per collective, each a
    number or a SizedEfficiency (the one measured nearest a call's size)."""

    variant: str
    codec: CodecRates | None = None
    efficiency: float | dict | SizedEfficiency = 1.0
    hierarchical: bool = False
    # collective -> its call through training's path (the gradient communicator on the
    # communication thread) over the harness's call the efficiency measured
    path: dict = field(default_factory=dict)
    # collective -> a call's time after a call of another collective over its time after
    # one of its own (the calls of a step in turn; 1.0 where absent)
    in_turn: dict = field(default_factory=dict)
    handoff_s: float = 0.0  # a round trip between the training and stream threads

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}")
        if (self.codec is None) != (self.variant in UNCOMPRESSED):
            raise ValueError(
                f"{self.variant} {'needs' if self.codec is None else 'takes no'} codec"
            )

    @property
    def label(self) -> str:
        flat = self.variant if self.codec is None else f"{self.variant}:{self.codec.spec}"
        return flat + NODE_MARK if self.hierarchical else flat

    def efficiency_for(self, collective: str, size=None, floor=None):
        """The efficiency of a call of `collective` (at OSU `size`, a number or an array,
        whose floor is `floor` seconds, where the efficiency was measured per size), times
        its factor through training's path (`path`)."""
        found = self.efficiency
        if isinstance(found, dict):
            found = found.get(collective, 1.0)
        found = found.at(size, floor) if isinstance(found, SizedEfficiency) else found
        return found * self.path.get(collective, 1.0)

    @property
    def ratio(self) -> float:
        return 1.0 if self.codec is None else self.codec.ratio


# ------------------------------------------------------------------------ one call


def algorithm_steps(variant: str, collective: str, ranks: int) -> int:
    """Steps that each pay the network's fixed cost: the ring's for ccbench's rings, the
    fewest any algorithm needs for the library's (costmodel.floor_steps)."""
    return floor_steps(collective, ranks, "library" if variant == LIBRARY else "ring")


def split_label(label: str) -> tuple[str, str, bool]:
    """An option's label as (variant, codec spec or "", hierarchical)."""
    hierarchical = label.endswith(NODE_MARK)
    variant, _, codec = label.removesuffix(NODE_MARK).partition(":")
    return variant, codec, hierarchical


def wire_bytes(option: Option, collective: str, size: float, ranks: int) -> float:
    """Bytes a rank sends in one call: the ring's volume over the codec's ratio."""
    return spec(collective).ring_wire_bytes(size, ranks) / option.ratio


def codec_work_bytes(variant: str, collective: str, size: float, ranks: int) -> dict:
    """Uncompressed bytes through each codec kernel on one rank in one call (OSU sizes:
    allgather's is what a rank sends, the others' the whole buffer).

    Collective level (compress once, forward payloads): the allgather encodes its block
    once and decodes the P-1 others; the reduce-scatter encodes its first block, decodes,
    adds and re-encodes at each of the P-2 middle hops and decodes the last one; the
    allreduce is both, on blocks of size/P. Point-to-point: every hop encodes what it
    sends and decodes what it receives."""
    p = ranks
    if p < 2 or variant in UNCOMPRESSED:
        return {"encode": 0.0, "decode": 0.0, "hop": 0.0}
    block = spec(collective).ring_block(size, p)
    if variant == P2P:
        hops = spec(collective).ring_hops(p)
        return {"encode": hops * block, "decode": hops * block, "hop": 0.0}
    encodes, decodes, hops = spec(collective).coll_codec_blocks(p)
    return {"encode": encodes * block, "decode": decodes * block, "hop": hops * block}


def codec_seconds(
    option: Option, collective: str, size: float, ranks: int, codec_share: float = 1.0
) -> float:
    """The codec's time of one call on one rank, times the ranks sharing its core."""
    if option.codec is None:
        return 0.0
    work = codec_work_bytes(option.variant, collective, size, ranks)
    c = option.codec
    cpu = work["encode"] / c.encode_bps + work["decode"] / c.decode_bps + work["hop"] / c.hop_bps
    return cpu * max(1.0, codec_share)


def call_seconds(
    option: Option, network: Network, collective: str, size, ranks: int, codec_share: float = 1.0
) -> dict:
    """One call's predicted time and its parts: wire (its floor), codec, floor and time
    (the floor times the option's efficiency). Sizes may be a numpy array. A flat option
    on a network of nodes: ranks placed in blocks, every ring step crosses each node's
    link once, so the ring is paced by that link as on one level."""
    size = np.asarray(size, dtype=np.float64)
    if option.hierarchical and network.ranks_per_node > 1:
        return hierarchical_call_seconds(option, network, collective, size, ranks, codec_share)
    wire = wire_floor_s(
        wire_bytes(option, collective, size, ranks),
        network.rate_bps,
        network.burst_bytes,
        algorithm_steps(option.variant, collective, ranks),
        network.step_s,
    )
    codec = codec_seconds(option, collective, size, ranks, codec_share)
    if option.variant == P2P:
        floor = wire + codec  # a hop encodes, sends, receives, decodes: nothing overlaps
    else:
        floor = call_floor_s(wire, codec)
    return {
        "wire": wire,
        "codec": codec * np.ones_like(size),
        "floor": floor,
        "time": option.efficiency_for(collective, size, floor) * floor,
    }


def hierarchical_levels(option: Option, collective: str) -> str:
    """How a hierarchical option runs its two levels, as its rows' `levels` say:
    "overlapped" for the collective-level ring's allgather and reduce-scatter (through
    the node's shared memory, `--intra-node auto` where the node's ranks share it),
    "series" otherwise."""
    return "overlapped" if option.variant == COLL and collective in OVERLAPPED_LEVELS else "series"


def hierarchical_call_seconds(
    option: Option, network: Network, collective: str, size, ranks: int, codec_share: float = 1.0
) -> dict:
    """One hierarchical call (N nodes of M ranks) on the two-level floor
    (costmodel.hierarchical_floor, as the hierarchical rows' floor): inside the node the
    uncompressed ring over M ranks (allgather: on each of the N nodes' slabs), its bytes
    at the intra-node rate; across nodes the variant's collective on N ranks of the
    inter-node size (allgather: the rank's block; the others: 1/M of the buffer), every
    local index at once, so the node's link carries M times one rank's bytes over the
    codec's ratio; the codec works on the inter-node collective only. The
    collective-level ring's allgather and reduce-scatter: the levels overlapped (the
    design `--intra-node auto` runs where a node's ranks share memory,
    collectives/hierarchical_shared.py); its allreduce, the levels in series.
    Point-to-point: the levels and the codec in series. Sizes may be a numpy array."""
    m = network.ranks_per_node
    n = network.nodes(ranks)
    described = spec(collective)
    steps = algorithm_steps(option.variant, collective, n) if n > 1 else 0
    overlapped = hierarchical_levels(option, collective) == "overlapped"
    parts = {"intra": [], "inter": [], "codec": [], "floor": []}
    for s in np.atleast_1d(np.asarray(size, dtype=np.float64)):
        intra_bytes = described.ring_wire_bytes(s, m) * (n if described.ring_block_is_send else 1)
        inter_size = s if described.ring_block_is_send else s / m
        link = node_link_bytes(collective, s, n, m, True) / option.ratio
        codec = codec_seconds(option, collective, inter_size, n, codec_share)
        floor = hierarchical_floor(
            intra_bytes,
            network.intra_rate_bps or None,
            link,
            network.rate_bps,
            codec,
            1.0,
            network.burst_bytes,
            steps,
            network.step_s,
            overlapped=overlapped,
        )
        parts["intra"].append(floor["intra"])
        parts["inter"].append(floor["inter"])
        parts["codec"].append(codec)
        serial = floor["intra"] + floor["inter"] + codec
        parts["floor"].append(serial if option.variant == P2P else floor["floor"])
    shape = np.shape(size)
    out = {k: np.asarray(v, dtype=np.float64).reshape(shape) for k, v in parts.items()}
    out["wire"] = out["intra"] + out["inter"]
    if overlapped:
        out["wire"] = np.maximum(out["intra"], out["inter"])
    out["time"] = option.efficiency_for(collective, size, out["floor"]) * out["floor"]
    return out


def uncompressed_alpha_beta(
    network: Network, collective: str, ranks: int, algorithm: str = "ring"
) -> AlphaBeta:
    """The uncompressed call as ``alpha + beta x size`` in microseconds (no burst): the
    form costmodel.LinkModel and the MG-WFBP planner use. ``rabenseifner``: recursive
    halving and doubling, 2 lg P steps of the ring's volume (Thakur et al., 2005)."""
    if algorithm == "rabenseifner":
        steps = 2 * math.log2(ranks) if ranks > 1 else 0
    else:
        steps = algorithm_steps(LIBRARY if algorithm == LIBRARY else RING, collective, ranks)
    per_byte = spec(collective).ring_wire_bytes(1.0, ranks) * 8.0 / network.rate_bps
    return AlphaBeta(steps * network.step_s * 1e6, per_byte * 1e6)


# ------------------------------------------------------------------------ one step


@dataclass
class StepPrediction:
    """A step's predicted time and where it goes."""

    step_s: float
    compute_s: float
    busy_s: float  # time the communication stream spends in calls
    codec_s: float  # of which the codec's
    bucket_s: dict = field(default_factory=dict)  # time in calls, by message-size bucket

    @property
    def exposed_s(self) -> float:
        """Communication the compute does not hide."""
        return max(0.0, self.step_s - self.compute_s)

    @property
    def exposed_codec_s(self) -> float:
        """The codec's part of the exposed communication (its share of the calls' time,
        as the replay's rows count it)."""
        return self.exposed_s * self.codec_s / self.busy_s if self.busy_s else 0.0


def bucket_of(nbytes: float) -> str:
    return BUCKET_NAMES[int(np.searchsorted(BUCKET_EDGES, nbytes, side="right"))]


def osu_size(collective: str, total_bytes: float, ranks: int) -> float:
    """A trace call's bytes (allgather: the gathered output) as the OSU size the model
    takes (allgather: what one rank sends)."""
    return spec(collective).osu_size_of_output(total_bytes, ranks)


def step_timeline(
    step: Step, durations_s: list[float], overlap: bool = True, handoff_s: float = 0.0
) -> float:
    """The step's time when call k takes durations_s[k]: the training thread runs the
    compute gaps, issues calls onto one communication stream (a call starts when it is
    issued and the previous one has ended) and waits where the trace waits.
    ``handoff_s`` is a round trip between the threads: half of it where a call finds the
    stream idle (its thread wakes), half where a wait finds its call still running (the
    training thread wakes)."""
    half = handoff_s / 2
    now, stream_free, ends, k = 0.0, 0.0, {}, 0
    for event in step.events:
        now += event.gap_us * 1e-6
        if event.op == "call":
            start = max(now, stream_free) + (half if now >= stream_free else 0.0)
            stream_free = ends[event.id] = start + durations_s[k]
            k += 1
            if event.blocking or not overlap:
                now = stream_free + half
        elif event.op == "wait":
            if ends[event.id] > now:
                now = ends[event.id] + half
        elif stream_free > now:  # drain
            now = stream_free + half
    return now + step.tail_us * 1e-6


def predict_step(
    option: Option,
    network: Network,
    step: Step,
    ranks: int,
    codec_share: float = 1.0,
    overlap: bool = True,
) -> StepPrediction:
    """One step of a trace, every call run the option's way; a call that follows one of
    another collective on the stream (the step's last call before its first: steps run
    back to back) takes the option's ``in_turn`` factor of its collective."""
    durations, codec_total = [], 0.0
    buckets = dict.fromkeys(BUCKET_NAMES, 0.0)
    calls = step.calls
    for k, call in enumerate(calls):
        size = osu_size(call.collective, call.nbytes, ranks)
        t = call_seconds(option, network, call.collective, size, ranks, codec_share)
        after_other = calls[k - 1].collective != call.collective
        turn = option.in_turn.get(call.collective, 1.0) if after_other else 1.0
        durations.append(float(t["time"]) * turn)
        codec_total += (
            float(t["codec"]) * option.efficiency_for(call.collective, size, t["floor"]) * turn
        )
        buckets[bucket_of(call.nbytes)] += float(t["time"]) * turn
    step_s = step_timeline(step, durations, overlap, option.handoff_s)
    return StepPrediction(
        step_s, step.compute_us * 1e-6, float(sum(durations)), codec_total, buckets
    )


def step_error(option: Option, step: Step, ranks: int, ranks_per_node: int = 1) -> float:
    """Relative L2 error a step's result carries: the codec's round trip on the user's
    data, grown over the round trips its worst element makes (independent errors add in
    quadrature); a hierarchical option compresses across its N nodes only. 0 for
    uncompressed options."""
    if option.codec is None:
        return 0.0
    kind = "coll" if option.variant == COLL else "p2p"
    if option.hierarchical and ranks_per_node > 1:
        ranks = max(1, ranks // ranks_per_node)
    trips = max((compressions_on_path(kind, c.collective, ranks) for c in step.calls), default=0)
    return option.codec.rel_l2 * math.sqrt(trips)


def break_even_bytes(
    option: Option,
    baseline: Option,
    network: Network,
    collective: str,
    ranks: int,
    codec_share: float = 1.0,
    sizes=None,
) -> float | None:
    """The smallest OSU size from which the option is faster than the baseline at every
    larger size of the grid (powers of two, 1 KiB to 4 GiB); None if it never is; 0 if
    it is at every size."""
    sizes = np.asarray(sizes if sizes is not None else [2.0**k for k in range(10, 33)])
    mine = call_seconds(option, network, collective, sizes, ranks, codec_share)["time"]
    theirs = call_seconds(baseline, network, collective, sizes, ranks, codec_share)["time"]
    faster = mine < theirs
    if not faster[-1]:
        return None
    slower = np.flatnonzero(~faster)
    return 0.0 if slower.size == 0 else float(sizes[slower[-1] + 1])


def rank_options(
    predictions: dict[str, StepPrediction], errors: dict[str, float], max_error: float | None
) -> list[str]:
    """Option labels fastest first; those whose error is over ``max_error`` are left out."""
    allowed = [k for k in predictions if max_error is None or errors[k] <= max_error]
    return sorted(allowed, key=lambda k: (predictions[k].step_s, k))


def fastest_map(
    options: list[Option],
    rates_bps,
    sizes,
    step_s: float,
    collective: str,
    ranks: int,
    codec_share: float = 1.0,
    levels: Network | None = None,
) -> np.ndarray:
    """Index of the fastest option for each (link rate, OSU size): rows rates, columns
    sizes (the break-even map); ``levels``: the nodes' layout and intra-node rate, kept
    fixed while the link's rate varies."""
    grid = np.empty((len(rates_bps), len(sizes)), dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.float64)
    for i, rate in enumerate(rates_bps):
        net = Network(float(rate), step_s)
        if levels is not None:
            net = Network(float(rate), step_s, 0.0, levels.ranks_per_node, levels.intra_rate_bps)
        times = np.array(
            [call_seconds(o, net, collective, sizes, ranks, codec_share)["time"] for o in options]
        )
        grid[i] = np.argmin(times, axis=0)
    return grid


# ------------------------------------------------------------------------ the check

CHECK_GOAL = 0.15  # a prediction within 15% of the measured step


def check_verdict(rows: list[dict], advised: str, goal: float = CHECK_GOAL) -> tuple[bool, str]:
    """Words for an `advise --check`: how far the advised option's measured step was from
    its prediction, where it stands against the measured fastest's 95% interval, and how
    many predictions were within ``goal``. ``rows``: the check's rows (option,
    predicted_ms, measured_ms, low_ms, high_ms, and `measured_here`: a row marked "no"
    predicted an option whose inputs were assumed; its error is named, not counted).
    (passed, the words)."""

    def num(row, key):
        try:
            return float(row.get(key, "nan"))
        except (TypeError, ValueError):
            return math.nan

    timed = [r for r in rows if math.isfinite(num(r, "measured_ms"))]
    if not timed:
        return False, "check failed: no replay was measured"
    fastest = min(timed, key=lambda r: num(r, "measured_ms"))

    def error(r) -> str:  # the prediction's error over the measurement, as the table's
        return f"{r['option']} {100 * (num(r, 'predicted_ms') / num(r, 'measured_ms') - 1):+.0f}%"

    counted = [r for r in timed if (r.get("measured_here") or "yes") == "yes"]
    assumed = [r for r in timed if r not in counted]
    misses = [
        r
        for r in counted
        if not abs(num(r, "measured_ms") - num(r, "predicted_ms")) <= goal * num(r, "measured_ms")
    ]
    within = (
        f"{len(counted) - len(misses)} of {len(counted)} predictions within {goal:.0%} of "
        "their measurement"
        + (" (off by more: " + ", ".join(map(error, misses)) + ")" if misses else "")
        + (
            "; not counted (not measured here, inputs assumed): " + ", ".join(map(error, assumed))
            if assumed
            else ""
        )
    )
    mine = next((r for r in timed if r["option"] == advised), None)
    if mine is None:
        return False, f"check failed: the advised option ({advised}) was not replayed; {within}"
    measured, predicted = num(mine, "measured_ms"), num(mine, "predicted_ms")
    off = measured / predicted - 1
    said = (
        f"the advised option ({advised}) measured {measured:.0f} ms (95% interval "
        f"{num(mine, 'low_ms'):.0f}-{num(mine, 'high_ms'):.0f}), "
        f"{abs(100 * off):.0f}% {'slower' if off > 0 else 'faster'} than predicted "
        f"({predicted:.0f} ms)"
    )
    interval = (
        f"{fastest['option']} ({num(fastest, 'measured_ms'):.0f} ms, "
        f"{num(fastest, 'low_ms'):.0f}-{num(fastest, 'high_ms'):.0f})"
    )
    if mine is fastest:
        where, fast = "and is the measured fastest", True
    elif measured <= num(fastest, "high_ms"):
        where, fast = f"and inside the interval of the measured fastest, {interval}", True
    else:
        where, fast = f"and outside the interval of the measured fastest, {interval}", False
    passed = fast and not misses
    return passed, f"check {'passed' if passed else 'failed'}: {said} {where}; {within}"

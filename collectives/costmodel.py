"""Alpha-beta cost models: fitting measured times, and network models per rank count.

All times are in microseconds and all sizes in bytes. A collective of ``s`` bytes costs
``alpha + beta * s``. ``fit_alpha_beta`` fits that line to measurements; ``LinkModel``
predicts alpha and beta of the classic ring (and recursive-halving/doubling) algorithms
from a per-hop latency and a link rate, so a simulator can extrapolate to any rank count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ccbench.collectives.spec import spec


@dataclass(frozen=True)
class AlphaBeta:
    """Cost of one collective call: ``alpha_us + beta_us_per_byte * nbytes``."""

    alpha_us: float
    beta_us_per_byte: float

    def time_us(self, nbytes):
        """Predicted time in microseconds (scalar or numpy array of sizes)."""
        return self.alpha_us + self.beta_us_per_byte * np.asarray(nbytes, dtype=np.float64)


@dataclass(frozen=True)
class Fit:
    """A fitted alpha-beta model and how well it describes the measurements."""

    model: AlphaBeta
    r2: float  # coefficient of determination on the measured times
    max_rel_err: float  # max |predicted - measured| / measured over the points
    npoints: int

    def describe(self) -> str:
        return (
            f"alpha = {self.model.alpha_us:.2f} us, "
            f"beta = {self.model.beta_us_per_byte * 1e3:.4f} us/KB "
            f"({bandwidth_gbps(self.model):.3f} Gbit/s), "
            f"R^2 = {self.r2:.4f}, max rel err = {100 * self.max_rel_err:.1f}% "
            f"over {self.npoints} sizes"
        )


def bandwidth_gbps(model: AlphaBeta) -> float:
    """Effective bandwidth 1/beta in Gbit/s (inf when beta is 0)."""
    if model.beta_us_per_byte <= 0:
        return float("inf")
    return 8e-3 / model.beta_us_per_byte


def fit_alpha_beta(sizes_bytes, times_us) -> Fit:
    """Least-squares fit of ``t = alpha + beta * s`` weighted by 1/t.

    The weighting minimises relative error, so the small sizes (which decide alpha)
    count as much as the large ones (which decide beta); an unweighted fit lets the
    largest message swamp alpha. Both coefficients are constrained to be >= 0: when the
    unconstrained optimum is negative, the coefficient is pinned to 0 and the other
    one refitted (a negative alpha or beta has no physical meaning).
    """
    s = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(times_us, dtype=np.float64)
    if s.ndim != 1 or s.shape != t.shape or s.size < 2:
        raise ValueError("fit_alpha_beta needs two equal-length 1-D sequences of >= 2 points")
    if np.unique(s).size < 2:
        raise ValueError("fit_alpha_beta needs at least two distinct sizes")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive")
    w = 1.0 / t
    design = np.column_stack([np.ones_like(s), s]) * w[:, None]
    alpha, beta = np.linalg.lstsq(design, t * w, rcond=None)[0]
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(w * w * s * t) / np.sum(w * w * s * s))
    elif beta < 0:
        alpha, beta = float(np.sum(w * w * t) / np.sum(w * w)), 0.0
    model = AlphaBeta(float(alpha), float(beta))
    pred = model.time_us(s)
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return Fit(model, r2, float(np.max(np.abs(pred - t) / t)), int(s.size))


@dataclass(frozen=True)
class LinkModel:
    """A homogeneous network: every hop costs ``hop_latency_us`` plus bytes / link rate.

    Alpha-beta parameters of the textbook algorithms on ``p`` ranks (Thakur, Rabenseifner
    and Gropp, 2005) follow; ``reduce`` arithmetic is not modelled (it overlaps with the
    wire on every machine this suite targets).
    """

    link_gbps: float
    hop_latency_us: float

    @property
    def us_per_byte(self) -> float:
        return 8e-3 / self.link_gbps

    def ring_allreduce(self, p: int) -> AlphaBeta:
        """Reduce-scatter then allgather around a ring: 2(p-1) steps of 1/p of the data."""
        if p < 2:
            return AlphaBeta(0.0, 0.0)
        return AlphaBeta(2 * (p - 1) * self.hop_latency_us, 2 * (p - 1) / p * self.us_per_byte)

    def ring_allgather(self, p: int) -> AlphaBeta:
        """Ring allgather; size is the total gathered buffer (p blocks)."""
        if p < 2:
            return AlphaBeta(0.0, 0.0)
        return AlphaBeta((p - 1) * self.hop_latency_us, (p - 1) / p * self.us_per_byte)

    def ring_reduce_scatter(self, p: int) -> AlphaBeta:
        """Ring reduce-scatter; size is the whole send buffer (p blocks)."""
        return self.ring_allgather(p)

    def rabenseifner_allreduce(self, p: int) -> AlphaBeta:
        """Recursive-halving reduce-scatter + recursive-doubling allgather (p a power of 2)."""
        if p < 2:
            return AlphaBeta(0.0, 0.0)
        if p & (p - 1):  # lg p would count fractional steps: the model holds for 2**k only
            raise ValueError(f"the Rabenseifner model needs a power of two ranks, not {p}")
        return AlphaBeta(2 * np.log2(p) * self.hop_latency_us, 2 * (p - 1) / p * self.us_per_byte)

    def allreduce(self, p: int, algorithm: str = "ring") -> AlphaBeta:
        try:
            return {"ring": self.ring_allreduce, "rabenseifner": self.rabenseifner_allreduce}[
                algorithm
            ](p)
        except KeyError:
            raise ValueError(f"unknown allreduce algorithm {algorithm!r}") from None

    @classmethod
    def from_ring_allreduce(cls, model: AlphaBeta, p: int) -> LinkModel:
        """Invert ``ring_allreduce``: the link that explains a measured fit on ``p`` ranks."""
        if p < 2:
            raise ValueError("a measured allreduce on >= 2 ranks is needed to infer a link")
        if model.beta_us_per_byte <= 0:
            raise ValueError("beta must be positive to infer a link rate")
        return cls(
            link_gbps=8e-3 * 2 * (p - 1) / p / model.beta_us_per_byte,
            hop_latency_us=model.alpha_us / (2 * (p - 1)),
        )


# ---------------------------------------------------------------- measuring a fit


def fit_sizes(total_bytes: int, low: int, ranks: int, item: int = 4) -> list[int]:
    """Powers of two from ``low`` up to ``total_bytes``, plus ``total_bytes``, each a whole
    number of ``item``-byte elements that splits evenly over ``ranks``."""
    quantum = item * ranks
    sizes, s = [], max(low, quantum)
    while s < total_bytes:
        sizes.append(s // quantum * quantum)
        s *= 2
    sizes.append(max(quantum, total_bytes // quantum * quantum))
    return sorted(set(sizes))


def fit_cost_model(
    comm, bind, send, recv, sizes: list[int], seconds_per_size: float, timer, item: int = 4
) -> tuple[Fit, list[dict]]:
    """Time one collective per size and fit ``alpha + beta * s`` (``fit_alpha_beta``).

    ``bind(send[:n], recv[:n])`` returns the call for n elements; ``timer(run,
    iterations)`` times it and returns microseconds per call, the same on every rank of
    the communicator ``comm`` (the harness's OSU-style timing). About
    ``seconds_per_size`` per size.
    """
    import time

    points = []
    for size in sizes:
        n = size // item
        run = bind(send[:n], recv[:n])
        run()  # warm-up, and a first estimate of the time per call
        t0 = time.perf_counter()
        run()
        first = comm.allreduce_value(time.perf_counter() - t0, op="max")
        iters = int(np.clip(seconds_per_size / max(first, 1e-6), 3, 200))
        points.append(
            {"size_bytes": size, "measured_us": float(timer(run, iters)), "iterations": iters}
        )
    fit = fit_alpha_beta([p["size_bytes"] for p in points], [p["measured_us"] for p in points])
    for p in points:
        p["fitted_us"] = float(fit.model.time_us(p["size_bytes"]))
    return fit, points


# ---------------------------------------------------------------- a call's floor
#
# One definition of the lower bound of a collective's call, used by the compressed
# variants' rows (overlap efficiency), the plots' model lines and floors, and the
# pipeline's chunk choice (docs/compression.md, "The floor").


def floor_steps(collective: str, ranks: int, algorithm: str = "ring") -> int:
    """The steps of a call that each pay the link's fixed cost: a ring's P-1 (twice for
    an allreduce: reduce-scatter then allgather); for an algorithm ccbench cannot see
    inside (the library's), the fewest any algorithm needs, ceil(log2 P)."""
    if ranks < 2:
        return 0
    if algorithm == "ring":
        return spec(collective).ring_hops(ranks)
    return int(ranks - 1).bit_length()


def wire_floor_s(wire_bytes, rate_bps, burst_bytes=0.0, steps=0, step_s=0.0):
    """Seconds the link needs for one call: the bytes a rank sends, less what the shaper's
    token bucket passes at once after a pause, at the link's payload rate, plus each
    step's fixed cost. Scalars or arrays (numpy, pandas) alike."""
    bits = np.maximum(wire_bytes - burst_bytes, 0.0) * 8.0
    return bits / rate_bps + steps * step_s


def call_floor_s(wire_s, codec_s):
    """A call's floor: the larger of the wire's and the codec's (codec_floor_s); no wire
    (None or NaN: no link), the codec's."""
    if wire_s is None:
        return codec_s
    return np.fmax(wire_s, codec_s)


def codec_floor_s(codec_cpu_s, codec_share: float) -> float:
    """The least time the codec work of one call needs, from the ranks that share the
    critical rank's cores (or device): each one's fastest codec time per call over the
    timed calls (a scalar: one rank's, the others assumed alike), and how many ranks share
    a core or device. Their work, summed, needs the cores they cover for its mean times
    the share; one rank's work runs on one thread, so its own time bounds the call too.
    The fastest call's time, not the mean, so that a call slowed by other work on the
    core does not raise the floor above calls that were not: a strict lower bound."""
    cpu = np.atleast_1d(np.asarray(codec_cpu_s, dtype=np.float64))
    if cpu.size == 0:
        return 0.0
    return float(max(cpu.max(), cpu.mean() * codec_share))


def pipeline_floor(
    wire_bytes: float,
    rate_bps: float | None,
    codec_cpu_s,
    codec_share: float,
    burst_bytes: float = 0.0,
    steps: int = 0,
    step_s: float = 0.0,
) -> dict:
    """One call's floor in seconds, its parts by name: wire (wire_floor_s; None without a
    link: shared memory), codec (codec_floor_s of the sharing ranks' fastest codec times)
    and floor."""
    wire = wire_floor_s(wire_bytes, rate_bps, burst_bytes, steps, step_s) if rate_bps else None
    codec = codec_floor_s(codec_cpu_s, codec_share)
    return {"wire": wire, "codec": codec, "floor": float(call_floor_s(wire, codec))}


def pipeline_time_s(
    block_bytes: float,
    chunks: int,
    ranks: int,
    chunk_s: float,
    codec_bps: float,
    wire_bps: float,
    share: float = 1.0,
    reduces: bool = False,
) -> float:
    """A model of one chunked ring pipeline's call over P-1 steps of B-byte blocks, each cut
    into n chunks, for choosing n (not a floor: it leaves out the burst and step cost):

        wire    W = (P-1) B / w
        codec   K = s (P-1) B / c
        chunks  C = (P-1) n o
        fill    F = 2 B / (n c)
        gaps    G = (P-2) max(0, B/(n w) + B/(n c) - B/w)     (reducing rings only)
        T       = max(W, K) + C + F + G

    o = chunk_s: the pipeline's own cost of one chunk in one step, in wall time (posting,
    polling, a codec call, a message, and waking the rank it is for, which on a shared
    core waits for the core), measured on these ranks; it is paid in series with the
    wire, since most of it is waiting for another rank, not work (docs/compression.md).
    c = codec_bps: data bytes/s through one encode and one decode on a
    rank; s = share: the ranks per core, each of which needs the core for its own codec;
    w = wire_bps: data bytes/s the link carries (its payload rate times the codec's
    ratio). F: the link idles
    for the first chunk's encode and the last one's decode. G: in a reduce-scatter a
    step's first chunk must arrive and be decoded, added and re-encoded before the next
    step can send, which the link covers only while the step's other n-1 chunks are on it;
    with one chunk per step codec and wire run in series."""
    b, n, p = float(block_bytes), max(int(chunks), 1), int(ranks)
    if p < 2 or b <= 0:
        return 0.0
    wire = (p - 1) * b / wire_bps
    codec = share * (p - 1) * b / codec_bps
    chunk = (p - 1) * n * max(chunk_s, 0.0)
    fill = 2 * b / (n * codec_bps)
    gaps = (
        (p - 2) * max(0.0, b / (n * wire_bps) + b / (n * codec_bps) - b / wire_bps)
        if reduces
        else 0.0
    )
    return max(wire, codec) + chunk + fill + gaps


def chunk_candidates(block_bytes: int, low: int, high: int | None = None) -> list[int]:
    """Chunk sizes worth modelling: the powers of two from `low` below the block (and
    `high`), and the block itself capped by `high` (one chunk per block)."""
    top = block_bytes if high is None else min(high, block_bytes)
    top = max(low, top)
    sizes, size = [top], 1 << max(0, int(low - 1).bit_length())
    while size < top:
        sizes.append(size)
        size *= 2
    return sorted(set(sizes))


def pipeline_chunk_bytes(
    block_bytes: int,
    ranks: int,
    chunk_s: float,
    codec_bps: float,
    wire_bps: float,
    low: int,
    high: int | None = None,
    share: float = 1.0,
    reduces: bool = False,
) -> int:
    """The chunk (uncompressed bytes) of least modelled time (pipeline_time_s) among
    chunk_candidates: powers of two of at least `low`, and the block (at most `high`);
    a tie goes to the larger chunk (fewer messages)."""
    best, best_t = None, float("inf")
    for size in chunk_candidates(block_bytes, low, high):
        chunks = -(-block_bytes // size) if block_bytes > 0 else 1
        t = pipeline_time_s(
            block_bytes, chunks, ranks, chunk_s, codec_bps, wire_bps, share, reduces
        )
        if t <= best_t * (1 + 1e-12):
            best, best_t = size, t
    return best


# ---------------------------------------------------------------- two levels
#
# A cluster of N nodes of M ranks: the ranks of a node on fast links (the emulated
# cluster: shared memory), nodes on a shaped network link, one per node, which its
# M ranks share. The hierarchical collectives (collectives/hierarchical.py) run an
# intra-node level and an inter-node one in series, or (through shared memory, with the
# collective-level ring across: collectives/hierarchical_shared.py) one beside the other.


# the collectives whose hierarchical design through shared memory, with the
# collective-level ring across, runs its levels one beside the other
OVERLAPPED_LEVELS = ("allgather", "reduce_scatter")


def node_link_bytes(
    collective: str, size_bytes: float, nodes: int, ranks_per_node: int, hierarchical: bool
) -> float:
    """Uncompressed bytes one node's link carries (each direction) in one call of an OSU
    size: the flat ring's every step crosses each node's link once with one block (ranks
    placed in blocks, M per node), (P-1) blocks of the P-rank ring; the hierarchical
    collective's M ranks each send the inter-node ring's bytes on N ranks of the
    inter-node size (allgather: the rank's block; the others: 1/M of the buffer)."""
    described = spec(collective)
    ranks = nodes * ranks_per_node
    if not hierarchical:
        return described.ring_wire_bytes(size_bytes, ranks)
    inter_size = size_bytes if described.ring_block_is_send else size_bytes / ranks_per_node
    return ranks_per_node * described.ring_wire_bytes(inter_size, nodes)


def hierarchical_floor(
    intra_bytes: float,
    intra_rate_bps: float | None,
    link_bytes: float,
    rate_bps: float | None,
    codec_cpu_s,
    codec_share: float,
    burst_bytes: float = 0.0,
    inter_steps: int = 0,
    step_s: float = 0.0,
    overlapped: bool = False,
) -> dict:
    """One hierarchical call's floor in seconds, its parts by name: intra (the bytes a
    rank sends inside its node at the intra-node rate; 0 where no rate is known), inter
    (wire_floor_s of the bytes through the node's link, all its ranks' inter-node bytes
    as they share it, plus the inter-node steps' fixed cost; None without a link), codec
    (codec_floor_s: the codec works during the inter-node level only), wire and floor.
    Levels in series: wire = intra + inter, floor = intra + the larger of inter and
    codec (the inter-node collective may overlap its codec with its transfers).
    `overlapped` (the level inside the node runs beside the level across): each is the
    larger of its parts, as no level can finish sooner than its own floor."""
    intra = intra_bytes * 8.0 / intra_rate_bps if intra_rate_bps else 0.0
    inter = (
        float(wire_floor_s(link_bytes, rate_bps, burst_bytes, inter_steps, step_s))
        if rate_bps
        else None
    )
    codec = codec_floor_s(codec_cpu_s, codec_share)
    across = float(call_floor_s(inter, codec))
    if overlapped:
        wire = max(intra, inter) if inter is not None else None
        floor = max(intra, across)
    else:
        wire = intra + inter if inter is not None else None
        floor = intra + across
    return {"intra": intra, "inter": inter, "codec": codec, "wire": wire, "floor": floor}

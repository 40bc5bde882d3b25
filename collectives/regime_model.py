"""The collective-level saving against the codec-to-wire ratio (docs/plots.md, the regime
figure): how much collective-level compression saves over point-to-point compression and
over the uncompressed library collective, one call at a time, as the codec gets faster
than the wire.

The ratio is the codec's round-trip rate per rank as the call sees it (encode and decode
of the same bytes, ranks sharing a core included) over the link's payload rate, both in
bytes/s. Every time comes from compression_model.call_seconds (the function `ccbench
advise` uses); this module only turns a ratio into the codec rates it stands for, and a
measured row's codec times into a ratio and the parts the model takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ccbench.collectives.compression_model import (
    COLL,
    LIBRARY,
    P2P,
    CodecRates,
    Network,
    Option,
    algorithm_steps,
    call_seconds,
    codec_work_bytes,
    wire_bytes,
)

SIZE = 16 << 20  # the paper's headline size, OSU bytes
RANKS = 4


@dataclass(frozen=True)
class RegimeParts:
    """What the model takes besides the ratio, each measured where rows give it:
    the codec's achieved compression ratio, encode's share of a round trip's time, the
    reduce-scatter hop's time per byte in round trips (decode, add, re-encode), the link's
    fixed cost per ring step and token-bucket burst, and each variant's overlap
    efficiency (call time over floor; 1.0: at the floor)."""

    compression: float
    encode_share: float = 0.5
    hop_round_trips: float = 1.0
    step_s: float = 0.0
    burst_bytes: float = 0.0
    efficiency: dict = field(default_factory=dict)


def codec_for_ratio(ratio: float, rate_bps: float, parts: RegimeParts) -> CodecRates:
    """The codec rates (per rank, as the call sees them) that are `ratio` times the link's
    payload rate `rate_bps` (bits/s)."""
    round_trip = ratio * rate_bps / 8.0
    share = min(max(parts.encode_share, 1e-9), 1 - 1e-9)
    return CodecRates(
        spec=f"ratio {ratio:g}",
        ratio=parts.compression,
        encode_bps=round_trip / share,
        decode_bps=round_trip / (1 - share),
        hop_bps=round_trip / parts.hop_round_trips,
    )


def call_times(
    ratio: float,
    collective: str,
    parts: RegimeParts,
    rate_bps: float = 1e9,
    size: float = SIZE,
    ranks: int = RANKS,
) -> dict:
    """Predicted seconds of one call for the uncompressed library collective
    (`baseline`), point-to-point (`p2p`) and collective-level (`coll`) compression."""
    codec = codec_for_ratio(ratio, rate_bps, parts)
    net = Network(rate_bps, parts.step_s, parts.burst_bytes)
    times = {}
    for name, variant, c in (
        ("baseline", LIBRARY, None),
        ("p2p", P2P, codec),
        ("coll", COLL, codec),
    ):
        option = Option(variant, c, parts.efficiency.get(variant, 1.0))
        times[name] = float(call_seconds(option, net, collective, size, ranks)["time"])
    return times


def savings(
    ratio: float,
    collective: str,
    parts: RegimeParts,
    rate_bps: float = 1e9,
    size: float = SIZE,
    ranks: int = RANKS,
) -> dict:
    """The collective level's saving (1 - its time over the other's) over point-to-point
    (`vs_p2p`) and over the uncompressed baseline (`vs_baseline`) at this ratio."""
    t = call_times(ratio, collective, parts, rate_bps, size, ranks)
    return {"vs_p2p": 1 - t["coll"] / t["p2p"], "vs_baseline": 1 - t["coll"] / t["baseline"]}


def measured_parts(
    collective: str,
    size: float,
    ranks: int,
    encode_us: float,
    decode_us: float,
    reduce_us: float = 0.0,
    link_payload_gbps: float = math.nan,
) -> dict:
    """A collective-level row's codec as the call saw it: its round-trip rate per rank
    (bytes/s), encode's share of a round trip, the reduce-scatter hop in round trips and
    the codec-to-wire ratio (nan without a link rate).

    Allgather: from the row's encode and decode wall times and the bytes the call encodes
    (its block) and decodes (the P-1 others). Reduce-scatter: the row counts its last
    decode with the hops' decode-add-encode (reduce_us), so its encode, decode and reduce
    times are taken together, over its codec work in round trips: the first encode and
    the last decode half a round trip of a block each, each of the P-2 hops one (encode
    share 1/2, a hop one round trip)."""
    work = codec_work_bytes(COLL, collective, size, ranks)
    if work["hop"] > 0:
        total_s = (encode_us + decode_us + reduce_us) * 1e-6
        round_trip_s = total_s / (0.5 * work["encode"] + 0.5 * work["decode"] + work["hop"])
        share, hop = 0.5, 1.0
    else:
        encode_s_per_byte = encode_us * 1e-6 / work["encode"]
        decode_s_per_byte = decode_us * 1e-6 / work["decode"]
        round_trip_s = encode_s_per_byte + decode_s_per_byte  # per byte
        share, hop = encode_s_per_byte / round_trip_s, 1.0
    rate = 1 / round_trip_s
    return {
        "round_trip_bps": rate,
        "encode_share": share,
        "hop_round_trips": hop,
        "ratio": rate / (link_payload_gbps * 1e9 / 8.0),
    }


def payload_rate_bps(
    collective: str,
    size: float,
    ranks: int,
    call_s: float,
    step_s: float = 0.0,
    burst_bytes: float = 0.0,
) -> float:
    """The link's payload rate (bits/s) that an uncompressed library call of `call_s`
    seconds reached: the floor call_seconds gives the library's call (the bytes a rank
    sends, less the token bucket's burst, over the rate, plus each step's fixed cost)
    solved for the rate. nan where the steps alone take the call's time."""
    sent = wire_bytes(Option(LIBRARY), collective, size, ranks)
    left = call_s - algorithm_steps(LIBRARY, collective, ranks) * step_s
    if not left > 0:
        return math.nan
    return max(sent - burst_bytes, 0.0) * 8.0 / left


def overlap_efficiency(
    variant: str,
    ratio: float,
    collective: str,
    parts: RegimeParts,
    call_s: float,
    rate_bps: float = 1e9,
    size: float = SIZE,
    ranks: int = RANKS,
) -> float:
    """A compressed variant's (COLL or P2P) overlap efficiency at a measured point: its
    call's time over the floor the model gives it there (call_seconds at efficiency 1)."""
    at_floor = RegimeParts(
        parts.compression,
        parts.encode_share,
        parts.hop_round_trips,
        parts.step_s,
        parts.burst_bytes,
    )
    key = {COLL: "coll", P2P: "p2p"}[variant]
    return call_s / call_times(ratio, collective, at_floor, rate_bps, size, ranks)[key]

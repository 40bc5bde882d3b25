"""Links matched to a codec: ``up --codec SPEC --codec-ratio R`` sets the link rate from
the codec's throughput on this host (one encode and one decode, CPU time, one core;
shared by the ranks that share a core) divided by R: the regime of a GPU codec R times
faster than the network.

The codec is timed by ``ccbench codec_throughput``'s own routine, so the regime and the
codec table measure the same thing.
"""

from __future__ import annotations

import math
import os

from ccbench.scripts.cluster.layout import format_rate


def codec_rates(spec: str, nbytes: int = 16 << 20, repeats: int = 5) -> dict:
    """The codec's encode and decode rates on this host, in bytes/s of uncompressed
    float32 gradient-like values, from the CPU time of the best of `repeats` (one core;
    other jobs on the host do not slow a CPU clock the way they slow a wall clock)."""
    # imported here: the cluster's other actions need neither numpy nor the codecs
    from ccbench.benchmarks.codec_throughput import measure_codec, set_one_thread

    set_one_thread()  # the fp16/bf16 kernels: one thread, as each rank runs them
    row = measure_codec(
        spec, "gradient-like", "numpy", "float32", nbytes // 4, repeats, clock="cpu"
    )
    encode, decode = row["encode_gbps"] * 1e9, row["decode_gbps"] * 1e9
    # one encode and one decode of the same bytes: the rates add harmonically
    return {
        "encode_bps": encode,
        "decode_bps": decode,
        "round_trip_bps": 1 / (1 / encode + 1 / decode),
    }


def regime_rate(
    spec: str, ratio: float, ranks: int, cores: int | None = None, measured: dict | None = None
) -> dict:
    """The link rate at which the codec is `ratio` times faster than the link.

    codec rate per rank = round trip bytes/s on one core x min(1, cores / ranks) (ranks on
    one host share its cores); link bytes/s = that / ratio, rounded to 3 significant
    digits (at least 1 Mbit/s)."""
    cores = cores or len(os.sched_getaffinity(0))
    measured = measured or codec_rates(spec)
    share = min(1.0, cores / ranks)
    per_rank = measured["round_trip_bps"] * share
    bps = per_rank * 8 / ratio
    digits = 2 - int(math.floor(math.log10(bps)))  # 3 significant digits
    rate = max(10**6, int(round(bps, digits)))
    return {
        "codec": spec,
        "codec_link_ratio": ratio,
        "cores": cores,
        "share": share,
        "encode_gbytes_per_s": measured["encode_bps"] / 1e9,
        "decode_gbytes_per_s": measured["decode_bps"] / 1e9,
        "round_trip_gbytes_per_s": measured["round_trip_bps"] / 1e9,
        "per_rank_gbytes_per_s": per_rank / 1e9,
        "rate_bps": rate,
    }


def describe_regime(r: dict, ranks: int) -> str:
    return (
        f"codec {r['codec']} on this host (CPU time, one core): encode "
        f"{r['encode_gbytes_per_s']:.2f} GB/s, decode {r['decode_gbytes_per_s']:.2f} "
        f"GB/s, round trip {r['round_trip_gbytes_per_s']:.2f} GB/s; {ranks} ranks on "
        f"{r['cores']} cores: {r['per_rank_gbytes_per_s']:.3f} GB/s per rank; / "
        f"{r['codec_link_ratio']:g} -> links of {format_rate(r['rate_bps'])}"
    )

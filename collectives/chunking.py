"""The collective-level ring's chunks: how many elements a pipelined chunk holds, how a
block splits into them, and `--chunk-bytes auto`'s choice (the closed form is the cost
model's, collectives/costmodel.py)."""

from __future__ import annotations

import math

from ccbench.collectives.costmodel import pipeline_chunk_bytes
from ccbench.collectives.spec import spec
from ccbench.kernels.codec_base import Codec
from ccbench.kernels.vocabulary import itemsize

DEFAULT_CHUNK_BYTES = 1 << 20  # uncompressed bytes per pipelined chunk

# --chunk-bytes auto: a chunk's per-message cost against the pipeline's fill and drain,
# from the transport's and the codec's rates measured on the ranks at start-up
# (benchmarks/coll_compressed.py); the closed form is the cost model's
AUTO_CHUNK_LOW = 64 << 10
# On a device every chunk of every ring step costs the host LAUNCHES_PER_CHUNK launches
# (its batched send and receive, its codec kernel), each `launch_s` of host time eagerly
# and none replayed from a CUDA graph; auto never picks a chunk whose launches cost more
# than LAUNCH_SHARE of its time on the wire.
LAUNCHES_PER_CHUNK = 2
LAUNCH_SHARE = 0.05


def launch_floor_bytes(
    launch_s: float, ratio: float, wire_bps: float, launches: int = LAUNCHES_PER_CHUNK
) -> int:
    """The smallest chunk (uncompressed bytes) whose payload (`ratio` times smaller) takes
    at least launches x launch_s / LAUNCH_SHARE on a wire of `wire_bps` bytes/s; 0 when
    a launch costs the host nothing (graphed, or host buffers)."""
    if launch_s <= 0 or not wire_bps > 0:
        return 0
    return math.ceil(launches * launch_s / LAUNCH_SHARE * wire_bps * ratio)


def auto_chunk_bytes(
    codec: Codec,
    dtype: str,
    block_bytes: int,
    ranks: int,
    link_gbps: float | None,
    codec_bps: float,
    chunk_s: float,
    collective: str = "allgather",
    share: float = 1.0,
    launch_s: float = 0.0,
) -> int:
    """Chunk size (uncompressed bytes) for blocks of `block_bytes` on `ranks` ranks, from
    the link's payload rate `link_gbps`, the codec's rate `codec_bps` (data bytes/s
    through one encode and one decode), the pipeline's own cost of a chunk in a step
    `chunk_s` and the ranks per core `share`, all measured (costmodel.pipeline_chunk_bytes:
    the data rate of the link is its payload rate times the codec's ratio; reduce-scatter
    and allreduce re-encode at every step); no link rate or codec rate (one rank): the
    default chunk. `launch_s`: the host's cost of a launch on a device (eager; 0 graphed):
    no chunk below launch_floor_bytes."""
    if not link_gbps or block_bytes <= 0 or not codec_bps > 0:
        return DEFAULT_CHUNK_BYTES
    ratio = codec.nominal_ratio(dtype) if codec.fixed_size else 1.0
    wire_bps = link_gbps * 1e9 / 8
    return pipeline_chunk_bytes(
        block_bytes,
        ranks,
        chunk_s,
        codec_bps,
        ratio * wire_bps,
        max(AUTO_CHUNK_LOW, launch_floor_bytes(launch_s, ratio, wire_bps)),
        share=share,
        reduces=spec(collective).reduces,
    )


def chunk_count_for(codec: Codec, dtype: str, chunk_bytes: int) -> int:
    """Elements per chunk: chunk_bytes of data, a multiple of the codec's granularity."""
    if chunk_bytes <= 0:
        return 0  # one chunk per block
    grain = codec.granularity
    per_chunk = chunk_bytes // itemsize(dtype)
    return max(grain, per_chunk // grain * grain)


def split_chunks(start: int, stop: int, chunk_count: int) -> list[tuple[int, int]]:
    """[start, stop) in chunks of chunk_count elements (0: one chunk); none if empty."""
    if stop <= start:
        return []
    if chunk_count <= 0:
        return [(start, stop)]
    return [(c, min(c + chunk_count, stop)) for c in range(start, stop, chunk_count)]

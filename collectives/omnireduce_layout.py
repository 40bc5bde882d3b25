"""OmniReduce's layout: blocks cut into streams of contiguous blocks, each stream owned by
one aggregator, and the constants of the messages both protocols send.

Aggregators are colocated (every rank aggregates `streams_per_aggregator` streams, the
rank's own share skips the wire) or dedicated (the last K ranks only aggregate, as in
the paper's testbed; their input is ignored and their output holds the sums of their
own streams only).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ccbench.collectives.ring import block_bounds
from ccbench.kernels.errors import UsageError
from ccbench.kernels.sparse import block_count

PROTOCOLS = ("request-driven", "stream-ahead")
TAG_BASE = 1000  # data tags TAG_BASE + s, result tags TAG_BASE + streams + s
MAX_TAG = 32767  # the smallest MPI_TAG_UB the standard allows


@dataclass(frozen=True)
class Layout:
    """Where every block goes: streams of contiguous blocks and their aggregators."""

    count: int
    block_size: int
    nblocks: int
    streams: tuple[tuple[int, int], ...]  # [start, stop) block positions per stream
    aggregator_of: tuple[int, ...]  # rank aggregating each stream
    workers: tuple[int, ...]  # ranks holding data
    fusion: int
    window: int
    protocol: str = "request-driven"

    def streams_of(self, rank: int) -> list[int]:
        return [s for s, agg in enumerate(self.aggregator_of) if agg == rank]

    @cached_property
    def message_blocks(self) -> int:
        """Blocks one message can hold: `fusion`, or a whole stream if that is less."""
        longest = max((stop - start for start, stop in self.streams), default=1)
        return max(1, min(self.fusion, longest))

    @cached_property
    def message_indices(self) -> int:
        """int32 positions one message can hold: a position per block, and (request-driven)
        a next position per block, or per column in a first packet."""
        return self.message_blocks * (2 if self.protocol == "request-driven" else 1)

    def columns(self, stream: int) -> int:
        """Request-driven: columns of one stream (its blocks in rows of this many)."""
        start, stop = self.streams[stream]
        return max(1, min(self.fusion, stop - start))


def make_layout(
    count: int,
    block_size: int,
    size: int,
    aggregators: int = 0,
    streams_per_aggregator: int = 2,
    fusion: int = 1024,
    window: int = 4,
    protocol: str = "request-driven",
) -> Layout:
    """The layout on `size` ranks: colocated when aggregators == 0, else the last K ranks.

    Streams are contiguous runs of blocks dealt to the aggregators round-robin; with the
    request-driven protocol each stream is one slot of its aggregator, so
    `streams_per_aggregator` is the slots per aggregator.
    """
    if protocol not in PROTOCOLS:
        raise UsageError(f"unknown omnireduce protocol {protocol!r}; use {', '.join(PROTOCOLS)}")
    if aggregators:
        agg_ranks = list(range(size - aggregators, size))
        workers = tuple(range(size - aggregators))
    else:
        agg_ranks = list(range(size))
        workers = tuple(range(size))
    nblocks = block_count(count, block_size)
    nstreams = min(len(agg_ranks) * streams_per_aggregator, nblocks)
    if TAG_BASE + 2 * nstreams > MAX_TAG:
        raise UsageError(
            f"{nstreams} omnireduce streams need more MPI tags than MPI promises "
            f"({MAX_TAG}); use fewer --streams"
        )
    streams = tuple(block_bounds(nblocks, nstreams)) if nstreams else ()
    aggregator_of = tuple(agg_ranks[s % len(agg_ranks)] for s in range(nstreams))
    return Layout(
        count, block_size, nblocks, streams, aggregator_of, workers, fusion, window, protocol
    )


def stream_share(layout: Layout, rank: int) -> np.ndarray:
    """Boolean per block: the blocks of the streams `rank` aggregates."""
    share = np.zeros(layout.nblocks, dtype=bool)
    for s in layout.streams_of(rank):
        start, stop = layout.streams[s]
        share[start:stop] = True
    return share

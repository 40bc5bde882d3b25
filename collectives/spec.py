"""One description per collective, as nccl-tests keeps one `testColl` per collective: its
name and titles, the counts of a message size on P ranks, the bus-bandwidth factor, the
bytes a ring puts on the wire, and the reference result that validation compares with.
Each is a field or a function of the collective's entry in SPECS, never a branch on its
name: adding a collective adds one entry.

The harness, the OSU printer, the variants and the plots all read these facts here.

Sizes follow OSU: Allgather's size is what each rank sends (the gathered buffer is P
times that), Reduce-Scatter's and Allreduce's the whole send buffer. nccl-tests' size is
the whole gathered or reduced buffer (`total_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import COLLECTIVES, itemsize


@dataclass(frozen=True)
class Shape:
    """One collective call of an OSU size on P ranks, as counts and bytes."""

    count: int  # elements in the OSU size
    send_count: int
    recv_count: int
    bytes_per_rank: int  # what each rank contributes (allgather) or receives (others)
    total_bytes: int  # nccl-tests' size: the whole gathered / reduced buffer


# The counts of one call, by what the collective does with a rank's send buffer.


def _gathered(count: int, item: int, ranks: int, dtype: str) -> Shape:
    """Each rank sends `count` elements and receives every rank's."""
    size = count * item
    return Shape(count, count, count * ranks, size, size * ranks)


def _scattered(count: int, item: int, ranks: int, dtype: str) -> Shape:
    """Each rank sends `count` elements and receives its 1/P share of their sum."""
    if count % ranks:
        raise UsageError(f"reduce_scatter: {count * item} B of {dtype} cannot be split "
                         f"over {ranks} ranks; use sizes that are multiples of "
                         f"{ranks * item} B")
    size = count * item
    return Shape(count, count, count // ranks, size // ranks, size)


def _whole(count: int, item: int, ranks: int, dtype: str) -> Shape:
    """Each rank sends `count` elements and receives as many (the sum)."""
    size = count * item
    return Shape(count, count, count, size, size)


# What a rank holds afterwards, in float64, from every rank's inputs.


def _concatenation(inputs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    return np.concatenate(inputs).astype(np.float64)


def _sum(inputs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    return np.sum(np.asarray(inputs, dtype=np.float64), axis=0)


def _share_of_sum(inputs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    total = _sum(inputs, rank)
    block = total.shape[0] // len(inputs)
    return total[rank * block:(rank + 1) * block]


@dataclass(frozen=True)
class CollectiveSpec:
    name: str
    osu_title: str  # the word in OSU's header, "# OSU MPI <title> Latency Test"
    label: str  # in figures
    size_convention: str
    reduces: bool
    # nccl-tests' bus bandwidth: busbw = algbw x factor(P)
    busbw: Callable[[int], float]
    # blocks a rank sends in the ring algorithm, per block (P - 1, or 2 (P - 1))
    ring_hops: Callable[[int], int]
    # the counts of a size of `count` elements of `item` bytes on P ranks (_gathered ...)
    counts: Callable[[int, int, int, str], Shape]
    # elements a rank receives for send_count sent on P ranks: recv_count(send_count, P)
    recv_count: Callable[[int, int], int]
    # what `rank` holds after the collective of every rank's inputs, in float64:
    # reference(inputs, rank)
    reference: Callable[[Sequence[np.ndarray], int], np.ndarray]
    # the fewest elements a size may hold on P ranks (too small: the size is skipped)
    min_count: Callable[[int], int]
    # a ring block is a rank's whole send buffer (gathering) or a 1/P share of it
    ring_block_is_send: bool
    # the collective-level compressed ring's codec work on one rank, in ring blocks:
    # (encodes, decodes, hops: decode-add-encode) on P ranks
    coll_codec_blocks: Callable[[int], tuple[int, int, int]]

    def shape(self, size_bytes: int, ranks: int, dtype: str) -> Shape | None:
        """The counts of one call; None when the size holds too few elements to split.
        Raises UsageError when the size cannot be split as the collective needs."""
        item = itemsize(dtype)
        if size_bytes % item:
            if size_bytes < item:
                return None
            raise UsageError(f"{self.name}: {size_bytes} B is not a whole number of "
                             f"{dtype} elements")
        count = size_bytes // item
        if count < self.min_count(ranks):
            return None
        return self.counts(count, item, ranks, dtype)

    def ring_block(self, size_bytes: float, ranks: int) -> float:
        """Bytes of one ring block for an OSU size (what one hop moves, uncompressed)."""
        return size_bytes if self.ring_block_is_send else size_bytes / ranks

    def ring_block_count(self, count: int, ranks: int) -> int:
        """Elements of the largest ring block for `count` elements of the OSU size (blocks
        of an allreduce differ by one element when P does not divide the count)."""
        return count if self.ring_block_is_send else -(-count // ranks)

    def osu_size_of_output(self, output_bytes: float, ranks: int) -> float:
        """The OSU size of a call whose output holds `output_bytes` (a gathered output is
        every rank's send buffer; the others' output is the OSU size)."""
        return output_bytes / ranks if self.ring_block_is_send else output_bytes

    def ring_wire_bytes(self, size_bytes: float, ranks: int) -> float:
        """Bytes each rank sends in the ring algorithm for an OSU size."""
        return self.ring_hops(ranks) * self.ring_block(size_bytes, ranks)


SPECS = {spec.name: spec for spec in (
    CollectiveSpec("allgather", "Allgather", "Allgather",
                   "Size = bytes each rank sends (OSU); the gathered buffer is ranks x Size",
                   reduces=False, busbw=lambda n: (n - 1) / n, ring_hops=lambda n: n - 1,
                   counts=_gathered, recv_count=lambda sent, n: sent * n,
                   reference=_concatenation, min_count=lambda n: 0, ring_block_is_send=True,
                   coll_codec_blocks=lambda n: (1, n - 1, 0)),
    CollectiveSpec("reduce_scatter", "Reduce_scatter", "Reduce-Scatter",
                   "Size = the whole send buffer (OSU); each rank receives Size / ranks",
                   reduces=True, busbw=lambda n: (n - 1) / n, ring_hops=lambda n: n - 1,
                   counts=_scattered, recv_count=lambda sent, n: sent // n,
                   reference=_share_of_sum, min_count=lambda n: n, ring_block_is_send=False,
                   coll_codec_blocks=lambda n: (1, 1, n - 2)),
    CollectiveSpec("allreduce", "Allreduce", "Allreduce",
                   "Size = the whole buffer (OSU and nccl-tests agree)",
                   reduces=True, busbw=lambda n: 2 * (n - 1) / n,
                   ring_hops=lambda n: 2 * (n - 1), counts=_whole,
                   recv_count=lambda sent, n: sent, reference=_sum, min_count=lambda n: 0,
                   ring_block_is_send=False, coll_codec_blocks=lambda n: (2, n, n - 2)),
)}
assert tuple(SPECS) == COLLECTIVES


def spec(name: str) -> CollectiveSpec:
    """The description of a collective by name; UsageError for an unknown one."""
    try:
        return SPECS[name]
    except KeyError:
        raise UsageError(f"unknown collective {name!r} (collectives: "
                         f"{', '.join(COLLECTIVES)})") from None

"""One description per collective, as nccl-tests keeps one `testColl` per collective: its
name and titles, the counts of a message size on P ranks, the bus-bandwidth factor, the
bytes a ring puts on the wire, and the reference result that validation compares with.

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
        if self.name == "allgather":
            return Shape(count, count, count * ranks, size_bytes, size_bytes * ranks)
        if self.name == "reduce_scatter":
            if count < ranks:
                return None
            if count % ranks:
                raise UsageError(f"reduce_scatter: {size_bytes} B of {dtype} cannot be split "
                                 f"over {ranks} ranks; use sizes that are multiples of "
                                 f"{ranks * item} B")
            return Shape(count, count, count // ranks, size_bytes // ranks, size_bytes)
        return Shape(count, count, count, size_bytes, size_bytes)

    def recv_count(self, send_count: int, ranks: int) -> int:
        """Elements a rank receives for `send_count` sent."""
        if self.name == "allgather":
            return send_count * ranks
        if self.name == "reduce_scatter":
            return send_count // ranks
        return send_count

    def ring_block(self, size_bytes: float, ranks: int) -> float:
        """Bytes of one ring block for an OSU size (what one hop moves, uncompressed)."""
        return size_bytes if self.name == "allgather" else size_bytes / ranks

    def ring_block_count(self, count: int, ranks: int) -> int:
        """Elements of the largest ring block for `count` elements of the OSU size (blocks
        of an allreduce differ by one element when P does not divide the count)."""
        return count if self.name == "allgather" else -(-count // ranks)

    def ring_wire_bytes(self, size_bytes: float, ranks: int) -> float:
        """Bytes each rank sends in the ring algorithm for an OSU size."""
        return self.ring_hops(ranks) * self.ring_block(size_bytes, ranks)

    def reference(self, inputs: Sequence[np.ndarray], rank: int) -> np.ndarray:
        """What `rank` holds after the collective of every rank's `inputs`, in float64."""
        if self.name == "allgather":
            return np.concatenate(inputs).astype(np.float64)
        total = np.sum(np.asarray(inputs, dtype=np.float64), axis=0)
        if self.name == "allreduce":
            return total
        block = total.shape[0] // len(inputs)
        return total[rank * block:(rank + 1) * block]


SPECS = {spec.name: spec for spec in (
    CollectiveSpec("allgather", "Allgather", "Allgather",
                   "Size = bytes each rank sends (OSU); the gathered buffer is ranks x Size",
                   reduces=False, busbw=lambda n: (n - 1) / n, ring_hops=lambda n: n - 1),
    CollectiveSpec("reduce_scatter", "Reduce_scatter", "Reduce-Scatter",
                   "Size = the whole send buffer (OSU); each rank receives Size / ranks",
                   reduces=True, busbw=lambda n: (n - 1) / n, ring_hops=lambda n: n - 1),
    CollectiveSpec("allreduce", "Allreduce", "Allreduce",
                   "Size = the whole buffer (OSU and nccl-tests agree)",
                   reduces=True, busbw=lambda n: 2 * (n - 1) / n,
                   ring_hops=lambda n: 2 * (n - 1)),
)}
assert tuple(SPECS) == COLLECTIVES


def spec(name: str) -> CollectiveSpec:
    """The description of a collective by name; UsageError for an unknown one."""
    try:
        return SPECS[name]
    except KeyError:
        raise UsageError(f"unknown collective {name!r} (collectives: "
                         f"{', '.join(COLLECTIVES)})") from None

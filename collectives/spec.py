"""One description per collective, as nccl-tests keeps one `testColl` per collective: its
name and titles, the counts of a message size on P ranks, the bus-bandwidth factor, the
bytes a ring puts on the wire, and the reference result that validation compares with.
Each is a field or a function of the collective's entry in SPECS, never a branch on its
name: adding a collective adds one entry.

The harness, the OSU printer, the variants, the algorithms, the transports' library calls,
trace replay and the plots all read these facts here; what an algorithm does per
collective is named by the entry (the ring's phases, objects of collectives/phases.py;
the library's call; how a staged call splits) and resolved where the algorithm or the
library lives.

Sizes follow OSU: Allgather's size is what each rank sends (the gathered buffer is P
times that), Reduce-Scatter's and Allreduce's the whole send buffer. nccl-tests' size is
the whole gathered or reduced buffer (`total_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ccbench.collectives.phases import GATHER, REDUCE, Phase, fuses
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
        raise UsageError(
            f"reduce_scatter: {count * item} B of {dtype} cannot be split "
            f"over {ranks} ranks; use sizes that are multiples of "
            f"{ranks * item} B"
        )
    size = count * item
    return Shape(count, count, count // ranks, size // ranks, size)


def _whole(count: int, item: int, ranks: int, dtype: str) -> Shape:
    """Each rank sends `count` elements and receives as many (the sum)."""
    size = count * item
    return Shape(count, count, count, size, size)


# The MPI call's argument list (benchmarks/timing_c.py writes OSU's C loop from it): a
# gathering call's (send, count, type, recv, count, type, comm), a reducing call's (send,
# recv, count, type, op, comm).
MPI_ARGS_GATHERED, MPI_ARGS_REDUCED = "gathered", "reduced"

# How a library call on device buffers staged through host memory splits into pieces
# (collectives/comm.py): each rank's piece k gathered side by side, the same element
# range of send and receive buffer, or no split (every piece of the input feeds every
# rank's result).
PIECES_GATHERED, PIECES_ELEMENTWISE, PIECES_WHOLE = "gathered", "elementwise", "whole"


# What a rank holds afterwards, from every rank's inputs, computed in float64 (or in
# `dtype`, rounding as numpy's sum in that dtype does).


def _concatenation(inputs: Sequence[np.ndarray], rank: int, dtype=np.float64) -> np.ndarray:
    return np.concatenate(inputs).astype(dtype)


def _sum(inputs: Sequence[np.ndarray], rank: int, dtype=np.float64) -> np.ndarray:
    return np.sum(np.asarray(inputs, dtype=dtype), axis=0)


def _share_of_sum(inputs: Sequence[np.ndarray], rank: int, dtype=np.float64) -> np.ndarray:
    total = _sum(inputs, rank, dtype)
    block = total.shape[0] // len(inputs)
    return total[rank * block : (rank + 1) * block]


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
    # what `rank` holds after the collective of every rank's inputs, in float64 unless a
    # dtype is given: reference(inputs, rank[, dtype])
    reference: Callable[..., np.ndarray]
    # the fewest elements a size may hold on P ranks (too small: the size is skipped)
    min_count: Callable[[int], int]
    # a ring block is a rank's whole send buffer (gathering) or a 1/P share of it
    ring_block_is_send: bool
    # the collective-level compressed ring's codec work on one rank, in ring blocks:
    # (encodes, decodes, hops: decode-add-encode) on P ranks
    coll_codec_blocks: Callable[[int], tuple[int, int, int]]
    # the ring's phases, in the order a call runs them (collectives/phases.py)
    phases: tuple[Phase, ...]
    # send and receive counts of a call whose whole buffer (nccl-tests' count: the
    # gathered or reduced buffer) holds n elements on P ranks: counts_of_whole(n, P)
    counts_of_whole: Callable[[int, int], tuple[int, int]]
    # the send count must be a multiple of this on P ranks (equal blocks of the input)
    send_multiple: Callable[[int], int]
    # the transports' own call: the MPI communicator's method (given send, recv and, where
    # it reduces, the op), torch.distributed's functions (the first one the installed
    # torch has: given (recv, send), or (recv) where it works in place)
    mpi_call: str
    # the MPI call's argument list (MPI_ARGS_*) and its count argument for buffers of
    # send_count and recv_count elements on P ranks: what OSU's C loop needs to call it
    mpi_arguments: str
    mpi_count: Callable[[int, int, int], int]
    torch_calls: tuple[str, ...]
    # the result lands on the input buffer: torch.distributed's call and the training
    # transport's take one buffer (the input copied into the output first where they differ)
    in_place: bool
    # MPI_IN_PLACE applies where the send buffer lies in the receive buffer (the rank's
    # block of a gathered output, or the output itself)
    mpi_in_place: bool
    # how a staged library call splits into pieces (PIECES_*)
    staged_pieces: str
    # OmniReduce (sparse_streaming) streams this collective's nonzero blocks
    streams_sparse: bool
    # PARAM's comms-trace names for it (collectives/trace_param.py); the first is written
    param_names: tuple[str, ...]

    def shape(self, size_bytes: int, ranks: int, dtype: str) -> Shape | None:
        """The counts of one call; None when the size holds too few elements to split.
        Raises UsageError when the size cannot be split as the collective needs."""
        item = itemsize(dtype)
        if size_bytes % item:
            if size_bytes < item:
                return None
            raise UsageError(
                f"{self.name}: {size_bytes} B is not a whole number of {dtype} elements"
            )
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

    @property
    def gathers(self) -> bool:
        """After the call every rank holds every ring block (a phase gathers them)."""
        return any(phase.step.holds_every_block for phase in self.phases)

    @property
    def fusible(self) -> bool:
        """Two consecutive phases can run as one pipeline (collectives/phases.fuses)."""
        return any(fuses(a, b) for a, b in zip(self.phases, self.phases[1:], strict=False))

    def result_block(self, recvbuf, start: int, stop: int):
        """Where this rank's block of the result lies: its place [start, stop) among the
        gathered blocks, or the whole receive buffer where no phase gathers."""
        return recvbuf[start:stop] if self.gathers else recvbuf

    @property
    def elementwise(self) -> bool:
        """Element i of the result depends on element i of every rank's input only: calls
        concatenate into one (MG-WFBP merges them) and split into element ranges."""
        return self.staged_pieces == PIECES_ELEMENTWISE

    def fits(self, send_count: int, recv_count: int, ranks: int) -> bool:
        """Whether buffers of these counts make one call of this collective on P ranks."""
        return (
            recv_count == self.recv_count(send_count, ranks)
            and send_count % self.send_multiple(ranks) == 0
        )

    def whole_count(self, send_count: int, recv_count: int) -> int:
        """Elements of the whole gathered or reduced buffer of a call with these counts
        (nccl-tests' count): a gathering collective's output, the others' input."""
        return recv_count if self.ring_block_is_send else send_count

    def own_block(self, sendbuf, start: int, stop: int):
        """This rank's ring block [start, stop) of its input: the whole send buffer where a
        block is one, else that part of it."""
        return sendbuf if self.ring_block_is_send else sendbuf[start:stop]

    def ring_wire_bytes(self, size_bytes: float, ranks: int) -> float:
        """Bytes each rank sends in the ring algorithm for an OSU size."""
        return self.ring_hops(ranks) * self.ring_block(size_bytes, ranks)


SPECS = {
    spec.name: spec
    for spec in (
        CollectiveSpec(
            "allgather",
            "Allgather",
            "Allgather",
            "Size = bytes each rank sends (OSU); the gathered buffer is ranks x Size",
            reduces=False,
            busbw=lambda n: (n - 1) / n,
            ring_hops=lambda n: n - 1,
            counts=_gathered,
            recv_count=lambda sent, n: sent * n,
            reference=_concatenation,
            min_count=lambda n: 0,
            ring_block_is_send=True,
            coll_codec_blocks=lambda n: (1, n - 1, 0),
            phases=(GATHER,),
            counts_of_whole=lambda n, p: (n // p, n),
            send_multiple=lambda n: 1,
            mpi_call="Allgather",
            mpi_arguments=MPI_ARGS_GATHERED,
            mpi_count=lambda send, recv, n: send,
            torch_calls=("all_gather_single", "all_gather_into_tensor"),
            in_place=False,
            mpi_in_place=True,
            staged_pieces=PIECES_GATHERED,
            streams_sparse=False,
            param_names=("all_gather", "all_gather_base"),
        ),
        CollectiveSpec(
            "reduce_scatter",
            "Reduce_scatter",
            "Reduce-Scatter",
            "Size = the whole send buffer (OSU); each rank receives Size / ranks",
            reduces=True,
            busbw=lambda n: (n - 1) / n,
            ring_hops=lambda n: n - 1,
            counts=_scattered,
            recv_count=lambda sent, n: sent // n,
            reference=_share_of_sum,
            min_count=lambda n: n,
            ring_block_is_send=False,
            coll_codec_blocks=lambda n: (1, 1, n - 2),
            phases=(REDUCE,),
            counts_of_whole=lambda n, p: (n, n // p),
            send_multiple=lambda n: n,
            mpi_call="Reduce_scatter_block",
            mpi_arguments=MPI_ARGS_REDUCED,
            mpi_count=lambda send, recv, n: recv,
            # reduce_scatter_tensor is deprecated in favour of reduce_scatter_single
            torch_calls=("reduce_scatter_single", "reduce_scatter_tensor"),
            in_place=False,
            mpi_in_place=False,
            staged_pieces=PIECES_WHOLE,
            streams_sparse=False,
            param_names=("reduce_scatter", "reduce_scatter_base"),
        ),
        CollectiveSpec(
            "allreduce",
            "Allreduce",
            "Allreduce",
            "Size = the whole buffer (OSU and nccl-tests agree)",
            reduces=True,
            busbw=lambda n: 2 * (n - 1) / n,
            ring_hops=lambda n: 2 * (n - 1),
            counts=_whole,
            recv_count=lambda sent, n: sent,
            reference=_sum,
            min_count=lambda n: 0,
            ring_block_is_send=False,
            coll_codec_blocks=lambda n: (2, n, n - 2),
            phases=(REDUCE, GATHER),
            counts_of_whole=lambda n, p: (n, n),
            send_multiple=lambda n: 1,
            mpi_call="Allreduce",
            mpi_arguments=MPI_ARGS_REDUCED,
            mpi_count=lambda send, recv, n: send,
            torch_calls=("all_reduce",),
            in_place=True,
            mpi_in_place=True,
            staged_pieces=PIECES_ELEMENTWISE,
            streams_sparse=True,
            param_names=("all_reduce",),
        ),
    )
}
assert tuple(SPECS) == COLLECTIVES
assert all(s.reduces == any(p.step.reduces for p in s.phases) for s in SPECS.values())


def spec(name: str) -> CollectiveSpec:
    """The description of a collective by name; UsageError for an unknown one."""
    try:
        return SPECS[name]
    except KeyError:
        raise UsageError(
            f"unknown collective {name!r} (collectives: {', '.join(COLLECTIVES)})"
        ) from None

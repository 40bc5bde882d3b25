"""The ring algorithm, written once: schedules, block layout and the uncompressed rings.

Rank r sends to r+1 and receives from r-1. The phases (collectives/phases.py) say which
block moves at each of the P-1 steps and what a step does with it; `ring_collective`
walks a collective's phases by their steps, and the compressed variants walk the same
phases with codecs in the loop instead of copying these loops.

Reduce-scatter ends with rank r holding the reduced block r, as MPI_Reduce_scatter_block.
Block b is summed in ring order starting at rank b+1 and ending at rank b, so results
equal the library's only where the sum is exact (the validation inputs are).
"""

from __future__ import annotations

from ccbench.collectives.phases import (
    COPY,
    GATHER,
    REDUCE,
    REDUCE_INTO,
    Phase,
    gather_schedule,
    reduce_schedule,
    step_walk,
)
from ccbench.collectives.spec import CollectiveSpec
from ccbench.kernels import arrays
from ccbench.kernels.reduce import add_into, copy_into


def ring_neighbors(rank: int, size: int) -> tuple[int, int]:
    """(left, right): the rank this one receives from, and the one it sends to."""
    return (rank - 1) % size, (rank + 1) % size


def block_bounds(count: int, size: int) -> list[tuple[int, int]]:
    """Split `count` elements into `size` contiguous blocks, the first count % size longer."""
    base, extra = divmod(count, size)
    bounds, start = [], 0
    for b in range(size):
        stop = start + base + (1 if b < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_blocks(described: CollectiveSpec, send_count: int, size: int) -> list[tuple[int, int]]:
    """The ring's blocks of a call: of the receive buffer, one send buffer each, where a
    block is a rank's whole send buffer; else of the send buffer, split in `size`."""
    if described.ring_block_is_send:
        return [(b * send_count, (b + 1) * send_count) for b in range(size)]
    return block_bounds(send_count, size)


# the ring's schedules by the collective they make alone (collectives/phases.py)
allgather_schedule, reduce_scatter_schedule = gather_schedule, reduce_schedule


def empty_like_block(x, count: int):
    """An uninitialised 1-D array of `count` elements with x's backend, dtype and device."""
    return arrays.empty_like(x, count)


class RingScratch:
    """Two block-sized work buffers for the reducing ring, allocated once per size."""

    def __init__(self, like, block_count: int):
        self.incoming = empty_like_block(like, block_count)
        self.partial = empty_like_block(like, block_count)


def ring_allgather_inplace(comm, buf, bounds, phase: Phase = GATHER) -> None:
    """Allgather in place: on entry buf[bounds[rank]] holds this rank's block."""
    left, right = ring_neighbors(comm.rank, comm.size)
    for _, send_block, recv_block in phase.schedule(comm.rank, comm.size):
        s0, s1 = bounds[send_block]
        r0, r1 = bounds[recv_block]
        comm.sendrecv(buf[s0:s1], right, buf[r0:r1], left)


def ring_allgather(comm, sendbuf, recvbuf) -> None:
    """recvbuf = concatenation of every rank's sendbuf (equal counts)."""
    n = sendbuf.shape[0]
    bounds = [(b * n, (b + 1) * n) for b in range(comm.size)]
    start, stop = bounds[comm.rank]
    copy_into(recvbuf[start:stop], sendbuf)
    ring_allgather_inplace(comm, recvbuf, bounds)


def ring_reduce_scatter_blocks(
    comm, sendbuf, bounds, out, scratch: RingScratch | None = None, phase: Phase = REDUCE
):
    """out = sum over ranks of sendbuf[bounds[rank]]; blocks may differ in length by one."""
    left, right = ring_neighbors(comm.rank, comm.size)
    if comm.size == 1:
        start, stop = bounds[0]
        copy_into(out, sendbuf[start:stop])
        return
    if scratch is None:
        scratch = RingScratch(sendbuf, max(stop - start for start, stop in bounds))
    outgoing = None
    for step, send_block, recv_block in phase.schedule(comm.rank, comm.size):
        s0, s1 = bounds[send_block]
        r0, r1 = bounds[recv_block]
        if outgoing is None:  # the first hop sends this rank's own contribution
            outgoing = sendbuf[s0:s1]
        incoming = scratch.incoming[: r1 - r0]
        comm.sendrecv(outgoing, right, incoming, left)
        last = step == comm.size - 2
        target = out if last else scratch.partial[: r1 - r0]
        add_into(target, incoming, sendbuf[r0:r1])
        outgoing = target


def ring_reduce_scatter(comm, sendbuf, recvbuf, scratch: RingScratch | None = None) -> None:
    """recvbuf = block `rank` of the element-wise sum of every rank's sendbuf (equal blocks)."""
    n = recvbuf.shape[0]
    bounds = [(b * n, (b + 1) * n) for b in range(comm.size)]
    ring_reduce_scatter_blocks(comm, sendbuf, bounds, recvbuf, scratch)


def ring_allreduce(comm, sendbuf, recvbuf, scratch: RingScratch | None = None) -> None:
    """recvbuf = element-wise sum of every rank's sendbuf: reduce-scatter, then allgather."""
    bounds = block_bounds(sendbuf.shape[0], comm.size)
    start, stop = bounds[comm.rank]
    ring_reduce_scatter_blocks(comm, sendbuf, bounds, recvbuf[start:stop], scratch)
    ring_allgather_inplace(comm, recvbuf, bounds)


def _reduce_walk(comm, phase, sendbuf, recvbuf, bounds, held, own, scratch):
    """The reduce step's walk: this rank's block of the sum into `own`."""
    ring_reduce_scatter_blocks(comm, sendbuf, bounds, own, scratch, phase)
    return own


def _copy_walk(comm, phase, sendbuf, recvbuf, bounds, held, own, scratch):
    """The copy step's walk: this rank's block (`held`) in its place, then every rank's
    block forwarded around the ring into the receive buffer."""
    if held is not own:
        copy_into(own, held)
    ring_allgather_inplace(comm, recvbuf, bounds, phase)
    return recvbuf


_WALKS = {REDUCE_INTO: _reduce_walk, COPY: _copy_walk}


def ring_collective(
    comm, described: CollectiveSpec, sendbuf, recvbuf, scratch: RingScratch | None = None
) -> None:
    """One call of the collective `described`, walking its phases by their steps: a
    reduce step leaves this rank's block of the sum in its place in the result (the whole
    result where no phase gathers); a copy step starts from the block the rank holds (its
    send buffer's where nothing came before) and forwards every rank's block around the
    ring."""
    bounds = ring_blocks(described, sendbuf.shape[0], comm.size)
    start, stop = bounds[comm.rank]
    own = described.result_block(recvbuf, start, stop)
    held = described.own_block(sendbuf, start, stop)
    for phase in described.phases:
        walk = step_walk(_WALKS, phase, "the ring")
        held = walk(comm, phase, sendbuf, recvbuf, bounds, held, own, scratch)


def ring_scratch(described: CollectiveSpec, sendbuf, size: int) -> RingScratch | None:
    """The work buffers of `ring_collective`, as long as its longest block (none where
    nothing is reduced)."""
    if not described.reduces:
        return None
    bounds = ring_blocks(described, sendbuf.shape[0], size)
    return RingScratch(sendbuf, max(stop - start for start, stop in bounds))

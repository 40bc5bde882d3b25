"""The uncompressed baseline: the transport library's collectives and the same ring by hand."""

from __future__ import annotations

from functools import partial

from ccbench.collectives.ring import (
    RingScratch,
    block_bounds,
    ring_allgather,
    ring_allreduce,
    ring_reduce_scatter,
)

# mpi and library both name the transport's own collective (mpi: as MPI runs spell it)
ALGORITHMS = ("mpi", "library", "ring")


def bind_collective(comm, algorithm: str, collective: str, sendbuf, recvbuf):
    """A zero-argument callable running one collective; set-up (views, scratch) done here."""
    if algorithm in ("mpi", "library"):
        return comm.library_call(collective, sendbuf, recvbuf)
    if algorithm != "ring":
        raise ValueError(f"unknown algorithm {algorithm!r}")
    if collective == "allgather":
        return partial(ring_allgather, comm, sendbuf, recvbuf)
    if collective == "reduce_scatter":
        scratch = RingScratch(sendbuf, recvbuf.shape[0])
        return partial(ring_reduce_scatter, comm, sendbuf, recvbuf, scratch)
    if collective == "allreduce":
        longest = max(stop - start for start, stop in block_bounds(sendbuf.shape[0], comm.size))
        scratch = RingScratch(sendbuf, longest)
        return partial(ring_allreduce, comm, sendbuf, recvbuf, scratch)
    raise ValueError(f"unknown collective {collective!r}")

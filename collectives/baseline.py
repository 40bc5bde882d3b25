"""The uncompressed baseline: the transport library's collectives and the same ring by hand."""

from __future__ import annotations

from functools import partial

from ccbench.collectives.ring import ring_collective, ring_scratch
from ccbench.collectives.spec import spec

# mpi and library both name the transport's own collective (mpi: as MPI runs spell it)
ALGORITHMS = ("mpi", "library", "ring")


def bind_collective(comm, algorithm: str, collective: str, sendbuf, recvbuf):
    """A zero-argument callable running one collective; set-up (views, scratch) done here."""
    if algorithm in ("mpi", "library"):
        return comm.library_call(collective, sendbuf, recvbuf)
    if algorithm != "ring":
        raise ValueError(f"unknown algorithm {algorithm!r}")
    described = spec(collective)
    return partial(
        ring_collective,
        comm,
        described,
        sendbuf,
        recvbuf,
        ring_scratch(described, sendbuf, comm.size),
    )

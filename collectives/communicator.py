"""The transport seam: what every algorithm asks of the library that moves its bytes.

`BaseCommunicator` is the contract. `Communicator` (collectives/comm.py) carries it over
mpi4py, `TorchCommunicator` (collectives/comm_torch.py) over torch.distributed (NCCL for
device buffers, gloo for host ones). Algorithms (the rings, the pipelines, OmniReduce)
take a communicator and never import mpi4py or torch.distributed themselves; the
harness's agreement on errors and its statistics, trace capture and trace replay use the
communicator's control plane (small Python objects and host arrays), so they work over
either. This module imports neither library.

What a transport says of itself: `transport` ("mpi", "torch") and `backend` ("mpi",
"gloo", "nccl"); `tagged` (messages are matched by tag; otherwise in posting order per
pair of ranks, as NCCL does); `any_completion` (a posted request can be tested and a
receive cancelled; otherwise only waited for, in order); `threaded` (a second thread may
call it, one thread at a time: a communication thread beside the training thread); `mpi`,
the mpi4py communicator where MPI carries the bytes (MPI's own timed loops need it), else
None; `torch_backend`, the torch.distributed backend of the default group where
torch.distributed carries them (stock FSDP and DDP start from that group), else None.
Callers ask these flags, never the transport's name. Every byte this rank sends is added
to `wire_bytes`, so what an algorithm puts on the wire is measured, never derived from a
formula.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ccbench.kernels.errors import UsageError

OPS = ("sum", "max", "min")


class BaseCommunicator:
    """The contract every transport fulfils (docstring of this module)."""

    transport = ""
    backend = ""
    tagged = True
    any_completion = True
    threaded = True
    mpi = None  # the mpi4py communicator, where MPI carries the bytes
    torch_backend: str | None = None  # the default group's, where torch carries them

    def __init__(self, rank: int, size: int, local_rank: int):
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.wire_bytes = 0
        self.stage_s = 0.0  # time spent staging device buffers through host memory

    def reset_wire_bytes(self) -> None:
        self.wire_bytes = 0

    # point to point: requests have Wait() (and Test() where any_completion) ----------
    def send(self, x, dest: int, tag: int = 0) -> None:
        raise NotImplementedError

    def recv(self, out, source: int, tag: int = 0) -> None:
        raise NotImplementedError

    def isend(self, x, dest: int, tag: int = 0):
        raise NotImplementedError

    def irecv(self, out, source: int, tag: int = 0):
        raise NotImplementedError

    def exchange(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> list:
        """Start sending `sendbuf` to `dest` and receiving `recvbuf` from `source`, as one
        batch where the backend needs it (NCCL); the requests, to wait for."""
        raise NotImplementedError

    def sendrecv(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> None:
        self.waitall(self.exchange(sendbuf, dest, recvbuf, source, tag))

    def wait(self, request) -> None:
        request.Wait()

    def waitall(self, requests) -> None:
        for request in requests:
            self.wait(request)

    def testsome(self, requests) -> list[int]:
        """Indices of the completed requests (completed here: staged data copied in)."""
        raise UsageError(f"the {self.transport} transport cannot test requests")

    def testall(self, requests) -> bool:
        raise UsageError(f"the {self.transport} transport cannot test requests")

    def cancel(self, request) -> None:
        raise UsageError(f"the {self.transport} transport cannot cancel receives")

    def completed(self, request) -> bool:
        """Whether a request was found complete by an earlier test."""
        raise UsageError(f"the {self.transport} transport cannot test requests")

    # the library's collectives ---------------------------------------------------------
    def library_call(self, collective: str, sendbuf, recvbuf):
        """A zero-argument callable running the library's own collective on these
        buffers, bound once (the timed loop pays what a bare library call pays)."""
        raise NotImplementedError

    def in_place_call(self, collective: str, recvbuf):
        """The library's in-place form of the collective on recvbuf (this rank's input
        already lies in it: at its block, or whole), bound; None where the library has
        none for these buffers (the caller then runs library_call)."""
        return None

    def allgather_bytes(self, sendbuf, recvbuf) -> None:
        """The library's allgather of one uint8 block per rank (the library-backed
        compressed collectives' payloads): recvbuf, `size` blocks of n bytes, receives
        every rank's sendbuf (n bytes, the same n on every rank) in rank order. Adds
        (size - 1) x n to `wire_bytes`: what this rank's block must reach, whichever route
        the library takes (a ring, recursive doubling and a direct exchange all send that
        much per rank, averaged over the ranks)."""
        raise NotImplementedError

    def alltoall_bytes(self, sendbuf, send_splits, recvbuf, recv_splits) -> None:
        """The library's all-to-all of uint8 blocks: sendbuf holds the block for rank d
        (send_splits[d] bytes) packed in rank order, recvbuf receives the block from rank
        s (recv_splits[s] bytes) packed in rank order; a split may be 0 (a rank's block to
        itself). Adds the bytes sent to the other ranks to `wire_bytes`."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    # control plane: small Python objects and host arrays, outside the timed calls -----
    def allgather_obj(self, obj) -> list:
        raise NotImplementedError

    def gather_obj(self, obj, root: int = 0) -> list | None:
        """Every rank's object in rank order on `root`; None on the other ranks."""
        raise NotImplementedError

    def bcast_obj(self, obj, root: int = 0):
        raise NotImplementedError

    def allreduce_value(self, value, op: str = "sum"):
        """A Python number reduced over the ranks."""
        whole = isinstance(value, int | np.integer) and not isinstance(value, bool)
        out = self.allreduce_array(np.array([value], np.int64 if whole else np.float64), op)
        return int(out[0]) if whole else float(out[0])

    def allreduce_array(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """A small host array reduced elementwise over the ranks (`op` one of OPS), as a
        new array of its shape and dtype."""
        raise NotImplementedError

    def allgather_array(self, array: np.ndarray) -> np.ndarray:
        """(size, *array.shape): every rank's array (the same shape on every rank)."""
        raise NotImplementedError

    def clock(self) -> float:
        return time.perf_counter()

    def abort(self, status: int) -> None:
        os._exit(status)

    def processor_name(self) -> str:
        import socket

        return socket.gethostname()

    def split(self, color: int, key: int):
        """A communicator of the ranks that give the same `color`, ordered by `key`
        (MPI_Comm_split); collective. Transports without sub-communicators refuse."""
        raise UsageError(
            f"the {self.transport} transport has no sub-communicators here; "
            "hierarchical collectives run over MPI (--transport mpi)"
        )

    def describe(self) -> dict:
        """What the sidecar records of this transport (library and versions)."""
        return {"transport": self.transport, "backend": self.backend}

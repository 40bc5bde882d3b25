"""The transport seam: what every algorithm asks of the library that moves its bytes.

`BaseCommunicator` is the contract; `Communicator` (here) carries it over mpi4py, and
`TorchCommunicator` (collectives/comm_torch.py) over torch.distributed (NCCL for device
buffers, gloo for host ones). Algorithms (the rings, the pipelines, OmniReduce) take a
communicator and never import mpi4py or torch.distributed themselves; the harness's
agreement on errors and its statistics use the communicator's control plane (small
Python objects and host arrays), so they work over either.

What a transport says of itself: `transport` ("mpi", "torch") and `backend` ("mpi",
"gloo", "nccl"); `tagged` (messages are matched by tag; otherwise in posting order per
pair of ranks, as NCCL does); `any_completion` (a posted request can be tested; otherwise
only waited for, in order). Every byte this rank sends is added to `wire_bytes`, so what
an algorithm puts on the wire is measured, never derived from a formula.

Host arrays (numpy, torch on the CPU) go to MPI as zero-copy numpy views. Device arrays
go straight to MPI when it is GPU-aware (`CCBENCH_GPU_AWARE=1`: mpi4py reads the CUDA
array interface / DLPack), after a wait for the kernels that wrote them; otherwise they
are staged through host buffers kept per device buffer (allocated on first use, reused by
every later call). Both are host synchronisations the algorithm needs: declared
(kernels.arrays.declared), counted in `host_syncs` and timed in `stage_s`.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from functools import partial

import numpy as np
from mpi4py import MPI

from ccbench.kernels import arrays
from ccbench.kernels.arrays import host_view
from ccbench.kernels.errors import UsageError
from ccbench.kernels.reduce import bfloat16_sum
from ccbench.kernels.vocabulary import dtype_name, nbytes

_BF16_SUM: MPI.Op | None = None
OPS = ("sum", "max", "min")


def sum_op(host_buffer: np.ndarray) -> MPI.Op:
    """MPI.SUM, or a user op for bfloat16 (carried as uint16), which MPI cannot add."""
    global _BF16_SUM
    if host_buffer.dtype != np.uint16:
        return MPI.SUM
    if _BF16_SUM is None:
        _BF16_SUM = MPI.Op.Create(bfloat16_sum, commute=True)
    return _BF16_SUM


class BaseCommunicator:
    """The contract every transport fulfils (docstring of this module)."""

    transport = ""
    backend = ""
    tagged = True
    any_completion = True

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

    def bcast_obj(self, obj, root: int = 0):
        raise NotImplementedError

    def allreduce_value(self, value, op: str = "sum"):
        """A Python number reduced over the ranks."""
        whole = isinstance(value, int | np.integer) and not isinstance(value, bool)
        out = self.allreduce_array(np.array([value], np.int64 if whole else np.float64), op)
        return int(out[0]) if whole else float(out[0])

    def allreduce_array(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
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

    def describe(self) -> dict:
        """What the sidecar records of this transport (library and versions)."""
        return {"transport": self.transport, "backend": self.backend}


class _StagedRecv:
    """A receive staged through host memory: copied to the device once it completes."""

    def __init__(self, comm, request: MPI.Request, host: np.ndarray, out):
        self.comm, self.request, self.host, self.out = comm, request, host, out
        self.finished = False

    def Wait(self) -> None:
        self.request.Wait()
        self.finish()

    def Test(self) -> bool:
        if self.request.Test():
            self.finish()
            return True
        return False

    def finish(self) -> None:
        if not self.finished:  # once: a completed request tests complete ever after
            self.finished = True
            self.comm._copy_in(self.host, self.out)


class Communicator(BaseCommunicator):
    """The MPI transport (mpi4py): point-to-point and collective calls on arrays."""

    transport = "mpi"
    backend = "mpi"
    STAGING = 4096  # host buffers kept for staging device buffers

    def __init__(self, mpi_comm: MPI.Comm = MPI.COMM_WORLD, gpu_aware: bool | None = None):
        local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED) if mpi_comm.Get_size() > 1 \
            else None
        super().__init__(mpi_comm.Get_rank(), mpi_comm.Get_size(),
                         local.Get_rank() if local is not None else 0)
        if local is not None:
            local.Free()
        self.mpi = mpi_comm
        if gpu_aware is None:
            gpu_aware = os.environ.get("CCBENCH_GPU_AWARE", "0") == "1"
        self.gpu_aware = gpu_aware
        self._staging: OrderedDict = OrderedDict()
        self._staged_any = False  # a staged receive was ever posted

    # Buffers ------------------------------------------------------------------------

    def _mirror(self, x) -> np.ndarray:
        """The host buffer that stages device array x: one per device buffer, reused."""
        key = (arrays.backend_of(x).address(x), nbytes(x))
        host = self._staging.get(key)
        if host is None:
            host = self._staging[key] = np.empty(nbytes(x), dtype=np.uint8)
            if len(self._staging) > self.STAGING:
                self._staging.popitem(last=False)
        return host

    def _copy_out(self, x) -> np.ndarray:
        t0 = time.perf_counter()
        host = self._mirror(x)
        arrays.to_host(x, host)
        self.stage_s += time.perf_counter() - t0
        return host

    def _copy_in(self, host: np.ndarray, out) -> None:
        t0 = time.perf_counter()
        arrays.to_device(host, out)
        self.stage_s += time.perf_counter() - t0

    def _device_direct(self, x):
        """A device array as a GPU-aware MPI reads it: once its kernels have finished (its
        bytes: point to point moves bytes, bfloat16 included)."""
        t0 = time.perf_counter()
        arrays.host_sync(x)
        self.stage_s += time.perf_counter() - t0
        return _bytes(arrays.backend_of(x).direct(x))

    def _send_buffer(self, x):
        if not arrays.is_device_array(x):
            return host_view(x)
        return self._device_direct(x) if self.gpu_aware else self._copy_out(x)

    def _staged(self, out) -> bool:
        return not self.gpu_aware and arrays.is_device_array(out)

    def _recv_buffer(self, out):
        if not arrays.is_device_array(out):
            return host_view(out)
        return _bytes(arrays.backend_of(out).direct(out))

    # Point to point -----------------------------------------------------------------

    def send(self, x, dest: int, tag: int = 0) -> None:
        self.wire_bytes += nbytes(x)
        self.mpi.Send(self._send_buffer(x), dest, tag)

    def recv(self, out, source: int, tag: int = 0) -> None:
        if self._staged(out):
            host = self._mirror(out)
            self.mpi.Recv(host, source, tag)
            self._copy_in(host, out)
        else:
            self.mpi.Recv(self._recv_buffer(out), source, tag)

    def isend(self, x, dest: int, tag: int = 0) -> MPI.Request:
        self.wire_bytes += nbytes(x)
        return self.mpi.Isend(self._send_buffer(x), dest, tag)

    def irecv(self, out, source: int, tag: int = 0):
        if self._staged(out):
            host = self._mirror(out)
            self._staged_any = True
            return _StagedRecv(self, self.mpi.Irecv(host, source, tag), host, out)
        return self.mpi.Irecv(self._recv_buffer(out), source, tag)

    def exchange(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> list:
        requests = []
        if recvbuf.shape[0]:
            requests.append(self.irecv(recvbuf, source, tag))
        if sendbuf.shape[0]:
            requests.append(self.isend(sendbuf, dest, tag))
        return requests

    def sendrecv(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> None:
        if self._staged(recvbuf):
            request = self.irecv(recvbuf, source, tag)
            self.send(sendbuf, dest, tag)
            request.Wait()
            return
        self.wire_bytes += nbytes(sendbuf)
        self.mpi.Sendrecv(self._send_buffer(sendbuf), dest, tag, self._recv_buffer(recvbuf),
                          source, tag)

    def testsome(self, requests) -> list[int]:
        if not self._staged_any:  # host buffers: MPI's requests as they are (the fast path)
            return MPI.Request.Testsome(requests) or []
        done = MPI.Request.Testsome([getattr(r, "request", r) for r in requests]) or []
        for i in done:
            if isinstance(requests[i], _StagedRecv):
                requests[i].finish()
        return done

    def testall(self, requests) -> bool:
        if not self._staged_any:
            return MPI.Request.Testall(requests)
        if not MPI.Request.Testall([getattr(r, "request", r) for r in requests]):
            return False
        for request in requests:
            if isinstance(request, _StagedRecv):
                request.finish()
        return True

    def cancel(self, request) -> None:
        mpi_request = getattr(request, "request", request)
        mpi_request.Cancel()
        mpi_request.Wait()

    def completed(self, request) -> bool:
        # a completed request is MPI_REQUEST_NULL (falsy) once a test has seen it
        return not getattr(request, "request", request)

    # The library's collectives ----------------------------------------------------

    def library_call(self, collective: str, sendbuf, recvbuf):
        """Buffers are parsed into MPI views once here, so each call in the timed loop
        costs what a bare mpi4py call costs. Device buffers are staged through host
        memory unless MPI is GPU-aware."""
        device = arrays.is_device_array(sendbuf) or arrays.is_device_array(recvbuf)
        if device and self.gpu_aware:
            if dtype_name(recvbuf) == "bfloat16" and collective != "allgather":
                raise UsageError(
                    "bfloat16 in device memory: MPI has no bfloat16 datatype to reduce "
                    "(ccbench's user op reduces it on the host only); unset "
                    "CCBENCH_GPU_AWARE to stage it, or use --transport torch (NCCL)")
            send, recv = _as_bytes_if_bf16(sendbuf), _as_bytes_if_bf16(recvbuf)
            call = self._bind(collective, arrays.backend_of(send).direct(send),
                              arrays.backend_of(recv).direct(recv), MPI.SUM)

            def direct_call():
                t0 = time.perf_counter()
                arrays.host_sync(sendbuf)  # MPI reads the device once its kernels ran
                self.stage_s += time.perf_counter() - t0
                call()

            return direct_call
        if device:
            host_recv = self._mirror(recvbuf)
            view = _typed_host(host_recv, recvbuf)
            host_send = self._mirror(sendbuf)
            call = self._bind(collective, _typed_host(host_send, sendbuf), view, sum_op(view))

            def staged_call():
                t0 = time.perf_counter()
                arrays.to_host(sendbuf, host_send)
                self.stage_s += time.perf_counter() - t0
                call()
                self._copy_in(host_recv, recvbuf)

            return staged_call
        recv = host_view(recvbuf)
        return self._bind(collective, host_view(sendbuf), recv, sum_op(recv))

    def _bind(self, collective: str, send, recv, op):
        mpi = self.mpi
        if collective == "allgather":
            return partial(mpi.Allgather, send, recv)
        if collective == "reduce_scatter":
            return partial(mpi.Reduce_scatter_block, send, recv, op)
        if collective == "allreduce":
            return partial(mpi.Allreduce, send, recv, op)
        raise ValueError(f"unknown collective {collective!r}")

    def allgather_bytes(self, sendbuf, recvbuf) -> None:
        self.wire_bytes += (self.size - 1) * nbytes(sendbuf)
        send = self._send_buffer(sendbuf)
        if self._staged(recvbuf):
            host = self._mirror(recvbuf)
            self.mpi.Allgather([send, MPI.BYTE], [host, MPI.BYTE])
            self._copy_in(host, recvbuf)
        else:
            self.mpi.Allgather([send, MPI.BYTE], [self._recv_buffer(recvbuf), MPI.BYTE])

    def alltoall_bytes(self, sendbuf, send_splits, recvbuf, recv_splits) -> None:
        self.wire_bytes += sum(send_splits) - send_splits[self.rank]
        sendbuf, recvbuf = sendbuf[:sum(send_splits)], recvbuf[:sum(recv_splits)]
        send = [self._send_buffer(sendbuf), (send_splits, _displacements(send_splits)),
                MPI.BYTE]
        recv_layout = (recv_splits, _displacements(recv_splits))
        if self._staged(recvbuf):
            host = self._mirror(recvbuf)
            self.mpi.Alltoallv(send, [host, recv_layout, MPI.BYTE])
            self._copy_in(host, recvbuf)
        else:
            self.mpi.Alltoallv(send, [self._recv_buffer(recvbuf), recv_layout, MPI.BYTE])

    def barrier(self) -> None:
        self.mpi.Barrier()

    # control plane ------------------------------------------------------------------
    def allgather_obj(self, obj) -> list:
        return self.mpi.allgather(obj)

    def bcast_obj(self, obj, root: int = 0):
        return self.mpi.bcast(obj, root=root)

    def allreduce_value(self, value, op: str = "sum"):
        return self.mpi.allreduce(value, op=_MPI_OPS[op])

    def allreduce_array(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        array = np.ascontiguousarray(array)
        out = np.empty_like(array)
        self.mpi.Allreduce(array, out, op=_MPI_OPS[op])
        return out

    def allgather_array(self, array: np.ndarray) -> np.ndarray:
        array = np.ascontiguousarray(array)
        out = np.empty((self.size, *array.shape), dtype=array.dtype)
        self.mpi.Allgather(array, out)
        return out

    def clock(self) -> float:
        return MPI.Wtime()

    def abort(self, status: int) -> None:
        self.mpi.Abort(status)

    def processor_name(self) -> str:
        return MPI.Get_processor_name()

    def describe(self) -> dict:
        library = MPI.Get_library_version().replace("\0", "").strip()
        return {"transport": "mpi", "backend": "mpi", "gpu_aware": self.gpu_aware,
                "mpi_library": library.splitlines()[0].strip() if library else ""}


_MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


def _displacements(splits) -> list[int]:
    """Offsets of blocks of these sizes packed end to end."""
    out, total = [], 0
    for n in splits:
        out.append(total)
        total += n
    return out


def _typed_host(host: np.ndarray, like) -> np.ndarray:
    """The staging bytes of `like` viewed as its dtype (bfloat16 as uint16)."""
    name = dtype_name(like)
    return host.view(np.uint16 if name == "bfloat16" else np.dtype(name))


def _bytes(x):
    """A contiguous 1-D device array's bytes (numpy, cupy or torch view)."""
    if type(x).__module__.startswith("torch"):
        import torch

        return x.view(torch.uint8)
    return x.view(np.uint8)


def _as_bytes_if_bf16(x):
    """A device bfloat16 array as int16 (MPI moves its bytes; it cannot add them)."""
    if dtype_name(x) != "bfloat16":
        return x
    import torch

    return x.view(torch.int16)

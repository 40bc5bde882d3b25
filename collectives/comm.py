"""A thin communicator over mpi4py that moves arrays of any backend and counts wire bytes.

Host arrays (numpy, torch on the CPU) go to MPI as zero-copy numpy views. Device arrays
(cupy, torch-CUDA) go straight to MPI when it is GPU-aware (`CCBENCH_GPU_AWARE=1`,
mpi4py then reads the CUDA array interface / DLPack), and are staged through host
memory otherwise. Every byte this rank sends is added to `wire_bytes`, so what an
algorithm puts on the wire is measured, never derived from a formula.
"""

from __future__ import annotations

import os
from functools import partial

import numpy as np
from mpi4py import MPI

from ccbench.kernels.arrays import host_view
from ccbench.kernels.reduce import bfloat16_sum
from ccbench.kernels.vocabulary import nbytes

_BF16_SUM: MPI.Op | None = None


def sum_op(host_buffer: np.ndarray) -> MPI.Op:
    """MPI.SUM, or a user op for bfloat16 (carried as uint16), which MPI cannot add."""
    global _BF16_SUM
    if host_buffer.dtype != np.uint16:
        return MPI.SUM
    if _BF16_SUM is None:
        _BF16_SUM = MPI.Op.Create(bfloat16_sum, commute=True)
    return _BF16_SUM


def _is_device(x) -> bool:
    if isinstance(x, np.ndarray):
        return False
    device = getattr(x, "device", None)
    if device is None:
        return False
    return getattr(device, "type", "cuda") != "cpu"


class _StagedRecv:
    """Completes a receive staged through host memory: copy to the device on wait."""

    def __init__(self, request: MPI.Request, host: np.ndarray, out):
        self.request, self.host, self.out = request, host, out

    def Wait(self) -> None:
        self.request.Wait()
        _copy_host_to_device(self.host, self.out)


def _copy_host_to_device(host: np.ndarray, out) -> None:
    if type(out).__module__.startswith("torch"):
        import torch

        out.copy_(torch.from_numpy(host).view(out.dtype))
    else:
        out.set(host.view(out.dtype))


def _device_to_host(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return host_view(x.cpu())
    return x.get()


class Communicator:
    """Point-to-point and collective calls on arrays, with a wire-byte counter."""

    def __init__(self, mpi_comm: MPI.Comm = MPI.COMM_WORLD, gpu_aware: bool | None = None):
        self.mpi = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        if gpu_aware is None:
            gpu_aware = os.environ.get("CCBENCH_GPU_AWARE", "0") == "1"
        self.gpu_aware = gpu_aware
        self.wire_bytes = 0

    def reset_wire_bytes(self) -> None:
        self.wire_bytes = 0

    # Buffers ------------------------------------------------------------------------

    def _send_buffer(self, x):
        if _is_device(x):
            return x if self.gpu_aware else _device_to_host(x)
        return host_view(x)

    # Point to point -----------------------------------------------------------------

    def send(self, x, dest: int, tag: int = 0) -> None:
        self.wire_bytes += nbytes(x)
        self.mpi.Send(self._send_buffer(x), dest, tag)

    def recv(self, out, source: int, tag: int = 0) -> None:
        if _is_device(out) and not self.gpu_aware:
            host = np.empty(nbytes(out), dtype=np.uint8)
            self.mpi.Recv(host, source, tag)
            _copy_host_to_device(host, out)
        else:
            self.mpi.Recv(out if _is_device(out) else host_view(out), source, tag)

    def isend(self, x, dest: int, tag: int = 0) -> MPI.Request:
        self.wire_bytes += nbytes(x)
        return self.mpi.Isend(self._send_buffer(x), dest, tag)

    def irecv(self, out, source: int, tag: int = 0):
        if _is_device(out) and not self.gpu_aware:
            host = np.empty(nbytes(out), dtype=np.uint8)
            return _StagedRecv(self.mpi.Irecv(host, source, tag), host, out)
        return self.mpi.Irecv(out if _is_device(out) else host_view(out), source, tag)

    def sendrecv(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> None:
        if _is_device(recvbuf) and not self.gpu_aware:
            request = self.irecv(recvbuf, source, tag)
            self.send(sendbuf, dest, tag)
            request.Wait()
            return
        self.wire_bytes += nbytes(sendbuf)
        recv = recvbuf if _is_device(recvbuf) else host_view(recvbuf)
        self.mpi.Sendrecv(self._send_buffer(sendbuf), dest, tag, recv, source, tag)

    # The library's collectives ----------------------------------------------------

    def library_call(self, collective: str, sendbuf, recvbuf):
        """A zero-argument callable running MPI's own collective on these buffers.

        Buffers are parsed into MPI views once here, so each call in the timed loop costs
        what a bare mpi4py call costs. Device buffers are staged through host memory
        unless MPI is GPU-aware.
        """
        staged = not self.gpu_aware and (_is_device(sendbuf) or _is_device(recvbuf))
        if staged:
            host_recv = np.empty(nbytes(recvbuf), dtype=np.uint8).view(
                _device_to_host(recvbuf[:1]).dtype
            )
            call = self._bind(collective, None, host_recv)

            def staged_call():
                call(_device_to_host(sendbuf))
                _copy_host_to_device(host_recv, recvbuf)

            return staged_call
        send = sendbuf if _is_device(sendbuf) else host_view(sendbuf)
        recv = recvbuf if _is_device(recvbuf) else host_view(recvbuf)
        bound = self._bind(collective, send, recv)
        return bound

    def _bind(self, collective: str, send, recv):
        mpi = self.mpi
        op = sum_op(recv) if isinstance(recv, np.ndarray) else MPI.SUM
        if send is None:  # staged: the send buffer is given per call
            table = {
                "allgather": lambda s: mpi.Allgather(s, recv),
                "reduce_scatter": lambda s: mpi.Reduce_scatter_block(s, recv, op),
                "allreduce": lambda s: mpi.Allreduce(s, recv, op),
            }
            return table[collective]
        if collective == "allgather":
            return partial(mpi.Allgather, send, recv)
        if collective == "reduce_scatter":
            return partial(mpi.Reduce_scatter_block, send, recv, op)
        if collective == "allreduce":
            return partial(mpi.Allreduce, send, recv, op)
        raise ValueError(f"unknown collective {collective!r}")

    @staticmethod
    def waitall(requests) -> None:
        for request in requests:
            request.Wait()

    def barrier(self) -> None:
        self.mpi.Barrier()

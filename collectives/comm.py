"""The transport contract (collectives/communicator.py) over mpi4py.

Host arrays (numpy, torch on the CPU) go to MPI as zero-copy numpy views. Device arrays
go straight to MPI when it is GPU-aware (`CCBENCH_GPU_AWARE=1`: mpi4py reads the CUDA
array interface / DLPack), after a wait for the kernels that wrote them. Otherwise (the
default) they are staged through pinned host buffers kept per device buffer (allocated
on first use, reused by every later call), with asynchronous copies on two copy streams
ordered by events: a D2H copy waits for the stream that wrote its buffer, the current
stream waits for an H2D copy. The host waits only where MPI must read bytes, once per
staged send (polled by the progress calls for a non-blocking send), never for an H2D
copy. The library's collectives go in pieces (`stage_chunk_bytes`) so copies and MPI
overlap. The host's waits are declared (kernels.arrays.declared), counted in
`host_syncs`; their time and the copies' enqueueing are in `stage_s`.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from functools import partial

import numpy as np
from mpi4py import MPI

from ccbench.collectives.communicator import BaseCommunicator
from ccbench.collectives.mpi_staging import Mirror, StagedRecv, StagedSend, Stager
from ccbench.collectives.spec import PIECES_ELEMENTWISE, PIECES_GATHERED, spec
from ccbench.kernels import arrays, switches
from ccbench.kernels.arrays import host_view
from ccbench.kernels.errors import UsageError
from ccbench.kernels.reduce import bfloat16_sum
from ccbench.kernels.vocabulary import dtype_name, nbytes

_BF16_SUM: MPI.Op | None = None


def sum_op(host_buffer: np.ndarray) -> MPI.Op:
    """MPI.SUM, or a user op for bfloat16 (carried as uint16), which MPI cannot add."""
    global _BF16_SUM
    if host_buffer.dtype != np.uint16:
        return MPI.SUM
    if _BF16_SUM is None:
        _BF16_SUM = MPI.Op.Create(bfloat16_sum, commute=True)
    return _BF16_SUM


class Communicator(BaseCommunicator):
    """The MPI transport (mpi4py): point-to-point and collective calls on arrays."""

    transport = "mpi"
    backend = "mpi"
    STAGING = 4096  # device buffers whose host mirrors are kept for staging
    # Staged library collectives move large buffers in pieces of this many bytes, so the
    # D2H copy of piece k+1 and the H2D copies of piece k-1 run while MPI moves piece k.
    # Chosen, not tuned: 8 pieces at 16 MiB; each piece's copy is ~40 us at 54 GB/s.
    STAGE_CHUNK_BYTES = 2 << 20

    def __init__(
        self,
        mpi_comm: MPI.Comm = MPI.COMM_WORLD,
        gpu_aware: bool | None = None,
        stage_chunk_bytes: int | None = None,
    ):
        local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED) if mpi_comm.Get_size() > 1 else None
        super().__init__(
            mpi_comm.Get_rank(), mpi_comm.Get_size(), local.Get_rank() if local is not None else 0
        )
        if local is not None:
            local.Free()
        self.mpi = mpi_comm
        self.threaded = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        if gpu_aware is None:
            gpu_aware = switches.current().gpu_aware == "1"
        self.gpu_aware = gpu_aware
        self.stage_chunk_bytes = (
            self.STAGE_CHUNK_BYTES if stage_chunk_bytes is None else stage_chunk_bytes
        )
        self._staging: OrderedDict = OrderedDict()  # device buffer -> its mirrors
        self._stagers: dict = {}
        self._pending: deque[StagedSend] = deque()  # sends waiting for their D2H copy
        self._staged_any = False  # a staged request was ever made
        self._status_pool: list = []

    # Buffers ------------------------------------------------------------------------

    def stages(self, x) -> bool:
        """Whether device array x goes to MPI through host memory (MPI not GPU-aware)."""
        return not self.gpu_aware and arrays.is_device_array(x)

    def _stager(self, x) -> Stager:
        b = arrays.backend_of(x)
        stager = self._stagers.get(b.name)
        if stager is None:
            stager = self._stagers[b.name] = Stager(b)
        return stager

    def _new_mirror(self, x, size: int) -> Mirror:
        b = arrays.backend_of(x)
        return Mirror(b.pinned_empty(size), b.copy_event(), None)

    def _mirrors(self, x) -> list:
        """The pinned host buffers that stage device array x: kept per device address
        (messages of any length from one buffer share them), allocated on first use
        (set-up and warm-up calls), reused by every later call."""
        key = arrays.backend_of(x).address(x)
        mirrors = self._staging.get(key)
        if mirrors is None or mirrors[0].host.nbytes < nbytes(x):
            mirrors = self._staging[key] = [self._new_mirror(x, nbytes(x))]
            if len(self._staging) > self.STAGING:
                self._staging.popitem(last=False)
        return mirrors

    def _send_mirror(self, x) -> Mirror:
        return self._mirrors(x)[0]

    def _recv_mirror(self, x) -> Mirror:
        """A mirror no H2D copy still reads (MPI would overwrite it under the copy):
        checked without waiting; another one is allocated if none is free."""
        b = arrays.backend_of(x)
        mirrors = self._mirrors(x)
        for mirror in mirrors:
            if mirror.host.nbytes >= nbytes(x) and (
                mirror.in_event is None or b.event_done(mirror.in_event)
            ):
                return mirror
        mirror = self._new_mirror(x, nbytes(x))
        mirrors.append(mirror)
        return mirror

    def _copy_out(self, x) -> Mirror:
        """x's bytes into its mirror; the host waits for them (MPI reads them next)."""
        t0 = time.perf_counter()
        stager, mirror = self._stager(x), self._send_mirror(x)
        stager.copy_out(stager.backend.byte_view(x), mirror.host[: nbytes(x)], mirror.out_event)
        arrays.wait_copy(x, mirror.out_event)
        self.stage_s += time.perf_counter() - t0
        return mirror

    def _copy_in(self, mirror: Mirror, out, count: int | None = None, head=None) -> None:
        """The first `count` received bytes into device array `out`, on the copy stream;
        the current stream waits for them, the host does not. `head` takes the first
        bytes on the host as well (a host copy: no round trip through the device)."""
        t0 = time.perf_counter()
        count = nbytes(out) if count is None else count
        if head is not None:
            shown = min(count, head.nbytes)
            head[:shown] = mirror.host[:shown]
        stager = self._stager(out)
        b = stager.backend
        if mirror.in_event is None:
            mirror.in_event = b.copy_event()
        stager.before_copies_in()
        if count:
            stager.copy_in(mirror.host[:count], b.byte_view(out)[:count])
        stager.after_copies_in(mirror.in_event)
        self.stage_s += time.perf_counter() - t0

    def _post_sends(self, block: bool, upto: StagedSend | None = None) -> bool:
        """Post the sends whose D2H copies have landed, oldest first; with `block`, wait
        for them (all, or up to `upto`). True when none is left waiting."""
        while self._pending:
            send = self._pending[0]
            if block:
                t0 = time.perf_counter()
                arrays.wait_copy(send.x, send.mirror.out_event)
                self.stage_s += time.perf_counter() - t0
            elif not arrays.poll_copy(send.x, send.mirror.out_event):
                return False
            self._pending.popleft()
            send.post()
            if send is upto:
                break
        return not self._pending

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
        return self._device_direct(x) if self.gpu_aware else self._copy_out(x).host[: nbytes(x)]

    def _recv_buffer(self, out):
        if not arrays.is_device_array(out):
            return host_view(out)
        return _bytes(arrays.backend_of(out).direct(out))

    # Point to point -----------------------------------------------------------------
    # Staged messages travel whole: a receive may be longer than its message
    # (OmniReduce's), so a message cut into pieces could not be matched piece by piece.

    def send(self, x, dest: int, tag: int = 0) -> None:
        self._post_sends(block=True)
        self.wire_bytes += nbytes(x)
        self.mpi.Send(self._send_buffer(x), dest, tag)

    def recv(self, out, source: int, tag: int = 0) -> None:
        if self.stages(out):
            self.irecv(out, source, tag).Wait()
            return
        self._post_sends(block=True)
        self.mpi.Recv(self._recv_buffer(out), source, tag)

    def isend(self, x, dest: int, tag: int = 0, head: np.ndarray | None = None):
        """A send; a staged one starts its D2H copy and is posted to MPI by a later
        progress call (test, wait) once the copy has landed. `head`: the message's first
        bytes come from this host array instead of x (OmniReduce's headers)."""
        if head is not None and not self.stages(x):
            raise ValueError("isend: a head goes with staged device messages only")
        self.wire_bytes += nbytes(x)
        if not self.stages(x):
            self._post_sends(block=True)  # messages to a peer keep their order
            return self.mpi.Isend(self._send_buffer(x), dest, tag)
        t0 = time.perf_counter()
        self._staged_any = True
        stager, mirror = self._stager(x), self._send_mirror(x)
        n = nbytes(x)
        h = 0 if head is None else min(head.nbytes, n)
        if h:
            mirror.host[:h] = head[:h]
        stager.copy_out(stager.backend.byte_view(x)[h:], mirror.host[h:n], mirror.out_event)
        send = StagedSend(self, x, mirror, n, dest, tag)
        self._pending.append(send)
        self.stage_s += time.perf_counter() - t0
        return send

    def irecv(self, out, source: int, tag: int = 0, head: np.ndarray | None = None):
        """A receive; `head` (host, staged device messages only) gets the message's
        first bytes too, copied on the host."""
        if self.stages(out):
            self._staged_any = True
            return StagedRecv(self, self._recv_mirror(out), out, head, source, tag)
        if head is not None:
            raise ValueError("irecv: a head goes with staged device messages only")
        return self.mpi.Irecv(self._recv_buffer(out), source, tag)

    def exchange(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> list:
        requests = []
        if recvbuf.shape[0]:
            requests.append(self.irecv(recvbuf, source, tag))
        if sendbuf.shape[0]:
            requests.append(self.isend(sendbuf, dest, tag))
        return requests

    def sendrecv(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> None:
        self._post_sends(block=True)
        self.wire_bytes += nbytes(sendbuf)
        if self.stages(recvbuf):
            mirror = self._recv_mirror(recvbuf)
            host = mirror.host[: nbytes(recvbuf)]
            status = MPI.Status()
            self.mpi.Sendrecv(self._send_buffer(sendbuf), dest, tag, host, source, tag, status)
            self._copy_in(mirror, recvbuf, status.Get_count(MPI.BYTE))
            return
        self.mpi.Sendrecv(
            self._send_buffer(sendbuf), dest, tag, self._recv_buffer(recvbuf), source, tag
        )

    def wait(self, request) -> None:
        if self._pending and not isinstance(request, StagedSend | StagedRecv):
            self._post_sends(block=True)
        request.Wait()

    def testsome(self, requests) -> list[int]:
        if not self._staged_any:  # host buffers: MPI's requests as they are (the fast path)
            return MPI.Request.Testsome(requests) or []
        self._post_sends(block=False)
        statuses = self._statuses(len(requests))
        done = MPI.Request.Testsome([_mpi_request(r) for r in requests], statuses) or []
        for i, status in zip(done, statuses, strict=False):
            if isinstance(requests[i], StagedRecv):
                requests[i].finish(status)
        return done

    def testall(self, requests) -> bool:
        if not self._staged_any:
            return MPI.Request.Testall(requests)
        self._post_sends(block=False)
        statuses = self._statuses(len(requests))
        if not MPI.Request.Testall([_mpi_request(r) for r in requests], statuses):
            return False  # (a send not yet posted is an inactive request here)
        for request, status in zip(requests, statuses, strict=False):
            if isinstance(request, StagedRecv):
                request.finish(status)
        return all(r.request is not None for r in requests if isinstance(r, StagedSend))

    def _statuses(self, count: int) -> list:
        while len(self._status_pool) < count:
            self._status_pool.append(MPI.Status())
        return self._status_pool

    def cancel(self, request) -> None:
        mpi_request = _mpi_request(request)
        mpi_request.Cancel()
        mpi_request.Wait()

    def completed(self, request) -> bool:
        # a completed request is MPI_REQUEST_NULL (falsy) once a test has seen it
        if isinstance(request, StagedSend | StagedRecv):
            return request.complete()
        return not request

    # The library's collectives ----------------------------------------------------

    def library_call(self, collective: str, sendbuf, recvbuf):
        """Buffers are parsed into MPI views once here, so each call in the timed loop
        costs what a bare mpi4py call costs. Device buffers are staged through host
        memory unless MPI is GPU-aware."""
        device = arrays.is_device_array(sendbuf) or arrays.is_device_array(recvbuf)
        if device and self.gpu_aware:
            if dtype_name(recvbuf) == "bfloat16" and spec(collective).reduces:
                raise UsageError(
                    "bfloat16 in device memory: MPI has no bfloat16 datatype to reduce "
                    "(ccbench's user op reduces it on the host only); unset "
                    "CCBENCH_GPU_AWARE to stage it, or use --transport torch (NCCL)"
                )
            send, recv = _as_bytes_if_bf16(sendbuf), _as_bytes_if_bf16(recvbuf)
            call = self._bind(
                collective,
                arrays.backend_of(send).direct(send),
                arrays.backend_of(recv).direct(recv),
                MPI.SUM,
            )

            def direct_call():
                t0 = time.perf_counter()
                arrays.host_sync(sendbuf)  # MPI reads the device once its kernels ran
                self.stage_s += time.perf_counter() - t0
                call()

            return direct_call
        if device:
            return self._staged_call(collective, sendbuf, recvbuf)
        recv = host_view(recvbuf)
        return self._bind(collective, host_view(sendbuf), recv, sum_op(recv))

    def in_place_call(self, collective: str, recvbuf):
        """MPI_IN_PLACE on host memory, where the collective has an in-place form."""
        if not spec(collective).mpi_in_place or arrays.is_device_array(recvbuf):
            return None
        recv = host_view(recvbuf)
        return self._bind(collective, MPI.IN_PLACE, recv, sum_op(recv))

    def _staged_call(self, collective: str, sendbuf, recvbuf):
        """A library collective on device buffers through pinned host mirrors, in pieces
        (`stage_chunk_bytes`): every piece's D2H copy is enqueued at once; the host waits
        for piece k's (its only wait), MPI moves it, its H2D copies are enqueued, and the
        current stream waits for them at the end. Mirrors and events are made here."""
        stager = self._stager(sendbuf)
        b = stager.backend
        send_bytes, recv_bytes = b.byte_view(sendbuf), b.byte_view(recvbuf)
        host_send = self._send_mirror(sendbuf).host
        recv_mirror = self._send_mirror(recvbuf)
        host_recv = recv_mirror.host
        if recv_mirror.in_event is None:
            recv_mirror.in_event = b.copy_event()
        typed_send, typed_recv = _typed_host(host_send, sendbuf), _typed_host(host_recv, recvbuf)
        op = sum_op(typed_recv)
        item = typed_recv.itemsize
        n = nbytes(sendbuf)
        split = spec(collective).staged_pieces
        pieces = []  # (D2H byte range of the send mirror, MPI call, H2D byte ranges)
        if split == PIECES_GATHERED:
            # piece k of every rank lands side by side in the mirror (piece-major), so
            # each piece is one plain contiguous call (MPI_Allgather)
            for a, z in _pieces(n, self.stage_chunk_bytes, 1):
                landing = host_recv[a * self.size : z * self.size]
                call = self._bind(collective, host_send[a:z], landing, op)
                copies = [(a * self.size + r * (z - a), r * n + a, z - a) for r in range(self.size)]
                pieces.append(((a, z), call, copies))
        elif split == PIECES_ELEMENTWISE:
            for a, z in _pieces(n, self.stage_chunk_bytes, item):
                call = self._bind(
                    collective,
                    typed_send[a // item : z // item],
                    typed_recv[a // item : z // item],
                    op,
                )
                pieces.append(((a, z), call, [(a, a, z - a)]))
        else:  # whole (reduce_scatter): every piece of the send feeds every rank's result
            call = self._bind(
                collective, typed_send[: n // item], typed_recv[: nbytes(recvbuf) // item], op
            )
            pieces.append(((0, n), call, [(0, 0, nbytes(recvbuf))]))
        events = [b.copy_event() for _ in pieces]
        # MPI writes into host_recv while the last call's H2D copies may read it only if
        # the device lags: piece 0's D2H copy, which the host waits for first, is queued
        # behind the current stream, which waits for those copies. No check needed.

        def staged_call():
            t0 = time.perf_counter()
            for ((a, z), _, _), event in zip(pieces, events, strict=True):
                stager.copy_out(send_bytes[a:z], host_send[a:z], event)
            stager.before_copies_in()
            for (_, call, copies), event in zip(pieces, events, strict=True):
                arrays.wait_copy(sendbuf, event)
                t1 = time.perf_counter()
                call()
                t2 = time.perf_counter()
                for src, dst, length in copies:
                    stager.copy_in(host_recv[src : src + length], recv_bytes[dst : dst + length])
                t0 += t2 - t1  # MPI's time is not staging
            stager.after_copies_in(recv_mirror.in_event)
            self.stage_s += time.perf_counter() - t0

        return staged_call

    def _bind(self, collective: str, send, recv, op):
        """The collective's MPI call on these buffers (collectives/spec.py names it), with
        the reduction op where it reduces."""
        described = spec(collective)
        call = getattr(self.mpi, described.mpi_call)
        return partial(call, send, recv, op) if described.reduces else partial(call, send, recv)

    def allgather_bytes(self, sendbuf, recvbuf) -> None:
        self.wire_bytes += (self.size - 1) * nbytes(sendbuf)
        send = self._send_buffer(sendbuf)  # staged: in its mirror, the host waited
        if self.stages(recvbuf):
            mirror = self._recv_mirror(recvbuf)
            self.mpi.Allgather([send, MPI.BYTE], [mirror.host[: nbytes(recvbuf)], MPI.BYTE])
            self._copy_in(mirror, recvbuf)
        else:
            self.mpi.Allgather([send, MPI.BYTE], [self._recv_buffer(recvbuf), MPI.BYTE])

    def alltoall_bytes(self, sendbuf, send_splits, recvbuf, recv_splits) -> None:
        self.wire_bytes += sum(send_splits) - send_splits[self.rank]
        sendbuf, recvbuf = sendbuf[: sum(send_splits)], recvbuf[: sum(recv_splits)]
        send = [self._send_buffer(sendbuf), (send_splits, _displacements(send_splits)), MPI.BYTE]
        recv_layout = (recv_splits, _displacements(recv_splits))
        if self.stages(recvbuf):
            mirror = self._recv_mirror(recvbuf)
            self.mpi.Alltoallv(send, [mirror.host[: nbytes(recvbuf)], recv_layout, MPI.BYTE])
            self._copy_in(mirror, recvbuf)
        else:
            self.mpi.Alltoallv(send, [self._recv_buffer(recvbuf), recv_layout, MPI.BYTE])

    def barrier(self) -> None:
        self.mpi.Barrier()

    def ibarrier(self):
        return self.mpi.Ibarrier()

    # control plane ------------------------------------------------------------------
    def allgather_obj(self, obj) -> list:
        return self.mpi.allgather(obj)

    def gather_obj(self, obj, root: int = 0) -> list | None:
        return self.mpi.gather(obj, root=root)

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

    def split(self, color: int, key: int) -> Communicator:
        return Communicator(self.mpi.Split(color, key), self.gpu_aware, self.stage_chunk_bytes)

    def describe(self) -> dict:
        library = MPI.Get_library_version().replace("\0", "").strip()
        return {
            "transport": "mpi",
            "backend": "mpi",
            "gpu_aware": self.gpu_aware,
            "mpi_library": library.splitlines()[0].strip() if library else "",
        }


_MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


def _mpi_request(request) -> MPI.Request:
    if isinstance(request, StagedSend | StagedRecv):
        return request.mpi_request()
    return request


def _pieces(nbytes: int, chunk: int, align: int) -> list[tuple[int, int]]:
    """[start, stop) byte ranges of `chunk` bytes (a multiple of `align`) covering nbytes."""
    if chunk <= 0 or nbytes <= chunk:
        return [(0, nbytes)]
    step = max(align, chunk // align * align)
    return [(a, min(a + step, nbytes)) for a in range(0, nbytes, step)]


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

"""ccbench's collectives inside stock PyTorch: FSDP2 custom collectives and DDP comm hooks.

The ranks are the ones ``mpiexec`` (or ``srun``) started; torch.distributed is set up
from the same launch (``init_torch_distributed``: gloo on the CPU, NCCL on a GPU), so
stock FSDP and DDP run unchanged while their gradient and parameter traffic goes through
ccbench's collectives over MPI:

- ``Transport``: one ccbench variant and codec bound to torch tensors. ``allgather``,
  ``reduce_scatter`` and ``allreduce`` take the tensors FSDP / DDP hand over and pass
  them to the ring (or the MPI library, or OmniReduce) as zero-copy views; bound objects
  (payload slots, scratch) are built once per buffer and reused.
- ``CommStream``: a communication thread that runs collectives in the order they were
  submitted, as a CUDA communication stream does. Every rank submits in the same order
  (FSDP's and DDP's schedules are deterministic), so MPI sees matching collectives. The
  training thread's waits on it are timed: that is the *exposed* communication.
- ``CcbenchAllGather`` / ``CcbenchReduceScatter``: FSDP2's ``AllGather`` /
  ``ReduceScatter`` interfaces (``FSDPModule.set_custom_all_gather`` /
  ``set_custom_reduce_scatter``). The all-gather's input is a view inside its output
  (FSDP copies the shard in place), so it runs in place. With ``overlap`` a prefetching
  all-gather (``async_op``) returns a ``dist.Work`` and the reduce-scatter returns at
  once; a callback queued on the autograd engine waits for the stream at the end of
  backward, where FSDP on a GPU waits for its reduce-scatter stream.
- ``DDPHook``: a DDP comm hook (``DistributedDataParallel.register_comm_hook``) that
  allreduces each gradient bucket in place on the stream and returns a future; or wraps
  torch's own hooks (``allreduce_hook``, ``fp16_compress_hook``, ``bf16_compress_hook``,
  PowerSGD) so their waits are timed the same way.

Error feedback (``error_feedback=True`` with a lossy codec) keeps, per buffer (FSDP
parameter group or DDP bucket), ``residual = g - decode(encode(g))`` of the compensated
gradient this rank sent, as the compact trainer does.
"""

from __future__ import annotations

import fcntl
import math
import os
import queue
import socket
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from ccbench.collectives.baseline import bind_collective
from ccbench.collectives.comm import sum_op
from ccbench.collectives.ring import RingScratch, block_bounds
from ccbench.kernels.arrays import host_view
from ccbench.kernels.errors import UsageError

# Variants a Transport runs: ccbench's, and "torch" (torch.distributed's own collectives).
VARIANTS = ("baseline", "p2p_compressed", "coll_compressed", "sparse_streaming", "torch")
COMPRESS = ("both", "grads", "params")
TORCH_HOOKS = ("none", "fp16", "bf16", "powersgd")


# ----------------------------------------------------------------------- torch.distributed


def _interface_address(name: str) -> str:
    """IPv4 address of a network interface (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def rendezvous_address(comm) -> str:
    """Where rank 0's store listens: the emulated cluster's interface, loopback on one
    host, else this host's name."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("FI_TCP_IFACE")
    if iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        return _interface_address(iface)
    hosts = comm.mpi.allgather(MPI.Get_processor_name())
    if len(set(hosts)) == 1:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def init_torch_distributed(comm, backend: str | None = None) -> str:
    """Initialise torch.distributed over the ranks of ``comm`` (an MPI launch).

    Rank 0 opens a TCPStore on a free port and broadcasts its address over MPI; every
    rank then joins the default process group with its MPI rank. ``backend``: gloo (the
    default, for models on the CPU, as the training benchmark's are) or nccl (models on a
    GPU; each rank takes device rank % devices); ``CCBENCH_TORCH_BACKEND`` sets the
    default. Returns the backend.
    """
    if dist.is_initialized():
        return dist.get_backend()
    backend = backend or os.environ.get("CCBENCH_TORCH_BACKEND", "gloo")
    address = comm.mpi.bcast(rendezvous_address(comm), root=0)
    store = None
    if comm.rank == 0:
        store = dist.TCPStore(address, 0, comm.size, is_master=True, wait_for_workers=False)
    port = comm.mpi.bcast(store.port if store is not None else None, root=0)
    if store is None:
        store = dist.TCPStore(address, port, comm.size, is_master=False)
    if backend == "nccl":
        torch.cuda.set_device(comm.rank % torch.cuda.device_count())
    dist.init_process_group(backend, store=store, rank=comm.rank, world_size=comm.size)
    return backend


# ----------------------------------------------------------------------- the stream


class Ticket:
    """One submitted collective: done when the stream has run it."""

    __slots__ = ("event", "error", "result")

    def __init__(self):
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.result = None


class CommStream:
    """Collectives run one after another on a communication thread, in submission order.

    ``overlap=False`` runs every call inline on the caller's thread instead (nothing is
    hidden behind compute). ``waited_s`` adds up the time the training thread spent
    waiting on communication (inline calls included); ``busy`` the time the collectives
    themselves took, per kind.
    """

    def __init__(self, overlap: bool = True):
        self.overlap = overlap
        self.waited_s = 0.0
        self.busy: dict[str, float] = {}
        self._pending: list[Ticket] = []
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._callback_queued = False
        if overlap:
            self._thread = threading.Thread(target=self._loop, name="ccbench-comm", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while (item := self._work.get()) is not None:
            call, kind, ticket = item
            t0 = time.perf_counter()
            try:
                ticket.result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                ticket.error = exc
            self.busy[kind] = self.busy.get(kind, 0.0) + time.perf_counter() - t0
            ticket.event.set()

    def submit(self, call, kind: str = "other") -> Ticket:
        """Run ``call()`` on the stream (inline without overlap); returns its ticket.
        ``kind`` (allgather, reduce_scatter, allreduce) files its time in ``busy``."""
        ticket = Ticket()
        if not self.overlap:
            t0 = time.perf_counter()
            ticket.result = call()
            elapsed = time.perf_counter() - t0
            self.busy[kind] = self.busy.get(kind, 0.0) + elapsed
            self.waited_s += elapsed
            ticket.event.set()
            return ticket
        self._pending.append(ticket)
        self._work.put((call, kind, ticket))
        return ticket

    def wait(self, ticket: Ticket):
        """Block until ``ticket`` is done (timed as exposed communication)."""
        if not ticket.event.is_set():
            t0 = time.perf_counter()
            ticket.event.wait()
            self.waited_s += time.perf_counter() - t0
        if ticket.error is not None:
            raise ticket.error
        return ticket.result

    def drain(self) -> None:
        """Wait for everything submitted so far."""
        pending, self._pending = self._pending, []
        for ticket in pending:
            self.wait(ticket)

    def drain_after_backward(self) -> None:
        """Queue, once per backward, an autograd-engine callback that drains the stream
        when backward ends (before DDP's reducer reads its buckets)."""
        if self._callback_queued or not self.overlap:
            return
        self._callback_queued = True

        def callback():
            self._callback_queued = False
            self.drain()

        torch.autograd.Variable._execution_engine.queue_callback(callback)

    def reset_counters(self) -> None:
        self.waited_s = 0.0
        self.busy = {}

    def close(self) -> None:
        if self._thread is not None:
            self._work.put(None)
            self._thread.join()
            self._thread = None


class StreamWork(dist.Work):
    """A ``dist.Work`` for a collective on the stream (FSDP waits on it)."""

    def __init__(self, stream: CommStream, ticket: Ticket):
        super().__init__()
        self.stream, self.ticket = stream, ticket

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - torch's signature
        self.stream.wait(self.ticket)
        return True

    def is_completed(self) -> bool:
        return self.ticket.event.is_set()


# ----------------------------------------------------------------------- transports


def _is_avg(op) -> bool:
    return op is not None and op == dist.ReduceOp.AVG


@dataclass
class TransportSpec:
    variant: str = "baseline"
    algorithm: str = "ring"           # baseline: mpi or ring
    codec: str = "none"
    compress: str = "both"            # which collectives of a compressed variant compress
    error_feedback: bool = False
    chunk_bytes: int | None = None    # coll_compressed pipeline chunk
    block_size: int = 256             # sparse_streaming (OmniReduce) options
    fusion: int = 1024
    window: int = 4


class Transport:
    """A ccbench variant and codec on torch tensors; also counts what it put on the wire.

    ``allgather(send, recv)``: recv = every rank's send (send may be a view inside recv,
    at this rank's block: FSDP's in-place all-gather). ``reduce_scatter(send, recv)``:
    recv = this rank's block of the sum. ``allreduce(buf)``: buf = the sum, in place.
    """

    CACHE = 512  # bound collectives kept (MG-WFBP's per-layer plans have many groups)

    def __init__(self, comm, spec: TransportSpec):
        if spec.variant not in VARIANTS:
            raise UsageError(f"unknown variant {spec.variant!r}; choose from {', '.join(VARIANTS)}")
        if spec.compress not in COMPRESS:
            raise UsageError(f"--compress must be one of {', '.join(COMPRESS)}")
        self.comm, self.spec = comm, spec
        self.codec = None
        self.kind = {"p2p_compressed": "p2p", "coll_compressed": "coll"}.get(spec.variant)
        if spec.variant in ("baseline", "sparse_streaming"):
            if spec.codec != "none":
                raise UsageError(f"the {spec.variant} variant sends uncompressed data: use "
                                 "--codec none")
            if spec.variant == "baseline" and spec.algorithm not in ("mpi", "ring"):
                raise UsageError("the baseline variant's --algorithm is mpi or ring")
        elif self.kind is not None:
            from ccbench.kernels.codecs import parse_codec

            if spec.codec == "none":
                raise UsageError(f"--variant {spec.variant} needs a codec, e.g. --codec fp16")
            self.codec = parse_codec(spec.codec)
        if spec.error_feedback and not self.lossy_gradients:
            raise UsageError("--error-feedback needs a lossy ccbench codec on the gradients "
                             "(a compressed variant with --compress both or grads)")
        self._bound: OrderedDict = OrderedDict()
        self._scratch: dict = {}

    # what is compressed
    @property
    def lossy_gradients(self) -> bool:
        return (self.codec is not None and self.codec.lossy
                and self.spec.compress in ("both", "grads"))

    def compresses(self, collective: str) -> bool:
        if self.codec is None:
            return False
        return self.spec.compress == "both" or (
            self.spec.compress == ("params" if collective == "allgather" else "grads"))

    def error_bound(self, collective: str, amaxes: list[float], dtype: str = "float32"):
        """Max abs error of one collective's result (None: exact up to summation order)."""
        if not self.compresses(collective) or not self.codec.lossy:
            return None
        from ccbench.collectives.compressed import error_bound

        return error_bound(self.codec, self.kind, collective, amaxes, dtype)

    # binding
    def _cached(self, key, build):
        bound = self._bound.get(key)
        if bound is None:
            bound = build()
            self._bound[key] = bound
            if len(self._bound) > self.CACHE:
                self._bound.popitem(last=False)
        else:
            self._bound.move_to_end(key)
        return bound

    def _ring_scratch(self, like, count: int) -> RingScratch:
        key = (like.dtype, like.device, count)
        if key not in self._scratch:
            self._scratch[key] = RingScratch(like, count)
        return self._scratch[key]

    def _compressed(self, collective: str, send, recv):
        from ccbench.collectives.compressed import DEFAULT_CHUNK_BYTES, bind_compressed

        options = ({"chunk_bytes": self.spec.chunk_bytes or DEFAULT_CHUNK_BYTES}
                   if self.kind == "coll" else {})
        key = (collective, send.data_ptr(), send.numel(), recv.numel(), send.dtype)
        bound = self._cached(key, lambda: bind_compressed(
            self.comm, self.kind, collective, self.codec, send, recv, **options))
        bound.recvbuf = recv  # a fresh output of the same length: retarget, keep the slots
        return bound

    def allgather(self, send, recv) -> None:
        v = self.spec.variant
        if v == "torch":
            _torch_all_gather(recv, send)
        elif self.compresses("allgather"):
            self._compressed("allgather", send, recv)()
        elif v == "baseline" and self.spec.algorithm == "mpi":
            if _aliases(send, recv):
                self.comm.mpi.Allgather(MPI.IN_PLACE, host_view(recv))
            else:
                self.comm.mpi.Allgather(host_view(send), host_view(recv))
        else:  # the ring (also the uncompressed side of a compressed variant)
            bind_collective(self.comm, "ring", "allgather", send, recv)()

    def reduce_scatter(self, send, recv) -> None:
        v = self.spec.variant
        if v == "torch":
            _torch_reduce_scatter(recv, send)
        elif self.compresses("reduce_scatter"):
            self._compressed("reduce_scatter", send, recv)()
        elif v == "baseline" and self.spec.algorithm == "mpi":
            r = host_view(recv)
            self.comm.mpi.Reduce_scatter_block(host_view(send), r, sum_op(r))
        else:
            from ccbench.collectives.ring import ring_reduce_scatter

            ring_reduce_scatter(self.comm, send, recv,
                                self._ring_scratch(send, recv.numel()))

    def allreduce(self, buf) -> None:
        """buf = sum over ranks, in place."""
        v = self.spec.variant
        if v == "torch":
            dist.all_reduce(buf)
        elif v == "sparse_streaming":
            self._omnireduce(buf)
        elif self.compresses("allreduce"):
            self._compressed("allreduce", buf, buf)()
        elif v == "baseline" and self.spec.algorithm == "mpi":
            b = host_view(buf)
            self.comm.mpi.Allreduce(MPI.IN_PLACE, b, sum_op(b))
        else:
            from ccbench.collectives.ring import ring_allreduce

            longest = max(b - a for a, b in block_bounds(buf.numel(), self.comm.size))
            ring_allreduce(self.comm, buf, buf, self._ring_scratch(buf, longest))

    def _omnireduce(self, buf) -> None:
        """OmniReduce reads its input while results arrive: a persistent output per
        buffer, copied back."""
        from ccbench.collectives.omnireduce import OmniReduce, make_layout

        def build():
            out = torch.empty_like(buf)
            layout = make_layout(buf.numel(), self.spec.block_size, self.comm.size,
                                 fusion=self.spec.fusion, window=self.spec.window)
            return OmniReduce(self.comm, buf, out, layout), out

        engine, out = self._cached(("omnireduce", buf.data_ptr(), buf.numel()), build)
        engine()
        buf.copy_(out)

    # error feedback
    def roundtrip(self, x, out, blocks: int) -> None:
        """out = decode(encode(x)), block by block as the ring encodes them."""
        from ccbench.kernels.codec_base import empty_payload

        codec = self.codec
        bounds = block_bounds(x.numel(), blocks)
        longest = max(b - a for a, b in bounds)
        payload = self._cached(("payload", longest, x.dtype),
                               lambda: empty_payload(x, codec.max_encoded_nbytes(longest)))
        for a, b in bounds:
            if b > a:
                codec.decode(codec.encode(x[a:b], out=payload), out[a:b])


def _aliases(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _torch_all_gather(out, inp) -> None:
    call = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    call(out, inp)


def _torch_reduce_scatter(out, inp) -> None:
    call = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    call(out, inp)


class ErrorFeedback:
    """Residual memory per buffer: g += r before sending; r = g - decode(encode(g))."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.residuals: dict = {}

    def apply(self, key, grad, blocks: int) -> None:
        residual = self.residuals.get(key)
        if residual is None or residual.shape != grad.shape:
            residual = self.residuals[key] = torch.zeros_like(grad)
        grad.add_(residual)
        self.transport.roundtrip(grad, residual, blocks)
        torch.sub(grad, residual, out=residual)


# ----------------------------------------------------------------------- FSDP2


class _FSDPComm:
    """What FSDP's two custom collectives share. ``allocate`` keeps one buffer per size:
    the all-gather's output (FSDP copies the parameters out of it before the group's next
    all-gather) and the reduce-scatter's input (FSDP copies the gradients into it), so
    the same buffers, and the collectives bound to them, serve step after step."""


    def __init__(self, transport: Transport, stream: CommStream, name: str = "",
                 feedback: ErrorFeedback | None = None):
        self.transport, self.stream, self.name, self.feedback = transport, stream, name, feedback
        self._buffers: dict = {}

    def allocate(self, size, *, dtype, device):
        key = (tuple(size), dtype, device)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(size, dtype=dtype, device=device)
        return self._buffers[key]


class CcbenchAllGather(_FSDPComm, AllGather):
    """FSDP2's all-gather through a Transport, in place (the input is this rank's block
    of the output)."""

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        ticket = self.stream.submit(
            lambda: self.transport.allgather(input_tensor, output_tensor), "allgather")
        if async_op:
            return StreamWork(self.stream, ticket)
        self.stream.wait(ticket)
        return None


class CcbenchReduceScatter(_FSDPComm, ReduceScatter):
    """FSDP2's reduce-scatter through a Transport; ``op`` SUM or AVG.

    With the stream overlapping, the call returns at once and the result is written
    before backward ends (the queued drain), as on a GPU's reduce-scatter stream. FSDP
    reads the output then only when it accumulates into an existing gradient, so the
    training loop must free gradients between steps (``zero_grad(set_to_none=True)``,
    torch's default); ``FSDPTrainer`` does.

    FSDP keeps the gradient as a view of the output, so the output is a fresh tensor
    every call (the input, P times larger, is kept): a kept one would be overwritten by
    the next step's reduce-scatter under a gradient that is being accumulated.
    """

    _largest = 0

    def allocate(self, size, *, dtype, device):
        numel = math.prod(size)
        if numel < self._largest:  # the output
            return torch.empty(size, dtype=dtype, device=device)
        self._largest = numel
        return super().allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op=None, async_op: bool = False):
        if op is not None and not (_is_avg(op) or op == dist.ReduceOp.SUM):
            raise UsageError(f"ccbench's FSDP reduce-scatter does SUM and AVG, not {op}")
        size = self.transport.comm.size
        avg = _is_avg(op)

        def run():
            if self.feedback is not None:
                self.feedback.apply((self.name, input_tensor.numel()), input_tensor, size)
            self.transport.reduce_scatter(input_tensor, output_tensor)
            if avg:
                output_tensor.div_(size)

        ticket = self.stream.submit(run, "reduce_scatter")
        if async_op:
            return StreamWork(self.stream, ticket)
        if self.stream.overlap:
            self.stream.drain_after_backward()
            return None
        self.stream.wait(ticket)
        return None


def set_fsdp_comms(model, transport: Transport, stream: CommStream) -> int:
    """Give every FSDPModule under ``model`` its own ccbench all-gather and reduce-scatter
    (each module has its own parameter group: set on the root alone, they are never
    called). Returns how many modules were set."""
    from torch.distributed.fsdp import FSDPModule

    feedback = ErrorFeedback(transport) if transport.spec.error_feedback else None
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(CcbenchAllGather(transport, stream, name))
            module.set_custom_reduce_scatter(
                CcbenchReduceScatter(transport, stream, name, feedback))
            count += 1
    return count


# ----------------------------------------------------------------------- DDP


class DDPHook:
    """A DDP comm hook: ``ddp.register_comm_hook(state=None, hook=DDPHook(...).hook)``.

    ccbench variants allreduce each bucket in place on the stream (error feedback per
    bucket) and divide by the ranks, as DDP's default hook does. ``torch_hook`` ('none',
    'fp16', 'bf16', 'powersgd') runs torch's own hook instead, over the default process
    group, and only times the wait for its futures.
    """

    def __init__(self, transport: Transport | None, stream: CommStream,
                 torch_hook: str = "none", powersgd_rank: int = 4):
        self.transport, self.stream = transport, stream
        self.torch_hook = torch_hook
        self.feedback = (ErrorFeedback(transport)
                         if transport is not None and transport.spec.error_feedback else None)
        self._inner = None
        self._state = None
        if transport is None:
            self._inner, self._state = _torch_hook(torch_hook, powersgd_rank)
        self._futures: list = []

    def hook(self, state, bucket):  # noqa: ARG002 - state is carried here
        if self.transport is None:
            future = self._inner(self._state, bucket)
            self._futures.append(future)
            self._queue_wait()
            return future
        buf = bucket.buffer()
        size = self.transport.comm.size
        future = torch.futures.Future()
        index = (bucket.index(), buf.data_ptr())  # DDP rebuilds its buckets once

        def run():
            try:
                if self.feedback is not None:
                    self.feedback.apply(index, buf, size)
                self.transport.allreduce(buf)
                buf.div_(size)
                future.set_result(buf)
            except BaseException as exc:  # noqa: BLE001 - DDP's wait raises it
                future.set_exception(exc)
                raise

        self.stream.submit(run, "allreduce")
        self.stream.drain_after_backward()
        return future

    def _queue_wait(self) -> None:
        if len(self._futures) > 1:
            return

        def callback():
            futures, self._futures = self._futures, []
            t0 = time.perf_counter()
            for f in futures:
                f.wait()
            self.stream.waited_s += time.perf_counter() - t0

        torch.autograd.Variable._execution_engine.queue_callback(callback)


def _torch_hook(name: str, powersgd_rank: int):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "none":
        return default_hooks.allreduce_hook, None
    if name == "fp16":
        return default_hooks.fp16_compress_hook, None
    if name == "bf16":
        return default_hooks.bf16_compress_hook, None
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
        return powerSGD_hook.powerSGD_hook, state
    raise UsageError(f"unknown torch hook {name!r}; choose from {', '.join(TORCH_HOOKS)}")


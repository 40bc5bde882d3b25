"""Training's gradient communicator: one ccbench variant and codec bound to torch tensors,
and the error feedback of its codec.

``allgather``, ``reduce_scatter`` and ``allreduce`` take the tensors FSDP / DDP hand over
and pass them to the ring (or the transport library's own collective, or OmniReduce) as
zero-copy views; bound objects (payload slots, scratch) are built once per buffer and
reused. The variant ``torch`` runs torch.distributed's own collectives instead. Which of
these a variant runs is read once, from its entry in the registry (kernels/variants.py):
its compressed schedule and the algorithm its rows name. The options that chose the
variant and codec checked them (benchmarks/options.py, ``check_gradient_codec``). Tensors
on a device reach the communicator as they are: staging through host memory, where the
transport cannot read the device (MPI without GPU-awareness), happens inside it alone.

Error feedback (``error_feedback=True`` with a lossy codec) keeps, per buffer (FSDP
parameter group or DDP bucket), ``residual = g - decode(encode(g))`` of the compensated
gradient this rank sent, as the compact trainer does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ccbench.collectives.baseline import bind_collective
from ccbench.collectives.ring import RingScratch, block_bounds
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays, variants
from ccbench.kernels.errors import UsageError

# The variants it runs: ccbench's, and "torch" (torch.distributed's own collectives).
VARIANTS = variants.GRADIENT_VARIANTS
COMPRESS = ("both", "grads", "params")


@dataclass
class GradientCommSpec:
    variant: str = "baseline"
    algorithm: str = "ring"  # baseline: mpi, library or ring
    codec: str = "none"  # a compressed variant's (the others': none)
    compress: str = "both"  # which collectives of a compressed variant compress
    error_feedback: bool = False
    chunk_bytes: int | None = None  # coll_compressed pipeline chunk
    block_size: int = 256  # sparse_streaming (OmniReduce) options
    fusion: int = 1024
    window: int = 4


class GradientCommunicator:
    """A ccbench variant and codec on torch tensors; also counts what it put on the wire.

    ``allgather(send, recv)``: recv = every rank's send (send may be a view inside recv,
    at this rank's block: FSDP's in-place all-gather). ``reduce_scatter(send, recv)``:
    recv = this rank's block of the sum. ``allreduce(buf)``: buf = the sum, in place.
    """

    CACHE = 512  # bound collectives kept (MG-WFBP's per-layer plans have many groups)

    def __init__(self, comm, spec: GradientCommSpec):
        self.comm, self.spec = comm, spec
        self.kind = variants.schedule(spec.variant)  # the compressed schedule, or None
        self.codec = None
        if self.kind is not None:
            from ccbench.kernels.codecs import parse_codec

            self.codec = parse_codec(spec.codec)
        # the uncompressed calls: torch.distributed's, the library's, OmniReduce or the ring
        algorithm = variants.gradient_algorithm(spec.variant, spec.algorithm)
        self.torch_calls = algorithm == variants.TORCH
        self.library = algorithm in ("mpi", "library")
        self.sparse = algorithm == "omnireduce"
        # needs the parsed codec (lossy or not): no option parser has it
        if spec.error_feedback and not self.lossy_gradients:
            raise UsageError(
                "--error-feedback needs a lossy ccbench codec on the gradients "
                "(a compressed variant with --compress both or grads)"
            )
        self._bound: OrderedDict = OrderedDict()
        self._scratch: dict = {}

    # what is compressed
    @property
    def lossy_gradients(self) -> bool:
        return (
            self.codec is not None and self.codec.lossy and self.spec.compress in ("both", "grads")
        )

    def compresses(self, collective: str) -> bool:
        if self.codec is None:
            return False
        # a reduction sums gradients; what is gathered is parameters
        return self.spec.compress == "both" or (
            self.spec.compress == ("grads" if spec(collective).reduces else "params")
        )

    def error_bound(self, collective: str, amaxes: list[float], dtype: str = "float32"):
        """Max abs error of one collective's result (None: exact up to summation order)."""
        if not self.compresses(collective) or not self.codec.lossy:
            return None
        from ccbench.collectives.compressed_error import error_bound

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

        options = (
            {"chunk_bytes": self.spec.chunk_bytes or DEFAULT_CHUNK_BYTES}
            if self.kind == "coll"
            else {}
        )
        key = (collective, send.data_ptr(), send.numel(), recv.numel(), send.dtype)
        bound = self._cached(
            key,
            lambda: bind_compressed(
                self.comm, self.kind, collective, self.codec, send, recv, **options
            ),
        )
        bound.recvbuf = recv  # a fresh output of the same length: retarget, keep the slots
        return bound

    def _library(self, collective: str, send, recv) -> None:
        """The transport library's own collective (MPI's, NCCL's, gloo's). MPI on host
        tensors runs in place where FSDP's input lies inside its output; elsewhere the
        communicator binds the call once per buffer (staging device tensors, if need be)."""
        comm, described = self.comm, spec(collective)
        host = not arrays.is_device_array(recv)
        if comm.mpi is not None and host:  # MPI carries the bytes: its in-place calls
            from mpi4py import MPI

            from ccbench.collectives.comm import sum_op

            r = arrays.host_view(recv)
            in_place = described.mpi_in_place and _aliases(send, recv)
            first = MPI.IN_PLACE if in_place else arrays.host_view(send)
            args = (first, r, sum_op(r)) if described.reduces else (first, r)
            getattr(comm.mpi, described.mpi_call)(*args)
            return
        if described.in_place:  # one buffer: the library's call reads a copy
            key = ("library-in", send.data_ptr(), send.numel(), send.dtype)
            send = self._cached(key, lambda: torch.empty_like(send)).copy_(send)
        key = (
            "library",
            collective,
            send.data_ptr(),
            recv.data_ptr(),
            send.numel(),
            recv.numel(),
            send.dtype,
        )
        self._cached(key, lambda: comm.library_call(collective, send, recv))()

    def allgather(self, send, recv) -> None:
        if self.torch_calls:
            _torch_call("allgather", recv, send)
        elif self.compresses("allgather"):
            self._compressed("allgather", send, recv)()
        elif self.library:
            self._library("allgather", send, recv)
        else:  # the ring (also the uncompressed side of a compressed variant)
            bind_collective(self.comm, "ring", "allgather", send, recv)()

    def reduce_scatter(self, send, recv) -> None:
        if self.torch_calls:
            _torch_call("reduce_scatter", recv, send)
        elif self.compresses("reduce_scatter"):
            self._compressed("reduce_scatter", send, recv)()
        elif self.library:
            self._library("reduce_scatter", send, recv)
        else:
            from ccbench.collectives.ring import ring_reduce_scatter

            ring_reduce_scatter(self.comm, send, recv, self._ring_scratch(send, recv.numel()))

    def allreduce(self, buf) -> None:
        """buf = sum over ranks, in place."""
        if self.torch_calls:
            _torch_call("allreduce", buf)
        elif self.sparse:
            self._omnireduce(buf)
        elif self.compresses("allreduce"):
            self._compressed("allreduce", buf, buf)()
        elif self.library:
            self._library("allreduce", buf, buf)
        else:
            from ccbench.collectives.ring import ring_allreduce

            longest = max(b - a for a, b in block_bounds(buf.numel(), self.comm.size))
            ring_allreduce(self.comm, buf, buf, self._ring_scratch(buf, longest))

    def _omnireduce(self, buf) -> None:
        """OmniReduce reads its input while results arrive: a persistent output per
        buffer, copied back."""
        from ccbench.collectives.omnireduce import OmniReduce
        from ccbench.collectives.omnireduce_layout import make_layout

        def build():
            out = torch.empty_like(buf)
            layout = make_layout(
                buf.numel(),
                self.spec.block_size,
                self.comm.size,
                fusion=self.spec.fusion,
                window=self.spec.window,
            )
            return OmniReduce(self.comm, buf, out, layout), out

        engine, out = self._cached(("omnireduce", buf.data_ptr(), buf.numel()), build)
        engine()
        buf.copy_(out)

    def check(self) -> None:
        """Raise what the codec's device encodes deferred (outside the collectives)."""
        if self.codec is not None:
            self.codec.check_deferred()

    # error feedback
    def roundtrip(self, x, out, blocks: int) -> None:
        """out = decode(encode(x)), block by block as the ring encodes them."""
        from ccbench.kernels.codec_base import empty_payload

        codec = self.codec
        bounds = block_bounds(x.numel(), blocks)
        longest = max(b - a for a, b in bounds)
        payload = self._cached(
            ("payload", longest, x.dtype),
            lambda: empty_payload(x, codec.max_encoded_nbytes(longest)),
        )
        for a, b in bounds:
            if b > a:
                codec.decode(codec.encode(x[a:b], out=payload), out[a:b])


def _aliases(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _torch_call(collective: str, *buffers) -> None:
    """torch.distributed's own call of a collective, the function spec.py names: given
    (out, in), or the one buffer of an in-place collective."""
    names = spec(collective).torch_calls
    next(getattr(dist, name) for name in names if hasattr(dist, name))(*buffers)


class ErrorFeedback:
    """Residual memory per buffer: g += r before sending; r = g - decode(encode(g))."""

    def __init__(self, gradient_comm: GradientCommunicator):
        self.gradient_comm = gradient_comm
        self.residuals: dict = {}

    def apply(self, key, grad, blocks: int) -> None:
        residual = self.residuals.get(key)
        if residual is None or residual.shape != grad.shape:
            residual = self.residuals[key] = torch.zeros_like(grad)
        grad.add_(residual)
        self.gradient_comm.roundtrip(grad, residual, blocks)
        torch.sub(grad, residual, out=residual)

"""Training's and trace replay's gradient communicator: the one way they bind and run
collectives (one ccbench variant and codec on torch tensors), and the error feedback of
its codec.

``allgather``, ``reduce_scatter`` and ``allreduce`` take the tensors the trainers (the
compact sharded one, FSDP, DDP, MG-WFBP) and trace replay hand over and pass them to the
ring (or the transport library's own collective, or OmniReduce) as zero-copy views;
bound objects (payload slots, scratch) are built once per buffer and reused. The variant
``torch`` runs torch.distributed's own collectives instead. Which of these a collective
runs is chosen once per collective, from the variant's entry in the registry
(kernels/variants.py: its compressed schedule and the algorithm its rows name) and the
collective's spec (collectives/spec.py: whether it reduces, runs in place, streams
sparse data). Every call to a library goes through the communicator
(collectives/comm.py, comm_torch.py). The options parsed the compression setting
(benchmarks/options.py, ``compression_of``): the communicator takes it as checked.
Tensors on a device reach the communicator as they are: staging through host memory,
where the transport cannot read the device (MPI without GPU-awareness), happens inside it
alone.

Error feedback (``error_feedback`` with a lossy codec) keeps, per buffer (the flat
gradients, an FSDP parameter group or a DDP bucket), ``residual = g - decode(encode(g))``
of the compensated gradient this rank sent.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import torch

from ccbench.collectives.compression import Compression
from ccbench.collectives.ring import block_bounds, ring_collective, ring_scratch
from ccbench.collectives.spec import spec
from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError

# The variants it runs: ccbench's, and "torch" (torch.distributed's own collectives).
VARIANTS = variants.GRADIENT_VARIANTS
COMPRESS = ("both", "grads", "params")


@dataclass
class GradientCommSpec:
    variant: str = "baseline"
    algorithm: str = "ring"  # baseline: mpi, library or ring
    compression: Compression = Compression()  # a compressed variant's codec and chunk
    compress: str = "both"  # which collectives of a compressed variant compress
    block_size: int = 256  # sparse_streaming (OmniReduce) options
    fusion: int = 1024
    window: int = 4
    # flat, or across nodes only: node (per local rank) or leader (through node leaders;
    # collectives/hierarchical.py, hierarchical_leader.py), M ranks per node (None: the
    # launch's layout)
    hierarchy: str = "flat"
    ranks_per_node: int | None = None
    intra_node: str = "auto"  # node: the level inside a node (collectives/hierarchies.py)


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
        self.codec = spec.compression.codec if self.kind is not None else None
        # the uncompressed calls: torch.distributed's, the library's, OmniReduce or the ring
        self.algorithm = variants.gradient_algorithm(spec.variant, spec.algorithm)
        self.torch_calls = self.algorithm == variants.TORCH  # the trainers' own hooks run
        # needs the parsed codec (lossy or not) and --compress together
        if spec.compression.error_feedback and not self.lossy_gradients:
            raise UsageError(
                "--error-feedback needs a lossy ccbench codec on the gradients "
                "(a compressed variant with --compress both or grads)"
            )
        self._bound: OrderedDict = OrderedDict()
        self._routes: dict = {}
        self.layout = None  # hierarchical: the node layout (collective where it asks hosts)
        if spec.hierarchy != "flat":
            from ccbench.collectives.hierarchical import node_layout

            if self.torch_calls or self.algorithm == "omnireduce":
                raise UsageError(
                    f"--hierarchy {spec.hierarchy} runs ccbench's collectives: the variant "
                    f"{spec.variant} has none to run across nodes"
                )
            self.layout = node_layout(comm, spec.ranks_per_node)

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
        from ccbench.collectives.compressed_error import error_bound, hierarchical_error_bound

        if self.layout is not None:
            return hierarchical_error_bound(
                self.codec, self.kind, collective, amaxes, dtype, self.layout.ranks_per_node
            )

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

    def _route(self, collective: str):
        """How this communicator runs `collective`, chosen once: torch.distributed's own
        call, OmniReduce (a collective that streams sparse data), the compressed schedule,
        the library's collective, or the ring (also the uncompressed side of a compressed
        variant)."""
        if self.torch_calls:
            return self._torch
        if self.layout is not None:
            return self._hierarchical
        if self.algorithm == "omnireduce" and spec(collective).streams_sparse:
            return self._omnireduce
        if self.compresses(collective):
            return self._compressed
        if self.algorithm in ("mpi", "library"):
            return self._library
        return self._ring

    def run(self, collective: str, send, recv) -> None:
        """One call of `collective` (an in-place one: send is recv)."""
        route = self._routes.get(collective)
        if route is None:
            route = self._routes[collective] = self._route(collective)
        route(collective, send, recv)

    def allgather(self, send, recv) -> None:
        self.run("allgather", send, recv)

    def reduce_scatter(self, send, recv) -> None:
        self.run("reduce_scatter", send, recv)

    def allreduce(self, buf) -> None:
        """buf = sum over ranks, in place."""
        self.run("allreduce", buf, buf)

    def _torch(self, collective: str, send, recv) -> None:
        from ccbench.collectives.comm_torch import default_group_call

        default_group_call(collective, send, recv)

    def _hierarchical(self, collective: str, send, recv) -> None:
        """Across nodes only: the same variant, flat, on each inter-node communicator,
        bound once per pair of buffers (no retargeting: the levels keep scratch of their
        own)."""
        from ccbench.collectives.hierarchies import design as hierarchical_design

        design = hierarchical_design(self.spec.hierarchy, self.spec.intra_node)
        flat = replace(self.spec, hierarchy="flat")

        def bind_inter(inter, s, r):
            return GradientCommunicator(inter, flat).bound_call(collective, s, r)

        key = ("hierarchical", collective, send.data_ptr(), recv.data_ptr())
        key += (send.numel(), recv.numel(), send.dtype)
        if self.compresses(collective):  # the uncompressed routes take tensors
            send, recv = host_view(send), host_view(recv)
        self._cached(
            key, lambda: design(self.comm, self.layout, collective, send, recv, bind_inter)
        )()

    def bound_call(self, collective: str, send, recv):
        """`collective` from send into recv as one callable: the bound compressed
        collective where this communicator compresses it (its breakdown and raw bytes
        with it), else a call of the uncompressed route."""
        if self.layout is None and not self.torch_calls and self.compresses(collective):
            from ccbench.collectives.compressed import bind_compressed

            options = self.spec.compression.bind_options(self.kind)
            return bind_compressed(
                self.comm, self.kind, collective, self.codec, send, recv, **options
            )
        return lambda: self.run(collective, send, recv)

    def _compressed(self, collective: str, send, recv) -> None:
        from ccbench.collectives.compressed import bind_compressed

        options = self.spec.compression.bind_options(self.kind)
        key = (collective, send.data_ptr(), send.numel(), recv.numel(), send.dtype)
        send, recv = host_view(send), host_view(recv)
        bound = self._cached(
            key,
            lambda: bind_compressed(
                self.comm, self.kind, collective, self.codec, send, recv, **options
            ),
        )
        bound.recvbuf = recv  # a fresh output of the same length: retarget, keep the slots
        bound()

    def _library(self, collective: str, send, recv) -> None:
        """The transport library's own collective (MPI's, NCCL's, gloo's), bound once per
        buffer. Where this rank's input lies inside the output (FSDP's in-place
        all-gather, an allreduce in place) the library's in-place form runs, where it has
        one (MPI on host memory); else a collective that runs in place reads a copy."""
        comm, described = self.comm, spec(collective)
        if _aliases(send, recv):
            in_place = comm.in_place_call(collective, recv)
            if in_place is not None:
                in_place()
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

    def _ring(self, collective: str, send, recv) -> None:
        described = spec(collective)
        key = ("ring-scratch", collective, send.dtype, send.device, send.numel())
        scratch = self._cached(key, lambda: ring_scratch(described, send, self.comm.size))
        ring_collective(self.comm, described, send, recv, scratch)

    def _omnireduce(self, collective: str, buf, _) -> None:
        """OmniReduce (an allreduce) reads its input while results arrive: a persistent
        output per buffer, copied back."""
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


def host_view(t):
    """A host tensor as a numpy array on the same memory (zero-copy): ccbench's
    collectives and codecs run on it with numpy's per-call costs, not torch's (a tensor
    view and dispatch per block and chunk: 0.1-0.3 ms a call). Tensors on a device, and
    dtypes numpy lacks (bfloat16), as they are."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.dtype == torch.bfloat16:
        return t
    return t.detach().numpy()


def _aliases(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class ErrorFeedback:
    """Residual memory per buffer: g += r before sending; r = g - decode(encode(g))."""

    def __init__(self, gradient_comm: GradientCommunicator):
        self.gradient_comm = gradient_comm
        self.residuals: dict = {}

    def residual(self, key, like):
        """The residual kept for this buffer (zeros the first time)."""
        residual = self.residuals.get(key)
        if residual is None or residual.shape != like.shape:
            residual = self.residuals[key] = torch.zeros_like(like)
        return residual

    def apply(self, key, grad, blocks: int) -> None:
        """g += r; r = g - decode(encode(g)), in `blocks` blocks as the ring encodes them."""
        residual = self.residual(key, grad)
        grad.add_(residual)
        self.gradient_comm.roundtrip(grad, residual, blocks)
        torch.sub(grad, residual, out=residual)

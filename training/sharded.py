"""A compact FSDP / ZeRO-3-style trainer over ccbench's collectives.

Every parameter of the model is a view of one flat buffer, padded so that P equal
shards cover it; gradients are views of a second flat buffer of the same layout. Rank r
owns shard r: the master copy of those parameters and their optimizer state. One step:

1. allgather the parameter shards into the flat parameter buffer (communication),
2. forward and backward on this rank's slice of the global batch (compute; autograd
   accumulates straight into the flat gradient buffer),
3. reduce-scatter the flat gradients into this rank's gradient shard, divided by P
   (communication), optionally after adding the error-feedback residual,
4. optimizer step on the shard (compute).

The two collectives are ccbench's, bound and run by the gradient communicator
(training/gradient_comm.py, as every trainer's): the baseline (MPI library or
hand-written ring), the point-to-point compressed ring or the collective-level compressed
ring, with any codec; its error feedback too.

What it leaves out of PyTorch FSDP, on purpose: one flat unit instead of one per
module, so no prefetch of the next unit's allgather behind compute, and the gathered
parameters stay allocated (these models are small). The communication volume per step
is FSDP's (one allgather of the parameters, one reduce-scatter of the gradients).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ccbench.collectives.compression import UNCOMPRESSED, Compression
from ccbench.training.gradient_comm import ErrorFeedback, GradientCommSpec, GradientCommunicator

# ----------------------------------------------------------------------- flat layout


class FlatParameters:
    """The model's parameters and gradients as views of two flat float32 buffers.

    The length is padded up to a multiple of ``size * align`` so every rank's shard has
    the same number of elements, a multiple of ``align`` (codec block sizes divide it).
    """

    def __init__(self, model: nn.Module, size: int, align: int = 256):
        params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in params)
        quantum = size * align
        self.padded = -(-self.numel // quantum) * quantum
        self.shard_numel = self.padded // size
        self.params = torch.zeros(self.padded, dtype=torch.float32)
        self.grads = torch.zeros(self.padded, dtype=torch.float32)
        offset = 0
        for p in params:
            n = p.numel()
            self.params[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = self.params[offset : offset + n].view_as(p)
            # A .grad that already exists is accumulated into in place by autograd.
            p.grad = self.grads[offset : offset + n].view_as(p)
            offset += n
        self._model_params = params

    def shard(self, buffer: torch.Tensor, rank: int) -> torch.Tensor:
        return buffer[rank * self.shard_numel : (rank + 1) * self.shard_numel]

    def check_grad_views(self) -> None:
        """Autograd must have accumulated into the views, not replaced them."""
        for p in self._model_params:
            if p.grad is None or p.grad.untyped_storage().data_ptr() != (
                self.grads.untyped_storage().data_ptr()
            ):
                raise RuntimeError("a gradient left the flat buffer (was zero_grad called?)")


# ----------------------------------------------------------------------- trainer


@dataclass
class StepRecord:
    """One step of any trainer (training/frameworks.py has the others). ``comm_us`` is the
    communication the step waited for (compute_us = step_us - comm_us); the collectives'
    own times may overlap compute where a trainer overlaps them."""

    loss: float
    step_us: float
    allgather_us: float
    compute_us: float
    reduce_scatter_us: float
    wire_bytes: int
    forward_us: float = 0.0
    backward_us: float = 0.0
    optimizer_us: float = 0.0
    comm_us: float = 0.0
    allreduce_us: float = 0.0
    comm_busy_us: float = 0.0
    strategy: int = 0  # index of the MG-WFBP strategy this step ran


class ShardedTrainer:
    """ZeRO-3-style data parallelism with flat parameter shards over ccbench collectives."""

    def __init__(
        self,
        model: nn.Module,
        comm,
        *,
        variant: str = "baseline",
        algorithm: str = "mpi",
        compression: Compression = UNCOMPRESSED,
        compress: str = "both",
        lr: float = 1e-3,
        clip: float = 0.0,
    ):
        self.model, self.comm, self.clip = model, comm, clip
        self.flat = FlatParameters(model, comm.size)
        own = self.flat.shard(self.flat.params, comm.rank)
        # The master shard: optimizer state lives only for these elements.
        self.shard = nn.Parameter(own.clone())
        self.shard.grad = torch.zeros_like(self.shard)
        self.optimizer = torch.optim.Adam([self.shard], lr=lr)
        self.gradient_comm = GradientCommunicator(
            comm, GradientCommSpec(variant, algorithm, compression, compress)
        )
        # the codec's error on this rank's compensated gradient, shard by shard as the
        # ring encodes them (GRACE's residual memory); the compressed ring also
        # recompresses partial sums, whose error is not fed back
        self.feedback = ErrorFeedback(self.gradient_comm) if compression.error_feedback else None

    @property
    def residual(self) -> torch.Tensor | None:
        """The error-feedback residual of the flat gradients (None without feedback)."""
        return None if self.feedback is None else self.feedback.residual("flat", self.flat.grads)

    def step(self, loss_fn: Callable[[nn.Module], torch.Tensor]) -> StepRecord:
        """One training step; ``loss_fn(model)`` is this rank's mean loss on its batch."""
        comm, flat = self.comm, self.flat
        comm.reset_wire_bytes()
        t0 = time.perf_counter()
        self.gradient_comm.allgather(self.shard.data, flat.params)
        t1 = time.perf_counter()
        flat.grads.zero_()
        loss = loss_fn(self.model)
        t_forward = time.perf_counter()
        loss.backward()
        if self.feedback is not None:
            self.feedback.apply("flat", flat.grads, comm.size)
        t2 = time.perf_counter()
        self.gradient_comm.reduce_scatter(flat.grads, self.shard.grad)
        t3 = time.perf_counter()
        self.shard.grad.div_(comm.size)
        clip_us = self._clip_gradients() if self.clip > 0 else 0.0
        self.optimizer.step()
        t4 = time.perf_counter()
        ag, rs = (t1 - t0) * 1e6, (t3 - t2) * 1e6 + clip_us
        total = (t4 - t0) * 1e6
        return StepRecord(
            float(loss.detach()),
            total,
            ag,
            total - ag - rs,
            rs,
            comm.wire_bytes,
            forward_us=(t_forward - t1) * 1e6,
            backward_us=(t2 - t_forward) * 1e6,
            optimizer_us=(t4 - t3) * 1e6 - clip_us,
            comm_us=ag + rs,
            comm_busy_us=ag + rs,
        )

    def _clip_gradients(self) -> float:
        """Clip the global gradient norm; the tiny allreduce is counted as communication."""
        t0 = time.perf_counter()
        local = np.array([float(self.shard.grad.double().square().sum())])
        total = self.comm.allreduce_array(local)
        elapsed = (time.perf_counter() - t0) * 1e6
        norm = float(np.sqrt(total[0]))
        if norm > self.clip:
            self.shard.grad.mul_(self.clip / norm)
        return elapsed

    def gather_exact_parameters(self) -> None:
        """Fill the model with the exact master shards (uncompressed, for evaluation)."""
        self.comm.library_call("allgather", self.shard.data, self.flat.params)()

    def exact_model(self) -> nn.Module:
        self.gather_exact_parameters()
        return self.model

    def final_parameters(self) -> np.ndarray:
        return self.flat.params[: self.flat.numel].numpy().copy()

    def close(self) -> None:
        pass

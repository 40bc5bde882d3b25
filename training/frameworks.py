"""Trainers on stock PyTorch: FSDP2 and DDP with ccbench's collectives, and MG-WFBP driven
by a real backward pass.

Every trainer takes a ``gradient_comm.GradientCommunicator`` (which variant and codec carry the
traffic) and a ``comm_stream.CommStream`` (the communication thread), and its ``step``
returns a ``sharded.StepRecord`` with the same fields as the compact trainer's:

- forward_us, backward_us: wall time of the forward pass and of ``loss.backward()``
  (including any communication waited for inside them), optimizer_us: the optimizer;
- comm_us: the communication the training thread *waited for* (exposed, not hidden
  behind compute), so step = compute + comm;
- allgather_us, reduce_scatter_us, allreduce_us: time inside each kind of collective on
  the stream, overlapped or not (comm_busy_us is their sum);
- wire_bytes: what this rank sent, counted by the communicator (0 where MPI or gloo moves
  the bytes itself).

``MergedGradientTrainer`` keeps the gradients as views of one flat buffer in backward
order. A hook on every parameter (``register_post_accumulate_grad_hook``) counts the
gradients of each group of the planner's schedule; when a group's last gradient is ready
its allreduce goes on the stream while backward goes on. With several strategies the
steps rotate through them, so every plan trains the same model under the same load.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ccbench.kernels.errors import UsageError
from ccbench.training.comm_stream import CommStream
from ccbench.training.gradient_comm import ErrorFeedback, GradientCommunicator
from ccbench.training.sharded import StepRecord
from ccbench.training.torch_hooks import DDPHook, set_fsdp_comms

FRAMEWORKS = ("own", "fsdp", "ddp", "mgwfbp")


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules FSDP wraps one by one: the items of every ModuleList (transformer
    blocks), else every direct child that holds parameters."""
    units = [m for child in model.children() if isinstance(child, nn.ModuleList) for m in child]
    if not units:
        units = [c for c in model.children() if any(True for _ in c.parameters())]
    return units


class StreamTrainer:
    """The step shared by the trainers on a CommStream (the subclasses build the model)."""

    framework = ""

    def __init__(
        self,
        model: nn.Module,
        comm,
        gradient_comm: GradientCommunicator,
        stream: CommStream,
        lr: float,
    ):
        self.model, self.comm, self.gradient_comm, self.stream = model, comm, gradient_comm, stream
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.strategy_index = 0

    def before_backward(self) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def step(self, loss_fn: Callable[[nn.Module], torch.Tensor]) -> StepRecord:
        comm, stream = self.comm, self.stream
        stream.drain()
        self.gradient_comm.check()  # a codec's deferred range check, outside the collectives
        comm.reset_wire_bytes()
        stream.reset_counters()
        # on a GPU the phases' host clocks wait for the device's queued work (a step's
        # phases, not a timed collective)
        settle = _settler(self.model)
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(self.model)
        settle()
        t1 = time.perf_counter()
        self.before_backward()
        loss.backward()
        stream.drain()
        self.after_backward()
        settle()
        t2 = time.perf_counter()
        self.optimizer.step()
        settle()
        t3 = time.perf_counter()
        total = (t3 - t0) * 1e6
        exposed = stream.waited_s * 1e6
        busy = {k: v * 1e6 for k, v in stream.busy.items()}
        return StepRecord(
            loss=float(loss.detach()),
            step_us=total,
            allgather_us=busy.get("allgather", 0.0),
            compute_us=total - exposed,
            reduce_scatter_us=busy.get("reduce_scatter", 0.0),
            wire_bytes=comm.wire_bytes,
            forward_us=(t1 - t0) * 1e6,
            backward_us=(t2 - t1) * 1e6,
            optimizer_us=(t3 - t2) * 1e6,
            comm_us=exposed,
            allreduce_us=busy.get("allreduce", 0.0),
            comm_busy_us=sum(busy.values()),
            strategy=self.strategy_index,
        )

    def exact_model(self) -> nn.Module:
        """A module with the exact (uncompressed) parameters, for evaluation."""
        return self.model

    def final_parameters(self) -> np.ndarray:
        return (
            torch.cat([p.detach().reshape(-1) for p in self.exact_model().parameters()])
            .cpu()
            .numpy()
            .copy()
        )

    def close(self) -> None:
        self.stream.close()


def _settler(model: nn.Module):
    """A wait for the model's device (nothing on the CPU)."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return lambda: None
    return lambda: torch.cuda.synchronize(device)


def full_tensor(v):
    """The whole of a sharded parameter (others as they are). Over gloo it is gathered from
    host copies: gloo's all-gather of CUDA DTensors crashed a rank (SIGSEGV) with two ranks
    on one GPU, and host copies are what gloo moves anyway."""
    if not hasattr(v, "full_tensor"):
        return v
    import torch.distributed as dist

    if dist.get_backend() != "gloo":
        return v.full_tensor()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    global _host_mesh
    if _host_mesh is None:
        _host_mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    host = DTensor.from_local(
        v.to_local().detach().cpu(),
        _host_mesh,
        v.placements,
        run_check=False,
        shape=v.shape,
        stride=v.stride(),
    )
    return host.full_tensor().to(v.device)


_host_mesh = None  # the default group's ranks as a CPU mesh, made on first use


class FSDPTrainer(StreamTrainer):
    """PyTorch FSDP2 (``fully_shard`` on every unit and the root) with ccbench's
    all-gather and reduce-scatter set on every FSDPModule, or torch's own collectives
    (variant torch) run on the same stream. With overlap, the next unit's all-gather is
    prefetched asynchronously in forward and backward."""

    framework = "fsdp"

    def __init__(self, model, comm, gradient_comm, stream, lr, build_replica=None):
        from torch.distributed.fsdp import fully_shard

        units = shard_units(model)
        for unit in units:
            fully_shard(unit)
        fully_shard(model)
        set_fsdp_comms(model, gradient_comm, stream)
        if stream.overlap:
            for unit in [*units, model]:
                unit._set_unshard_async_op(True)
            for previous, following in zip(units, units[1:], strict=False):
                previous.set_modules_to_forward_prefetch([following])
        self.build_replica = build_replica
        super().__init__(model, comm, gradient_comm, stream, lr)

    def exact_model(self) -> nn.Module:
        """An unsharded replica with the exact parameters (the default group gathers them)."""
        self.stream.drain()
        state = {k: full_tensor(v) for k, v in self.model.state_dict().items()}
        if self.build_replica is None:
            raise RuntimeError("FSDPTrainer needs build_replica to evaluate")
        replica = self.build_replica()
        replica.load_state_dict(state)
        return replica


class DDPTrainer(StreamTrainer):
    """PyTorch DDP (default 25 MB buckets, gradients as bucket views) with a comm hook:
    ccbench's allreduce of each bucket on the stream, or torch's hooks."""

    framework = "ddp"

    def __init__(
        self,
        model,
        comm,
        gradient_comm,
        stream,
        lr,
        torch_hook: str = "none",
        bucket_cap_mb: float | None = None,
        powersgd_rank: int = 4,
    ):
        from torch.nn.parallel import DistributedDataParallel

        kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        device = next(model.parameters()).device
        if device.type == "cuda":  # a single-device module on the rank's GPU
            kwargs["device_ids"] = [device.index]
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True, **kwargs)
        self.module = model
        self.hook = DDPHook(
            None if gradient_comm.torch_calls else gradient_comm, stream, torch_hook, powersgd_rank
        )
        ddp.register_comm_hook(state=None, hook=self.hook.hook)
        super().__init__(ddp, comm, gradient_comm, stream, lr)

    def exact_model(self) -> nn.Module:
        return self.module


# ----------------------------------------------------------------------- MG-WFBP


def measure_profile(
    model: nn.Module, loss_fn, comm, iterations: int = 5, warmup: int = 2, name: str = "model"
):
    """This model's layer profile on its real backward pass (no communication), in
    backward order, averaged over iterations and ranks so every rank plans the same
    schedule (``training.profiler.backward_stamps``). Returns the profile and the
    parameter indices in backward order; the weights are not changed."""
    from ccbench.collectives.mgwfbp import Profile
    from ccbench.training.profiler import backward_stamps

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    order, gaps, forward_ns = backward_stamps(model, loss_fn, warmup, iterations)
    order = comm.bcast_obj(order, root=0)  # the same layout everywhere
    local = np.concatenate([[forward_ns.mean()], gaps.mean(axis=0)]) / 1e3
    if len(local) != len(order) + 1:
        raise UsageError("ranks disagree on the model's gradients")
    mean = comm.allreduce_array(local) / comm.size
    nbytes = [params[n].numel() * params[n].element_size() for n in order]
    profile = Profile.from_arrays(
        name, nbytes, np.maximum(mean[1:], 0.0), float(mean[0]), params=order
    )
    return profile, [names.index(n) for n in order]


class MergedGradientTrainer(StreamTrainer):
    """Data parallelism whose gradient allreduces follow MG-WFBP's schedule (or another
    strategy of ``collectives.mgwfbp``), launched from gradient-ready hooks."""

    framework = "mgwfbp"

    def __init__(self, model, comm, gradient_comm, stream, lr):
        super().__init__(model, comm, gradient_comm, stream, lr)
        self.feedback = (
            ErrorFeedback(gradient_comm) if gradient_comm.spec.compression.error_feedback else None
        )
        self.plans: list = []
        self.params: list[nn.Parameter] = []
        self.flat = None
        self._remaining: list[int] = []
        self._group_of: dict[int, int] = {}
        self._handles: list = []

    def prepare(self, profile, order: list[int], plans: list) -> None:
        """Lay the gradients out in backward order and arm the hooks for ``plans``."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = [params[i] for i in order]
        self.plans = plans
        total = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(total, dtype=self.params[0].dtype, device=self.params[0].device)
        self.edges = np.concatenate(([0], np.cumsum([p.numel() for p in self.params])))
        for i, p in enumerate(self.params):
            p.grad = self.flat[self.edges[i] : self.edges[i + 1]].view_as(p)
        self._position = {id(p): i for i, p in enumerate(self.params)}
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def _groups(self):
        return self.plans[self.strategy_index].groups

    def before_backward(self) -> None:
        groups = self._groups()
        self._remaining = [b - a for a, b in groups]
        self._group_of = {i: g for g, (a, b) in enumerate(groups) for i in range(a, b)}

    def _ready(self, p) -> None:
        g = self._group_of[self._position[id(p)]]
        self._remaining[g] -= 1
        if self._remaining[g] == 0:
            a, b = self._groups()[g]
            chunk = self.flat[self.edges[a] : self.edges[b]]
            key = (self.strategy_index, g)

            def run():
                if self.feedback is not None:  # residual memory per group of each plan
                    self.feedback.apply(key, chunk, self.comm.size)
                self.gradient_comm.allreduce(chunk)

            self.stream.submit(run, "allreduce", tensor=chunk, label=f"group {g}")

    def after_backward(self) -> None:
        self.flat.div_(self.comm.size)

    def step(self, loss_fn):
        # gradients stay allocated as views of the flat buffer: zero them, never free them
        zero = self.optimizer.zero_grad
        self.optimizer.zero_grad = lambda set_to_none=True: self.flat.zero_()
        try:
            record = super().step(loss_fn)
        finally:
            self.optimizer.zero_grad = zero
        for p in self.params:
            if p.grad is None or p.grad.untyped_storage().data_ptr() != (
                self.flat.untyped_storage().data_ptr()
            ):
                raise RuntimeError("a gradient left the flat buffer")
        self.strategy_index = (self.strategy_index + 1) % max(1, len(self.plans))
        return record

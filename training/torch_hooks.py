"""ccbench's collectives inside stock PyTorch: FSDP2 custom collectives and a DDP comm hook.

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

Each hook hands its tensors to a ``GradientCommunicator`` (``training.gradient_comm``) on a
``CommStream`` (``training.comm_stream``).
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from ccbench.kernels.errors import UsageError
from ccbench.training.comm_stream import CommStream, StreamWork
from ccbench.training.gradient_comm import ErrorFeedback, GradientCommunicator

TORCH_HOOKS = ("none", "fp16", "bf16", "powersgd")


def _is_avg(op) -> bool:
    return op is not None and op == dist.ReduceOp.AVG


# ----------------------------------------------------------------------- FSDP2


class _FSDPComm:
    """What FSDP's two custom collectives share. ``allocate`` keeps one buffer per size:
    the all-gather's output (FSDP copies the parameters out of it before the group's next
    all-gather) and the reduce-scatter's input (FSDP copies the gradients into it), so
    the same buffers, and the collectives bound to them, serve step after step."""

    def __init__(
        self,
        gradient_comm: GradientCommunicator,
        stream: CommStream,
        name: str = "",
        feedback: ErrorFeedback | None = None,
    ):
        self.gradient_comm, self.stream = gradient_comm, stream
        self.name, self.feedback = name, feedback
        self._buffers: dict = {}

    def allocate(self, size, *, dtype, device):
        key = (tuple(size), dtype, device)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(size, dtype=dtype, device=device)
        return self._buffers[key]


class CcbenchAllGather(_FSDPComm, AllGather):
    """FSDP2's all-gather through a GradientCommunicator, in place (the input is this rank's block
    of the output)."""

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        ticket = self.stream.submit(
            lambda: self.gradient_comm.allgather(input_tensor, output_tensor),
            "allgather",
            tensor=output_tensor,
            label=self.name or "root",
            blocking=not async_op,
        )
        if async_op:
            return StreamWork(self.stream, ticket)
        self.stream.wait(ticket)
        return None


class CcbenchReduceScatter(_FSDPComm, ReduceScatter):
    """FSDP2's reduce-scatter through a GradientCommunicator; ``op`` SUM or AVG.

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
        size = self.gradient_comm.comm.size
        avg = _is_avg(op)

        def run():
            if self.feedback is not None:
                self.feedback.apply((self.name, input_tensor.numel()), input_tensor, size)
            self.gradient_comm.reduce_scatter(input_tensor, output_tensor)
            if avg:
                output_tensor.div_(size)

        ticket = self.stream.submit(
            run,
            "reduce_scatter",
            tensor=input_tensor,
            label=self.name or "root",
            blocking=not (async_op or self.stream.overlap),
        )
        if async_op:
            return StreamWork(self.stream, ticket)
        if self.stream.overlap:
            self.stream.drain_after_backward()
            return None
        self.stream.wait(ticket)
        return None


def set_fsdp_comms(model, gradient_comm: GradientCommunicator, stream: CommStream) -> int:
    """Give every FSDPModule under ``model`` its own ccbench all-gather and reduce-scatter
    (each module has its own parameter group: set on the root alone, they are never
    called). Returns how many modules were set."""
    from torch.distributed.fsdp import FSDPModule

    feedback = (
        ErrorFeedback(gradient_comm) if gradient_comm.spec.compression.error_feedback else None
    )
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(CcbenchAllGather(gradient_comm, stream, name))
            module.set_custom_reduce_scatter(
                CcbenchReduceScatter(gradient_comm, stream, name, feedback)
            )
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

    def __init__(
        self,
        gradient_comm: GradientCommunicator | None,
        stream: CommStream,
        torch_hook: str = "none",
        powersgd_rank: int = 4,
    ):
        self.gradient_comm, self.stream = gradient_comm, stream
        self.torch_hook = torch_hook
        self.feedback = (
            ErrorFeedback(gradient_comm)
            if gradient_comm is not None and gradient_comm.spec.compression.error_feedback
            else None
        )
        self._inner = None
        self._state = None
        if gradient_comm is None:
            self._inner, self._state = _torch_hook(torch_hook, powersgd_rank)
        self._futures: list = []

    def hook(self, state, bucket):  # noqa: ARG002 - state is carried here
        if self.gradient_comm is None:
            future = self._inner(self._state, bucket)
            self._futures.append(future)
            self._queue_wait()
            return future
        buf = bucket.buffer()
        size = self.gradient_comm.comm.size
        # on a GPU the future carries the communication stream's completion to DDP's
        # stream (set on that stream by the comm thread), not only to the host
        future = torch.futures.Future(devices=[buf.device] if buf.is_cuda else None)
        index = (bucket.index(), buf.data_ptr())  # DDP rebuilds its buckets once

        def run():
            try:
                if self.feedback is not None:
                    self.feedback.apply(index, buf, size)
                self.gradient_comm.allreduce(buf)
                buf.div_(size)
                future.set_result(buf)
            except BaseException as exc:  # noqa: BLE001 - DDP's wait raises it
                future.set_exception(exc)
                raise

        self.stream.submit(run, "allreduce", tensor=buf, label=f"bucket {bucket.index()}")
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
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
        )
        return powerSGD_hook.powerSGD_hook, state
    raise UsageError(f"unknown torch hook {name!r}; choose from {', '.join(TORCH_HOOKS)}")

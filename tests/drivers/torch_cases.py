"""Cases for tests/test_torch_training.py: stock FSDP2 and DDP steps on ccbench's collectives.

Run on 2 ranks (``python -m tests.drivers.torch_cases``); rank 0 prints one JSON line per
case. Every collective FSDP or DDP hands to ccbench is checked, on the same inputs, against
torch.distributed's own collective (gloo): the largest error and the codec's stated bound
for those inputs are reported, so the test can assert error <= bound.
"""

from __future__ import annotations

import json
import math

from ccbench.benchmarks.options import compression_of

VARIANTS = [  # (variant, algorithm, codec, compress, error feedback)
    ("baseline", "mpi", "none", "both", False),
    ("baseline", "ring", "none", "both", False),
    ("p2p_compressed", "ring", "fp16", "both", False),
    ("coll_compressed", "ring", "fp16", "both", False),
    ("coll_compressed", "ring", "bfp:rate=8", "both", True),
    ("p2p_compressed", "ring", "bf16", "grads", False),
]
DDP_ONLY = [("sparse_streaming", "mpi", "none", "both", False)]
TORCH_HOOKS = ["none", "fp16", "bf16", "powersgd"]
STEPS = 3


def case_id(
    framework, variant, algorithm, codec, compress="both", feedback=False, overlap=True
) -> str:
    return "-".join(
        map(str, (framework, variant, algorithm, codec, compress, int(feedback), int(overlap)))
    )


def checked_transport(comm, spec):
    """A GradientCommunicator that compares each result with gloo's on a copy of the same inputs."""
    import torch
    import torch.distributed as dist

    from ccbench.training.gradient_comm import GradientCommunicator

    class Checked(GradientCommunicator):
        checks: list = []

        def _amaxes(self, x) -> list[float]:
            mine = torch.tensor([float(x.abs().max()) if x.numel() else 0.0])
            out = torch.empty(comm.size)
            dist.all_gather_into_tensor(out, mine)
            return out.tolist()

        def _check(self, collective, run, inp, got, reference):
            """Run ours, then torch's on the saved input, and record the difference."""
            inp = inp.clone()
            amaxes = self._amaxes(inp)
            run()
            want = reference(inp)
            bound = self.error_bound(collective, amaxes)
            err = float((got - want).abs().max()) if got.numel() else 0.0
            # lossless: exact up to float32 summation order
            limit = bound if bound is not None else 1e-6 * max(1.0, sum(amaxes))
            self.checks.append(
                {
                    "collective": collective,
                    "err": err,
                    "limit": limit,
                    "exact": bound is None,
                    "n": int(got.numel()),
                }
            )

        def allgather(self, send, recv):
            def reference(inp):
                want = torch.empty_like(recv)
                dist.all_gather_into_tensor(want, inp)
                return want

            self._check(
                "allgather",
                lambda: super(Checked, self).allgather(send, recv),
                send,
                recv,
                reference,
            )

        def reduce_scatter(self, send, recv):
            def reference(inp):
                want = torch.empty_like(recv)
                dist.reduce_scatter_tensor(want, inp)
                return want

            self._check(
                "reduce_scatter",
                lambda: super(Checked, self).reduce_scatter(send, recv),
                send,
                recv,
                reference,
            )

        def allreduce(self, buf):
            def reference(inp):
                dist.all_reduce(inp)
                return inp

            self._check(
                "allreduce", lambda: super(Checked, self).allreduce(buf), buf, buf, reference
            )

    return Checked(comm, spec)


def run_case(
    comm,
    task,
    framework,
    variant,
    algorithm,
    codec,
    compress,
    feedback,
    overlap=True,
    torch_hook="none",
):
    import torch

    from ccbench.training import frameworks
    from ccbench.training.comm_stream import CommStream
    from ccbench.training.gradient_comm import GradientCommSpec
    from ccbench.training.models import build_model

    spec = GradientCommSpec(
        variant=variant,
        algorithm=algorithm,
        compression=compression_of(codec, variant=variant, error_feedback=feedback),
        compress=compress,
    )
    transport = checked_transport(comm, spec)
    transport.checks = []
    stream = CommStream(overlap=overlap)
    model = build_model(task, 0)
    if framework == "fsdp":
        trainer = frameworks.FSDPTrainer(
            model, comm, transport, stream, 1e-3, build_replica=lambda: build_model(task, 0)
        )
    else:
        trainer = frameworks.DDPTrainer(model, comm, transport, stream, 1e-3, torch_hook)
    batch = task.default_batch
    lo, hi = batch * comm.rank // comm.size, batch * (comm.rank + 1) // comm.size
    losses, wire = [], []
    try:
        for step in range(1, STEPS + 1):
            inputs = task.batch(0, step, batch, lo, hi)
            record = trainer.step(lambda m, b=inputs: task.loss(m, b))
            losses.append(record.loss)
            wire.append(record.wire_bytes)
        params = trainer.final_parameters()
    finally:
        trainer.close()
    checks = transport.checks
    worst = max(
        (
            c["err"] / c["limit"] if c["limit"] > 0 else (0.0 if c["err"] == 0 else math.inf)
            for c in checks
        ),
        default=0.0,
    )
    return {
        "losses": losses,
        "wire": wire,
        "calls": len(checks),
        "kinds": sorted({c["collective"] for c in checks}),
        "worst_ratio": worst,
        "all_exact": all(c["exact"] for c in checks),
        "params_sum": float(torch.from_numpy(params).double().abs().sum()),
        "params": params,
    }


def driver() -> int:
    import numpy as np
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator
    from ccbench.training.models import make_task
    from ccbench.training.rendezvous import init_torch_distributed

    comm = Communicator(MPI.COMM_WORLD)
    init_torch_distributed(comm)
    task = make_task("lm-tiny")
    results = {}

    def emit(case, fields):
        if comm.rank == 0:
            fields = {k: v for k, v in fields.items() if k != "params"}
            print(json.dumps({"case": case, **fields}), flush=True)

    for framework in ("fsdp", "ddp"):
        reference = run_case(comm, task, framework, "torch", "mpi", "none", "both", False)
        results[framework] = reference
        emit(case_id(framework, "torch", "mpi", "none"), reference)
        cases = VARIANTS + (DDP_ONLY if framework == "ddp" else [])
        for variant, algorithm, codec, compress, feedback in cases:
            got = run_case(comm, task, framework, variant, algorithm, codec, compress, feedback)
            got["param_diff"] = float(np.abs(got["params"] - reference["params"]).max())
            emit(case_id(framework, variant, algorithm, codec, compress, feedback), got)
        # the same step without the communication thread
        got = run_case(
            comm, task, framework, "coll_compressed", "ring", "fp16", "both", False, overlap=False
        )
        emit(case_id(framework, "coll_compressed", "ring", "fp16", overlap=False), got)
    for hook in TORCH_HOOKS[1:]:
        got = run_case(comm, task, "ddp", "torch", "mpi", "none", "both", False, torch_hook=hook)
        got["param_diff"] = float(np.abs(got["params"] - results["ddp"]["params"]).max())
        emit(case_id("ddp", "torch", "mpi", hook), got)
    _accumulation_case(comm, task, emit)
    _mgwfbp_case(comm, task, emit)


def _accumulation_case(comm, task, emit):
    """FSDP accumulating gradients over two micro-batches (no zero_grad between them, so
    FSDP adds the second reduce-scatter's output to the gradient the first one left):
    against stock FSDP with its own collectives."""
    import numpy as np
    from torch.distributed.fsdp import fully_shard

    from ccbench.training import frameworks
    from ccbench.training.comm_stream import CommStream
    from ccbench.training.gradient_comm import GradientCommSpec, GradientCommunicator
    from ccbench.training.models import build_model

    def accumulate(model):
        for step in (1, 2):
            batch = task.batch(0, step, task.default_batch, comm.rank * 8, comm.rank * 8 + 8)
            task.loss(model, batch).backward()
        return np.concatenate([p.grad.to_local().reshape(-1).numpy() for p in model.parameters()])

    stock = build_model(task, 0)
    for unit in frameworks.shard_units(stock):
        fully_shard(unit)
    fully_shard(stock)
    want = accumulate(stock)
    transport = GradientCommunicator(comm, GradientCommSpec(variant="baseline", algorithm="ring"))
    trainer = frameworks.FSDPTrainer(
        build_model(task, 0), comm, transport, CommStream(overlap=False), 1e-3
    )
    got = accumulate(trainer.model)
    trainer.close()
    emit(
        "fsdp-accumulate",
        {"diff": float(np.abs(want - got).max()), "norm": float(np.abs(want).max())},
    )


def _mgwfbp_case(comm, task, emit):
    """Every strategy, rotated step by step, on the real backward pass; against DDP."""
    import numpy as np

    from ccbench.collectives.costmodel import AlphaBeta
    from ccbench.training.loop import TrainConfig, build_trainer, run_training

    config = TrainConfig(
        model="lm-tiny",
        framework="mgwfbp",
        variant="baseline",
        algorithm="ring",
        steps=STEPS * 2,
        warmup=0,
        strategy="all",
        profile_iterations=2,
    )
    trainer = build_trainer(comm, config, task, cost=lambda t, p: AlphaBeta(100.0, 1e-3))
    result = run_training(comm, config, task=task, trainer=trainer, keep_params=True)
    ddp = TrainConfig(
        model="lm-tiny",
        framework="ddp",
        variant="baseline",
        algorithm="ring",
        steps=STEPS * 2,
        warmup=0,
    )
    reference = run_training(comm, ddp, task=task, keep_params=True)
    emit(
        "mgwfbp",
        {
            "losses": [float(x) for x in result.loss],
            "strategies": result.strategies,
            "per_step": [int(x) for x in result.strategy],
            "groups": result.plan_groups,
            "predicted": result.predicted_us,
            "ddp_losses": [float(x) for x in reference.loss],
            "param_diff": float(np.abs(result.final_params - reference.final_params).max()),
            "tensors": trainer.profile.ntensors,
            "nparams": len(list(trainer.model.parameters())),
            "wire": [float(x) for x in result.wire_bytes],
            "ddp_wire": [float(x) for x in reference.wire_bytes],
            "exposed": [float(x) for x in result.times["comm_us"]],
            "steps": [float(x) for x in result.times["step_us"]],
        },
    )


if __name__ == "__main__":
    raise SystemExit(driver())

"""Error feedback reaches every gradient, in each trainer that keeps a residual memory.

Run on 2 ranks (``python -m tests.drivers.feedback_cases``); rank 0 prints one JSON line
per case: the gradient elements `ErrorFeedback.apply` compensated in each step (a
recording wrapper counts them) and the model's trainable parameters, for FSDP2's
reduce-scatter hook, DDP's comm hook and MG-WFBP's merged allreduces, with error feedback
on and off.
"""

from __future__ import annotations

import json

from ccbench.benchmarks.options import compression_of

FRAMEWORKS = ("fsdp", "ddp", "mgwfbp")
STEPS = 2


def driver() -> int:
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator
    from ccbench.collectives.costmodel import AlphaBeta
    from ccbench.training import gradient_comm
    from ccbench.training.loop import TrainConfig, build_trainer, run_training
    from ccbench.training.models import make_task, parameter_count
    from ccbench.training.rendezvous import init_torch_distributed

    comm = Communicator(MPI.COMM_WORLD)
    init_torch_distributed(comm)
    task = make_task("lm-tiny")
    applied: list[int] = []
    original = gradient_comm.ErrorFeedback.apply

    def recording_apply(self, key, grad, blocks):
        applied.append(int(grad.numel()))
        return original(self, key, grad, blocks)

    gradient_comm.ErrorFeedback.apply = recording_apply
    try:
        for framework in FRAMEWORKS:
            for feedback in (True, False):
                applied.clear()
                config = TrainConfig(
                    model="lm-tiny",
                    framework=framework,
                    variant="coll_compressed",
                    algorithm="ring",
                    compression=compression_of(
                        "bfp:rate=8", variant="coll_compressed", error_feedback=feedback
                    ),
                    steps=STEPS,
                    warmup=0,
                    strategy="mgwfbp",
                    profile_iterations=2,
                )
                trainer = build_trainer(
                    comm, config, task, cost=lambda t, p: AlphaBeta(100.0, 1e-3)
                )
                model = trainer.model
                run_training(comm, config, task=task, trainer=trainer)
                if comm.rank == 0:
                    print(
                        json.dumps(
                            {
                                "case": f"{framework}-{int(feedback)}",
                                "applied": sum(applied),
                                "calls": len(applied),
                                "steps": STEPS,
                                "params": parameter_count(model),
                            }
                        ),
                        flush=True,
                    )
    finally:
        gradient_comm.ErrorFeedback.apply = original
    return 0


if __name__ == "__main__":
    raise SystemExit(driver())

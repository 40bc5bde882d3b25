"""The training loop of the training benchmark: configuration, steps, held-out evaluation.

Collective over every rank of the communicator; the trainer (sharded.py) does the
allgather / reduce-scatter through ccbench's collectives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ccbench.kernels.errors import UsageError

STEP_FIELDS = ("step_us", "allgather_us", "compute_us", "reduce_scatter_us")


@dataclass
class TrainConfig:
    model: str = "lm-small"
    variant: str = "baseline"
    algorithm: str = "mpi"
    codec: str = "none"
    compress: str = "both"
    error_feedback: bool = False
    steps: int = 100
    batch: int | None = None       # global batch; None: the model's default
    lr: float | None = None        # None: the model's default
    seed: int = 0
    warmup: int = 3                # steps left out of the timing averages
    clip: float = 0.0
    eval_every: int = 0
    final_window: int = 10
    threads: int = 1
    chunk_bytes: int | None = None  # coll_compressed pipeline chunk; None: the default


@dataclass
class TrainResult:
    """Per-step arrays (averaged over ranks) and the run's summary; same on every rank."""

    config: TrainConfig
    model_name: str
    dataset: str
    params: int
    global_batch: int
    lr: float
    unit: str
    units_per_step: int
    loss: np.ndarray                  # mean over ranks of each rank's batch loss
    times: dict[str, np.ndarray]      # STEP_FIELDS, microseconds, mean over ranks
    max_step_us: np.ndarray           # slowest rank per step
    wire_bytes: np.ndarray            # per rank per step (mean over ranks); 0 = not counted
    evals: dict[int, tuple[float, float]] = field(default_factory=dict)  # step -> (loss, acc)
    final_params: np.ndarray | None = None

    def timed(self) -> slice:
        """The steps the timing averages use: all but the first ``warmup``."""
        warmup = min(self.config.warmup, max(len(self.loss) - 1, 0))
        return slice(warmup, None)

    def summary(self) -> dict:
        t = self.timed()
        step_us = float(self.times["step_us"][t].mean())
        comm = self.times["allgather_us"][t] + self.times["reduce_scatter_us"][t]
        window = min(self.config.final_window, len(self.loss))
        wire = float(self.wire_bytes[t].mean())
        held_out = self.evals.get(len(self.loss), (None, None))
        return {
            "step_us": step_us,
            "compute_us": float(self.times["compute_us"][t].mean()),
            "comm_us": float(comm.mean()),
            "allgather_us": float(self.times["allgather_us"][t].mean()),
            "reduce_scatter_us": float(self.times["reduce_scatter_us"][t].mean()),
            "max_step_us": float(self.max_step_us[t].mean()),
            "loss": float(self.loss[-window:].mean()),
            "wire_bytes_per_rank": wire if wire > 0 else None,
            "throughput": self.units_per_step / (step_us * 1e-6),
            "held_out_loss": held_out[0],
            "held_out_accuracy": held_out[1],
        }




def evaluate(trainer, task, comm) -> tuple[float, float]:
    """Held-out mean loss and accuracy of the exact (uncompressed) parameters."""
    from ccbench.training.models import Metrics

    trainer.gather_exact_parameters()
    n = task.held_out_size()
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    trainer.model.eval()
    local: Metrics = task.evaluate(trainer.model, lo, hi)
    trainer.model.train()
    total = np.empty(3)
    comm.mpi.Allreduce(np.array([local.loss_sum, local.correct, local.count], float), total)
    return float(total[0] / total[2]), float(total[1] / total[2])


def build_trainer(comm, config: TrainConfig, task):
    """The trainer for ``config`` (raises UsageError on values it cannot run)."""
    import torch

    from ccbench.training.models import build_model
    from ccbench.training.sharded import ShardedTrainer

    torch.set_num_threads(config.threads)
    batch = config.batch or task.default_batch
    if batch % comm.size:
        raise UsageError(f"the global batch ({batch}) must divide by the ranks ({comm.size})")
    model = build_model(task, config.seed)
    return ShardedTrainer(
        model, comm, variant=config.variant, algorithm=config.algorithm, codec=config.codec,
        compress=config.compress, lr=config.lr or task.default_lr,
        error_feedback=config.error_feedback, clip=config.clip, chunk_bytes=config.chunk_bytes,
    )


def run_training(comm, config: TrainConfig, task=None, trainer=None, keep_params=False,
                 on_step=None):
    """Train ``config.steps`` steps on ``comm``; collective over all its ranks.

    ``on_step(step, loss)`` is called after every step (a progress bar, a log line).
    """
    from ccbench.training.models import make_task, parameter_count

    task = task if task is not None else make_task(config.model)
    trainer = trainer if trainer is not None else build_trainer(comm, config, task)
    model = trainer.model
    batch = config.batch or task.default_batch
    lr = config.lr or task.default_lr
    lo, hi = batch * comm.rank // comm.size, batch * (comm.rank + 1) // comm.size
    records, evals = [], {}
    for step in range(1, config.steps + 1):
        inputs = task.batch(config.seed, step, batch, lo, hi)  # the data loader's work
        records.append(trainer.step(lambda m, b=inputs: task.loss(m, b)))
        if on_step is not None:
            on_step(step, records[-1].loss)
        if step == config.steps or (config.eval_every and step % config.eval_every == 0):
            evals[step] = evaluate(trainer, task, comm)
    local = np.array(
        [[r.loss, r.step_us, r.allgather_us, r.compute_us, r.reduce_scatter_us, r.wire_bytes]
         for r in records]
    )
    mean = np.empty_like(local)
    comm.mpi.Allreduce(local, mean)
    mean /= comm.size
    slowest = np.empty(len(records))
    comm.mpi.Allreduce(np.ascontiguousarray(local[:, 1]), slowest, op=_mpi_max())
    final = trainer.flat.params[: trainer.flat.numel].numpy().copy() if keep_params else None
    return TrainResult(
        config=config, model_name=task.name, dataset=task.dataset,
        params=parameter_count(model), global_batch=batch, lr=lr, unit=task.unit,
        units_per_step=batch * task.units_per_sample(), loss=mean[:, 0],
        times=dict(zip(STEP_FIELDS, mean[:, 1:5].T, strict=True)), max_step_us=slowest,
        wire_bytes=mean[:, 5], evals=evals, final_params=final,
    )


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX

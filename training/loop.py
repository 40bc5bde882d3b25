"""The training loop of the training benchmark: configuration, steps, held-out evaluation.

Collective over every rank of the communicator. The trainer is the compact sharded one
(``--framework own``, sharded.py), stock PyTorch FSDP2 or DDP with ccbench's collectives
plugged in, or MG-WFBP on a real backward pass (``fsdp``, ``ddp``, ``mgwfbp``:
frameworks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ccbench.collectives.compression import Compression
from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError

STEP_FIELDS = (
    "step_us",
    "allgather_us",
    "compute_us",
    "reduce_scatter_us",
    "forward_us",
    "backward_us",
    "optimizer_us",
    "comm_us",
    "allreduce_us",
    "comm_busy_us",
)


@dataclass
class TrainConfig:
    model: str = "lm-small"
    framework: str = "own"  # own (training/sharded.py), fsdp, ddp, mgwfbp
    variant: str = "baseline"
    algorithm: str = "mpi"
    compression: Compression = Compression()  # codec, chunk, error feedback (parsed)
    compress: str = "both"
    steps: int = 100
    batch: int | None = None  # global batch; None: the model's default
    lr: float | None = None  # None: the model's default
    seed: int = 0
    warmup: int = 3  # steps left out of the timing averages
    clip: float = 0.0
    eval_every: int = 0
    final_window: int = 10
    threads: int = 1
    overlap: bool = True  # fsdp / ddp / mgwfbp: communication on its own thread
    strategy: str = "mgwfbp"  # mgwfbp: comma-separated strategies, rotated per step
    bucket_cap_mb: float | None = None  # ddp: None is DDP's default (25)
    powersgd_rank: int = 4
    profile_iterations: int = 5  # mgwfbp: backward passes profiled before training
    device: str = "auto"  # fsdp / ddp / mgwfbp: cpu, cuda, or auto (cuda if any)


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
    loss: np.ndarray  # mean over ranks of each rank's batch loss
    times: dict[str, np.ndarray]  # STEP_FIELDS, microseconds, mean over ranks
    max_step_us: np.ndarray  # slowest rank per step
    wire_bytes: np.ndarray  # per rank per step (mean over ranks); 0 = not counted
    evals: dict[int, tuple[float, float]] = field(default_factory=dict)  # step -> (loss, acc)
    final_params: np.ndarray | None = None
    strategy: np.ndarray | None = None  # mgwfbp: index into strategies, per step
    strategies: list[str] = field(default_factory=list)
    predicted_us: list[float] = field(default_factory=list)  # per strategy (the planner)
    predicted_exposed_us: list[float] = field(default_factory=list)  # its non-overlapped comm
    plan_groups: list[int] = field(default_factory=list)  # per strategy

    def timed(self) -> slice:
        """The steps the timing averages use: all but the first ``warmup``."""
        warmup = min(self.config.warmup, max(len(self.loss) - 1, 0))
        return slice(warmup, None)

    def summary(self, strategy: int | None = None) -> dict:
        """Means over the timed steps (of one MG-WFBP strategy's steps, if given)."""
        t = np.zeros(len(self.loss), dtype=bool)
        t[self.timed()] = True
        if strategy is not None and self.strategy is not None:
            t &= self.strategy == strategy
            if not t.any():  # too few steps: every step of the strategy
                t = self.strategy == strategy
        mean = {k: float(v[t].mean()) for k, v in self.times.items()}
        window = min(self.config.final_window, len(self.loss))
        wire = float(self.wire_bytes[t].mean())
        held_out = self.evals.get(len(self.loss), (None, None))
        out = {
            **mean,
            "max_step_us": float(self.max_step_us[t].mean()),
            "loss": float(self.loss[-window:].mean()),
            "wire_bytes_per_rank": wire if wire > 0 else None,
            "throughput": self.units_per_step / (mean["step_us"] * 1e-6),
            "held_out_loss": held_out[0],
            "held_out_accuracy": held_out[1],
        }
        if strategy is not None and self.strategies:
            out["strategy"] = self.strategies[strategy]
            out["predicted_us"] = self.predicted_us[strategy]
            out["predicted_exposed_us"] = self.predicted_exposed_us[strategy]
            out["groups"] = self.plan_groups[strategy]
        return out

    def summaries(self) -> list[dict]:
        """One summary, or one per MG-WFBP strategy."""
        if not self.strategies:
            return [self.summary()]
        return [self.summary(k) for k in range(len(self.strategies))]


def evaluate(trainer, task, comm) -> tuple[float, float]:
    """Held-out mean loss and accuracy of the exact (uncompressed) parameters."""
    from ccbench.training.models import Metrics

    model = trainer.exact_model()
    n = task.held_out_size()
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    model.eval()
    local: Metrics = task.evaluate(model, lo, hi)
    model.train()
    total = comm.allreduce_array(np.array([local.loss_sum, local.correct, local.count], float))
    return float(total[0] / total[2]), float(total[1] / total[2])


DEVICES = ("auto", "cpu", "cuda")


def training_device(config: TrainConfig, local_rank: int):
    """The device the model trains on: the node-local rank's GPU for the stock-PyTorch
    trainers when there is one (--device auto), else the CPU; the compact trainer keeps
    its model on the CPU."""
    import torch

    if config.device not in DEVICES:
        raise UsageError(f"--device {config.device}: choose one of {', '.join(DEVICES)}")
    stock = config.framework in ("fsdp", "ddp", "mgwfbp")
    if config.device == "cuda" and not stock:
        raise UsageError(
            "--device cuda: the compact trainer (--framework own) runs on the "
            "CPU; use --framework fsdp, ddp or mgwfbp"
        )
    if config.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device on this host")
    if config.device == "cpu" or not stock or not torch.cuda.is_available():
        return torch.device("cpu")
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def to_device(batch, device):
    """A batch (a tensor or a tuple of them) on the model's device."""
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    return batch.to(device, non_blocking=True) if hasattr(batch, "to") else batch


def build_trainer(comm, config: TrainConfig, task, cost=None):
    """The trainer for ``config`` (raises UsageError on values it cannot run).

    ``cost`` (mgwfbp only): ``cost(gradient_comm, profile) -> AlphaBeta``, the
    allreduce cost model the planner uses; the benchmark measures it through the gradient
    communicator.
    """
    import torch

    from ccbench.training.models import build_model

    torch.set_num_threads(config.threads)
    batch = config.batch or task.default_batch
    if batch % comm.size:
        raise UsageError(f"the global batch ({batch}) must divide by the ranks ({comm.size})")
    device = training_device(config, comm.local_rank)
    model = build_model(task, config.seed).to(device)
    lr = config.lr or task.default_lr
    if config.framework == "own":
        from ccbench.training.sharded import ShardedTrainer

        if config.variant not in variants.SHARDED_VARIANTS:
            raise UsageError(
                f"--variant {config.variant} runs with --framework fsdp, ddp or mgwfbp"
            )
        return ShardedTrainer(
            model,
            comm,
            variant=config.variant,
            algorithm=config.algorithm,
            compression=config.compression,
            compress=config.compress,
            lr=lr,
            clip=config.clip,
        )
    return _build_stream_trainer(comm, config, task, model, lr, cost, device)


def torch_hook_of(config: TrainConfig) -> str:
    """'none', 'fp16', 'bf16' or 'powersgd': torch's own hook of a --variant torch run."""
    return config.compression.hook


def default_group_backend(comm) -> str:
    """The backend of the default group that stock FSDP and DDP start from: under
    ``--transport torch`` the communicator's own; under MPI gloo, whatever the model's
    device. An NCCL group beside the MPI ranks would carry none of the measured traffic,
    and it aborts where two ranks share a GPU (the MPI-staged runs allow that)."""
    return comm.torch_backend or "gloo"


def _build_stream_trainer(comm, config: TrainConfig, task, model, lr, cost, device):
    from ccbench.training import frameworks
    from ccbench.training.comm_stream import CommStream
    from ccbench.training.gradient_comm import GradientCommSpec, GradientCommunicator
    from ccbench.training.rendezvous import init_torch_distributed

    if config.framework not in frameworks.FRAMEWORKS:
        raise UsageError(
            f"unknown framework {config.framework!r}; choose from "
            f"{', '.join(frameworks.FRAMEWORKS)}"
        )
    if config.clip:
        raise UsageError("--clip is implemented by --framework own only")
    torch_hook = torch_hook_of(config)
    compression = config.compression
    if config.variant == "torch":
        if config.framework != "ddp" and torch_hook != "none":
            raise UsageError(
                "torch's compression hooks (fp16, bf16, powersgd) are DDP comm "
                "hooks: use --framework ddp"
            )
        if compression.error_feedback:
            raise UsageError("--error-feedback applies to ccbench codecs (PowerSGD keeps its own)")
        compression = Compression(chunk_bytes=compression.chunk_bytes)  # the hook compresses
    if config.variant == "sparse_streaming" and config.framework == "fsdp":
        raise UsageError("sparse streaming is an allreduce: use --framework ddp or mgwfbp")
    spec = GradientCommSpec(
        variant=config.variant,
        algorithm=config.algorithm,
        compression=compression,
        compress=config.compress,
    )
    gradient_comm = GradientCommunicator(comm, spec)
    init_torch_distributed(comm, default_group_backend(comm))
    stream = CommStream(overlap=config.overlap, device=device)
    if config.framework == "fsdp":
        from ccbench.training.models import build_model

        return frameworks.FSDPTrainer(
            model,
            comm,
            gradient_comm,
            stream,
            lr,
            build_replica=lambda: build_model(task, config.seed),
        )
    if config.framework == "ddp":
        return frameworks.DDPTrainer(
            model,
            comm,
            gradient_comm,
            stream,
            lr,
            torch_hook,
            config.bucket_cap_mb,
            config.powersgd_rank,
        )
    return _build_mgwfbp(comm, config, task, model, lr, gradient_comm, stream, cost, device)


def _build_mgwfbp(comm, config, task, model, lr, gradient_comm, stream, cost, device):
    from ccbench.collectives.mgwfbp import parse_strategies, plan
    from ccbench.training.frameworks import MergedGradientTrainer, measure_profile

    strategies = parse_strategies(config.strategy)
    if cost is None:
        raise UsageError("--framework mgwfbp needs an allreduce cost model")
    batch = config.batch or task.default_batch
    lo, hi = batch * comm.rank // comm.size, batch * (comm.rank + 1) // comm.size
    inputs = to_device(task.batch(config.seed, 0, batch, lo, hi), device)  # step 0: unseen
    profile, order = measure_profile(
        model,
        lambda m: task.loss(m, inputs),
        comm,
        iterations=config.profile_iterations,
        name=task.name,
    )
    alpha_beta = cost(gradient_comm, profile)
    trainer = MergedGradientTrainer(model, comm, gradient_comm, stream, lr)
    trainer.prepare(profile, order, [plan(s, profile, alpha_beta) for s in strategies])
    trainer.profile, trainer.cost = profile, alpha_beta
    return trainer


RECORD_FIELDS = ("loss", *STEP_FIELDS, "wire_bytes", "strategy")


def run_training(
    comm, config: TrainConfig, task=None, trainer=None, keep_params=False, on_step=None
):
    """Train ``config.steps`` steps on ``comm``; collective over all its ranks.

    ``on_step(step, loss)`` is called after every step (a progress bar, a log line).
    """
    from ccbench.training.models import make_task, parameter_count

    task = task if task is not None else make_task(config.model)
    trainer = trainer if trainer is not None else build_trainer(comm, config, task)
    batch = config.batch or task.default_batch
    lr = config.lr or task.default_lr
    lo, hi = batch * comm.rank // comm.size, batch * (comm.rank + 1) // comm.size
    records, evals = [], {}
    try:
        for step in range(1, config.steps + 1):
            # the data loader's work, and its copy to the model's device
            inputs = to_device(
                task.batch(config.seed, step, batch, lo, hi), _device_of(trainer.model)
            )
            records.append(trainer.step(lambda m, b=inputs: task.loss(m, b)))
            if on_step is not None:
                on_step(step, records[-1].loss)
            if step == config.steps or (config.eval_every and step % config.eval_every == 0):
                evals[step] = evaluate(trainer, task, comm)
        final = trainer.final_parameters() if keep_params else None
    finally:
        trainer.close()
    local = np.array([[getattr(r, f) for f in RECORD_FIELDS] for r in records], dtype=float)
    mean = comm.allreduce_array(local) / comm.size
    slowest = comm.allreduce_array(np.ascontiguousarray(local[:, 1]), "max")
    column = {f: mean[:, i] for i, f in enumerate(RECORD_FIELDS)}
    plans = getattr(trainer, "plans", [])
    return TrainResult(
        config=config,
        model_name=task.name,
        dataset=task.dataset,
        params=parameter_count(trainer.model),
        global_batch=batch,
        lr=lr,
        unit=task.unit,
        units_per_step=batch * task.units_per_sample(),
        loss=column["loss"],
        times={f: column[f] for f in STEP_FIELDS},
        max_step_us=slowest,
        wire_bytes=column["wire_bytes"],
        evals=evals,
        final_params=final,
        strategy=local[:, -1].astype(int) if plans else None,
        strategies=[p.strategy for p in plans],
        predicted_us=[p.iteration_us for p in plans],
        predicted_exposed_us=[p.nonoverlapped_us for p in plans],
        plan_groups=[p.ngroups for p in plans],
    )


def _device_of(model):
    for parameter in model.parameters():
        return parameter.device
    return "cpu"

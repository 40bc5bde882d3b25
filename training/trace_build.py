"""Traces of models too large to train here: built from their shapes, on the meta device.

``build_trace`` constructs the model on PyTorch's meta device (shapes only: no weight,
activation or gradient is allocated), runs one forward and backward pass there under
``torch.utils.flop_counter.FlopCounterMode`` with hooks on every FSDP unit and every
parameter, and so learns, in execution order, when each unit's forward and backward
starts and ends and when each gradient is ready, in FLOPs since the step began. A FLOP
rate turns FLOPs into time (``--flop-rate``: a number, or a GPU's dense BF16 peak times
``--mfu``), or a measured layer profile gives the backward times instead (``--profile``).
The collectives are then laid out as the framework issues them:

- ``fsdp``: FSDP2 (``fully_shard`` on every block and on the root, as the training
  benchmark does), with forward prefetch: the root's all-gather at the start; at each
  block's forward, a wait for its all-gather and the next block's all-gather; in
  backward (blocks resharded after forward, the root not), at each block's start a
  wait for its all-gather and the previous block's; at its end its reduce-scatter; the
  root's reduce-scatter when backward ends, then the wait for them all. Sizes are
  FSDP2's: every parameter's dim 0 padded to a multiple of the ranks.
- ``ddp``: DDP's buckets (``--bucket-mb``, 25 by default, the first capped at 1 MiB,
  filled in backward order until they reach the cap), each allreduced when its last
  gradient is ready; ``--bucket-mb 0``: one allreduce per gradient (WFBP).

The optimizer (Adam, the step's tail) reads and writes 28 bytes per parameter of this
rank (parameter, gradient, two moments in float32) at ``--memory-rate``. The tests
check that the trace built for this suite's own models has the collectives, sizes and
order of the trace captured from their real FSDP2 and DDP steps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ccbench.collectives.trace import Event, Step, Trace
from ccbench.kernels.errors import UsageError

# Dense BF16 tensor-core peak (FLOP/s) and memory bandwidth (B/s) of the GPUs --flop-rate
# names (the vendors' data sheets: A100 SXM4 40GB, H100 SXM5, V100 SXM2 FP16).
GPUS = {"a100": (312e12, 1.555e12), "h100": (989e12, 3.35e12), "v100": (125e12, 0.9e12)}
DEFAULT_GPU, DEFAULT_MFU = "a100", 0.4
ADAM_BYTES_PER_PARAM = 28  # read p, g, m, v; write p, m, v (float32)
DDP_FIRST_BUCKET_BYTES = 1 << 20
DEFAULT_TOKENS_PER_RANK = 8192
FRAMEWORKS = ("fsdp", "ddp")


@dataclass
class BuildModel:
    """How to build one model on the meta device and the batch of one rank."""

    build: Callable[[], nn.Module]
    inputs: Callable[[int, int], tuple]  # (batch, sequence) -> (inputs, targets) on meta
    batch: Callable[[int], int]  # default per-rank batch for a sequence
    sequence: int  # default sequence (0: not a sequence model)
    description: str
    sparse: Callable[[nn.Module], tuple[str, int] | None] = lambda model: None


def _tokens(vocab: int):
    def make(batch: int, seq: int):
        return (
            torch.zeros(batch, seq, dtype=torch.long, device="meta"),
            torch.zeros(batch, seq, dtype=torch.long, device="meta"),
        )

    del vocab
    return make


def _per_rank_tokens(seq: int) -> int:
    return max(1, DEFAULT_TOKENS_PER_RANK // seq)


def models() -> dict[str, BuildModel]:
    from ccbench.training import model_configs, profile_models
    from ccbench.training.models import MODELS as SUITE
    from ccbench.training.models import DigitsCNN, DigitsMLP, GPTDecoder

    out = {}
    for name, c in model_configs.CONFIGS.items():
        out[name] = BuildModel(
            lambda c=c: model_configs.build(c),
            _tokens(c.vocab),
            _per_rank_tokens,
            c.sequence,
            c.published,
            model_configs.sparse_embedding,
        )
    lm = {"lm-small": (256, 4, 4, 64), "lm-tiny": (64, 2, 2, 32)}
    for name, (width, depth, heads, context) in lm.items():
        out[name] = BuildModel(
            lambda a=(width, depth, heads, context): GPTDecoder(*a),
            _tokens(256),
            lambda seq: 8,
            context,
            SUITE[name][1],
        )
    for name, cls in (("digits-cnn", DigitsCNN), ("digits-mlp", DigitsMLP)):
        out[name] = BuildModel(
            cls,
            lambda b, s: (
                torch.zeros(b, 1, 8, 8, device="meta"),
                torch.zeros(b, dtype=torch.long, device="meta"),
            ),
            lambda seq: 32,
            0,
            SUITE[name][1],
        )
    for name, spec in profile_models.MODELS.items():
        out[name] = BuildModel(
            lambda s=spec: s.build(1.0),
            lambda b, s, spec=spec: tuple(
                t.to("meta") for t in spec.make_batch(b, torch.Generator().manual_seed(0))
            ),
            lambda seq, spec=spec: spec.batch,
            0,
            spec.description + " (published width)",
        )
    return out


def flop_rate(text: str, mfu: float) -> tuple[float, str]:
    """(FLOP/s, how it was given): a GPU's name (its peak times ``mfu``) or a number with
    an optional k, M, G, T or P."""
    name = text.strip().lower()
    if name in GPUS:
        return GPUS[name][0] * mfu, f"{name} x {mfu:g} MFU"
    match = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)\s*([kmgtp]?)", name)
    if not match:
        raise UsageError(
            f"--flop-rate {text!r}: a GPU ({', '.join(GPUS)}) or a number such as 125T"
        )
    value = float(match.group(1)) * 10 ** (3 * " kmgtp".index(match.group(2) or " "))
    if not value > 0:
        raise UsageError("--flop-rate must be positive")
    return value, f"{value:.4g} FLOP/s"


# ----------------------------------------------------------------------- the meta pass


@dataclass
class Pass:
    """What one forward and backward on the meta device showed, in FLOPs since the start."""

    marks: list[tuple[str, int, float]]  # (kind, unit or parameter index, FLOPs so far)
    total_flops: float
    forward_flops: float


def meta_pass(model: nn.Module, units: list[nn.Module], inputs, targets) -> Pass:
    from torch.utils.flop_counter import FlopCounterMode

    params = [p for p in model.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(params)}
    marks: list = []
    counter = FlopCounterMode(display=False)

    def mark(kind, i):
        marks.append((kind, i, float(counter.get_total_flops())))

    handles = []
    for u, unit in enumerate(units):
        handles.append(unit.register_forward_pre_hook(lambda m, a, u=u: mark("fwd", u)))
        handles.append(unit.register_full_backward_pre_hook(lambda m, g, u=u: mark("bwd", u)))
    for p in params:
        handles.append(p.register_post_accumulate_grad_hook(lambda p: mark("grad", index[id(p)])))
    try:
        with counter:
            out = model(inputs)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))
            forward = float(counter.get_total_flops())
            loss.backward()
    except (RuntimeError, NotImplementedError) as exc:
        raise UsageError(
            f"the model does not run on the meta device: {str(exc).splitlines()[0]}"
        ) from None
    finally:
        for h in handles:
            h.remove()
    return Pass(marks, float(counter.get_total_flops()), forward)


def fsdp_count(params, ranks: int) -> int:
    """Elements of one FSDP2 unit's all-gather output: each parameter's dim 0 padded to a
    multiple of the ranks."""
    total = 0
    for p in params:
        rows = p.shape[0] if p.dim() else 1
        total += math.ceil(rows / ranks) * ranks * (p.numel() // max(rows, 1))
    return total


# ----------------------------------------------------------------------- schedules


class Timeline:
    """Events in order, each after the compute since the previous one (in us)."""

    def __init__(self):
        self.events: list[Event] = []
        self.now = 0.0  # us of compute so far
        self.last = 0.0
        self.calls = 0

    def at(self, t: float) -> float:
        gap, self.last = max(0.0, t - self.last), max(self.last, t)
        return gap

    def call(self, t, collective, count, label, sparse=False, density=None) -> int:
        self.events.append(
            Event(
                op="call",
                gap_us=self.at(t),
                id=self.calls,
                collective=collective,
                count=count,
                label=label,
                sparse=sparse,
                density=density,
            )
        )
        self.calls += 1
        return self.calls - 1

    def wait(self, t, call: int) -> None:
        self.events.append(Event(op="wait", gap_us=self.at(t), id=call))

    def drain(self, t) -> None:
        self.events.append(Event(op="drain", gap_us=self.at(t)))


def fsdp_schedule(p: Pass, units, names, model, ranks: int, to_us) -> Timeline:
    unit_params = [list(u.parameters()) for u in units]
    owned = {id(q) for ps in unit_params for q in ps}
    root_params = [q for q in model.parameters() if id(q) not in owned]
    counts = [fsdp_count(ps, ranks) for ps in unit_params]
    root = fsdp_count(root_params, ranks)
    last = len(units) - 1
    line, gathers = Timeline(), {}
    if root:
        line.wait(0.0, line.call(0.0, "allgather", root, "root"))
    grads_left = [len(ps) for ps in unit_params]
    index = {id(q): i for i, q in enumerate(q for q in model.parameters() if q.requires_grad)}
    unit_of = {index[id(q)]: u for u, ps in enumerate(unit_params) for q in ps}
    backward_end = 0.0
    for kind, i, flops in p.marks:
        t = to_us(flops)
        if kind == "fwd":
            if i not in gathers:
                gathers[i] = line.call(t, "allgather", counts[i], names[i])
            line.wait(t, gathers.pop(i))
            if i < last:
                gathers[i + 1] = line.call(t, "allgather", counts[i + 1], names[i + 1])
        elif kind == "bwd":
            if i not in gathers:
                gathers[i] = line.call(t, "allgather", counts[i], names[i])
            line.wait(t, gathers.pop(i))
            if i > 0:
                gathers[i - 1] = line.call(t, "allgather", counts[i - 1], names[i - 1])
        elif kind == "grad":
            backward_end = t
            u = unit_of.get(i)
            if u is not None:
                grads_left[u] -= 1
                if grads_left[u] == 0:
                    line.call(t, "reduce_scatter", counts[u], names[u])
    if root:
        line.call(backward_end, "reduce_scatter", root, "root")
    line.drain(backward_end)
    return line


def ddp_schedule(p: Pass, params, names, bucket_bytes: int, to_us, sparse) -> Timeline:
    """DDP's buckets in the order gradients became ready (DDP rebuilds them so after its
    first step); bucket_bytes 0: one allreduce per gradient."""
    ready = [(i, to_us(f)) for kind, i, f in p.marks if kind == "grad"]
    line, bucket, filled, cap, n = Timeline(), [], 0, min(DDP_FIRST_BUCKET_BYTES, bucket_bytes), 0
    for k, (i, t) in enumerate(ready):
        bucket.append(i)
        filled += params[i].numel() * 4
        if bucket_bytes and filled < cap and k < len(ready) - 1:
            continue
        count = sum(params[j].numel() for j in bucket)
        density = None
        if sum(params[j].numel() for j in bucket if j in sparse) >= 0.9 * count:
            # mostly a sparse gradient: the dense members count as dense rows
            density = sum(sparse.get(j, 1.0) * params[j].numel() for j in bucket) / count
        label = names[bucket[0]] if len(bucket) == 1 else f"bucket {n}"
        line.call(t, "allreduce", count, label, sparse=density is not None, density=density)
        bucket, filled, cap, n = [], 0, bucket_bytes, n + 1
    line.drain(ready[-1][1] if ready else 0.0)
    return line


# ----------------------------------------------------------------------- the trace


def build_trace(
    name: str,
    framework: str = "fsdp",
    ranks: int = 8,
    batch: int | None = None,
    sequence: int | None = None,
    rate: str = DEFAULT_GPU,
    mfu: float = DEFAULT_MFU,
    memory_rate: float | None = None,
    bucket_mb: float = 25.0,
    profile: str | None = None,
) -> Trace:
    """The trace of one training step of ``name`` on ``ranks`` ranks (see the module)."""
    from ccbench.training.frameworks import shard_units

    catalogue = models()
    if name not in catalogue:
        raise UsageError(f"unknown model {name!r}; choose from {', '.join(catalogue)}")
    if framework not in FRAMEWORKS:
        raise UsageError(f"--framework must be one of {', '.join(FRAMEWORKS)}")
    if ranks < 1 or (batch is not None and batch < 1) or bucket_mb < 0 or not 0 < mfu <= 1:
        raise UsageError(
            "ranks and batch must be positive, --bucket-mb not negative, --mfu in (0, 1]"
        )
    spec = catalogue[name]
    seq = sequence or spec.sequence
    per_rank = batch or spec.batch(seq)
    flops_per_s, rate_text = flop_rate(rate, mfu)
    gpu = rate.strip().lower() if rate.strip().lower() in GPUS else ""
    memory = memory_rate or GPUS[gpu or DEFAULT_GPU][1]
    with torch.device("meta"):
        model = spec.build()
    inputs, targets = spec.inputs(per_rank, seq)
    units = shard_units(model) if framework == "fsdp" else []
    unit_names = {id(m): n for n, m in model.named_modules()}
    p = meta_pass(model, units, inputs, targets)
    params = [q for q in model.parameters() if q.requires_grad]
    names = [n for n, q in model.named_parameters() if q.requires_grad]
    to_us = _profile_times(profile, p, names) if profile else (lambda f: f / flops_per_s * 1e6)
    nparams = sum(q.numel() for q in params)
    sparse = {}
    found = spec.sparse(model)
    if found is not None and seq:
        rows = found[1]
        sparse[names.index(found[0])] = 1 - (1 - 1 / rows) ** (per_rank * seq)
    if framework == "fsdp":
        line = fsdp_schedule(p, units, [unit_names[id(u)] for u in units], model, ranks, to_us)
        optimizer_params = nparams / ranks
    else:
        line = ddp_schedule(p, params, names, int(bucket_mb * (1 << 20)), to_us, sparse)
        optimizer_params = nparams
    backward_end = to_us(p.total_flops)
    tail = (
        max(0.0, backward_end - line.last) + optimizer_params * ADAM_BYTES_PER_PARAM / memory * 1e6
    )
    source = {
        "kind": "built",
        "model": name,
        "framework": framework,
        "params": nparams,
        "batch_per_rank": per_rank,
        "sequence": seq,
        "flops_per_step": p.total_flops,
        "flop_rate": flops_per_s,
        "flop_rate_given": rate_text,
        "memory_rate": memory,
        "profile": profile or "",
        "bucket_mb": bucket_mb if framework == "ddp" else None,
        "published": spec.description,
    }
    return Trace(
        ranks=ranks, steps=[Step(events=line.events, tail_us=tail, number=1)], source=source
    )


def _profile_times(path: str, p: Pass, names: list[str]):
    """FLOPs -> us from a measured layer profile (collectives/mgwfbp.read_profile): each
    gradient ready when the profile says, the forward pass the profile's forward time
    spread over it by FLOPs, and backward FLOPs between two gradients at the rate of
    the profile's time between them."""
    import numpy as np

    from ccbench.collectives.mgwfbp import read_profile

    profile = read_profile(path)
    order = [i for kind, i, _ in p.marks if kind == "grad"]
    if list(profile.params or []) != [names[i] for i in order]:
        raise UsageError(
            f"{path}: its gradients are not this model's, in backward order "
            "(profile the same model at the same width)"
        )
    flops = [p.forward_flops] + [f for kind, _, f in p.marks if kind == "grad"]
    times = [profile.forward_us] + list(profile.forward_us + profile.ready_us)
    xs, ys = np.array([0.0, *flops]), np.array([0.0, *times])
    return lambda f: float(np.interp(f, xs, ys))


def build_named(spec: str, ranks: int) -> Trace:
    """model:NAME[:FRAMEWORK] of trace_replay: the defaults of ``ccbench trace build``."""
    name, _, framework = spec.partition(":")
    return build_trace(name, framework or "fsdp", ranks)

"""`ccbench corpus`: capture real tensors from the project's own models, for `--data`.

    ccbench corpus                  # results/corpus (or $CCBENCH_CORPUS), 40 s of CPU
    ccbench corpus --out corpus-tiny --lm-model lm-tiny --steps 4 --ranks 2   # seconds

Trains the language model (default lm-small) and the digits model (default digits-cnn)
of training/models.py from a fixed seed with Adam, one process. At three steps (early
= 0, middle = steps/2, late = steps) every simulated rank computes its own gradient on
its own slice of the global batch, as the ranks of a data-parallel job do, and the
update uses their mean. Saved as flat .npy files under the output folder:

- gradients per simulated rank at each phase (parameters flattened in forward order,
  as a flat gradient buffer);
- weights at each phase (the weights those gradients were computed at);
- activations per simulated rank at the late step (every ReLU / GELU output and every
  transformer block's output, flattened in forward order);

all in float32, and the late phase also in bfloat16 (round to nearest even, stored as
uint16 bit patterns). `manifest.json` lists every file with its origin, shape, byte
entropies and statistics, the seed and the command. A second run with the same options
does nothing (the manifest matches and every file is in place); `--force` rebuilds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ccbench.benchmarks.options import RankAwareParser, positive_int
from ccbench.kernels.errors import UsageError
from ccbench.kernels.inputs import CORPUS_FORMAT, MANIFEST, PHASES, corpus_root

ENTROPY = (
    "byte_entropy: Shannon entropy of the histogram of the data's bytes (little "
    "endian), bits per byte, 8 = no order-0 coder can shrink them; lane_entropy: "
    "the same for each byte lane of the elements (lane 0 the least significant "
    "byte); lane_order0_ratio: bits per element / the lanes' entropies summed, the "
    "ratio an ideal order-0 coder of each lane would reach (what byte shuffle + an "
    "entropy coder approximates)"
)
BF16_PHASES = ("late",)


def build_parser() -> argparse.ArgumentParser:
    try:
        from ccbench.training.models import MODELS
    except ImportError:
        raise UsageError(
            "ccbench corpus trains models: it needs torch (pip install 'ccbench[torch]')"
        ) from None

    lms = [name for name in MODELS if name.startswith("lm-")]
    digits = [name for name in MODELS if name.startswith("digits-")]
    parser = RankAwareParser(
        prog="ccbench corpus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="corpus folder (default $CCBENCH_CORPUS, else results/corpus)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and batches")
    parser.add_argument(
        "--steps",
        type=int,
        default=120,
        help="training steps; the late phase is the last (default 120, >= 2)",
    )
    parser.add_argument(
        "--ranks",
        type=positive_int,
        default=4,
        help="simulated data-parallel ranks, each its own micro-batch (default 4)",
    )
    parser.add_argument("--lm-model", choices=lms, default="lm-small")
    parser.add_argument(
        "--digits-model",
        choices=[*digits, "none"],
        default="digits-cnn",
        help="default digits-cnn; none: the language model only",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads (default 1: the same bits on every run)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    return parser


# Statistics ---------------------------------------------------------------------------------


def _entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum()) if p.size else 0.0


def byte_statistics(raw: np.ndarray) -> dict:
    """Entropies of an array's bytes, pooled and per byte lane (see ENTROPY)."""
    size = raw.dtype.itemsize
    lanes = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, size)
    lane = [_entropy_bits(np.bincount(lanes[:, k], minlength=256)) for k in range(size)]
    pooled = _entropy_bits(np.bincount(lanes.reshape(-1), minlength=256))
    total = sum(lane)
    return {
        "byte_entropy": round(pooled, 6),
        "lane_entropy": [round(e, 6) for e in lane],
        "lane_order0_ratio": round(8 * size / total, 6) if total > 0 else None,
    }


def value_statistics(x: np.ndarray) -> dict:
    x64 = x.astype(np.float64)
    return {
        "zero_fraction": float(np.count_nonzero(x64 == 0) / max(1, x64.size)),
        "max_abs": float(np.abs(x64).max()) if x64.size else 0.0,
        "rms": float(np.sqrt(np.mean(x64 * x64))) if x64.size else 0.0,
    }


def to_bfloat16_bits(x):
    """uint16 bit patterns of a float32 torch tensor rounded to bfloat16 (nearest even)."""
    import torch

    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


# Capture ------------------------------------------------------------------------------------


class Writer:
    """Saves tensors as .npy under the corpus folder and keeps their manifest entries."""

    def __init__(self, root: Path):
        self.root = root
        self.entries: list[dict] = []

    def save(
        self, tensor, *, model: str, kind: str, phase: str, step: int, rank: int | None
    ) -> None:
        x32 = tensor.detach().to(dtype=_torch().float32).contiguous().reshape(-1)
        stored = [("float32", x32.numpy())]
        if phase in BF16_PHASES:
            stored.append(("bfloat16", to_bfloat16_bits(x32)))
        stats = value_statistics(stored[0][1])
        who = "" if rank is None else f"-r{rank}"
        for dtype, array in stored:
            relative = Path(model) / f"{kind}-{phase}{who}.{dtype}.npy"
            path = self.root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, array)
            self.entries.append(
                {
                    "file": relative.as_posix(),
                    "model": model,
                    "tensor": kind,
                    "phase": phase,
                    "step": step,
                    "rank": rank,
                    "dtype": dtype,
                    "stored_as": "float32" if dtype == "float32" else "uint16 (bfloat16 bits)",
                    "shape": list(array.shape),
                    "count": int(array.size),
                    "data_bytes": int(array.nbytes),
                    "file_bytes": path.stat().st_size,
                    "sha256": _sha256(path),
                    **byte_statistics(array),
                    **(stats if dtype == "float32" else value_statistics(_bf16_to_float32(array))),
                }
            )


def _torch():
    import torch

    return torch


def _bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _activation_modules(model) -> list:
    """(name, module) whose outputs are captured: activation functions, transformer blocks."""
    from torch import nn

    from ccbench.training.models import TransformerBlock

    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ReLU | nn.GELU | TransformerBlock)
    ]


def capture_model(name: str, writer: Writer, steps: int, ranks: int, seed: int) -> dict:
    """Train `name` for `steps` steps; save gradients, weights and activations."""
    torch = _torch()
    from ccbench.training.models import build_model, make_task, parameter_count

    task = make_task(name)
    model = build_model(task, seed)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=task.default_lr)
    micro = max(1, task.default_batch // ranks)
    global_batch = micro * ranks
    capture = {0: "early", steps // 2: "middle", steps: "late"}
    losses: dict[str, float] = {}
    activations: list[tuple[str, tuple]] = []
    for step in range(steps + 1):
        phase = capture.get(step)
        if phase is None:
            optimizer.zero_grad(set_to_none=False)
            task.loss(model, task.batch(seed, step, global_batch, 0, global_batch)).backward()
        else:
            writer.save(
                torch.cat([p.detach().reshape(-1) for p in params]),
                model=name,
                kind="weights",
                phase=phase,
                step=step,
                rank=None,
            )
            mean = torch.zeros(sum(p.numel() for p in params))
            loss_sum = 0.0
            for rank in range(ranks):
                optimizer.zero_grad(set_to_none=False)
                outputs: list = []
                hooks = []
                if phase == "late":
                    for module_name, module in _activation_modules(model):
                        hooks.append(
                            module.register_forward_hook(
                                lambda _m, _i, out, n=module_name, kept=outputs: kept.append(
                                    (n, out.detach())
                                )
                            )
                        )
                batch = task.batch(seed, step, global_batch, rank * micro, (rank + 1) * micro)
                loss = task.loss(model, batch)
                for hook in hooks:
                    hook.remove()
                loss.backward()
                loss_sum += float(loss.detach())
                grad = torch.cat([p.grad.reshape(-1) for p in params])
                mean += grad
                writer.save(grad, model=name, kind="grad", phase=phase, step=step, rank=rank)
                if outputs:
                    activations = [(n, tuple(out.shape)) for n, out in outputs]
                    writer.save(
                        torch.cat([out.reshape(-1) for _, out in outputs]),
                        model=name,
                        kind="act",
                        phase=phase,
                        step=step,
                        rank=rank,
                    )
            losses[phase] = loss_sum / ranks
            mean /= ranks
            offset = 0
            for p in params:  # the data-parallel update: the ranks' mean gradient
                p.grad.copy_(mean[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        if step < steps:
            optimizer.step()
    layout, offset = [], 0
    for param_name, p in model.named_parameters():
        layout.append([param_name, offset, list(p.shape)])
        offset += p.numel()
    act_layout, offset = [], 0
    for act_name, shape in activations:
        act_layout.append([act_name, offset, list(shape)])
        offset += int(np.prod(shape))
    return {
        "params": parameter_count(model),
        "dataset": task.dataset,
        "global_batch": global_batch,
        "micro_batch": micro,
        "optimizer": "Adam",
        "lr": task.default_lr,
        "capture_steps": {p: s for s, p in capture.items()},
        "mean_loss": losses,
        "parameters": layout,
        "activations": act_layout,
    }


# The command ----------------------------------------------------------------------------------


def recipe_of(opts) -> dict:
    import torch

    return {
        "format": CORPUS_FORMAT,
        "seed": opts.seed,
        "steps": opts.steps,
        "ranks": opts.ranks,
        "lm_model": opts.lm_model,
        "digits_model": opts.digits_model,
        "threads": opts.threads,
        "torch": torch.__version__,
        "bf16_phases": list(BF16_PHASES),
    }


def command_of(opts) -> str:
    words = [
        "ccbench",
        "corpus",
        "--seed",
        str(opts.seed),
        "--steps",
        str(opts.steps),
        "--ranks",
        str(opts.ranks),
        "--lm-model",
        opts.lm_model,
        "--digits-model",
        opts.digits_model,
        "--threads",
        str(opts.threads),
    ]
    return shlex.join(words)


def up_to_date(root: Path, recipe: dict) -> bool:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe") != recipe:
        return False
    return all(
        (root / t["file"]).is_file() and (root / t["file"]).stat().st_size == t["file_bytes"]
        for t in manifest.get("tensors", [])
    )


def build(opts) -> Path:
    if opts.steps < 2:
        raise UsageError(
            f"--steps must be at least 2 (early, middle and late differ), got {opts.steps}"
        )
    root = opts.out if opts.out is not None else corpus_root()
    recipe = recipe_of(opts)
    if not opts.force and up_to_date(root, recipe):
        print(f"ccbench corpus: {root} is up to date ({command_of(opts)})")
        return root
    torch = _torch()
    torch.set_num_threads(opts.threads)
    (root / MANIFEST).unlink(missing_ok=True)  # a half-built corpus has no manifest
    for model in (opts.lm_model, opts.digits_model):
        if (root / model).is_dir():
            shutil.rmtree(root / model)
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    writer = Writer(root)
    models = {}
    names = [opts.lm_model] + ([] if opts.digits_model == "none" else [opts.digits_model])
    for name in names:
        t0 = time.perf_counter()
        models[name] = capture_model(name, writer, opts.steps, opts.ranks, opts.seed)
        print(
            f"ccbench corpus: {name}: {opts.steps} steps, {opts.ranks} simulated ranks, "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    manifest = {
        "format": CORPUS_FORMAT,
        "command": command_of(opts),
        "seed": opts.seed,
        "recipe": recipe,
        "language_model": opts.lm_model,
        "phases": list(PHASES),
        "entropy": ENTROPY,
        "models": models,
        "tensors": writer.entries,
        "total_bytes": sum(t["file_bytes"] for t in writer.entries),
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    staged = root / (MANIFEST + ".tmp")
    staged.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(staged, root / MANIFEST)
    print(
        f"ccbench corpus: wrote {len(writer.entries)} tensors, "
        f"{manifest['total_bytes'] / 2**20:.1f} MiB, to {root} in "
        f"{manifest['build_seconds']} s",
        flush=True,
    )
    return root


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    build(opts)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except UsageError as exc:
        print(f"ccbench corpus: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

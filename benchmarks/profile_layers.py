"""Per-tensor gradient sizes and backward times of a model, measured with gradient hooks.

    python -m benchmarks.profile_layers --model resnet50 [--model vgg16 ...|--model all]

A hook on every parameter (``register_post_accumulate_grad_hook``) stamps the time its
gradient is ready (after a device sync when the model is on a GPU). Over ``--iterations``
timed iterations after ``--warmup``, the gaps between consecutive stamps (the first from
the end of the forward pass) are averaged per tensor (``--statistic mean|median``). Rows go to
``results/profiles/<model>.csv`` in backward order (``collectives.mgwfbp.PROFILE_COLUMNS``),
so the planner and the simulator read them without torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.errors import UsageError
from benchmarks.options import RankAwareParser, non_negative_int, positive_int
from benchmarks.results import write_csv_atomic
from collectives.mgwfbp import PROFILE_COLUMNS

DEFAULT_DIR = Path("results") / "profiles"
MODEL_NAMES = ("resnet50", "vgg16", "bert", "lstm")  # benchmarks.models.MODELS, without torch


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def profile_model(name: str, width: float | None = None, batch: int | None = None,
                  warmup: int = 3, iterations: int = 10, device: str = "cpu",
                  seed: int = 0, statistic: str = "mean") -> list[dict]:
    """Profile rows of one model, in backward order (see module docstring)."""
    import torch

    from benchmarks.models import loss_of, model_spec

    spec = model_spec(name)
    width = spec.width if width is None else width
    batch = spec.batch if batch is None else batch
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = spec.build(width).to(dev)
    generator = torch.Generator().manual_seed(seed)
    inputs, targets = (t.to(dev) for t in spec.make_batch(batch, generator))
    params = dict(model.named_parameters())
    names = {id(p): n for n, p in params.items()}
    stamps: list[tuple[str, int]] = []

    def hook(p):
        _sync(dev)
        stamps.append((names[id(p)], time.perf_counter_ns()))

    handles = [p.register_post_accumulate_grad_hook(hook) for p in params.values()]
    gaps = {n: [] for n in params}
    forward_ns, order = [], None
    try:
        for it in range(warmup + iterations):
            model.zero_grad(set_to_none=True)
            _sync(dev)
            t0 = time.perf_counter_ns()
            loss = loss_of(model, inputs, targets)
            _sync(dev)
            t1 = time.perf_counter_ns()
            stamps.clear()
            loss.backward()
            if it < warmup:
                continue
            seen = [n for n, _ in stamps]
            if len(seen) != len(params):
                raise UsageError(f"{name}: {len(params) - len(seen)} parameters got no gradient")
            if order is None:
                order = seen
            forward_ns.append(t1 - t0)
            previous = t1
            for n, t in stamps:
                gaps[n].append(t - previous)
                previous = t
    finally:
        for h in handles:
            h.remove()
    if iterations < 1 or order is None:
        raise UsageError("need at least one timed iteration")
    average = {"mean": np.mean, "median": np.median}[statistic]
    forward_us = float(average(forward_ns)) / 1e3
    rows, ready = [], 0.0
    for i, n in enumerate(order):
        p = params[n]
        backward_us = float(average(gaps[n])) / 1e3
        ready += backward_us
        rows.append({
            "model": name, "order": i, "param": n, "shape": "x".join(map(str, p.shape)),
            "numel": p.numel(), "dtype": str(p.dtype).removeprefix("torch."),
            "bytes": p.numel() * p.element_size(), "backward_us": round(backward_us, 3),
            "ready_us": round(ready, 3), "forward_us": round(forward_us, 3), "batch": batch,
            "device": dev.type, "iterations": iterations, "width": width,
        })  # fmt: skip
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="python -m benchmarks.profile_layers",
        description=__doc__.split("\n\n")[0] + "\n\nmodels: " + ", ".join(MODEL_NAMES)
        + " (benchmarks/models.py; docs/merged-gradient.md)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", action="append", metavar="NAME",
                        help=f"model to profile, repeatable, or 'all' ({', '.join(MODEL_NAMES)})")
    parser.add_argument("--width", type=float, default=None,
                        help="width multiplier (1 = published size; default per model)")
    parser.add_argument("--batch", type=positive_int, default=None,
                        help="batch size (default per model)")
    parser.add_argument("--warmup", type=non_negative_int, default=3)
    parser.add_argument("--iterations", type=positive_int, default=10)
    parser.add_argument("--statistic", choices=("mean", "median"), default="mean",
                        help="average of the timed iterations (default mean, as the paper; "
                             "median resists other processes' load)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch intra-op threads (default 1: steady times on a shared "
                             "host)")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_DIR,
                        help=f"folder of <model>.csv (default {DEFAULT_DIR})")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        opts = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        names = [m for spec in (opts.model or ["all"])
                 for m in (MODEL_NAMES if spec == "all" else [spec])]
        if opts.width is not None and opts.width <= 0:
            raise UsageError("--width must be positive")
        import torch

        torch.set_num_threads(opts.threads)
        for name in dict.fromkeys(names):
            rows = profile_model(name, opts.width, opts.batch, opts.warmup,
                                 opts.iterations, opts.device, statistic=opts.statistic)
            path = opts.out_dir / f"{name}.csv"
            write_csv_atomic(path, rows, PROFILE_COLUMNS)
            total = sum(r["bytes"] for r in rows)
            print(f"{name}: {len(rows)} tensors, {total / 2**20:.2f} MiB of gradients, "
                  f"forward {rows[0]['forward_us'] / 1e3:.2f} ms, "
                  f"backward {rows[-1]['ready_us'] / 1e3:.2f} ms -> {path}", flush=True)
    except UsageError as exc:
        print(f"ccbench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`ccbench profile`: per-tensor gradient sizes and backward times of MG-WFBP's models.

    ccbench profile --model resnet50 [--model vgg16 ...|--model all]

Runs training/profiler.py on each model and writes ``<out-dir>/<model>.csv`` in backward
order. The default folder is not the tracked ``results/profiles/`` that the merged_gradient
benchmark and ``ccbench simulate`` read by default: pass ``--out-dir results/profiles``
to replace those, or ``--profile``/``--profile-dir`` to use a new profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ccbench.benchmarks.options import RankAwareParser, non_negative_int, positive_int
from ccbench.benchmarks.progress import progress_bar
from ccbench.benchmarks.results import PROFILE, SCHEMA, write_csv_atomic
from ccbench.kernels.errors import UsageError

DEFAULT_OUT_DIR = Path("results") / "measured-profiles"  # git-ignored, unlike results/profiles


def model_names() -> tuple[str, ...]:
    try:
        from ccbench.training.profile_models import MODELS
    except ImportError:
        raise UsageError("profiling needs torch (pip install 'ccbench[torch]')") from None
    return tuple(MODELS)


def build_parser() -> argparse.ArgumentParser:
    names = model_names()
    parser = RankAwareParser(
        prog="ccbench profile",
        description=__doc__.split("\n\n")[0]
        + "\n\nmodels: "
        + ", ".join(names)
        + " (training/profile_models.py; docs/merged-gradient.md)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help=f"model to profile, repeatable, or 'all' ({', '.join(names)})",
    )
    parser.add_argument(
        "--width",
        type=float,
        default=None,
        help="width multiplier (1 = published size; default per model)",
    )
    parser.add_argument(
        "--batch", type=positive_int, default=None, help="batch size (default per model)"
    )
    parser.add_argument("--warmup", type=non_negative_int, default=3)
    parser.add_argument("--iterations", type=positive_int, default=10)
    parser.add_argument(
        "--statistic",
        choices=("mean", "median"),
        default="mean",
        help="average of the timed iterations (default mean, as the paper; "
        "median resists other processes' load)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch intra-op threads (default 1: steady times on a shared host)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help=f"folder of <model>.csv (default {DEFAULT_OUT_DIR}; "
        "results/profiles replaces the tracked profiles)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        opts = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        names = [
            m
            for spec in (opts.model or ["all"])
            for m in (model_names() if spec == "all" else [spec])
        ]
        if opts.width is not None and opts.width <= 0:
            raise UsageError("--width must be positive")
        import torch

        from ccbench.training.profiler import profile_model

        torch.set_num_threads(opts.threads)
        for name in dict.fromkeys(names):
            with progress_bar(opts.warmup + opts.iterations, name, unit="iteration") as bar:
                rows = profile_model(
                    name,
                    opts.width,
                    opts.batch,
                    opts.warmup,
                    opts.iterations,
                    opts.device,
                    statistic=opts.statistic,
                    on_iteration=lambda b=bar: b.update(1),
                )
            path = opts.out_dir / f"{name}.csv"
            write_csv_atomic(path, [{SCHEMA: PROFILE.tag, **r} for r in rows], PROFILE.names)
            total = sum(r["bytes"] for r in rows)
            print(
                f"{name}: {len(rows)} tensors, {total / 2**20:.2f} MiB of gradients, "
                f"forward {rows[0]['forward_us'] / 1e3:.2f} ms, "
                f"backward {rows[-1]['ready_us'] / 1e3:.2f} ms -> {path}",
                flush=True,
            )
    except UsageError as exc:
        print(f"ccbench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Rows of the model-level producers for the plotting tests: layer profiles, the
merged-gradient benchmark's fit points, measured iterations and simulations, training
runs (own and MG-WFBP) and trace replays, each with its step rows and the summary rows
the producer writes, so every number a figure draws is known in advance."""

from __future__ import annotations

import math

import numpy as np

from ccbench.benchmarks.results import REPLAY
from tests.plot_benchmark_rows import SWEEP


def profile_rows(model: str, ntensors: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for order in range(ntensors):
        numel = int(2 ** rng.integers(6, 20))
        out.append(
            dict(
                model=model,
                order=order,
                param=f"layer{ntensors - order}.weight",
                shape=f"({numel},)",
                numel=numel,
                dtype="float32",
                bytes=4 * numel,
                backward_us=float(rng.uniform(50, 900)),
                ready_us="",
                forward_us=5000.0,
                batch=32,
                device="cpu",
                iterations=20,
            )
        )
    return out


def seed002_rows():
    """Fit points (benchmarks.merged_gradient --fit-csv), measured iteration rows and
    simulated rows (one schema, ccbench.scripts.simulate.COLUMNS)."""
    fit, iteration, simulation = [], [], []
    for ranks, alpha, beta in ((2, 40.0, 2e-3), (4, 90.0, 4e-3)):
        for size in (32 << 10, 128 << 10, 512 << 10, 2 << 20):
            fit.append(
                dict(
                    model="resnet50",
                    ranks=ranks,
                    transport="mpi",
                    size_bytes=size,
                    measured_us=(alpha + beta * size) * (1.03 if size % 3 else 0.98),
                    iterations=50,
                    fitted_us=alpha + beta * size,
                )
            )
    for model, base in (("resnet50", 90e3), ("bert", 150e3)):
        for strategy, factor in (
            ("wfbp", 1.3),
            ("single", 1.2),
            ("fixed:64MB", 1.18),
            ("ddp:25MB", 1.15),
            ("mgwfbp", 1.05),
            ("optimal", 1.04),
        ):
            common = dict(
                model=model,
                strategy=strategy,
                predicted_us=base * factor * 0.95,
                forward_us=base * 0.3,
                backward_us=base * 0.6,
                nonoverlapped_us=base * (factor - 0.9),
                groups=3,
                alpha_us=90.0,
                beta_us_per_byte=4e-3,
            )
            iteration.append(
                dict(
                    common,
                    sweep_id=SWEEP,
                    variant="merged_gradient",
                    ranks=4,
                    transport="mpi",
                    measured_us=base * factor,
                    measured_std_us=base * 0.02,
                    fit_r2=0.998,
                    link_gbps=1,
                    iterations=20,
                    validation="Pass",
                )
            )
            for ranks in (4, 16, 64, 256, 1024, 2048):
                loss = {"wfbp": 0.12, "single": 0.08, "mgwfbp": 0.05}.get(
                    strategy.split(":")[0], 0.07
                )
                simulation.append(
                    dict(
                        common,
                        sweep_id=SWEEP,
                        variant="mgwfbp_simulation",
                        ranks=ranks,
                        scaling_efficiency=1 / (1 + loss * math.log2(ranks)),
                        link_gbps=10,
                        hop_latency_us=5,
                        algorithm="ring",
                        compute_speedup=1,
                    )
                )
    return fit, iteration, simulation


TRAINING_WARMUP, TRAINING_WINDOW = 3, 10  # as benchmarks.training's summaries take them


def summarize(steps: list[dict], fields=("step_us", "compute_us", "comm_us")) -> dict:
    """The summary row the training loop writes: means over the timed steps, the final
    loss over the last steps."""
    timed = [r for r in steps if r["step"] > TRAINING_WARMUP] or steps
    out = {k: sum(r[k] for r in timed) / len(timed) for k in fields}
    last = [r["loss"] for r in steps][-TRAINING_WINDOW:]
    return dict(out, loss=sum(last) / len(last))


def training_rows(steps=30):
    out = []
    runs = (
        ("baseline", "mpi", "none", 1.0),
        ("p2p_compressed", "ring", "fp16", 0.86),
        ("coll_compressed", "ring", "fp16", 0.72),
    )
    for variant, algorithm, codec, factor in runs:
        comm = 40e3 * factor
        common = dict(
            run_id=variant,
            variant=variant,
            algorithm=algorithm,
            codec=codec,
            compress="both" if codec != "none" else "",
            error_feedback=0,
            model="tiny-lm",
            ranks=4,
            link_gbps=1,
        )
        mine = []
        for step in range(1, steps + 1):
            loss = 4.0 * math.exp(-step / 12) + 1.0 + (0.01 if codec != "none" else 0)
            jitter = 1500.0 * math.sin(1.7 * step + factor)  # a spread to draw
            mine.append(
                dict(
                    common,
                    row="step",
                    step=step,
                    loss=loss,
                    step_us=60e3 + comm + jitter,
                    compute_us=58e3 + jitter,
                    comm_us=comm,
                )
            )
        out += mine + [dict(common, row="summary", step="", **summarize(mine))]
    return out


def mgwfbp_training_rows(steps=15):
    """benchmarks.training --framework mgwfbp: strategies rotated step by step."""
    plans = (
        ("mgwfbp", 4, 9.0e3, 10.0e3),
        ("ddp:25MB", 1, 11.0e3, 12.5e3),
        ("wfbp", 28, 12.0e3, 16.0e3),
    )
    common = dict(
        run_id="mg",
        framework="mgwfbp",
        variant="baseline",
        algorithm="mpi",
        codec="none",
        compress="",
        error_feedback=0,
        overlap=1,
        model="digits-mlp",
        ranks=2,
        link_gbps="",
    )
    out = []
    for step in range(1, steps + 1):
        strategy, groups, predicted, measured = plans[(step - 1) % len(plans)]
        measured += 300.0 * math.cos(2.3 * step)
        out.append(
            dict(
                common,
                row="step",
                step=step,
                loss=2.0 / step,
                strategy=strategy,
                groups=groups,
                predicted_us=predicted,
                step_us=measured + 1e3,
                optimizer_us=1e3,
                compute_us=measured,
                comm_us=1e3,
            )
        )
    final = summarize(out)["loss"]  # over the run's last steps, whatever their strategy
    for strategy, groups, predicted, _ in plans:
        summary = summarize([r for r in out if r["row"] == "step" and r["strategy"] == strategy])
        out.append(
            dict(
                common,
                row="summary",
                step="",
                strategy=strategy,
                groups=groups,
                predicted_us=predicted,
                optimizer_us=1e3,
                **dict(summary, loss=final),
            )
        )
    return out


def replay_rows(steps=4) -> list[dict]:
    """benchmarks.trace_replay: a built GPT-2 small FSDP trace replayed by three variants."""
    out = []
    for variant, algorithm, codec, comm, codec_us in (
        ("baseline", "ring", "none", 40e3, 0.0),
        ("p2p_compressed", "ring", "fp16", 30e3, 12e3),
        ("coll_compressed", "ring", "fp16", 24e3, 8e3),
    ):
        common = dict(
            schema=REPLAY.tag,
            run_id=f"replay-{variant}",
            sweep_id=SWEEP,
            timestamp="2025-01-01T00:00:00",
            trace="model:gpt2-small:fsdp",
            trace_id="0123456789ab",
            source="built",
            framework="fsdp",
            model="gpt2-small",
            variant=variant,
            algorithm=algorithm,
            codec=codec,
            compress="both" if codec != "none" else "",
            merge="",
            compute_wait="sleep",
            compute_scale=1.0,
            data="gradient-like",
            ranks=2,
            traced_ranks=2,
            steps=steps,
            warmup_steps=1,
            link_gbps="",
        )
        mine = []
        for step in range(1, steps + 2):
            jitter = 800.0 * math.sin(step + comm / 1e4)
            mine.append(
                dict(
                    common,
                    row="step",
                    step=step,
                    step_us=60e3 + comm + jitter,
                    compute_us=60e3 + jitter,
                    comm_us=comm,
                    codec_us=codec_us,
                    exposed_codec_us=codec_us * 0.5,
                    comm_busy_us=2 * comm,
                )
            )
        timed = mine[1:]
        values = [r["step_us"] for r in timed]
        mean = sum(values) / len(values)
        summary = {
            k: sum(r[k] for r in timed) / len(timed)
            for k in (
                "step_us",
                "compute_us",
                "comm_us",
                "codec_us",
                "exposed_codec_us",
                "comm_busy_us",
            )
        }
        out += mine + [
            dict(
                common,
                row="summary",
                step="",
                **summary,
                step_ci_low_us=mean - 900.0,
                step_ci_high_us=mean + 900.0,
            )
        ]
    return out

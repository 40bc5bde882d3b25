"""Result CSVs for the plotting tests, built here with timings from a simple link-bound
model so the figures look like real runs and every number is known in advance (see
tests/test_plots.py and tests/test_plots_page.py), and small helpers that draw one
figure and read its notes."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from ccbench.benchmarks.results import COMMON_COLUMNS, REPLAY
from ccbench.benchmarks.results import MGWFBP_COLUMNS as SIMULATE_COLUMNS
from ccbench.benchmarks.training import COLUMNS as TRAINING_COLUMNS
from ccbench.collectives.mgwfbp import PROFILE_COLUMNS
from ccbench.plots import cli
from ccbench.scripts.comparisons.rounds import COLUMNS as COMPARE_COLUMNS

SWEEP = "fixture-20250101T000000-abcdef"
US_PER_BYTE_1G = 8e-3  # 1 Gbit/s
RATIOS = {
    "none": 1.0,
    "fp16": 2.0,
    "bfp:rate=8": 4.0,
    "zfp:rate=8": 4.0,
    "zfp:rate=4": 8.0,
    "zfp:rate=16": 2.0,
}
CODEC_US_PER_BYTE = {
    "none": 0.0,
    "fp16": 2e-4,
    "bfp:rate=8": 6e-4,
    "zfp:rate=8": 1e-3,
    "zfp:rate=4": 9e-4,
    "zfp:rate=16": 1.2e-3,
}


def write(path: Path, rows: list[dict], columns=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def sidecar(path: Path, runs: dict[str, str]) -> None:
    """The JSON sidecar a producer writes beside its CSV: each launch's sweep."""
    Path(f"{path}.json").write_text(
        json.dumps(
            {"runs": {run: {"run_id": run, "sweep_id": sweep} for run, sweep in runs.items()}}
        )
    )


def harness_row(
    run, variant, algorithm, collective, codec, ranks, size, avg_us, link, sweep=SWEEP, **extra
) -> dict:
    n = ranks
    total = size * n if collective == "allgather" else size
    factor = 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n
    algbw = total / (avg_us * 1e-6) / 1e9
    row = {c: "" for c in COMMON_COLUMNS}
    row.update(
        run_id=run,
        sweep_id=sweep,
        timestamp="2025-01-01T00:00:00",
        variant=variant,
        algorithm=algorithm,
        collective=collective,
        codec=codec,
        dtype="float32",
        buffer="numpy",
        ranks=ranks,
        nodes=1,
        size_bytes=size,
        bytes_per_rank=size if collective == "allgather" else size // n,
        total_bytes=total,
        count=size // 4,
        iterations=100,
        warmup=10,
        timing="per-call",
        avg_us=avg_us,
        min_us=0.95 * avg_us,
        max_us=1.05 * avg_us,
        ci_low_us=0.97 * avg_us,
        ci_high_us=1.04 * avg_us,
        algbw_gbps=algbw,
        busbw_gbps=algbw * factor,
        compression_ratio=RATIOS.get(codec, 1.0),
        validation="Pass",
        link_gbps=link if link else "",
        mpi_library="MPICH 4",
        hostname="host",
        git_sha="abc123",
    )
    row.update(extra)
    return row


def seed000_rows(sizes, ranks=4, link=1.0, run="run-a", sweep=SWEEP) -> list[dict]:
    """Baseline (mpi, ring), p2p and collective-level compressed rows, link-bound model."""
    upb = US_PER_BYTE_1G / link if link else 2e-4
    out = []
    for collective in ("allgather", "reduce_scatter", "allreduce"):
        hops = 2 * (ranks - 1) if collective == "allreduce" else ranks - 1
        for size in sizes:
            block = size if collective == "allgather" else size / ranks
            wire = hops * block
            base = 20 + wire * upb
            out.append(
                harness_row(
                    run, "baseline", "mpi", collective, "none", ranks, size, base, link, sweep
                )
            )
            out.append(
                harness_row(
                    run,
                    "baseline",
                    "ring",
                    collective,
                    "none",
                    ranks,
                    size,
                    1.1 * base,
                    link,
                    sweep,
                    wire_bytes_per_rank=int(wire),
                )
            )
            for codec in ("fp16", "bfp:rate=8", "zfp:rate=8", "zfp:rate=4", "zfp:rate=16"):
                ratio, cost = RATIOS[codec], CODEC_US_PER_BYTE[codec]
                rate = 32 / ratio
                err = 2.0 ** (-rate)
                p2p = 20 + wire * upb / ratio + 2 * hops * block * cost
                coll = 20 + wire * upb / ratio + 2 * block * cost
                for variant, t, e in (
                    ("p2p_compressed", p2p, err * hops),
                    ("coll_compressed", coll, err),
                ):
                    out.append(
                        harness_row(
                            run,
                            variant,
                            "ring",
                            collective,
                            codec,
                            ranks,
                            size,
                            t,
                            link,
                            sweep,
                            wire_bytes_per_rank=int(wire / ratio),
                            max_abs_err=e,
                            max_rel_err=e,
                            error_bound=10 * e,
                            data="grad:lm-small",
                            rel_l2_err=e / 3 * (1 + math.log2(size) / 64),
                            psnr_db=-20 * math.log10(e),
                        )
                    )
    return out


def seed001_rows(size=1 << 22, ranks_list=(2, 4), link=1.0) -> list[dict]:
    upb = US_PER_BYTE_1G / link
    out = []
    for ranks in ranks_list:
        for density in (1.0, 0.4, 0.1, 0.02):
            for block in (64, 256):
                for fusion in (1, 8):
                    nnz = density * size
                    meta = nnz / (4 * block) * 4
                    minimum = (nnz + meta) * 2 * (ranks - 1) / ranks
                    wire = 1.04 * minimum * (1 + 16 / block) * (1.0 if fusion > 1 else 1.1)
                    config = dict(
                        density=density,
                        block_size=block,
                        fusion=fusion,
                        overlap="random",
                        union_density=min(1, density * ranks),
                        wire_min_bytes_per_rank=int(minimum),
                    )
                    out.append(
                        harness_row(
                            "run-s",
                            "sparse_streaming",
                            "omnireduce",
                            "allreduce",
                            "none",
                            ranks,
                            size,
                            60 + wire * upb,
                            link,
                            wire_bytes_per_rank=int(wire),
                            **config,
                        )
                    )
                    dense = 2 * (ranks - 1) / ranks * size
                    out.append(
                        harness_row(
                            "run-s",
                            "sparse_streaming",
                            "dense",
                            "allreduce",
                            "none",
                            ranks,
                            size,
                            20 + dense * upb,
                            link,
                            wire_bytes_per_rank=int(dense),
                            **config,
                        )
                    )
                    gathered = (ranks - 1) * nnz * 2
                    out.append(
                        harness_row(
                            "run-s",
                            "sparse_streaming",
                            "allgather-sparse",
                            "allreduce",
                            "none",
                            ranks,
                            size,
                            30 + gathered * upb,
                            link,
                            wire_bytes_per_rank=int(gathered),
                            **config,
                        )
                    )
    return out


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


def codec_rows():
    out = []
    for data in ("random", "grad:lm-small"):
        for codec, enc, dec in (
            ("fp16", 4.1, 5.0),
            ("bf16", 3.0, 3.4),
            ("bfp:rate=8", 1.6, 1.9),
            ("zfp:rate=8", 0.6, 0.7),
            ("zstd", 0.4, 1.1),
        ):
            out.append(
                dict(
                    run_id="codec-run",
                    codec=codec,
                    data=data,
                    dtype="float32",
                    size_bytes=1 << 24,
                    encode_gbps=enc,
                    decode_gbps=dec,
                    copy_gbps=6.0,
                    ratio=RATIOS.get(codec, 1.3 if data != "random" else 1.05),
                )
            )
    return out


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


def compare_row(
    compare_id,
    a,
    b,
    collective,
    size,
    ratio,
    low,
    high,
    verdict,
    config="",
    ranks=4,
    link=1.0,
    rounds=6,
    iterations=(100, 100),
    turns=1,
) -> dict:
    return dict(
        compare_id=compare_id,
        sweep_id=SWEEP,
        timestamp="2025-01-01T00:00:00",
        a=a,
        b=b,
        a_rev="",
        b_rev="",
        collective=collective,
        ranks=ranks,
        size_bytes=size,
        config=config,
        statistic="avg",
        rounds=rounds,
        a_us=100.0,
        b_us=100.0 * ratio,
        ratio=ratio,
        ratio_low=low,
        ratio_high=high,
        margin=0.03,
        verdict=verdict,
        a_iterations=iterations[0],
        b_iterations=iterations[1],
        link_gbps=link,
        load_start=0.5,
        load_end=0.6,
        hostname="host",
        git_sha="abc123",
        pairing="in-launch" if turns > 1 else "launches",
        turns=turns,
    )


def compare_rows() -> list[dict]:
    """`ccbench compare` rows: against the baseline (two sizes), against p2p written the
    other way round (B = p2p), a lossless codec, OmniReduce, and one matching no claim."""
    base, fp16 = "baseline --algorithm mpi", "coll_compressed --codec fp16"
    return [
        compare_row("c1", base, fp16, "allgather", 1 << 20, 0.8, 0.7, 0.9, "faster"),
        compare_row("c1", base, fp16, "allgather", 1 << 24, 0.3, 0.25, 0.36, "faster"),
        compare_row(
            "c2",
            fp16,
            "p2p_compressed --codec fp16",
            "allgather",
            1 << 24,
            1.5,
            1.3,
            1.7,
            "slower",
            iterations=(100, 80),
            turns=8,
        ),
        compare_row(
            "c3",
            base,
            "coll_compressed --codec zstd",
            "allgather",
            1 << 24,
            0.9,
            0.8,
            1.0,
            "no difference",
        ),
        compare_row(
            "c4",
            "sparse_streaming --algorithm dense",
            "sparse_streaming --algorithm omnireduce",
            "allreduce",
            1 << 22,
            0.5,
            0.4,
            0.6,
            "faster",
            config="density=0.1",
        ),
        compare_row(
            "c5", base, "baseline --algorithm ring", "allgather", 1 << 24, 1.1, 1.05, 1.2, "slower"
        ),
    ]


def build_results(root: Path, sizes=(1 << 16, 1 << 20, 1 << 24)) -> Path:
    """A results folder holding every kind of CSV the plotting stage reads."""
    write(root / "seed000_link.csv", seed000_rows(sizes, ranks=4, link=1.0))
    write(root / "seed000_shm.csv", seed000_rows(sizes[:2], ranks=2, link=0, run="run-b"))
    write(root / "sparse.csv", seed001_rows())
    for model, n, seed in (("resnet50", 24, 1), ("bert", 12, 2)):
        write(root / "profiles" / f"{model}.csv", profile_rows(model, n, seed), PROFILE_COLUMNS)
    fit, iteration, simulation = seed002_rows()
    write(root / "costfit.csv", fit)
    write(root / "mgwfbp.csv", iteration, SIMULATE_COLUMNS)
    write(root / "simulate.csv", simulation, SIMULATE_COLUMNS)
    sidecar(write(root / "codecs.csv", codec_rows()), {"codec-run": SWEEP})
    sidecar(
        write(root / "training.csv", training_rows(), TRAINING_COLUMNS),
        {"baseline": SWEEP, "p2p_compressed": SWEEP, "coll_compressed": SWEEP},
    )
    sidecar(
        write(root / "training-mgwfbp.csv", mgwfbp_training_rows(), TRAINING_COLUMNS), {"mg": SWEEP}
    )
    write(root / "compare.csv", compare_rows(), COMPARE_COLUMNS)
    write(root / "replay.csv", replay_rows(), REPLAY.names)
    return root


def draw(spec_name: str, data, style):
    spec = next(s for s in cli.all_figures() if s.name == spec_name)
    return spec.draw(data, style)


def note_lines(ax) -> list[str]:
    """The lines of the note beside a panel."""
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def legend_labels(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]

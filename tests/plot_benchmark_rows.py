"""Rows of the micro-benchmark producers for the plotting tests: the harness's
(`seed000_rows`: baseline, point-to-point and collective-level compressed collectives;
`seed001_rows`: sparse streaming), the codec benchmark's and `ccbench compare`'s, with
timings from a simple link-bound model so the figures look like real runs and every
number is known in advance. `SWEEP` is the sweep every fixture row belongs to."""

from __future__ import annotations

import math

from tests.helpers.rows import harness_row

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


def modelled_row(
    run, variant, algorithm, collective, codec, ranks, size, avg_us, link, sweep=SWEEP, **extra
) -> dict:
    """A harness row whose times and bandwidths follow from `avg_us` as a run's would."""
    n = ranks
    total = size * n if collective == "allgather" else size
    factor = 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n
    algbw = total / (avg_us * 1e-6) / 1e9
    fields = dict(
        run_id=run,
        sweep_id=sweep,
        timestamp="2025-01-01T00:00:00",
        variant=variant,
        algorithm=algorithm,
        collective=collective,
        codec=codec,
        ranks=ranks,
        nodes=1,
        size_bytes=size,
        bytes_per_rank=size if collective == "allgather" else size // n,
        total_bytes=total,
        count=size // 4,
        iterations=100,
        warmup=10,
        avg_us=avg_us,
        min_us=0.95 * avg_us,
        max_us=1.05 * avg_us,
        ci_low_us=0.97 * avg_us,
        ci_high_us=1.04 * avg_us,
        algbw_gbps=algbw,
        busbw_gbps=algbw * factor,
        compression_ratio=RATIOS.get(codec, 1.0),
        link_gbps=link if link else "",
        mpi_library="MPICH 4",
        hostname="host",
        git_sha="abc123",
    )
    return harness_row(**{**fields, **extra})


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
                modelled_row(
                    run, "baseline", "mpi", collective, "none", ranks, size, base, link, sweep
                )
            )
            out.append(
                modelled_row(
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
                for variant, t, e, steps in (
                    ("p2p_compressed", p2p, err * hops, hops),
                    ("coll_compressed", coll, err, 1),
                ):
                    # the breakdown as the times above count it (the regime figure's
                    # ratio comes from the collective level's encode and decode)
                    codec_us = steps * block * cost
                    parts = dict(
                        call_us=t,
                        encode_us=codec_us,
                        decode_us=codec_us,
                        reduce_us=0.0,
                        wait_us=t - 2 * codec_us,
                        idle_us=0.0,
                    )
                    out.append(
                        modelled_row(
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
                            **parts,
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
                        modelled_row(
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
                        modelled_row(
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
                        modelled_row(
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
    other way round (B = p2p), a lossless codec, OmniReduce, one matching no claim and a
    hierarchical one (the two-level figure's)."""
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
        # the two-level figure's: hierarchical over flat (no harness row: no expected figure)
        compare_row(
            "c6", fp16, f"{fp16} --hierarchy node", "allgather", 1 << 24, 0.9, 0.8, 1.0, "faster"
        ),
    ]

"""The regression gate: passes identical and merely slower-machine results, catches each
kind of injected regression; and the tracked reference's exact metrics are the closed
forms of the size conventions and ring volumes."""

from __future__ import annotations

import collections
import csv
import itertools
from pathlib import Path

import numpy as np
import pytest

from ccbench.benchmarks.results import COMMON_COLUMNS, write_csv_atomic
from ccbench.scripts.sweeps import merge, regress

REPO = Path(__file__).resolve().parent.parent
SIZES = (4096, 16384, 65536, 262144)


def result_rows(seed: int = 0) -> list[dict]:
    """A small, realistic result set: the baseline (mpi, ring) and two compressed variants,
    with times that depend on the size and a little seeded noise."""
    rng = np.random.default_rng(seed)
    series = [
        ("baseline", "mpi", "none", 1.0, None),
        ("baseline", "ring", "none", 1.0, None),
        ("coll_compressed", "ring", "fp16", 2.0, 1e-3),
        ("coll_compressed", "ring", "zfp:rate=8", 4.0, 2e-2),
    ]
    speed = {"mpi": 1.0, "ring": 1.6}
    rows = []
    for (variant, algo, codec, ratio, err), collective, size in itertools.product(
        series, ("allgather", "allreduce"), SIZES
    ):
        t = (20 + size / 2000) * speed[algo] / (ratio**0.5) * rng.uniform(0.9, 1.1)
        rows.append(
            {
                "run_id": f"run{seed}",
                "timestamp": "2026-01-01T00:00:00+00:00",
                "variant": variant,
                "algorithm": algo,
                "collective": collective,
                "codec": codec,
                "dtype": "float32",
                "buffer": "numpy",
                "ranks": 2,
                "nodes": 1,
                "size_bytes": size,
                "bytes_per_rank": size,
                "total_bytes": 2 * size,
                "count": size // 4,
                "iterations": 20,
                "warmup": 2,
                "timing": "per-call",
                "avg_us": t,
                "min_us": 0.9 * t,
                "max_us": 1.1 * t,
                "algbw_gbps": 2 * size / t / 1e3,
                "busbw_gbps": size / t / 1e3,
                "wire_bytes_per_rank": None if algo == "mpi" else int(size / ratio),
                "compression_ratio": ratio if codec != "none" else None,
                "max_abs_err": 0.0 if err is None else err * 3.0,
                "max_rel_err": 0.0 if err is None else err,
                "error_bound": None if err is None else 10 * err,
                "validation": "Pass",
                "mpi_library": "MPICH",
                "hostname": "h",
                "git_sha": "x",
            }
        )
    return rows


def write(path: Path, rows: list[dict]) -> Path:
    write_csv_atomic(path, rows, COMMON_COLUMNS)
    return path


def gate(tmp_path, new_rows, ref_rows=None, *extra) -> tuple[int, str]:
    ref = write(tmp_path / "ref" / "ref.csv", ref_rows or result_rows())
    new = write(tmp_path / "new" / "new.csv", new_rows)
    status = regress.main([str(new.parent), "--against", str(ref.parent), *extra])
    return status


def edit(rows, where, **changes):
    for row in rows:
        if where(row):
            for key, fn in changes.items():
                row[key] = fn(row[key])
    return rows


def is_zfp(row):
    return row["codec"] == "zfp:rate=8"


def test_identical_results_pass(tmp_path, capsys):
    assert gate(tmp_path, result_rows()) == 0
    assert "0 moved, 0 regressions" in capsys.readouterr().out


def test_slower_machine_and_timing_noise_pass(tmp_path, capsys):
    # everything 2.5x slower and re-drawn noise: ratios to the baseline hold
    rows = edit(result_rows(seed=7), lambda r: True, avg_us=lambda t: 2.5 * t)
    assert gate(tmp_path, rows) == 0, capsys.readouterr().out


def test_catches_validation_failure(tmp_path, capsys):
    rows = edit(
        result_rows(), lambda r: is_zfp(r) and r["size_bytes"] == 16384, validation=lambda v: "Fail"
    )
    assert gate(tmp_path, rows) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "validation" in out and "16384B" in out
    assert "2 regressions" in out  # allgather and allreduce


def test_catches_validation_not_run(tmp_path, capsys):
    rows = edit(result_rows(), is_zfp, validation=lambda v: "")
    assert gate(tmp_path, rows) == 1
    assert "(not run)" in capsys.readouterr().out


def test_catches_doubled_wire_bytes(tmp_path, capsys):
    rows = edit(
        result_rows(),
        lambda r: r["algorithm"] == "ring" and r["codec"] == "fp16",
        wire_bytes_per_rank=lambda w: 2 * w,
    )
    assert gate(tmp_path, rows) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "wire_bytes_per_rank" in ln]
    assert len(lines) == len(SIZES) * 2 and all("FAIL" in ln and "+100.0%" in ln for ln in lines)


def test_catches_compression_ratio_drop(tmp_path, capsys):
    rows = edit(result_rows(), is_zfp, compression_ratio=lambda c: c * 0.8)
    assert gate(tmp_path, rows) == 1
    out = capsys.readouterr().out
    assert "compression_ratio" in out and "-20.0%" in out


def test_timings_are_not_gated_unless_asked(tmp_path, capsys):
    rows = edit(result_rows(seed=3), is_zfp, avg_us=lambda t: 3 * t)
    assert gate(tmp_path, rows) == 0
    assert "time_vs_baseline" not in capsys.readouterr().out


def test_catches_variant_three_times_slower_than_baseline(tmp_path, capsys):
    rows = edit(result_rows(seed=3), is_zfp, avg_us=lambda t: 3 * t)
    assert gate(tmp_path, rows, None, "--tolerance", "time_vs_baseline=:1.0") == 1
    out = capsys.readouterr().out
    fails = [ln for ln in out.splitlines() if ln.lstrip().startswith("FAIL")]
    assert fails and all("time_vs_baseline" in ln and "zfp:rate=8" in ln for ln in fails)
    assert len(fails) == 2  # one series per collective, sizes folded into a median


def test_baseline_slowing_down_flags_every_variant_faster_not(tmp_path, capsys):
    # a faster variant (or a slower library) is not a regression of the variant
    rows = edit(result_rows(), lambda r: r["variant"] != "baseline", avg_us=lambda t: t / 3)
    assert gate(tmp_path, rows, None, "--tolerance", "time_vs_baseline=:1.0") == 0
    assert "time_vs_baseline" in capsys.readouterr().out  # listed as moved


def test_error_relative_bound(tmp_path, capsys):
    small = edit(result_rows(), is_zfp, max_rel_err=lambda e: e * 1.2)
    assert gate(tmp_path / "a", small) == 0
    large = edit(result_rows(), is_zfp, max_rel_err=lambda e: e * 2)
    assert gate(tmp_path / "b", large) == 1
    out = capsys.readouterr().out
    assert "max_rel_err" in out and "+100.0%" in out


def test_lossless_error_must_stay_zero(tmp_path):
    rows = edit(
        result_rows(),
        lambda r: r["codec"] == "none" and r["algorithm"] == "ring",
        max_abs_err=lambda e: 1e-7,
    )
    assert gate(tmp_path, rows) == 1


def test_missing_points_fail_unless_allowed(tmp_path, capsys):
    rows = [r for r in result_rows() if not (is_zfp(r) and r["size_bytes"] == 65536)]
    assert gate(tmp_path / "a", rows) == 1
    assert "(missing)" in capsys.readouterr().out
    assert gate(tmp_path / "b", rows, None, "--allow-missing") == 0


def test_tolerance_override(tmp_path):
    rows = edit(result_rows(seed=3), is_zfp, avg_us=lambda t: 3 * t)
    assert gate(tmp_path, rows, None, "--tolerance", "time_vs_baseline=:3.5") == 0


@pytest.mark.parametrize(
    "bad", [["--tolerance", "nonsense=1:2"], ["--tolerance", "avg_us"], ["--baseline", "baseline"]]
)
def test_bad_options_are_usage_errors(tmp_path, capsys, bad):
    assert gate(tmp_path, result_rows(), None, *bad) == 2
    err = capsys.readouterr().err
    assert err.startswith("ccbench regress:") and len(err.strip().splitlines()) == 1


def reference_rows() -> tuple[list[str], list[dict]]:
    ref = REPO / "results" / "reference"
    if not list(ref.glob("*.csv")):
        pytest.skip("results/reference holds no CSV yet (generate with sweeps/ci.toml)")
    _, columns, rows, _ = merge.merge_rows(sorted(ref.glob("*.csv")))
    return columns, rows


def test_reference_exact_metrics_follow_the_closed_forms():
    """The tracked reference, read with the csv module, against the size conventions and
    ring volumes worked out by hand (README; docs/compression.md): what the gate holds
    every new run to must itself be right."""
    paths = sorted((REPO / "results" / "reference").glob("*.csv"))
    if not paths:
        pytest.skip("results/reference holds no CSV yet (generate with sweeps/ci.toml)")
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    checked = collections.Counter()
    for r in rows:
        p, size, collective = int(r["ranks"]), int(r["size_bytes"]), r["collective"]
        per_rank, total = {
            "allgather": (size, p * size),
            "reduce_scatter": (size // p, size),
            "allreduce": (size, size),
        }[collective]
        assert (int(r["bytes_per_rank"]), int(r["total_bytes"])) == (per_rank, total), r
        assert int(r["count"]) == size // 4 and r["dtype"] == "float32", r
        assert r["validation"] == "Pass", r
        # what one rank sends per call in the uncompressed ring
        ring = {
            "allgather": (p - 1) * size,
            "reduce_scatter": (p - 1) * size // p,
            "allreduce": 2 * (p - 1) * size // p,
        }[collective]
        lossy = r["codec"] not in ("none", "zstd")
        if r["variant"] == "baseline":
            wire = "" if r["algorithm"] == "mpi" else str(ring)
            assert r["wire_bytes_per_rank"] == wire, r
        elif r["variant"] in ("p2p_compressed", "coll_compressed"):
            wire = float(r["wire_bytes_per_rank"])
            # a mean over ranks, written rounded for variable-size codecs
            assert float(r["compression_ratio"]) == pytest.approx(ring / wire, rel=1e-4), r
            nominal = {"fp16": 2, "zfp:rate=8": 4}.get(r["codec"])  # 16 and 8 of 32 bits
            if nominal:
                assert wire == ring / nominal, r
            else:  # zstd on float32 gradients: a little, never below raw (its header aside)
                assert 1.0 < float(r["compression_ratio"]) < 1.5, r
        if lossy:
            assert 0 < float(r["validation_err"]) <= float(r["error_bound"]), r
        else:
            assert float(r["validation_err"] or 0) == 0 and r["error_bound"] == "", r
        checked[r["variant"]] += 1
    assert set(checked) >= {"baseline", "p2p_compressed", "coll_compressed", "sparse_streaming"}


def test_reference_covers_every_gated_metric():
    _, rows = reference_rows()
    variants = {r["variant"] for r in rows}
    assert {"baseline", "p2p_compressed", "coll_compressed", "sparse_streaming"} <= variants
    assert {r["validation"] for r in rows} == {"Pass"}
    assert any(r["wire_bytes_per_rank"] for r in rows)
    assert any(r["compression_ratio"] not in ("", "1.0") for r in rows)
    assert any(r["max_rel_err"] not in ("", "0.0") for r in rows)


@pytest.mark.parametrize(
    "column, change",
    [
        ("validation", lambda v: "Fail"),
        ("wire_bytes_per_rank", lambda w: str(2 * int(w))),
        ("compression_ratio", lambda c: repr(float(c) * 0.9)),
    ],
)
def test_gate_catches_regressions_injected_into_the_real_reference(tmp_path, column, change):
    columns, rows = reference_rows()
    hit = [r for r in rows if r["variant"] == "coll_compressed" and r[column]]
    assert hit
    for r in hit[:1]:
        r[column] = change(r[column])
    new = tmp_path / "new.csv"
    write_csv_atomic(new, rows, columns)
    assert regress.main([str(new), "--against", str(REPO / "results" / "reference")]) == 1

"""The codec throughput benchmark (one process): its accuracy metrics against a second
computation here, lossless ratios on real floats against integers, the CLI and its CSV."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
zstandard = pytest.importorskip("zstandard")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from ccbench.scripts.cli import main

    root = tmp_path_factory.mktemp("corpus")
    assert (
        main(
            [
                "corpus",
                "--out",
                str(root),
                "--lm-model",
                "lm-tiny",
                "--digits-model",
                "none",
                "--steps",
                "2",
                "--ranks",
                "2",
            ]
        )
        == 0
    )
    return root


def test_lossy_metrics_match_a_second_computation():
    from ccbench.benchmarks.codec_throughput import measure_codec
    from ccbench.kernels.inputs import values

    count = 50000
    row = measure_codec("fp16", "gradient-like", "numpy", "float32", count, 1, seed=2)
    x = values("gradient-like", count, 0, 1, seed=2).astype(np.float32).astype(np.float64)
    y = x.astype(np.float16).astype(np.float64)  # fp16 rounds to nearest even, as numpy
    diff = y - x
    assert row["lossless"] is False and row["data"] == "gradient-like"
    assert row["max_abs_err"] == pytest.approx(np.abs(diff).max(), rel=1e-12)
    assert row["rel_l2_err"] == pytest.approx(np.sqrt((diff**2).sum() / (x**2).sum()), rel=1e-9)
    rmse = np.sqrt((diff**2).mean())
    assert row["psnr_db"] == pytest.approx(20 * np.log10(np.abs(x).max() / rmse), rel=1e-9)
    cosine = (x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum())
    assert row["cosine"] == pytest.approx(cosine, abs=1e-12)
    assert 0.99 < row["cosine"] < 1.0
    assert row["ratio"] == 2.0
    normal = measure_codec("fp16", "normal", "numpy", "float32", count, 1)
    assert normal["cosine"] is None  # not a gradient kind: no cosine


@pytest.mark.parametrize("dtype,buffer", [("float32", "numpy"), ("bfloat16", "torch")])
def test_lossless_rows_are_exact_and_their_ratio_is_the_bytes_saved(dtype, buffer):
    from ccbench.benchmarks.codec_throughput import measure_codec
    from ccbench.kernels import arrays
    from ccbench.kernels.inputs import values

    count = 40000
    row = measure_codec("zstd", "gradient-like", buffer, dtype, count, 1, seed=1)
    assert row["lossless"] is True
    assert row["max_abs_err"] == 0 and row["rel_l2_err"] == 0
    assert row["cosine"] == pytest.approx(1.0, abs=1e-15)
    assert row["psnr_db"] == float("inf")
    x = arrays.from_numpy(buffer, values("gradient-like", count, 0, 1, 1), dtype)
    if dtype == "bfloat16":  # numpy has no bfloat16: its bits as int16
        x = x.view(torch.int16).numpy()
    raw = np.frombuffer(x.tobytes(), dtype=np.uint8)
    size = 4 if dtype == "float32" else 2
    shuffled = raw.reshape(-1, size).T.copy()  # byte k of every value, then zstd level 1
    expected = count * size / (8 + len(zstandard.ZstdCompressor(level=1).compress(shuffled)))
    assert row["ratio"] == pytest.approx(expected, rel=1e-12)


def test_zstd_on_real_gradients_is_honest(corpus, switch):
    """Real float32 gradients barely compress losslessly; integers do, a lot."""
    from ccbench.benchmarks.codec_throughput import measure_codec

    switch("CCBENCH_CORPUS", str(corpus))
    real = measure_codec("zstd", "gradient", "numpy", "float32", 200000, 1)
    exact = measure_codec("zstd", "exact", "numpy", "float32", 200000, 1)
    assert real["data"] == "grad:lm-tiny" and real["cosine"] == pytest.approx(1, abs=1e-15)
    assert 1.0 < real["ratio"] < 1.5
    assert exact["ratio"] > 4


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "ccbench.benchmarks.codec_throughput", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_cli_writes_the_new_columns(tmp_path, corpus):
    import os

    out = tmp_path / "codecs.csv"
    env = {**os.environ, "CCBENCH_CORPUS": str(corpus)}
    proc = run_cli(
        "-m",
        "256K:256K",
        "-i",
        "1",
        "--codec",
        "zstd",
        "--codec",
        "bfp:rate=8",
        "--data",
        "gradient,weights,exact",
        "--csv",
        str(out),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "zstd (lossless)" in proc.stdout
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    # bfp on its fused kernels and on the array-API reference; zstd has one implementation
    assert [(r["codec"], r["kernels"], r["data"]) for r in rows] == [
        (c, k, d)
        for c, k in (("zstd", "library"), ("bfp:rate=8", "fused"), ("bfp:rate=8", "reference"))
        for d in ("grad:lm-tiny", "weights:lm-tiny", "exact")
    ]
    for r in rows:
        assert r["lossless"] == str(r["codec"] == "zstd")
        assert (r["cosine"] != "") == (r["data"] == "grad:lm-tiny")
        for column in (
            "rel_l2_err",
            "psnr_db",
            "max_abs_err",
            "encode_gbps",
            "hop_gbps",
            "hop_vs_copy",
        ):
            float(r[column])
    # both paths: the same bytes, so the same ratio and errors
    fused, reference = rows[3:6], rows[6:9]
    for a, b in zip(fused, reference, strict=True):
        assert (a["ratio"], a["max_abs_err"], a["rel_l2_err"]) == (
            b["ratio"],
            b["max_abs_err"],
            b["rel_l2_err"],
        )


def test_kernels_option(tmp_path):
    proc = run_cli(
        "-m",
        "64K:64K",
        "-i",
        "1",
        "--codec",
        "fp16",
        "--codec",
        "zstd",
        "--data",
        "normal",
        "--kernels",
        "reference",
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert [line[:2] for line in lines] == [["fp16", "reference"], ["zstd", "(lossless)"]]
    assert lines[1][2] == "library"
    proc = run_cli("-m", "64K:64K", "-i", "1", "--kernels", "fastest")
    assert proc.returncode == 2 and "--kernels" in proc.stderr


def test_cli_bad_or_missing_data_fails_with_one_line(tmp_path):
    import os

    env = {**os.environ, "CCBENCH_CORPUS": str(tmp_path / "none")}
    proc = run_cli("-m", "64K:64K", "-i", "1", "--data", "gradient", env=env)
    assert proc.returncode == 2 and "ccbench corpus" in proc.stderr
    assert proc.stderr.count("\n") == 1
    proc = run_cli("-m", "64K:64K", "-i", "1", "--data", "exact,random", env=env)
    assert proc.returncode == 2 and "'random'" in proc.stderr
    assert proc.stderr.count("\n") == 1

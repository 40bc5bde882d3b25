"""The compressed collectives on real ranks (2 and 4), and their benchmark scripts.

The algorithms run every codec x collective x variant in one mpiexec launch per rank
count (tests/drivers/compressed_cases.py checks results, bounds and wire bytes on every
rank); the scripts are run as a user would, with -c and --csv, and with bad input.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from tests.drivers.compressed_cases import cases
from tests.mpirun import case_results, mpirun, variant_module

pytest.importorskip("torch")
pytest.importorskip("zfpy")
pytest.importorskip("zstandard")

CASE_IDS = [case_id for case_id, _ in cases()]


def results(nranks: int) -> dict:
    """All cases in one launch per rank count, shared by the parametrized tests."""
    return case_results("tests.drivers.compressed_cases", nranks, timeout=280)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_compressed_collective(nranks, case_id):
    result = results(nranks).get(case_id)
    assert result is not None, f"{case_id} did not report"
    assert result["ok"], json.dumps(result)


# ------------------------------------------------------------------ the scripts

def run_script(nranks: int, variant: str, args: list[str], tmp_path, timeout: float = 120):
    out = tmp_path / f"{variant}.csv"
    proc = mpirun(nranks, [*variant_module(variant), *args, "--csv", str(out)],
                  timeout=timeout)
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    return proc, rows


@pytest.mark.timeout(150)
def test_coll_reduce_scatter_rows(tmp_path):
    """4 ranks, bfp: every size validates, and the row's numbers agree with each other."""
    proc, rows = run_script(4, "coll_compressed", [
        "--collective", "reduce_scatter", "--codec", "bfp:rate=8", "--chunk-bytes", "8K",
        "-m", "512:256K", "-i", "3", "-x", "1", "-c"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(rows) == 10
    for row in rows:
        assert row["validation"] == "Pass"
        assert row["variant"] == "coll_compressed" and row["codec"] == "bfp:rate=8"
        assert row["algorithm"] == "ring" and int(row["chunk_bytes"]) == 8192
        assert int(row["compressions"]) == 3
        size = int(row["size_bytes"])
        raw = 3 * size // 4  # the uncompressed ring sends 3 of the 4 blocks
        wire = float(row["wire_bytes_per_rank"])
        assert float(row["compression_ratio"]) == pytest.approx(raw / wire, rel=1e-9)
        # bfp:rate=8 with 32-value blocks: 33 bytes per 32 values, per chunk
        assert float(row["compression_ratio"]) == pytest.approx(32 * 4 / 33, rel=0.02)
        # -c: integers through the lossy ring, within the stated bound
        assert 0 < float(row["validation_err"]) <= float(row["error_bound"])
        # the timed data (real gradients): a small error, the direction kept
        assert row["data"].startswith("grad:")
        assert 0 < float(row["max_rel_err"]) < 0.05 and float(row["cosine"]) > 0.999
    assert "Ratio" in proc.stdout and "MaxRelErr" in proc.stdout


@pytest.mark.timeout(150)
def test_p2p_allreduce_lossless_odd_counts(tmp_path):
    """zstd is exact; -m 12 gives 3 values on 2 ranks (blocks of 2 and 1)."""
    proc, rows = run_script(2, "p2p_compressed", [
        "--collective", "allreduce", "--codec", "zstd", "--threshold", "1K",
        "-m", "12:48K", "-i", "3", "-x", "1", "-c"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [int(r["size_bytes"]) for r in rows][:2] == [12, 24]
    for row in rows:
        assert row["validation"] == "Pass" and float(row["validation_err"]) == 0.0
        assert row["error_bound"] == "" and int(row["threshold_bytes"]) == 1024
        assert int(row["compressions"]) == 2
        ratio = float(row["compression_ratio"])
        # below the threshold the blocks travel raw; above, zstd saves a little on float32
        # gradients (their low mantissa bytes are noise)
        assert ratio == 1.0 if int(row["size_bytes"]) // 2 < 1024 else 1.0 < ratio < 1.5


@pytest.mark.timeout(150)
def test_coll_allgather_torch_bfloat16(tmp_path):
    proc, rows = run_script(2, "coll_compressed", [
        "--collective", "allgather", "--codec", "bfp:rate=4", "-d", "torch", "-T", "bfloat16",
        "-m", "2K:64K", "-i", "2", "-x", "1", "-c"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {r["validation"] for r in rows} == {"Pass"}
    big = rows[-1]
    assert int(big["compressions"]) == 1
    assert float(big["compression_ratio"]) == pytest.approx(16 * 32 / (32 * 4 + 8), rel=0.01)


@pytest.mark.timeout(120)
def test_lossy_rows_carry_errors_without_c(tmp_path):
    """Every row reports its accuracy on the timed data, even without -c (no Pass/Fail)."""
    proc, rows = run_script(2, "p2p_compressed", [
        "--collective", "allgather", "--codec", "bfp:rate=16", "-m", "1K:4K", "-i", "2",
        "-x", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in rows:
        assert row["validation"] == "" and row["error_bound"] == ""
        assert 0 < float(row["max_rel_err"]) < 1e-3 and 0 < float(row["rel_l2_err"]) < 1e-3
        assert math.isfinite(float(row["psnr_db"])) and float(row["cosine"]) > 0.999999
        assert float(row["compression_ratio"]) == pytest.approx(32 * 4 / 65)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant, args, words", [
    ("p2p_compressed", ["--codec", "bfp:rate=99"], "rate must be an integer in 2..16"),
    ("coll_compressed", ["--codec", "lz77"], "unknown codec 'lz77'"),
    ("coll_compressed", ["--codec", "zfp:rate=8,tol=1"], "exactly one of"),
    ("coll_compressed", ["--codec", "fp16", "-T", "int8"], "dtype int8 is not supported"),
    ("p2p_compressed", ["--threshold", "-1"], "bad message size"),
])
def test_bad_input_one_line_exit_2(variant, args, words):
    proc = mpirun(2, [*variant_module(variant), *args, "-m", "1K:1K"], timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["p2p_compressed", "coll_compressed"])
def test_nan_input_stops_the_job(variant):
    proc = mpirun(2, ["-m", "tests.drivers.compressed_nan", variant, "--codec", "bfp:rate=8",
                      "-m", "1K:4K", "-i", "2", "-x", "1"], timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "rank 1: codec bfp:rate=8: input contains NaN" in proc.stderr
    assert "Traceback" not in proc.stderr

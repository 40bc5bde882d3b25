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
from tests.helpers.drivers import failed_checks
from tests.mpirun import case_results, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

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
    assert failed_checks(result) == [], json.dumps(result)


# ------------------------------------------------------------------ the scripts


def run_script(nranks: int, variant: str, args: list[str], tmp_path, timeout: float = 120):
    out = tmp_path / f"{variant}.csv"
    proc = mpirun(nranks, [*variant_module(variant), *args, "--csv", str(out)], timeout=timeout)
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    return proc, rows


class _SlowRequests:
    """A transport whose one request completes on the 5th look: a call that waits."""

    any_completion = True

    def __init__(self):
        self.looks = 0

    def testsome(self, requests):
        self.looks += 1
        return [0] if self.looks == 5 else []

    def testall(self, requests):
        return True


@pytest.mark.parametrize("codec_threads", [0, 1])
def test_the_engine_lends_its_waits_to_side_work(codec_threads):
    """While a call waits on its transfers, its caller's side work runs, one piece per
    look, until it says it has none; with a codec thread it is never run (the thread's
    waits are not the caller's)."""
    from ccbench.collectives.pipeline import Breakdown, Engine

    pieces, arrived = [], []

    def side():
        pieces.append(len(arrived))  # how many arrivals had been handled by then
        return len(pieces) <= 2  # two pieces of work, then none

    engine = Engine(_SlowRequests(), Breakdown(), codec_threads, "yield", side)
    engine.post(object(), lambda: arrived.append(1))
    engine.run()
    assert arrived == [1]
    if codec_threads:
        assert pieces == []
    else:  # looks 2, 3, 4 find nothing: side work twice, then none left (one more ask)
        assert pieces[:3] == [0, 0, 0] and len(pieces) >= 3


@pytest.mark.timeout(150)
def test_coll_reduce_scatter_rows(tmp_path):
    """4 ranks, bfp: every size validates, and the row's numbers agree with each other."""
    proc, rows = run_script(
        4,
        "coll_compressed",
        [
            "--collective",
            "reduce_scatter",
            "--codec",
            "bfp:rate=8",
            "--chunk-bytes",
            "8K",
            "-m",
            "512:256K",
            "-i",
            "3",
            "-x",
            "1",
            "-c",
        ],
        tmp_path,
    )
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
    proc, rows = run_script(
        2,
        "p2p_compressed",
        [
            "--collective",
            "allreduce",
            "--codec",
            "zstd",
            "--threshold",
            "1K",
            "-m",
            "12:48K",
            "-i",
            "3",
            "-x",
            "1",
            "-c",
        ],
        tmp_path,
    )
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
    proc, rows = run_script(
        2,
        "coll_compressed",
        [
            "--collective",
            "allgather",
            "--codec",
            "bfp:rate=4",
            "-d",
            "torch",
            "-T",
            "bfloat16",
            "-m",
            "2K:64K",
            "-i",
            "2",
            "-x",
            "1",
            "-c",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {r["validation"] for r in rows} == {"Pass"}
    big = rows[-1]
    assert int(big["compressions"]) == 1
    assert float(big["compression_ratio"]) == pytest.approx(16 * 32 / (32 * 4 + 8), rel=0.01)


@pytest.mark.timeout(120)
def test_lossy_rows_carry_errors_without_c(tmp_path):
    """Every row reports its accuracy on the timed data, even without -c (no Pass/Fail)."""
    proc, rows = run_script(
        2,
        "p2p_compressed",
        [
            "--collective",
            "allgather",
            "--codec",
            "bfp:rate=16",
            "-m",
            "1K:4K",
            "-i",
            "2",
            "-x",
            "1",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in rows:
        assert row["validation"] == "" and row["error_bound"] == ""
        assert 0 < float(row["max_rel_err"]) < 1e-3 and 0 < float(row["rel_l2_err"]) < 1e-3
        assert math.isfinite(float(row["psnr_db"])) and float(row["cosine"]) > 0.999999
        assert float(row["compression_ratio"]) == pytest.approx(32 * 4 / 65)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "variant, args, words",
    [
        ("p2p_compressed", ["--codec", "bfp:rate=99"], "rate must be an integer in 2..16"),
        ("coll_compressed", ["--codec", "lz77"], "unknown codec 'lz77'"),
        ("coll_compressed", ["--codec", "zfp:rate=8,tol=1"], "exactly one of"),
        ("coll_compressed", ["--codec", "fp16", "-T", "int8"], "dtype int8 is not supported"),
        ("p2p_compressed", ["--threshold", "-1"], "bad message size"),
        (
            "coll_compressed",
            ["--algorithm", "library", "--chunk-bytes", "4K"],
            "--chunk-bytes: the ring's pipeline options; --algorithm library",
        ),
        # library is the default over torch: the ring's options name the ring
        (
            "coll_compressed",
            ["--transport", "torch", "--no-fuse", "--wait", "yield"],
            "--wait, --no-fuse: the ring's pipeline options; --algorithm library makes one library "
            "call per phase (use --algorithm ring)",
        ),
        ("coll_compressed", ["--algorithm", "tree"], "invalid choice: 'tree'"),
    ],
)
def test_bad_input_one_line_exit_2(variant, args, words):
    proc = mpirun(2, [*variant_module(variant), *args, "-m", "1K:1K"], timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["p2p_compressed", "coll_compressed"])
def test_nan_input_stops_the_job(variant):
    proc = mpirun(
        2,
        [
            "-m",
            "tests.drivers.compressed_nan",
            variant,
            "--codec",
            "bfp:rate=8",
            "-m",
            "1K:4K",
            "-i",
            "2",
            "-x",
            "1",
        ],
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert "rank 1: codec bfp:rate=8: input contains NaN" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ pipeline: floor, chunks
# (the chunk choice by hand, and --chunk-bytes itself: tests/test_chunking.py)


def chunk_by_hand(block: int, ranks: int, row: dict, wire_bps: float, reduces: bool) -> int:
    """docs/compression.md's chunk choice, written out from the row's measured rates: the
    least of T = max(W, K) + C + F + G over chunks of 64 KiB, 128 KiB, ... below the block,
    and the block; ties to the larger."""
    o = float(row["pipeline_chunk_us"]) * 1e-6
    c = float(row["auto_codec_gbps"]) * 1e9 / 8
    s = float(row["ranks_per_core"])
    sizes = [block] + [64 << 10 << k for k in range(20) if 64 << 10 << k < block]
    best = None
    for size in sorted(set(max(64 << 10, x) for x in sizes)):
        n = -(-block // size)
        t = (
            max((ranks - 1) * block / wire_bps, s * (ranks - 1) * block / c)
            + (ranks - 1) * n * o
            + 2 * block / (n * c)
        )
        if reduces:
            t += (ranks - 2) * max(0.0, block / (n * wire_bps) + block / (n * c) - block / wire_bps)
        if best is None or t <= best[0] * (1 + 1e-9):
            best = (t, size)
    return best[1]


@pytest.mark.timeout(120)
def test_auto_measures_the_gloo_transport(tmp_path):
    """Over torch.distributed's gloo, off any emulated link, --chunk-bytes auto measures
    the transport's per-message cost and rate and the pipeline's cost per chunk, records
    them (a chunk costs at least its message) and chooses for that rate: with 2
    ranks no gaps, the model of docs/compression.md worked from the row's numbers."""
    out = tmp_path / "coll.csv"
    proc = mpirun(
        2,
        [
            *variant_module("coll_compressed"),
            "--collective",
            "reduce_scatter",
            "--codec",
            "fp16",
            "--transport",
            "torch",
            "--backend",
            "gloo",
            "--algorithm",
            "ring",
            "-m",
            "4M:4M",
            "-i",
            "2",
            "-x",
            "1",
            "--chunk-bytes",
            "auto",
            "--csv",
            str(out),
        ],
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = list(csv.DictReader(out.open()))
    message_s = float(row["transport_message_us"]) * 1e-6
    assert message_s > 0 and float(row["transport_gbps"]) > 0
    assert float(row["pipeline_chunk_us"]) * 1e-6 >= message_s  # at least its message
    assert float(row["auto_link_gbps"]) == float(row["transport_gbps"])  # no emulated link
    assert row["floor_us"] and not row["wire_floor_us"]  # no link: the codec's floor alone
    wire_bps = 2 * float(row["transport_gbps"]) * 1e9 / 8  # fp16's ratio 2
    expected = chunk_by_hand(2 << 20, 2, row, wire_bps, reduces=True)
    assert int(float(row["chunk_used_bytes"])) == expected


def test_sub_chunks_only_for_concatenating_payloads():
    """Codec work is cut where a range's payload is its pieces' payloads end to end."""
    import numpy as np

    from ccbench.collectives.pipeline import splittable, sub_ranges
    from ccbench.kernels.codecs import parse_codec

    assert sub_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert sub_ranges(10, 0) == [(0, 10)]
    x = np.random.default_rng(3).standard_normal(3 * 8192 + 77).astype(np.float32)
    for spec, piece in (("fp16", 1000), ("bfp:rate=8", 8192), ("zfp:rate=8", 64)):
        codec = parse_codec(spec)
        assert splittable(codec, "float32", piece), spec
        whole = np.asarray(codec.encode(x))
        parts = [np.asarray(codec.encode(x[a:b])) for a, b in sub_ranges(x.size, piece)]
        assert np.array_equal(whole, np.concatenate(parts)), spec
    assert not splittable(parse_codec("bfp:rate=8"), "float32", 1000)  # not whole tiles
    assert not splittable(parse_codec("zstd"), "float32", 1024)  # variable size


@pytest.mark.timeout(150)
def test_breakdown_wire_floor_and_auto_chunk_from_closed_forms(tmp_path):
    """The wire bytes and the wire floor against the ring's closed form, and the chunk
    --chunk-bytes auto picks against the documented formula applied by hand to the rates
    the row records (which slow encode or decode lands in which column is checked with
    stub codecs in test_behaviours_ranks.py)."""

    out = tmp_path / "coll.csv"
    proc = mpirun(
        4,
        [
            *variant_module("coll_compressed"),
            "--collective",
            "allgather",
            "--codec",
            "bfp:rate=8",
            "-m",
            "256K:1M",
            "-i",
            "4",
            "-x",
            "1",
            "--chunk-bytes",
            "auto",
            "--csv",
            str(out),
        ],
        env={
            "CCBENCH_LINK_GOODPUT_GBPS": "0.5",
            "CCBENCH_LINK_BURST_BYTES": "20000",
            "CCBENCH_LINK_STEP_US": "100",
        },
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [int(r["size_bytes"]) for r in rows] == [256 << 10, 512 << 10, 1 << 20]
    for row in rows:
        f = {
            k: float(row[k])
            for k in (
                "call_us",
                "encode_us",
                "decode_us",
                "reduce_us",
                "wait_us",
                "idle_us",
                "wire_floor_us",
                "floor_us",
                "wire_bytes_per_rank",
            )
        }
        # a rank forwards the 3 other blocks of the 4-rank ring, each bfp:rate=8 coded:
        # per 32 values one exponent byte and 32 bytes of 8-bit integers
        values = int(row["size_bytes"]) // 4
        wire = 3 * values // 32 * 33
        assert f["wire_bytes_per_rank"] == wire
        # the floor: past the 20 kB burst at 0.5 Gbit/s, plus 3 ring steps of 100 us
        assert f["wire_floor_us"] == pytest.approx((wire - 20000) * 8 / 0.5e9 * 1e6 + 300)
        assert f["floor_us"] >= f["wire_floor_us"] and f["reduce_us"] == 0
        assert f["encode_us"] > 0 and f["decode_us"] > 0
        assert row["chunk_bytes"] == "auto" and float(row["auto_link_gbps"]) == 0.5
        # the transport's alpha and beta, measured at start-up, recorded and positive
        assert float(row["transport_message_us"]) > 0 and float(row["transport_gbps"]) > 0
        assert float(row["pipeline_chunk_us"]) >= float(row["transport_message_us"])
        # the model of docs/compression.md worked from the row's rates; the allgather's
        # block is the per-rank size; r = 32 / (8 + 8/32) for bfp:rate=8
        expected = chunk_by_hand(values * 4, 4, row, 32 / 8.25 * 0.5e9 / 8, reduces=False)
        assert int(float(row["chunk_used_bytes"])) == expected

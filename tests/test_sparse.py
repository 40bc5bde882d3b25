"""Sparse streaming (OmniReduce): block kernels, data generators, the protocol on real
ranks (2, 4, and 4 workers + 2 dedicated aggregators) against numpy, and the benchmark
script as a user runs it."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from ccbench.kernels.errors import UsageError
from tests.helpers.drivers import failed_checks
from tests.mpirun import mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

torch = pytest.importorskip("torch")

BACKENDS = {"numpy": lambda a: a.copy(), "torch": lambda a: torch.from_numpy(a.copy())}


def as_numpy(x) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def naive_mask(x: np.ndarray, block: int, threshold: float) -> np.ndarray:
    return np.array(
        [bool((np.abs(x[i : i + block]) > threshold).any()) for i in range(0, x.size, block)],
        dtype=bool,
    )


# Kernels, single process ------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("count,block", [(4096, 64), (1000, 64), (5, 8), (0, 4)])
@pytest.mark.parametrize("threshold", [0.0, 1.0])
def test_block_mask_matches_naive_scan(backend, count, block, threshold):
    from ccbench.kernels.sparse import block_mask, nonzero_block_ids
    from ccbench.kernels.sparse_data import sparse_input

    x = sparse_input(count, block, 0.4, "random", 1, 4, seed=5)
    if count:
        x[-1] = 0.25  # a small value in the tail block: kept at 0, dropped at 1
    t = BACKENDS[backend](x)
    expected = naive_mask(x, block, threshold)
    assert np.array_equal(as_numpy(block_mask(t, block, threshold)), expected)
    assert np.array_equal(
        as_numpy(nonzero_block_ids(t, block, threshold)), np.flatnonzero(expected)
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("count,block", [(4096, 64), (1000, 64), (5, 8)])
def test_gather_scatter_and_scatter_add_round_trip(backend, count, block):
    from ccbench.kernels.sparse import (
        gather_blocks,
        nonzero_block_ids,
        scatter_add_blocks,
        scatter_blocks,
        zero_blocks,
    )
    from ccbench.kernels.sparse_data import sparse_input

    x = sparse_input(count, block, 0.5, "random", 0, 2, seed=1)
    t = BACKENDS[backend](x)
    ids = nonzero_block_ids(t, block)
    blocks = gather_blocks(t, ids, block)
    assert tuple(blocks.shape) == (ids.shape[0], block)
    if count % block and as_numpy(ids).size and as_numpy(ids)[-1] == count // block:
        assert not as_numpy(blocks)[-1, count % block :].any()  # tail padded with zeros
    out = BACKENDS[backend](np.zeros(count, np.float32))
    scatter_blocks(out, ids, blocks, block)
    assert np.array_equal(as_numpy(out), x)
    scatter_add_blocks(out, ids, blocks, block)
    assert np.array_equal(as_numpy(out), 2 * x)
    padded = BACKENDS[backend](np.zeros((-(-count // block), block), np.float32))
    scatter_add_blocks(padded, ids, blocks, block)
    assert np.array_equal(as_numpy(padded).reshape(-1)[:count], x)
    zero_blocks(out, ids, block)
    assert not as_numpy(out).any()


def test_gather_into_a_preallocated_view():
    from ccbench.kernels.sparse import gather_blocks

    x = np.arange(12, dtype=np.float32)
    out = np.full((2, 4), -1, dtype=np.float32)
    gather_blocks(x, np.array([2, 0]), 4, out=out)
    assert np.array_equal(out, [[8, 9, 10, 11], [0, 1, 2, 3]])


def test_dropped_mass_counts_only_dropped_blocks():
    from ccbench.kernels.sparse import block_mask, dropped_abs_sum

    x = np.array([0.5, -0.5, 0.25, 0, 0, 3, -0.25, 0.25, 0.5, 1], dtype=np.float32)
    mask = block_mask(x, 3, 0.75)
    assert mask.tolist() == [False, True, False, True]  # the tail [1] survives: 1 > 0.75
    assert dropped_abs_sum(x, mask, 3) == 2.25
    assert dropped_abs_sum(x, block_mask(x, 3, 1.0), 3) == 3.25


# Data generators --------------------------------------------------------------------------


@pytest.mark.parametrize("count,block", [(25600, 256), (1000, 64)])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.1, 0.37, 1.0])
@pytest.mark.parametrize("overlap", ["random", "all", "none"])
def test_generator_meets_density_exactly_in_blocks(count, block, density, overlap):
    from ccbench.kernels.sparse_data import sparse_input

    nblocks = -(-count // block)
    masks = [
        naive_mask(sparse_input(count, block, density, overlap, r, 4, seed=2), block, 0)
        for r in range(4)
    ]
    for mask in masks:
        assert mask.sum() == round(density * nblocks)
    if overlap == "all":
        assert all(np.array_equal(m, masks[0]) for m in masks)
    if overlap == "none":
        union = np.logical_or.reduce(masks).sum()
        assert union == min(nblocks, 4 * round(density * nblocks))  # disjoint, or all
    if overlap == "random" and 1 < round(density * nblocks) < nblocks:
        assert not all(np.array_equal(m, masks[0]) for m in masks)  # chosen per rank


def test_generator_is_seeded_and_exactly_summable():
    from ccbench.kernels.sparse_data import sparse_input

    a = sparse_input(10000, 100, 0.3, "random", 2, 4, seed=9)
    assert np.array_equal(a, sparse_input(10000, 100, 0.3, "random", 2, 4, seed=9))
    assert not np.array_equal(a, sparse_input(10000, 100, 0.3, "random", 2, 4, seed=10))
    values = a[a != 0]
    assert np.all(values * 4 == np.round(values * 4)) and np.abs(values).max() <= 4
    blocks = a.reshape(-1, 100)
    chosen = blocks[(blocks != 0).any(axis=1)]
    assert (chosen != 0).all()  # every element of a non-zero block is non-zero
    total = sum(sparse_input(10000, 100, 1.0, "all", r, 16) for r in range(16))
    half = torch.from_numpy(total).to(torch.bfloat16).float().numpy()
    assert np.array_equal(half, total)  # 16 ranks' sums are exact even in bfloat16


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_generator_rejects_densities_outside_0_1(bad):
    from ccbench.kernels.sparse_data import sparse_input

    with pytest.raises(UsageError):
        sparse_input(100, 10, bad, "random", 0, 2)


def test_density_list_parsing():
    from ccbench.benchmarks.sparse_streaming import PAPER_DENSITIES, parse_densities

    assert parse_densities(["1,0.1", "0.01"]) == [1.0, 0.1, 0.01]
    assert parse_densities(["paper"]) == list(PAPER_DENSITIES)
    for bad in (["x"], ["2"], [","]):
        with pytest.raises(UsageError):
            parse_densities(bad)


@pytest.mark.parametrize("size,aggregators", [(4, 0), (6, 2), (2, 1)])
@pytest.mark.parametrize("count,block", [(10000, 64), (100, 64), (0, 8)])
def test_layout_covers_every_block_once(size, aggregators, count, block):
    from ccbench.collectives.omnireduce_layout import make_layout

    layout = make_layout(count, block, size, aggregators, streams_per_aggregator=3)
    covered = [b for start, stop in layout.streams for b in range(start, stop)]
    assert covered == list(range(layout.nblocks))
    assert set(layout.aggregator_of) <= set(range(size - aggregators if aggregators else 0, size))
    assert layout.workers == tuple(range(size - aggregators))


# The protocol and its baselines on real ranks ------------------------------------------------

LAUNCHES = {"2 ranks": (2, 0), "4 ranks": (4, 0), "4 workers + 2 aggregators": (6, 2)}


def _case_ids(aggregators: int) -> list[str]:
    from tests.drivers.sparse_cases import cases

    return [case_id for case_id, _ in cases(aggregators)]


PARAMS = [(launch, case_id) for launch, (_, k) in LAUNCHES.items() for case_id in _case_ids(k)]


@pytest.fixture(scope="module")
def launched():
    """Each launch runs once (all its cases), then the tests read its JSON lines."""
    results: dict[str, dict] = {}

    def get(launch: str) -> dict:
        if launch not in results:
            nranks, aggregators = LAUNCHES[launch]
            proc = mpirun(
                nranks,
                ["-m", "tests.drivers.sparse_cases", "--aggregators", str(aggregators)],
                timeout=150,
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
            lines = [json.loads(s) for s in proc.stdout.splitlines() if s.startswith("{")]
            results[launch] = {line["case"]: line for line in lines}
        return results[launch]

    return get


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launch,case_id", PARAMS)
def test_sparse_allreduce_matches_numpy_and_moves_only_nonzero_blocks(launched, launch, case_id):
    result = launched(launch).get(case_id)
    assert failed_checks(result) == [], result
    assert result["same_wire"]
    if case_id.startswith("dense-"):
        return  # the library's bytes are not measurable
    nranks, aggregators = LAUNCHES[launch]
    # the non-zero blocks must travel; beyond them only indices and message headers
    headers = 64 * max(1, result["streams"]) * (nranks - aggregators)
    if "request-driven" in case_id:  # plus the first packets: a position per column
        headers *= 2
    assert result["payload"] <= result["wire"] <= 1.10 * result["minimum"] + headers
    if result["union_blocks"] == 0:
        assert result["wire"] <= headers  # blocks zero on every rank never travel
    if "threshold" in case_id:
        assert result["dropped"] > 0
    if "request-driven" in case_id:
        # every packet of every rank is exactly the protocol's, replayed from the inputs
        assert result["unrequested"] == 0
        assert result["exact_packets"] and result["exact_positions"], result
        assert result["exact_wire"], result


# The benchmark script, as a user runs it ---------------------------------------------------


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(120)
def test_script_density_sweep_validates_and_writes_columns(tmp_path):
    out = tmp_path / "sparse.csv"
    proc = mpirun(
        2,
        [
            *variant_module("sparse_streaming"),
            "-m",
            "4K:64K",
            "-i",
            "3",
            "-x",
            "1",
            "--density",
            "0,0.1",
            "1",
            "--block-size",
            "100",
            "--fusion",
            "4",
            "-c",
            "--csv",
            out,
        ],
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Fail" not in proc.stdout
    rows = _rows(out)
    assert len(rows) == 5 * 3  # 5 sizes x 3 densities
    assert {r["validation"] for r in rows} == {"Pass"}
    for row in rows:
        assert row["algorithm"] == "omnireduce" and row["block_size"] == "100"
        assert float(row["nonzero_density"]) == pytest.approx(float(row["density"]), abs=0.02)
        wire, minimum = int(row["wire_bytes_per_rank"]), int(row["wire_min_bytes_per_rank"])
        assert minimum <= wire <= 1.1 * minimum + 512
    dense = [r for r in rows if r["density"] == "1.0"]
    assert all(float(r["union_density"]) == 1.0 for r in dense)


@pytest.mark.timeout(120)
def test_script_baselines_overlap_threshold_and_dedicated_aggregators(tmp_path):
    common = [*variant_module("sparse_streaming"), "-m", "16K:16K", "-i", "2", "-x", "1", "-c"]
    for algorithm in ("dense", "dense-ring", "allgather-sparse"):
        proc = mpirun(
            2,
            [
                *common,
                "--algorithm",
                algorithm,
                "--density",
                "0.3",
                "--csv",
                tmp_path / f"{algorithm}.csv",
            ],
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert {r["validation"] for r in _rows(tmp_path / f"{algorithm}.csv")} == {"Pass"}
    proc = mpirun(
        2,
        [
            *common,
            "--overlap",
            "all",
            "--density",
            "0.25",
            "--threshold",
            "1",
            "--csv",
            tmp_path / "t.csv",
        ],
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = _rows(tmp_path / "t.csv")
    assert row["validation"] == "Pass" and float(row["error_bound"]) == 2.0
    assert 0 < float(row["dropped_mass_rel"]) < 1
    assert float(row["union_density"]) <= 0.25  # all-overlap: the same blocks everywhere
    proc = mpirun(
        3,
        [*common, "--aggregators", "1", "--density", "0.2", "--csv", tmp_path / "k.csv"],
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = _rows(tmp_path / "k.csv")
    assert row["validation"] == "Pass" and row["aggregators"] == "1"


@pytest.mark.timeout(120)
def test_script_protocols_validate_and_record_their_parameters(tmp_path):
    common = [
        *variant_module("sparse_streaming"),
        "-m",
        "64K:64K",
        "-i",
        "2",
        "-x",
        "1",
        "-c",
        "--density",
        "0.2",
        "--fusion",
        "16",
        "--csv",
        tmp_path / "p.csv",
    ]
    for extra in (
        [],
        ["--slots", "3"],
        ["--protocol", "stream-ahead"],
        ["--protocol", "stream-ahead", "--window", "2", "--streams", "1"],
    ):
        proc = mpirun(2, [*common, *extra], timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _rows(tmp_path / "p.csv")
    assert [(r["protocol"], r["slots"], r["window"], r["streams"]) for r in rows] == [
        ("request-driven", "2", "", ""),
        ("request-driven", "3", "", ""),
        ("stream-ahead", "", "4", "2"),
        ("stream-ahead", "", "2", "1"),
    ]
    for row in rows:
        assert row["validation"] == "Pass"
        wire, minimum = int(row["wire_bytes_per_rank"]), int(row["wire_min_bytes_per_rank"])
        assert minimum <= wire <= 1.1 * minimum + 2048
    # request-driven blocks carry their next position too: 4 more bytes each in the minimum
    driven, ahead = rows[0], rows[2]
    blocks = (int(driven["wire_min_bytes_per_rank"]) - int(ahead["wire_min_bytes_per_rank"])) / 4
    assert blocks > 0 and blocks == int(blocks)
    assert int(ahead["wire_min_bytes_per_rank"]) == pytest.approx(blocks * (256 * 4 + 4))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args,message",
    [
        (["--density", "1.5"], "outside [0, 1]"),
        (["--algorithm", "dense", "--aggregators", "1"], "omnireduce only"),
        (["--aggregators", "2"], "leaves no worker"),
        (["--overlap", "some"], "invalid choice"),
        (["-T", "int8"], "floating-point"),
        (["--window", "2"], "stream-ahead only"),
        (["--streams", "3"], "stream-ahead only"),
        (["--protocol", "stream-ahead", "--slots", "3"], "request-driven only"),
        (["--protocol", "ahead"], "invalid choice"),
    ],
)
def test_script_bad_options_fail_with_one_line(args, message):
    proc = mpirun(2, [*variant_module("sparse_streaming"), "-m", "4K:4K", *args], timeout=50)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("ccbench: error") == 1

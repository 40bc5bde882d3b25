"""Behaviours seen in a variant's CSV rows on real ranks (tests/drivers/behaviour_cases.py,
one launch per rank count), each against a value worked out here by hand:

* bus bandwidth on 4 ranks, where (n-1)/n = 3/4 differs from 1/n, 1 - 1/n**2 and the
  other formulas that all give 0.5 on 2 ranks;
* OmniReduce's --slots: the streams per aggregator it sets, seen in the wire bytes;
* the time breakdown: a stub codec whose encode (or decode) sleeps puts that time in its
  own column, and the row reports the critical (slowest) rank.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.drivers.behaviour_cases import STUB_SLEEP_S
from tests.mpirun import case_results

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


def rows_of(nranks: int, case: str) -> list[dict]:
    result = case_results("tests.drivers.behaviour_cases", nranks).get(case)
    assert result is not None, f"{case} did not report"
    assert result["status"] == 0 and result["rows"], result
    return result["rows"]


# ----------------------------------------------------------------------------- bus bandwidth

# nccl-tests' factors by hand: allgather and reduce-scatter (n-1)/n, allreduce 2(n-1)/n
HAND_FACTORS = {
    ("allgather", 3): 2 / 3,
    ("allgather", 4): 3 / 4,
    ("allgather", 8): 7 / 8,
    ("reduce_scatter", 3): 2 / 3,
    ("reduce_scatter", 4): 3 / 4,
    ("reduce_scatter", 8): 7 / 8,
    ("allreduce", 3): 4 / 3,
    ("allreduce", 4): 3 / 2,
    ("allreduce", 8): 7 / 4,
    ("allgather", 1): 0.0,
    ("allreduce", 1): 0.0,
}


def test_busbw_factors_beyond_two_ranks():
    from ccbench.collectives.spec import SPECS

    for (collective, n), factor in HAND_FACTORS.items():
        assert SPECS[collective].busbw(n) == pytest.approx(factor, rel=1e-15), (collective, n)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "collective, factor", [("allgather", 3 / 4), ("reduce_scatter", 3 / 4), ("allreduce", 3 / 2)]
)
def test_busbw_column_on_four_ranks(collective, factor):
    rows = rows_of(4, f"busbw-{collective}")
    assert [int(r["size_bytes"]) for r in rows] == [1024, 65536]
    # algbw's bytes (nccl-tests): allgather the gathered 4 x size_bytes, reduce-scatter
    # and allreduce size_bytes
    total = {"allgather": 4, "reduce_scatter": 1, "allreduce": 1}[collective]
    for row in rows:
        size = int(row["size_bytes"])
        assert row["ranks"] == "4"
        assert int(row["total_bytes"]) == total * size
        algbw = total * size / (float(row["avg_us"]) * 1e-6) / 1e9
        assert float(row["algbw_gbps"]) == pytest.approx(algbw, rel=1e-9)
        assert float(row["busbw_gbps"]) == pytest.approx(factor * algbw, rel=1e-9)


# ----------------------------------------------------------------------------- OmniReduce slots


def test_slots_set_the_streams_of_every_aggregator():
    from ccbench.benchmarks.harness import parse_options, plan_cases
    from ccbench.benchmarks.sparse_streaming import SparseStreaming

    comm = SimpleNamespace(rank=0, size=4)
    for slots, aggregators, owners in ((3, 0, range(4)), (5, 1, [3]), (1, 2, [2, 3])):
        variant = SparseStreaming()
        opts = parse_options(
            variant, ["-m", "1M:1M", "--slots", str(slots), "--aggregators", str(aggregators)], comm
        )
        (case, *_), _ = plan_cases(variant, opts, comm)
        layout = variant.layout(case)
        # 1 MiB: 1024 blocks of 256 floats, enough for every slot to have a stream
        assert {r: len(layout.streams_of(r)) for r in range(4)} == {
            r: slots if r in owners else 0 for r in range(4)
        }


def omnireduce_wire(ranks: int, slots: int, nblocks: int, fusion: int, block_bytes: int) -> int:
    """Bytes one rank sends in a request-driven OmniReduce allreduce, every block non-zero
    on every rank, every stream the same length, worked from the message format.

    ranks x slots streams of L = nblocks / (ranks x slots) blocks, in C = min(fusion, L)
    columns and R = L / C rows. Each stream, each way (worker to aggregator, aggregator to
    each remote worker): a first packet of the header and C next positions (int32, padded
    to 16 bytes), then one packet per row: header, C positions, C nexts, C blocks.
    A rank works for the (ranks - 1) x slots streams of the others and answers the
    ranks - 1 remote workers of its own slots streams.
    """

    def pad16(n):
        return -(-n // 16) * 16

    length = nblocks // (ranks * slots)
    columns = min(fusion, length)
    rows = length // columns
    one_way = pad16(4 * (4 + columns)) + rows * (
        pad16(4 * (4 + 2 * columns)) + columns * block_bytes
    )
    return 2 * slots * (ranks - 1) * one_way


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "slots, expected",
    [
        # 64 KiB: 64 blocks of 1 KiB; fusion 4; one way per stream 32 + R x (48 + 4096):
        (1, 99_648),  # L 16, R 4: 2 x 1 x 3 x (32 + 4 x 4144)
        (2, 99_840),  # L 8,  R 2: 2 x 2 x 3 x (32 + 2 x 4144)
        (4, 100_224),  # L 4,  R 1: 2 x 4 x 3 x (32 + 4144)
    ],
)
def test_slots_per_aggregator_in_the_wire_bytes(slots, expected):
    assert omnireduce_wire(4, slots, 64, 4, 1024) == expected
    (row,) = rows_of(4, f"slots-{slots}")
    assert (row["slots"], row["protocol"], row["validation"]) == (
        str(slots),
        "request-driven",
        "Pass",
    )
    assert int(row["wire_bytes_per_rank"]) == expected


# ----------------------------------------------------------------------------- time breakdown

SLEEP_US = STUB_SLEEP_S * 1e6


# codec calls per allgather call on 2 ranks, by hand: collective level encodes its own
# block once and decodes both blocks (its own too: every rank ends with the decoded
# values), each in two pieces of 512 KiB when a block of 1 MiB is cut for testall
# progress; point to point has one hop, one encode of the block it sends and one decode
# of the block it gets
VARIANTS = ["coll", "coll-pieces", "p2p"]
ENCODES_PER_CALL = {"coll": 1, "coll-pieces": 2, "p2p": 1}
DECODES_PER_CALL = {"coll": 2, "coll-pieces": 4, "p2p": 1}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", VARIANTS)
def test_breakdown_puts_a_slow_encode_in_the_encode_column(variant):
    # every rank sleeps before each encode: that time is the encode column's alone
    (row,) = rows_of(2, f"breakdown-{variant}-slow-encode")
    encode, decode = float(row["encode_us"]), float(row["decode_us"])
    assert encode >= ENCODES_PER_CALL[variant] * SLEEP_US
    assert decode < SLEEP_US  # the fast side never holds a sleep
    assert float(row["call_us"]) >= encode


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", VARIANTS)
def test_breakdown_reports_the_critical_rank(variant):
    # only rank 1 decodes slowly: its calls take at least its decodes' sleeps, while rank
    # 0 never waits for rank 1's decodes (local work, done after rank 1's send); the row
    # must be rank 1's
    (row,) = rows_of(2, f"breakdown-{variant}-slow-decode-rank1")
    encode, decode = float(row["encode_us"]), float(row["decode_us"])
    assert decode >= DECODES_PER_CALL[variant] * SLEEP_US
    assert encode < SLEEP_US
    assert float(row["call_us"]) >= decode

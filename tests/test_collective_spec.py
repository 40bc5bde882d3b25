"""The one description of each collective (collectives/spec.py), against hand-worked
values: counts of an OSU size, bus-bandwidth factors, the ring's wire bytes, references."""

from __future__ import annotations

import numpy as np
import pytest

from ccbench.collectives.spec import SPECS, spec
from ccbench.kernels.errors import UsageError


def test_counts_of_an_osu_size_by_hand():
    # allgather: 4096 B float32 is what each of 4 ranks sends; 16 KiB gathered
    shape = spec("allgather").shape(4096, 4, "float32")
    assert (shape.count, shape.send_count, shape.recv_count) == (1024, 1024, 4096)
    assert (shape.bytes_per_rank, shape.total_bytes) == (4096, 16384)
    # reduce-scatter: 4096 B is the whole send buffer; each of 4 ranks keeps 256 values
    shape = spec("reduce_scatter").shape(4096, 4, "float32")
    assert (shape.recv_count, shape.bytes_per_rank, shape.total_bytes) == (256, 1024, 4096)
    assert spec("reduce_scatter").shape(8, 4, "float32") is None  # 2 values on 4 ranks
    with pytest.raises(UsageError, match="multiples of 12 B"):
        spec("reduce_scatter").shape(4096, 3, "float32")
    with pytest.raises(UsageError, match="unknown collective 'gather'"):
        spec("gather")


@pytest.mark.parametrize("ranks, gather, reduce", [(2, 0.5, 1.0), (3, 2 / 3, 4 / 3),
                                                    (4, 0.75, 1.5), (8, 0.875, 1.75)])
def test_bus_bandwidth_factors_are_nccl_tests(ranks, gather, reduce):
    assert SPECS["allgather"].busbw(ranks) == pytest.approx(gather, rel=1e-15)
    assert SPECS["reduce_scatter"].busbw(ranks) == pytest.approx(gather, rel=1e-15)
    assert SPECS["allreduce"].busbw(ranks) == pytest.approx(reduce, rel=1e-15)


def test_ring_wire_bytes_by_hand():
    # 4 ranks, 1 MiB: allgather forwards 3 blocks of 1 MiB; reduce-scatter 3 of 256 KiB;
    # allreduce 6 of 256 KiB
    mib = 1 << 20
    assert spec("allgather").ring_wire_bytes(mib, 4) == 3 * mib
    assert spec("reduce_scatter").ring_wire_bytes(mib, 4) == 3 * mib / 4
    assert spec("allreduce").ring_wire_bytes(mib, 4) == 6 * mib / 4
    # an allreduce of 10 values on 4 ranks: blocks of 3, 3, 2, 2, the largest 3
    assert spec("allreduce").ring_block_count(10, 4) == 3


def test_references_by_hand():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0, 40.0])
    assert spec("allgather").reference([a, b], 1).tolist() == [1, 2, 3, 4, 10, 20, 30, 40]
    assert spec("allreduce").reference([a, b], 0).tolist() == [11, 22, 33, 44]
    assert spec("reduce_scatter").reference([a, b], 0).tolist() == [11, 22]
    assert spec("reduce_scatter").reference([a, b], 1).tolist() == [33, 44]

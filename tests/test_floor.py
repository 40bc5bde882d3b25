"""The one floor of a call (collectives/costmodel.py) worked by hand, and the same number
from each of its users: the compressed variants' rows (overlap efficiency), the plots'
model lines and breakdown ticks; the share of the codec's work when ranks share a core or
a device. No ranks are launched."""

from __future__ import annotations

import pandas as pd
import pytest

from ccbench.collectives.costmodel import (
    call_floor_s,
    floor_steps,
    pipeline_chunk_bytes,
    pipeline_floor,
    wire_floor_s,
)


def test_floor_steps_by_hand():
    # a ring: P-1 steps, an allreduce twice that; the library's: ceil(log2 P) at least
    assert floor_steps("allgather", 4) == 3
    assert floor_steps("reduce_scatter", 4) == 3
    assert floor_steps("allreduce", 4) == 6
    assert floor_steps("allgather", 4, "mpi") == 2
    assert floor_steps("allreduce", 5, "mpi") == 3   # ceil(log2 5)
    assert floor_steps("allreduce", 8, "omnireduce") == 3
    assert floor_steps("allgather", 1) == 0


def test_wire_floor_by_hand():
    # 1 MB at 1 Gbit/s past a 125 kB burst: 875,000 x 8 / 1e9 = 7 ms; 3 steps of 0.2 ms
    assert wire_floor_s(1e6, 1e9, 125e3, 3, 2e-4) == pytest.approx(7.6e-3)
    # no burst, no fixed cost: the bytes at the rate, 8 ms
    assert wire_floor_s(1e6, 1e9) == pytest.approx(8e-3)
    # all of it inside the burst: only the steps remain, 2 x 0.1 ms
    assert wire_floor_s(100e3, 1e9, 125e3, 2, 1e-4) == pytest.approx(2e-4)


def test_call_floor_is_the_larger_of_wire_and_codec():
    assert call_floor_s(7.6e-3, 5e-3) == pytest.approx(7.6e-3)
    assert call_floor_s(7.6e-3, 9e-3) == pytest.approx(9e-3)
    assert call_floor_s(None, 4e-3) == 4e-3  # no link: the codec alone


def test_pipeline_floor_by_hand():
    # 1 MB over 1 Gbit/s is 8 ms on the wire; 3 ms of codec CPU on a core shared by two
    # ranks is 6 ms: the wire bounds the call
    got = pipeline_floor(1e6, 1e9, 3e-3, 2.0)
    assert got == pytest.approx({"wire": 8e-3, "codec": 6e-3, "floor": 8e-3})
    # the burst and the steps: (1e6 - 125e3) x 8 / 1e9 + 3 x 0.5 ms = 8.5 ms
    got = pipeline_floor(1e6, 1e9, 3e-3, 2.0, 125e3, 3, 5e-4)
    assert got == pytest.approx({"wire": 8.5e-3, "codec": 6e-3, "floor": 8.5e-3})
    # a costlier codec bounds it instead; one rank per core (or fewer) counts once
    got = pipeline_floor(1e6, 1e9, 10e-3, 0.5)
    assert got == pytest.approx({"wire": 8e-3, "codec": 10e-3, "floor": 10e-3})
    # shared memory: no link, the codec alone
    assert pipeline_floor(1e6, None, 2e-3, 2.0) == {"wire": None, "codec": 4e-3, "floor": 4e-3}


def test_pipeline_chunk_bytes_by_hand():
    # B = 4 MiB, 4 ranks, o = 1 ms, c = 1 GB/s, w = 0.5 GB/s of data through the link:
    # per byte 2/1e9 + 2/5e8 = 6e-9 s; sqrt(1e-3 x 4194304 / 6e-9) = 836,078 B -> 512 KiB
    assert pipeline_chunk_bytes(4 << 20, 4, 1e-3, 1e9, 5e8, 64 << 10) == 512 << 10
    # a cap below that holds it; a floor above it lifts it
    assert pipeline_chunk_bytes(4 << 20, 4, 1e-3, 1e9, 5e8, 64 << 10, 256 << 10) == 256 << 10
    assert pipeline_chunk_bytes(4 << 20, 4, 1e-3, 1e9, 5e8, 1 << 20) == 1 << 20
    # 10 ms per message: sqrt(1e-2 x 4194304 / 6e-9) = 2.64 MB, short of the block -> 2 MiB;
    # 100 ms: 8.36 MB, past the block -> the block, one chunk
    assert pipeline_chunk_bytes(4 << 20, 4, 1e-2, 1e9, 5e8, 64 << 10) == 2 << 20
    assert pipeline_chunk_bytes(4 << 20, 4, 1e-1, 1e9, 5e8, 64 << 10) == 4 << 20
    # no per-message cost: the smallest chunk
    assert pipeline_chunk_bytes(4 << 20, 4, 0.0, 1e9, 5e8, 64 << 10) == 64 << 10


def test_the_codec_share_counts_ranks_per_core_and_per_device():
    from ccbench.benchmarks.compressed_base import codec_share

    # 4 ranks on host a over 2 cores, 1 rank on host b: 2 ranks per core on a
    places = [("a", [0], None), ("a", [1], None), ("a", [0], None), ("a", [1], None),
              ("b", [0, 1, 2, 3], None)]
    assert codec_share(places, 1, on_device=False) == (2.0, None)
    assert codec_share(places, 4, on_device=False) == (0.25, None)
    # on devices: 3 ranks of host a on device 0, 1 on device 1, host b's rank on device 0
    places = [("a", [0], "gpu0"), ("a", [1], "gpu0"), ("a", [2], "gpu0"),
              ("a", [3], "gpu1"), ("b", [0], "gpu0")]
    assert codec_share(places, 0, on_device=True) == (1.0, 3.0)
    assert codec_share(places, 3, on_device=True) == (1.0, 1.0)
    assert codec_share(places, 4, on_device=True) == (1.0, 1.0)  # another host's gpu0


def floor_row(**extra) -> dict:
    row = {"collective": "reduce_scatter", "ranks": 4, "algorithm": "ring",
           "variant": "coll_compressed", "size_bytes": 4 << 20, "link_gbps": 1.0,
           "link_ceiling_gbps": 0.95, "link_burst_bytes": 125000, "link_step_us": 200.0,
           "wire_bytes_per_rank": 1_000_000, "codec_floor_us": 5000.0, "avg_us": 1.0}
    row.update(extra)
    return row


def test_every_user_of_the_floor_gets_the_same_number():
    """The plots' floor (latency model lines and breakdown ticks: plots.base.floor_us) and
    the rows' floor (costmodel.pipeline_floor, as benchmarks/compressed_base.py calls it)
    on the same inputs, both against the number worked by hand."""
    from ccbench.plots.base import floor_us

    # (1e6 - 125e3) B x 8 / 0.95 Gbit/s = 7,368.42 us, + 3 steps x 200 us = 7,968.42 us;
    # the codec's 5,000 us is less
    hand = 875000 * 8 / 0.95e3 + 600
    frame = pd.DataFrame([floor_row()])
    assert float(floor_us(frame).iloc[0]) == pytest.approx(hand)
    row = pipeline_floor(1_000_000, 0.95e9, 2.5e-3, 2.0, 125000,
                         floor_steps("reduce_scatter", 4), 200e-6)
    assert row["floor"] * 1e6 == pytest.approx(hand)
    # the codec bounds it where it is larger
    frame = pd.DataFrame([floor_row(codec_floor_us=9000.0)])
    assert float(floor_us(frame).iloc[0]) == pytest.approx(9000.0)
    # the library's allgather: ceil(log2 4) = 2 steps, nothing of a codec
    frame = pd.DataFrame([floor_row(variant="baseline", algorithm="mpi", collective="allgather",
                                    codec_floor_us=float("nan"))])
    assert float(floor_us(frame).iloc[0]) == pytest.approx(875000 * 8 / 0.95e3 + 400)
    # off a link: no floor
    frame = pd.DataFrame([floor_row(link_gbps=float("nan"))])
    assert floor_us(frame).isna().all()


def test_a_row_under_its_floor_is_found():
    from ccbench.plots.base import below_floor

    hand = 875000 * 8 / 0.95e3 + 600
    frame = pd.DataFrame([floor_row(avg_us=hand * 0.99), floor_row(avg_us=hand * 1.01)])
    assert list(below_floor(frame).index) == [0]

"""The one floor of a call (collectives/costmodel.py) worked by hand, and the same number
from each of its users: the compressed variants' rows (overlap efficiency), the plots'
model lines and breakdown ticks; the share of the codec's work when ranks share a core or
a device. No ranks are launched."""

from __future__ import annotations

import pandas as pd
import pytest

from ccbench.collectives.costmodel import (
    call_floor_s,
    chunk_candidates,
    codec_floor_s,
    floor_steps,
    pipeline_chunk_bytes,
    pipeline_floor,
    pipeline_time_s,
    wire_floor_s,
)


def test_floor_steps_by_hand():
    # a ring: P-1 steps, an allreduce twice that; the library's: ceil(log2 P) at least
    assert floor_steps("allgather", 4) == 3
    assert floor_steps("reduce_scatter", 4) == 3
    assert floor_steps("allreduce", 4) == 6
    assert floor_steps("allgather", 4, "mpi") == 2
    assert floor_steps("allreduce", 5, "mpi") == 3  # ceil(log2 5)
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


def test_codec_floor_from_the_fastest_calls_of_the_sharing_ranks():
    # two ranks on one core, fastest codec times 2 ms and 3 ms per call: the core must
    # give both 5 ms (the mean 2.5 ms times 2 ranks per core)
    assert codec_floor_s([2e-3, 3e-3], 2.0) == pytest.approx(5e-3)
    # one rank with 4 cores to itself: its own 3 ms (one thread), not 3 ms x 0.25
    assert codec_floor_s([3e-3], 0.25) == pytest.approx(3e-3)
    # 4 ranks over 2 cores, one much slower (7 ms): the mean 2.5 ms x 2 = 5 ms is less
    # than that rank's own 7 ms, which bounds the call
    assert codec_floor_s([1e-3, 1e-3, 1e-3, 7e-3], 2.0) == pytest.approx(7e-3)
    # the rows' floor takes the sharing ranks' times (a scalar: one rank's, times share)
    assert pipeline_floor(0.0, None, [2e-3, 3e-3], 2.0)["codec"] == pytest.approx(5e-3)


def test_pipeline_time_by_hand():
    # B = 256 KiB over 4 ranks, B/w = 1 ms, B/c = 0.25 ms, o = 0.1 ms, 2 ranks per core:
    # W = 3 ms; K = 2 x 3 x 0.25 = 1.5 ms; C = 3 x 0.1 n = 0.3 n ms; F = 0.5 / n ms;
    # G (reducing) = 2 max(0, 1.25 / n - 1) ms; T = max(W, K) + C + F + G
    b, w, c = 262144, 262144 / 1e-3, 262144 / 0.25e-3
    hand = {1: (4.3e-3, 3.8e-3), 2: (3.85e-3, 3.85e-3), 4: (4.325e-3, 4.325e-3)}
    for n, (reducing, gathering) in hand.items():
        assert pipeline_time_s(b, n, 4, 1e-4, c, w, 2.0, True) == pytest.approx(reducing)
        assert pipeline_time_s(b, n, 4, 1e-4, c, w, 2.0, False) == pytest.approx(gathering)
    assert pipeline_time_s(b, 1, 1, 1e-4, c, w) == 0.0  # one rank: no ring


def test_pipeline_chunk_bytes_by_hand():
    b, w, c = 262144, 262144 / 1e-3, 262144 / 0.25e-3
    assert chunk_candidates(b, 64 << 10) == [64 << 10, 128 << 10, 256 << 10]
    assert chunk_candidates(16 << 10, 64 << 10) == [64 << 10]  # a block under the least
    # the times of test_pipeline_time_by_hand: the reduce-scatter's least is n = 2,
    # chunks of 128 KiB; the allgather's (no gaps) n = 1, the block
    assert pipeline_chunk_bytes(b, 4, 1e-4, c, w, 64 << 10, share=2.0, reduces=True) == 128 << 10
    assert pipeline_chunk_bytes(b, 4, 1e-4, c, w, 64 << 10, share=2.0) == b
    # 1 ms per chunk: C = 3 n ms; n = 1: 3 + 3 + 0.5 + 0.5 = 7 ms, n = 2: 3 + 6 + 0.25
    # = 9.25 ms: one chunk per step, the block
    assert pipeline_chunk_bytes(b, 4, 1e-3, c, w, 64 << 10, share=2.0, reduces=True) == b
    # free chunks: n = 4, 3 + 0.125 ms, is least: the least chunk, 64 KiB
    assert pipeline_chunk_bytes(b, 4, 0.0, c, w, 64 << 10, share=2.0, reduces=True) == 64 << 10
    # a cap holds it (1 ms per chunk would take the block), a least chunk above it lifts it
    assert pipeline_chunk_bytes(b, 4, 1e-3, c, w, 64 << 10, 128 << 10, 2.0, True) == 128 << 10
    assert pipeline_chunk_bytes(b, 4, 0.0, c, w, 256 << 10, share=2.0, reduces=True) == b


def test_the_codec_share_counts_ranks_per_core_and_per_device():
    from ccbench.benchmarks.compressed_base import codec_share

    # 4 ranks on host a over 2 cores, 1 rank on host b: 2 ranks per core on a
    places = [
        ("a", [0], None),
        ("a", [1], None),
        ("a", [0], None),
        ("a", [1], None),
        ("b", [0, 1, 2, 3], None),
    ]
    assert codec_share(places, 1, on_device=False) == (2.0, None)
    assert codec_share(places, 4, on_device=False) == (0.25, None)
    # on devices: 3 ranks of host a on device 0, 1 on device 1, host b's rank on device 0
    places = [
        ("a", [0], "gpu0"),
        ("a", [1], "gpu0"),
        ("a", [2], "gpu0"),
        ("a", [3], "gpu1"),
        ("b", [0], "gpu0"),
    ]
    assert codec_share(places, 0, on_device=True) == (1.0, 3.0)
    assert codec_share(places, 3, on_device=True) == (1.0, 1.0)
    assert codec_share(places, 4, on_device=True) == (1.0, 1.0)  # another host's gpu0


def floor_row(**extra) -> dict:
    row = {
        "collective": "reduce_scatter",
        "ranks": 4,
        "algorithm": "ring",
        "variant": "coll_compressed",
        "size_bytes": 4 << 20,
        "link_gbps": 1.0,
        "link_ceiling_gbps": 0.95,
        "link_burst_bytes": 125000,
        "link_step_us": 200.0,
        "wire_bytes_per_rank": 1_000_000,
        "codec_floor_us": 5000.0,
        "avg_us": 1.0,
    }
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
    row = pipeline_floor(
        1_000_000, 0.95e9, 2.5e-3, 2.0, 125000, floor_steps("reduce_scatter", 4), 200e-6
    )
    assert row["floor"] * 1e6 == pytest.approx(hand)
    # the codec bounds it where it is larger
    frame = pd.DataFrame([floor_row(codec_floor_us=9000.0)])
    assert float(floor_us(frame).iloc[0]) == pytest.approx(9000.0)
    # the library's allgather: ceil(log2 4) = 2 steps, nothing of a codec
    frame = pd.DataFrame(
        [
            floor_row(
                variant="baseline",
                algorithm="mpi",
                collective="allgather",
                codec_floor_us=float("nan"),
            )
        ]
    )
    assert float(floor_us(frame).iloc[0]) == pytest.approx(875000 * 8 / 0.95e3 + 400)
    # off a link: no floor
    frame = pd.DataFrame([floor_row(link_gbps=float("nan"))])
    assert floor_us(frame).isna().all()


def test_a_row_under_its_floor_is_found():
    from ccbench.plots.base import below_floor

    hand = 875000 * 8 / 0.95e3 + 600
    frame = pd.DataFrame([floor_row(avg_us=hand * 0.99), floor_row(avg_us=hand * 1.01)])
    assert list(below_floor(frame).index) == [0]
    assert list(below_floor(frame)["_bound"]) == ["wire"]


def test_a_row_under_its_codec_floor_is_named_with_its_reason():
    """A row whose codec floor (9,000 us) is above its wire floor (7,968 us, by hand) and
    whose call took 8,500 us is under the codec's floor; one at 7,900 us is under both,
    and the codec's sets its floor; one at 9,100 us is above."""
    from ccbench.plots.base import below_floor, below_floor_text

    frame = pd.DataFrame(
        [floor_row(codec_floor_us=9000.0, avg_us=t) for t in (8500.0, 7900.0, 9100.0)]
        + [floor_row(avg_us=7900.0)]
    )
    below = below_floor(frame)
    assert list(below.index) == [0, 1, 3]
    assert list(below["_bound"]) == ["codec", "codec", "wire"]
    text = below_floor_text(below, "point(s) (red x)")
    assert text.startswith(" 3 point(s) (red x) measured BELOW their floor (red): ")
    assert "2 under the codec's floor" in text and "1 under the wire's floor" in text
    assert below_floor_text(below_floor(frame.iloc[[2]]), "point(s)") == ""


class FourRanks:
    """What breakdown_columns asks of a communicator, with every rank's contribution
    given: 4 ranks of host a, bound 2 to a core."""

    def __init__(self, everyone):
        self.everyone = everyone

    def processor_name(self) -> str:
        return "a"

    def allgather_obj(self, _mine):
        return self.everyone


def test_the_rows_codec_floor_takes_every_sharing_ranks_fastest_call(switch):
    """The row's codec floor, as benchmarks/compressed_base.py computes it, against the
    hand-worked number: 4 ranks on 2 cores (2 per core); mean call times 10, 12, 9 and
    11 ms (rank 1 is critical), mean codec times 4, 5, 3 and 4 ms, fastest calls' codec
    times 3, 4, 2.5 and 3.5 ms. The floor: mean 3.25 ms x 2 = 6.5 ms (not rank 1's mean
    5 ms x 2 = 10 ms, which the calls' 9-12 ms would not all clear); no link: the codec's
    floor alone; efficiency 12 / 6.5."""
    from ccbench.benchmarks.compressed_base import breakdown_columns

    for name in (
        "CCBENCH_LINK_CEILING_GBPS",
        "CCBENCH_LINK_GOODPUT_GBPS",
        "CCBENCH_LINK_GBPS",
        "CCBENCH_LINK_BURST_BYTES",
        "CCBENCH_LINK_STEP_US",
    ):
        switch(name, None)
    ms = 1e-3
    calls, codec, fastest = (10, 12, 9, 11), (4, 5, 3, 4), (3, 4, 2.5, 3.5)
    everyone = [
        ([t * ms, 0.0, 0.0, 0.0, 0.0, c * ms, 0.0], 1000, ("a", [r % 2], None), f * ms)
        for r, (t, c, f) in enumerate(zip(calls, codec, fastest, strict=True))
    ]
    row = breakdown_columns(FourRanks(everyone), everyone[0][0], 1000, "allgather")
    assert row["call_us"] == pytest.approx(12000.0)
    assert row["codec_cpu_us"] == pytest.approx(5000.0)  # the critical rank's mean
    assert row["ranks_per_core"] == 2.0
    assert row["codec_floor_us"] == pytest.approx(6500.0)
    assert row["floor_us"] == pytest.approx(6500.0) and row["wire_floor_us"] is None
    assert row["overlap_efficiency"] == pytest.approx(12 / 6.5)


def test_the_fastest_call_is_the_least_of_the_timed_calls():
    """Breakdown.fastest: the least value of each field over the timed calls (the warm-up
    and the untimed last call left out), worked by hand on three timed calls."""
    import numpy as np

    from ccbench.collectives.pipeline import CODEC_CPU, Breakdown

    breakdown = Breakdown()
    codec = [0.5, 3.0, 2.0, 4.0, 0.1]  # warm-up, three timed calls, the untimed last call
    breakdown.rows = [np.array([1.0, 0, 0, 0, 0, c, 0]) for c in codec]
    assert breakdown.fastest(1, -1)[CODEC_CPU] == 2.0
    assert breakdown.mean(1, -1)[CODEC_CPU] == pytest.approx(3.0)

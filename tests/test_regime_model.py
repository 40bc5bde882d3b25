"""The regime model: savings against the codec-to-wire ratio, checked against closed forms
worked by hand (4 ranks, 16 MiB, in units of S / L: the seconds 16 MiB takes on the link).

Allgather: baseline 3; collective level max(3/r, 2/rho) (one encode, three decodes of S,
half a round trip each); point-to-point 3/r + 3/rho (three hops, each a round trip).
Reduce-scatter: baseline 3/4; collective level max(3/(4r), 3/(4 rho)) (an encode, a decode
and two hops of S/4, a hop costing a round trip); point-to-point 3/(4r) + 3/(4 rho).
"""

import math

import pytest

from ccbench.collectives.regime_model import (
    RegimeParts,
    call_times,
    measured_parts,
    overlap_efficiency,
    payload_rate_bps,
    savings,
)

S_OVER_L = (16 << 20) * 8 / 1e9  # seconds for 16 MiB at 1 Gbit/s


@pytest.mark.parametrize(
    "collective, r, rho, vs_p2p, vs_baseline",
    [
        ("allgather", 2, 4, 1 - 1.5 / 2.25, 1 - 1.5 / 3),  # wire-bound: 1/3 and 1/2
        ("allgather", 8, 1, 1 - 2 / 3.375, 1 - 2 / 3),  # codec-bound: 0.407 and 1/3
        ("allgather", 8, 16, 1 - 0.375 / 0.5625, 1 - 0.375 / 3),  # 1/3 and 0.875
        ("reduce_scatter", 4, 2, 1 - 0.375 / 0.5625, 1 - 0.375 / 0.75),  # codec-bound
        ("reduce_scatter", 4, 16, 1 - 0.1875 / 0.234375, 1 - 0.1875 / 0.75),  # 0.2, 0.75
    ],
)
def test_savings_closed_forms(collective, r, rho, vs_p2p, vs_baseline):
    got = savings(rho, collective, RegimeParts(compression=r))
    assert got["vs_p2p"] == pytest.approx(vs_p2p, rel=1e-9)
    assert got["vs_baseline"] == pytest.approx(vs_baseline, rel=1e-9)


def test_step_cost_and_efficiency_enter_the_times():
    # allgather r=2, rho=4, 10 ms per step: the library pays ceil(log2 4) = 2 steps, the
    # rings 3; the collective level runs at 1.2x its floor
    parts = RegimeParts(compression=2, step_s=0.01, efficiency={"coll_compressed": 1.2})
    t = call_times(4, "allgather", parts)
    assert t["baseline"] == pytest.approx(3 * S_OVER_L + 0.02)
    assert t["coll"] == pytest.approx(1.2 * (1.5 * S_OVER_L + 0.03))
    assert t["p2p"] == pytest.approx(1.5 * S_OVER_L + 0.03 + 0.75 * S_OVER_L)


def test_encode_share_moves_the_allgathers_codec_time():
    # encode a quarter of a round trip: coll codec = S/4 + 3 x 3S/4 = 2.5 S (per rho L)
    t = call_times(1, "allgather", RegimeParts(compression=8, encode_share=0.25))
    assert t["coll"] == pytest.approx(2.5 * S_OVER_L)
    assert t["p2p"] == pytest.approx((3 / 8 + 3) * S_OVER_L)


def test_measured_parts_from_a_rows_codec_times():
    # allgather of 1 MiB: encode 1 MiB in 1 ms, decode 3 MiB in 6 ms -> 3 ms per MiB round
    # trip: 1 MiB / 3 ms = 349.5 MB/s over 1 Gbit/s (125 MB/s) = 2.796
    got = measured_parts("allgather", 1 << 20, 4, 1000, 6000, 0, 1.0)
    assert got["round_trip_bps"] == pytest.approx((1 << 20) / 3e-3)
    assert got["encode_share"] == pytest.approx(1 / 3)
    assert got["ratio"] == pytest.approx((1 << 20) / 3e-3 / 1.25e8)
    # reduce-scatter of 4 MiB: blocks of 1 MiB, encode 1 ms, decode 1 ms, two hops 4 ms:
    # 6 ms over 3 MiB of round trips (half of each end block, two hops), 2 ms per MiB
    got = measured_parts("reduce_scatter", 4 << 20, 4, 1000, 1000, 4000, 0.5)
    assert got["hop_round_trips"] == pytest.approx(1.0)
    assert got["encode_share"] == pytest.approx(0.5)
    assert got["ratio"] == pytest.approx((1 << 20) / 2e-3 / 6.25e7)
    # the row counts the last decode with the hops: the same codec work, the same rate
    same = measured_parts("reduce_scatter", 4 << 20, 4, 1000, 0, 5000, 0.5)
    assert same["ratio"] == pytest.approx(got["ratio"])


def test_payload_rate_from_the_librarys_call():
    # allgather, 4 ranks, 16 MiB: a rank sends 3 x 16 MiB; the library pays 2 steps of
    # 10 ms; a call of 2.01326592 s leaves 1.99326592 s for 402653184 bits
    got = payload_rate_bps("allgather", 16 << 20, 4, 2.01326592, 0.01)
    assert got == pytest.approx(402653184 / 1.99326592)
    # reduce-scatter: 3/4 of 16 MiB sent, less a 125000-byte burst: 99663328 bits over
    # 0.5 s less 2 steps of 5 ms
    got = payload_rate_bps("reduce_scatter", 16 << 20, 4, 0.5, 0.005, 125000)
    assert got == pytest.approx((12582912 - 125000) * 8 / 0.49)
    # the steps alone take the whole call: no rate
    assert math.isnan(payload_rate_bps("allgather", 16 << 20, 4, 0.02, 0.01))


def test_overlap_efficiency_is_the_call_over_the_models_floor():
    # allgather r=2, rho=4: the collective level's floor is max(3/2, 2/4) = 1.5 S/L; a call
    # of 2.25 S/L is 1.5 times it, whatever efficiency the parts already carry
    parts = RegimeParts(compression=2, efficiency={"coll_compressed": 9.0})
    got = overlap_efficiency("coll_compressed", 4, "allgather", parts, 2.25 * S_OVER_L)
    assert got == pytest.approx(1.5)
    # point-to-point's floor there: 3/2 + 3/4 = 2.25 S/L; a call of 1.8 S/L is 0.8 of it
    got = overlap_efficiency("p2p_compressed", 4, "allgather", parts, 1.8 * S_OVER_L)
    assert got == pytest.approx(0.8)
    # at 0.5 Gbit/s (the codec still 4 times that rate) wire and codec take twice as
    # long: a floor of 3 S/L (S/L at 1 Gbit/s)
    got = overlap_efficiency(
        "coll_compressed", 4, "allgather", RegimeParts(compression=2), 4.5 * S_OVER_L, 0.5e9
    )
    assert got == pytest.approx(1.5)

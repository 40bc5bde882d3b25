"""The cost model of `ccbench advise` (collectives/compression_model.py): hand-worked
calls and steps, the closed forms already in the project (the ring's wire bytes, the
textbook ring and Rabenseifner alpha-beta, MG-WFBP's timeline), and the ranking."""

from __future__ import annotations

import numpy as np
import pytest

from ccbench.collectives import compression_model as cm
from ccbench.collectives.costmodel import LinkModel
from ccbench.collectives.mgwfbp import Profile, evaluate, wfbp_stops
from ccbench.collectives.spec import spec
from ccbench.collectives.trace import Event, Step

MIB = 1 << 20


def codec(name="fp16", ratio=2.0, rate=1e9, rel_l2=1e-4):
    return cm.CodecRates(name, ratio, rate, rate, rate, rel_l2)


def test_ring_allgather_by_hand():
    # P = 4, 1 MiB each: 3 MiB sent = 25.165824 ms at 1 Gbit/s, plus 3 steps of 0.1 ms
    net = cm.Network(1e9, 100e-6)
    t = cm.call_seconds(cm.Option(cm.RING), net, "allgather", MIB, 4)
    assert float(t["time"]) == pytest.approx(25.465824e-3, rel=1e-12)
    # the library's: the same bytes, ceil(log2 4) = 2 steps
    t = cm.call_seconds(cm.Option(cm.LIBRARY), net, "allgather", MIB, 4)
    assert float(t["time"]) == pytest.approx(25.365824e-3, rel=1e-12)


def test_collective_level_by_hand():
    # fp16 halves the 3 MiB; the codec encodes 1 MiB and decodes 3 MiB at 1 GB/s
    # (4.194304 ms), times 2 ranks per core = 8.388608 ms: under the wire, so hidden
    net = cm.Network(1e9, 100e-6)
    option = cm.Option(cm.COLL, codec(), efficiency=1.1)
    t = cm.call_seconds(option, net, "allgather", MIB, 4, codec_share=2)
    assert float(t["wire"]) == pytest.approx(12.882912e-3, rel=1e-12)
    assert float(t["codec"]) == pytest.approx(8.388608e-3, rel=1e-12)
    assert float(t["time"]) == pytest.approx(1.1 * 12.882912e-3, rel=1e-12)
    # point-to-point: encode and decode at each of 3 hops (6 MiB of codec work), in series
    p2p = cm.call_seconds(cm.Option(cm.P2P, codec()), net, "allgather", MIB, 4)
    assert float(p2p["time"]) == pytest.approx(12.882912e-3 + 6 * MIB / 1e9, rel=1e-12)
    # a slow codec: the floor is the codec's
    slow = cm.Option(cm.COLL, codec(rate=0.2e9))
    t = cm.call_seconds(slow, net, "allgather", MIB, 4)
    assert float(t["time"]) == pytest.approx(4 * MIB / 0.2e9, rel=1e-12)


def test_reduce_scatter_codec_work_by_hand():
    # 8 MiB over 4 ranks: 2 MiB blocks; encode one, 2 middle hops, decode one
    work = cm.codec_work_bytes(cm.COLL, "reduce_scatter", 8 * MIB, 4)
    assert work == {"encode": 2 * MIB, "decode": 2 * MIB, "hop": 4 * MIB}
    assert cm.codec_work_bytes(cm.RING, "allreduce", 8 * MIB, 4) == {
        "encode": 0.0,
        "decode": 0.0,
        "hop": 0.0,
    }


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_wire_bytes_are_the_rings_over_the_ratio(collective, ranks):
    size = 48 * MIB
    ring = spec(collective).ring_wire_bytes(size, ranks)
    assert cm.wire_bytes(cm.Option(cm.RING), collective, size, ranks) == ring
    assert cm.wire_bytes(
        cm.Option(cm.COLL, codec(ratio=4.0)), collective, size, ranks
    ) == pytest.approx(ring / 4)
    expected = {
        "allgather": (ranks - 1) * size,
        "reduce_scatter": (ranks - 1) / ranks * size,
        "allreduce": 2 * (ranks - 1) / ranks * size,
    }[collective]
    assert ring == pytest.approx(expected)


@pytest.mark.parametrize("ranks", [2, 4, 5, 8, 16])
def test_ring_allreduce_is_the_textbook_alpha_beta(ranks):
    net = cm.Network(10e9, 5e-6)
    mine = cm.uncompressed_alpha_beta(net, "allreduce", ranks, "ring")
    theirs = LinkModel(link_gbps=10.0, hop_latency_us=5.0).ring_allreduce(ranks)
    assert mine.alpha_us == pytest.approx(theirs.alpha_us)
    assert mine.beta_us_per_byte == pytest.approx(theirs.beta_us_per_byte)
    # and the call's time through the floor is the same line
    t = cm.call_seconds(cm.Option(cm.RING), net, "allreduce", 64 * MIB, ranks)["time"]
    assert float(t) * 1e6 == pytest.approx(float(theirs.time_us(64 * MIB)))


@pytest.mark.parametrize("ranks", [2, 4, 8, 64])
def test_rabenseifner_is_the_projects_model(ranks):
    net = cm.Network(25e9, 2e-6)
    mine = cm.uncompressed_alpha_beta(net, "allreduce", ranks, "rabenseifner")
    theirs = LinkModel(link_gbps=25.0, hop_latency_us=2.0).rabenseifner_allreduce(ranks)
    assert mine.alpha_us == pytest.approx(theirs.alpha_us)
    assert mine.beta_us_per_byte == pytest.approx(theirs.beta_us_per_byte)


def test_step_timeline_by_hand():
    # call 0 issued at 1 ms runs 3 ms (ends 4); call 1 issued at 2 ms waits for the
    # stream, ends 5; wait(0) at 2 ms -> 4; 2 ms compute -> 6; drain (5) -> 6; tail 1 -> 7
    step = Step(
        events=[
            Event("call", 1000, id=0, collective="allgather", count=4),
            Event("call", 1000, id=1, collective="allgather", count=4),
            Event("wait", 0, id=0),
            Event("drain", 2000),
        ],
        tail_us=1000,
    )
    assert cm.step_timeline(step, [3e-3, 1e-3]) == pytest.approx(7e-3)
    # without overlap every call blocks: 1 + 3 + 1 + 1 + 2 + 1 = 9 ms
    assert cm.step_timeline(step, [3e-3, 1e-3], overlap=False) == pytest.approx(9e-3)


def test_step_agrees_with_mgwfbp_timeline():
    # one allreduce per gradient as it is ready (WFBP), on MG-WFBP's alpha-beta
    nbytes = np.array([4 * MIB, 1 * MIB, 16 * MIB, 256 << 10], dtype=np.int64)
    backward = np.array([3000.0, 500.0, 8000.0, 200.0])
    profile = Profile("m", tuple("abcd"), nbytes, backward, forward_us=5000.0)
    net = cm.Network(1e9, 50e-6)
    cost = cm.uncompressed_alpha_beta(net, "allreduce", 4, "ring")
    plan = evaluate(profile, cost, wfbp_stops(profile))
    events = [
        Event(
            "call",
            backward[i] + (profile.forward_us if i == 0 else 0.0),
            id=i,
            collective="allreduce",
            count=int(nbytes[i]) // 4,
        )
        for i in range(4)
    ]
    step = Step(events=[*events, Event("drain", 0.0)])
    predicted = cm.predict_step(cm.Option(cm.RING), net, step, 4)
    assert predicted.step_s * 1e6 == pytest.approx(plan.iteration_us)
    assert predicted.compute_s * 1e6 == pytest.approx(5000 + backward.sum())


def step_of(sizes_mib):
    """A step of blocking allgathers (no compute): every call exposed."""
    return Step(
        events=[
            Event("call", 0.0, id=i, collective="allgather", count=s * MIB // 4, blocking=True)
            for i, s in enumerate(sizes_mib)
        ]
    )


def test_ranking_on_a_known_case():
    # a slow link and fast codecs: bfp (ratio 4) then fp16 (2) then the uncompressed ones,
    # the library ahead of the ring (fewer steps); an error budget that leaves bfp out
    net = cm.Network(0.1e9, 100e-6)
    options = {
        o.label: o
        for o in (
            cm.Option(cm.LIBRARY),
            cm.Option(cm.RING),
            cm.Option(cm.COLL, codec("fp16", 2.0, 10e9, 2e-4)),
            cm.Option(cm.COLL, codec("bfp:rate=8", 4.0, 10e9, 1e-2)),
        )
    }
    step = step_of([8, 8, 32])
    predictions = {k: cm.predict_step(o, net, step, 4) for k, o in options.items()}
    errors = {k: cm.step_error(o, step, 4) for k, o in options.items()}
    assert cm.rank_options(predictions, errors, None) == [
        "coll_compressed:bfp:rate=8",
        "coll_compressed:fp16",
        "library",
        "ring",
    ]
    assert cm.rank_options(predictions, errors, 1e-3)[0] == "coll_compressed:fp16"
    # allgather: one round trip per element (collective level)
    assert errors["coll_compressed:fp16"] == pytest.approx(2e-4)
    # a fast link and a slow codec: nothing compressed pays
    fast = cm.Network(400e9, 100e-6)
    slow = {
        k: cm.Option(o.variant, cm.CodecRates(o.codec.spec, o.codec.ratio, 1e9, 1e9, 1e9))
        if o.codec
        else o
        for k, o in options.items()
    }
    predictions = {k: cm.predict_step(o, fast, step, 4) for k, o in slow.items()}
    assert cm.rank_options(predictions, errors, None)[0] == "library"


def test_break_even_by_hand():
    # coll fp16 at efficiency 1.2 (codec free) against the ring: faster when
    # 1.2 (12 S / R + 3 f) < 24 S / R + 3 f, S > 0.6 f R / 9.6 = 6250 B -> 8 KiB
    net = cm.Network(1e9, 100e-6)
    option = cm.Option(cm.COLL, codec(rate=1e15), efficiency=1.2)
    assert cm.break_even_bytes(option, cm.Option(cm.RING), net, "allgather", 4) == 8192
    assert (
        cm.break_even_bytes(
            cm.Option(cm.COLL, codec(rate=1e15)), cm.Option(cm.RING), net, "allgather", 4
        )
        == 0.0
    )
    slow = cm.Option(cm.COLL, codec(rate=1e6))
    assert cm.break_even_bytes(slow, cm.Option(cm.RING), net, "allgather", 4) is None


def test_fastest_map_switches_with_the_link():
    options = [cm.Option(cm.LIBRARY), cm.Option(cm.COLL, codec(rate=2e9))]
    grid = cm.fastest_map(options, [0.1e9, 1000e9], [64 * MIB], 10e-6, "allgather", 4)
    assert grid[:, 0].tolist() == [1, 0]


def test_buckets_and_options():
    assert [cm.bucket_of(b) for b in (1000, MIB, 20 * MIB, 64 * MIB)] == list(cm.BUCKET_NAMES)
    with pytest.raises(ValueError):
        cm.Option(cm.COLL)
    with pytest.raises(ValueError):
        cm.Option("fast")

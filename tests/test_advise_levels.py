"""`ccbench advise` on a network of nodes (docs/advise.md, "Nodes: two levels"): the
hierarchical options' calls and errors worked by hand, their efficiencies read from
hierarchical rows only, an intra-node rate nobody measured setting them apart, and a
layout that does not fit refused in one line. No MPI, no cluster."""

from __future__ import annotations

import csv
import math
import subprocess
import sys

import pytest

from ccbench.benchmarks.results import CODEC, HARNESS, SCHEMA, write_csv_atomic
from ccbench.collectives import compression_model as cm
from ccbench.collectives import trace_files as tracefile
from ccbench.collectives.trace import Event, Step, Trace
from ccbench.scripts.advise import command as advise

MIB = 1 << 20
S = 8e6  # OSU size of the hand-worked calls, bytes
# 2 nodes x 2 ranks; 1 Gbit/s between nodes, 1 ms a step, no burst; 8 Gbit/s inside
TWO_LEVELS = cm.Network(1e9, 1e-3, 0.0, 2, 8e9)
FP16_X4 = cm.CodecRates("fp16", 4.0, 1e9, 1e9, 1e9, 0.01)


@pytest.mark.parametrize(
    "option, collective, seconds",
    [
        # inside: the node's ring allgather on each of the 2 nodes' slabs, 2 x 8 MB at
        # 8 Gbit/s = 16 ms; across: each node's link carries its 2 ranks' blocks, 16 MB
        # at 1 Gbit/s = 128 ms, plus 1 step (2 nodes) = 145 ms
        (cm.Option("library", hierarchical=True), "allgather", 0.145),
        (cm.Option("ring", hierarchical=True), "allgather", 0.145),
        # flat on 4 ranks: 3 x 8 MB = 192 ms, and the ring's 3 steps or log2 4 = 2
        (cm.Option("ring"), "allgather", 0.195),
        (cm.Option("library"), "allgather", 0.194),
        # reduce-scatter: inside 8 MB / 2 = 4 MB at 8 Gbit/s = 4 ms; across 2 ranks x
        # half of 4 MB = 4 MB at 1 Gbit/s = 32 ms, 1 step: 37 ms (flat: 6 MB, 3 steps)
        (cm.Option("ring", hierarchical=True), "reduce_scatter", 0.037),
        (cm.Option("ring"), "reduce_scatter", 0.051),
        # x4 codec: the link's 16 MB / 4 = 32 ms + 1 ms; the codec encodes 8 MB and
        # decodes 8 MB at 1 GB/s = 16 ms, hidden behind the link at the collective
        # level, whose level inside the node runs beside it too (max(16, 33, 16) =
        # 33 ms; its allreduce keeps them in series); point-to-point, all in
        # series (16 + 33 + 16)
        (cm.Option("coll_compressed", FP16_X4, hierarchical=True), "allgather", 0.033),
        (cm.Option("p2p_compressed", FP16_X4, hierarchical=True), "allgather", 0.065),
    ],
)
def test_calls_on_two_levels_by_hand(option, collective, seconds):
    got = cm.call_seconds(option, TWO_LEVELS, collective, S, 4)
    assert float(got["time"]) == pytest.approx(seconds, rel=1e-12)
    # arrays of sizes alike (the break-even map's grid): twice the size, twice the
    # bytes, the same steps
    both = cm.call_seconds(option, TWO_LEVELS, collective, [S, 2 * S], 4)["time"]
    assert float(both[0]) == pytest.approx(seconds, rel=1e-12)


def test_a_hierarchical_option_is_flat_on_one_level():
    one = cm.Network(1e9, 1e-3)
    for c in ("allgather", "reduce_scatter", "allreduce"):
        hier = cm.call_seconds(cm.Option("ring", hierarchical=True), one, c, S, 4)["time"]
        flat = cm.call_seconds(cm.Option("ring"), one, c, S, 4)["time"]
        assert float(hier) == float(flat)


def test_the_error_crosses_nodes_only():
    step = Step(
        events=[Event("call", 0.0, id=0, collective="reduce_scatter", count=MIB, blocking=True)]
    )
    # the collective-level ring reduce-scatter re-encodes at every hop: P - 1 round
    # trips on 4 ranks, N - 1 = 1 on 2 nodes
    flat = cm.step_error(cm.Option("coll_compressed", FP16_X4), step, 4, 2)
    hier = cm.step_error(cm.Option("coll_compressed", FP16_X4, hierarchical=True), step, 4, 2)
    assert flat == pytest.approx(0.01 * math.sqrt(3))
    assert hier == pytest.approx(0.01)


def _row(**values) -> dict:
    row = dict.fromkeys(HARNESS.variant_columns("coll_compressed"), "")
    row.update(
        {
            SCHEMA: HARNESS.tag,
            "variant": "coll_compressed",
            "collective": "allgather",
            "codec": "fp16",
            "ranks": 4,
            "size_bytes": 2 * MIB,
            "link_gbps": 1,
            "link_step_us": 1000,
            "compression_ratio": 2.0,
            "ranks_per_core": 1.0,
            **values,
        }
    )
    return row


def two_level_parts(folder, intra_gbps):
    folder.mkdir()
    codec = dict.fromkeys(CODEC.names, "")
    codec.update(
        {
            SCHEMA: CODEC.tag,
            "run_id": "codecrun",
            "codec": "fp16",
            "kernels": "fused",
            "data": "grad:lm-small",
            "buffer": "numpy",
            "ratio": 2.0,
            "encode_gbps": 1e6,
            "decode_gbps": 1e6,
            "hop_gbps": 1e6,
            "rel_l2_err": 2e-4,
        }
    )
    write_csv_atomic(folder / "codecs.csv", [codec], CODEC.names)
    flat = _row(
        run_id="flatrun",
        algorithm="ring",
        # 1.25 x the flat floor: 3 x 2 MiB / 2 at 1 Gbit/s = 25.165824 ms + 3 steps
        avg_us=1.25 * 28165.824,
        # 8 MiB through the codec (2 encoded, 6 decoded) in 8.388608 us: 1e12 B/s in a
        # step, 1000 x slower than alone
        encode_us=2.097152,
        decode_us=6.291456,
        reduce_us=0.0,
    )
    hier = _row(
        run_id="noderun",
        algorithm="hierarchical-ring",
        ranks_per_node=2,
        intra_node_gbps=intra_gbps,
        # the row's ratio counts the uncompressed bytes inside the node; across nodes
        # the link carried 2 x 2 MiB / 2: the codec's ratio 2 there
        compression_ratio=1.2,
        node_link_bytes=2 * MIB,
        # 1.5 x the two-level floor: inside 2 x 2 MiB at 8 Gbit/s = 4.194304 ms, beside
        # the level across: the node's 2 x 2 MiB / 2 at 1 Gbit/s = 16.777216 ms + 1 step
        avg_us=1.5 * 17777.216,
    )
    # through node leaders: a design measured beside the others, no option's parts (read
    # as flat, it would pull the flat efficiency's median to (1.25 + 3) / 2)
    leaders = _row(
        run_id="leadersrun",
        algorithm="leaders-ring",
        ranks_per_node=2,
        avg_us=3 * 28165.824,
        encode_us=2.097152,
        decode_us=6.291456,
        reduce_us=0.0,
    )
    # the same design with its levels in series (the ring inside the node): not the one
    # the option's model runs, so not its efficiency (read, 10 x would move the median)
    series = _row(
        run_id="seriesrun",
        algorithm="hierarchical-ring",
        ranks_per_node=2,
        intra_node_gbps=intra_gbps,
        compression_ratio=1.2,
        node_link_bytes=2 * MIB,
        levels="series",
        avg_us=15 * 17777.216,
    )
    hier["levels"] = "overlapped"
    columns = HARNESS.variant_columns("coll_compressed")
    write_csv_atomic(folder / "coll.csv", [flat, hier, leaders, series], columns)


def one_allgather_trace(path):
    # one blocking allgather of an 8 MiB gathered buffer on 4 ranks: OSU size 2 MiB
    step = Step(
        events=[Event("call", 0.0, id=0, collective="allgather", count=2 * MIB, blocking=True)],
        number=1,
    )
    tracefile.write(Trace(ranks=4, steps=[step], source={"kind": "built"}), path)


def run_advise(tmp_path, *extra):
    trace = tmp_path / "t.json"
    one_allgather_trace(trace)
    out = tmp_path / "advice.csv"
    argv = ["--model", str(trace), "--link", "1gbit", "--latency", "1ms", "--ranks-per-node"]
    argv += ["2", "--results", str(tmp_path / "parts"), "--codecs", "fp16"]
    argv += ["--variants", "ring,coll_compressed", "--csv", str(out), *extra]
    assert advise.main(argv) == 0
    with open(out, newline="") as f:
        rows = {r["option"]: r for r in csv.DictReader(f)}
    with open(tmp_path / "advice-inputs.csv", newline="") as f:
        inputs = list(csv.DictReader(f))
    return rows, inputs


def test_hierarchical_and_flat_options_each_from_their_own_rows(tmp_path):
    two_level_parts(tmp_path / "parts", intra_gbps=8)
    rows, inputs = run_advise(tmp_path, "--intra-link", "8gbit")
    hier, flat = rows["coll_compressed:fp16@node"], rows["coll_compressed:fp16"]
    assert float(hier["step_ms"]) == pytest.approx(1.5 * 17.777216, rel=1e-9)
    assert float(flat["step_ms"]) == pytest.approx(1.25 * 28.165824, rel=1e-9)
    assert hier["rank"] == "1" and flat["rank"] == "2"
    assert hier["measured_here"] == "yes" == flat["measured_here"]

    def value(option, name):
        found = [i for i in inputs if (i["option"], i["input"]) == (option, name)]
        return float(found[0]["value"])

    assert value("coll_compressed:fp16", "efficiency allgather") == pytest.approx(1.25)
    assert value("coll_compressed:fp16@node", "efficiency allgather") == pytest.approx(1.5)
    assert value("coll_compressed:fp16@node", "intra-node rate b/s") == 8e9
    # the uncompressed ring, flat and hierarchical, are in the table, unmeasured here
    assert rows["ring"]["measured_here"] == "no" == rows["ring@node"]["measured_here"]


def test_an_unmeasured_intra_node_rate_never_wins(tmp_path):
    # no --intra-link and rows that recorded none: inside a node is costed 0, so the
    # hierarchical option is predicted fastest, and listed apart, unranked
    two_level_parts(tmp_path / "parts", intra_gbps="")
    rows, _ = run_advise(tmp_path)
    hier, flat = rows["coll_compressed:fp16@node"], rows["coll_compressed:fp16"]
    # 1.5 x (16.777216 + 1) ms: the row's own efficiency, against the floor without
    # the intra level, and the prediction without it
    assert float(hier["step_ms"]) == pytest.approx(1.5 * 17.777216, rel=1e-9)
    assert float(hier["step_ms"]) < float(flat["step_ms"])
    assert hier["rank"] == "" and "intra-node rate b/s" in hier["not_measured"]
    assert flat["rank"] == "1"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ranks", "4", "--ranks-per-node", "3"], "--ranks-per-node 3: 4 ranks do not make"),
        (["--ranks", "4", "--ranks-per-node", "0"], "--ranks-per-node 0: must be at least 1"),
        (["--ranks", "4", "--intra-link", "100gbit"], "--intra-link goes with --ranks-per-node"),
    ],
)
def test_a_layout_that_does_not_fit_is_one_line_and_status_2(tmp_path, argv, message):
    done = subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", "advise", "--model", "lm-tiny"]
        + ["--link", "1gbit", "--latency", "1ms", *argv, "--results", str(tmp_path)]
        + ["--csv", str(tmp_path / "a.csv")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr


def test_the_map_names_a_hierarchical_option_apart():
    from ccbench.plots.advise_map import option_label

    assert option_label(cm.Option("library")) == "library (MPI)"
    assert option_label(cm.Option("library", hierarchical=True)) == "library (MPI), hierarchical"


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"ranks_per_node": "2", "ranks": "4", "nodes": "2"}, 2),
        # the baseline's hierarchical rows record the layout through `nodes` alone
        ({"ranks_per_node": "", "ranks": "4", "nodes": "2"}, 2),
        ({"ranks": "8", "nodes": "2"}, 4),
        ({"ranks": "4", "nodes": "4"}, 1),
        ({"ranks": "4", "nodes": "3"}, 1),  # no whole nodes: one rank per node
        ({"ranks": "4"}, 1),
    ],
)
def test_a_rows_ranks_per_node(row, expected):
    from ccbench.scripts.advise.parts import _row_ranks_per_node

    assert _row_ranks_per_node(row) == expected


def test_a_call_between_measured_sizes_takes_their_excess_over_the_floor_interpolated():
    m, ms = 1 << 20, 1e-3
    # measured at 1, 2 and 4 MiB against floors of 1, 2 and 4 ms: excesses 1, 1 and 2 ms
    e = cm.SizedEfficiency.of([m, 2 * m, 4 * m], [2.0, 1.5, 1.5], [1 * ms, 2 * ms, 4 * ms])
    assert e.at(3 * m, 3 * ms) == pytest.approx(1 + 1.5 / 3)  # excess 1.5 ms, halfway
    assert e.at(2 * m, 2 * ms) == pytest.approx(1.5)  # a measured size: its own
    assert e.at(m // 2, 0.5 * ms) == pytest.approx(3.0)  # below: the line, flat here: 1 ms
    assert e.at(8 * m, 8 * ms) == 1.5  # above the largest: its efficiency
    assert e.at(3 * m) == 1.5  # no floor given: the nearest size's (4 MiB on a log)
    assert list(e.at([3 * m, 8 * m], [3 * ms, 8 * ms])) == pytest.approx([1.5, 1.5])
    # below the smallest, the line through the two smallest: 2 ms at 1 MiB, 1 at 2 MiB
    falling = cm.SizedEfficiency.of([m, 2 * m], [3.0, 1.5], [1 * ms, 2 * ms])
    assert falling.at(m // 2, 0.5 * ms) == pytest.approx(1 + 2.5 / 0.5)
    # 0.5 ms at 1 MiB, 2 ms at 2 MiB: the line reaches -0.625 ms at 256 KiB; held at 0
    rising = cm.SizedEfficiency.of([m, 2 * m], [1.5, 2.0], [1 * ms, 2 * ms])
    assert rising.at(m // 4, 0.25 * ms) == pytest.approx(1.0)
    # one size, or no floors: the nearest size's efficiency
    assert cm.SizedEfficiency.of([m], [2.0], [1 * ms]).at(m // 2, 0.5 * ms) == 2.0
    assert cm.SizedEfficiency.of([m, 4 * m], [2.0, 1.5]).at(3 * m, 3 * ms) == 1.5


def test_a_calls_time_is_its_floor_plus_the_interpolated_excess():
    m = 1 << 20
    one = cm.Network(1e9, 0.0)
    # a ring allgather on 4 ranks at 1 Gbit/s: 3 x size bytes, 25.165824 ms a MiB
    floor = [3 * s * 8 / 1e9 for s in (m, 2 * m)]
    assert float(cm.call_seconds(cm.Option("ring"), one, "allgather", m, 4)["floor"]) == (
        pytest.approx(floor[0])
    )
    measured = [floor[0] + 2e-3, floor[1] + 4e-3]  # excess 2 ms at 1 MiB, 4 ms at 2 MiB
    e = cm.SizedEfficiency.of(
        [m, 2 * m], [t / f for t, f in zip(measured, floor, strict=True)], floor
    )
    option = cm.Option("ring", efficiency={"allgather": e})
    t = cm.call_seconds(option, one, "allgather", 1.5 * m, 4)
    assert float(t["time"]) == pytest.approx(3 * 1.5 * m * 8 / 1e9 + 3e-3)


def test_a_call_takes_the_efficiency_measured_nearest_its_size():
    m = 1 << 20
    e = cm.SizedEfficiency.of([m, 4 * m, 16 * m, 16 * m], [2.0, 1.5, 1.25, 1.75])
    assert e.sizes == (m, 4 * m, 16 * m) and e.values == (2.0, 1.5, 1.5)
    assert e.median == 1.625  # of the four rows
    e = cm.SizedEfficiency.of([m, 4 * m, 16 * m, 16 * m], [2.0, 1.5, 1.25, 1.25])
    # 0.79 MB: 1 MiB is nearest; 3.2 MB: log(4 MiB / 3.2 MB) 0.27 < log(3.2 MB / 1 MiB) 1.1
    assert e.at(790_000) == 2.0 and e.at(3.2e6) == 1.5 and e.at(64 * m) == 1.25
    assert e.at(None) == 1.375
    assert list(e.at([m, 9 * m])) == [2.0, 1.25]  # 9 MiB: 16 MiB nearer than 4 on a log
    option = cm.Option("ring", efficiency={"allgather": e})
    one = cm.Network(1e9, 0.0)
    for size, eff in ((m, 2.0), (4 * m, 1.5)):
        t = cm.call_seconds(option, one, "allgather", size, 4)
        assert float(t["time"]) == pytest.approx(eff * float(t["floor"]))


def test_rows_timed_back_to_back_are_the_efficiency_where_there_are_any(tmp_path):
    two_level_parts(tmp_path / "parts", intra_gbps=8)
    # the flat option's call at 2 MiB timed back to back (as a step issues its calls), at
    # 1.6 x its floor, beside the per-call row at 1.25 x: the step reads 1.6
    back_to_back = _row(
        run_id="batchrun",
        algorithm="ring",
        timing="batch",
        avg_us=1.6 * 28165.824,
        encode_us=2.097152,
        decode_us=6.291456,
        reduce_us=0.0,
    )
    path = tmp_path / "parts" / "batch.csv"
    write_csv_atomic(path, [back_to_back], HARNESS.variant_columns("coll_compressed"))
    rows, inputs = run_advise(tmp_path, "--intra-link", "8gbit")
    assert float(rows["coll_compressed:fp16"]["step_ms"]) == pytest.approx(1.6 * 28.165824)
    found = [
        i
        for i in inputs
        if (i["option"], i["input"]) == ("coll_compressed:fp16", "efficiency allgather")
    ]
    assert float(found[0]["value"]) == pytest.approx(1.6)
    assert "timed back to back" in found[0]["source"] and "batchrun" in found[0]["source"]
    # the hierarchical option had no row timed so: its per-call row, as before
    assert float(rows["coll_compressed:fp16@node"]["step_ms"]) == pytest.approx(1.5 * 17.777216)

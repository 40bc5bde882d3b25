"""`ccbench advise` ranks on measurements (docs/advise.md): an option with an input not
measured on this link, rank count and codec is listed apart and never ranked above a
measured one; an efficiency nothing measured is the worst measured of its collective;
codec rates are the ones a step ran (the harness rows' in-call codec time); a default
error budget; the ring and the library always in the table; the check's verdict in the
advice. Every expected value is worked by hand from the rows built here."""

from __future__ import annotations

import csv

import pytest

from ccbench.benchmarks.results import CODEC, HARNESS, SCHEMA, write_csv_atomic
from ccbench.collectives import compression_model as cm
from ccbench.collectives import trace_files as tracefile
from ccbench.collectives.trace import Event, Step, Trace
from ccbench.scripts.advise import check as advise_check
from ccbench.scripts.advise import command as advise
from tests.helpers.rows import harness_row

MIB = 1 << 20
WIRE_4MIB_MS = 100.663296  # a 4 MiB allgather's ring on 4 ranks: 12 MiB at 1 Gbit/s


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def trace_file(path):
    # one blocking allgather of a 4 MiB gathered buffer on 4 ranks: OSU size 1 MiB
    step = Step(
        events=[Event("call", 0.0, id=0, collective="allgather", count=MIB, blocking=True)],
        number=1,
    )
    tracefile.write(Trace(ranks=4, steps=[step], source={"kind": "built"}), path)
    return str(path)


def codec_row(codec, ratio, gbps, rel_l2):
    row = dict.fromkeys(CODEC.names, "")
    row.update(
        {
            SCHEMA: CODEC.tag,
            "run_id": "codecrun",
            "codec": codec,
            "kernels": "fused",
            "data": "grad:lm-small",
            "buffer": "numpy",
            "ratio": ratio,
            "encode_gbps": gbps,
            "decode_gbps": gbps,
            "hop_gbps": gbps,
            "rel_l2_err": rel_l2,
        }
    )
    return row


def ranked_row(variant, codec, avg_us, **extra):
    """A 4 MiB (OSU) allgather on 4 ranks at an emulated 1 Gbit/s, no step cost."""
    columns = HARNESS.variant_columns(variant)
    row = harness_row(
        columns,
        run_id=f"{variant}run",
        variant=variant,
        algorithm="ring",
        collective="allgather",
        codec=codec,
        ranks=4,
        size_bytes=4 * MIB,
        link_gbps=1,
        avg_us=avg_us,
        **extra,
    )
    return row, columns


def write(folder, name, rows, columns):
    folder.mkdir(exist_ok=True)
    write_csv_atomic(folder / name, rows, columns)


def measured_fp16_and_ring(folder):
    """fp16 (collective level) measured at 1.5 x its floor with its codec timed in the
    call; the ring at 1.1 x its floor; bfp:rate=8 and bf16 only alone on a core."""
    write(
        folder,
        "codecs.csv",
        [
            codec_row("fp16", 2.0, 1e6, 2e-4),
            codec_row("bfp:rate=8", 4.0, 1e6, 1.1e-2),
            codec_row("bfp:rate=4", 8.0, 1e6, 0.1),
        ],
        CODEC.names,
    )
    # fp16: 6 MiB on the wire (50.331648 ms) over a codec of 16 MiB at 1e12 B/s in a step
    row, columns = ranked_row(
        "coll_compressed",
        "fp16",
        1.5 * 50331.648,
        compression_ratio=2.0,
        encode_us=4.194304,
        decode_us=12.582912,
        reduce_us=0.0,
        ranks_per_core=1.0,
    )
    write(folder, "coll.csv", [row], columns)
    row, columns = ranked_row("baseline", "none", 1.1 * WIRE_4MIB_MS * 1e3)
    write(folder, "ring.csv", [row], columns)


def run(tmp_path, *extra):
    out = tmp_path / "a.csv"
    argv = [
        "--model",
        trace_file(tmp_path / "t.json"),
        "--link",
        "1gbit",
        "--latency",
        "100us",
        "--results",
        str(tmp_path / "parts"),
        "--csv",
        str(out),
        *extra,
    ]
    assert advise.main(argv) == 0
    return read(out), read(tmp_path / "a-inputs.csv")


def test_an_option_not_measured_here_is_never_ranked_above_a_measured_one(tmp_path, capsys):
    measured_fp16_and_ring(tmp_path / "parts")
    rows, inputs = run(tmp_path, "--codecs", "fp16,bfp:rate=8", "--variants",
                       "library,ring,coll_compressed")  # fmt: skip
    by = {r["option"]: r for r in rows}
    # measured, ranked: fp16 1.5 x (3 MiB / 2 at 1 Gbit/s + 3 x 100 us) = 19.324368 ms;
    # the ring 1.1 x (3 MiB at 1 Gbit/s + 3 x 100 us) = 28.0124064 ms
    assert [r["option"] for r in rows[:2]] == ["coll_compressed:fp16", "ring"]
    assert [r["rank"] for r in rows[:2]] == ["1", "2"]
    assert float(by["coll_compressed:fp16"]["step_ms"]) == pytest.approx(19.324368, rel=1e-9)
    assert float(by["ring"]["step_ms"]) == pytest.approx(28.0124064, rel=1e-9)
    # bfp:rate=8 ran on no link: its efficiency is the worst measured of the allgather
    # (fp16's 1.5, not the floor's 1.0): 1.5 x (3 MiB / 4 at 1 Gbit/s + 0.3 ms) =
    # 9.887184 ms, faster than fp16, and still below it, unranked, naming what it lacks
    bfp = by["coll_compressed:bfp:rate=8"]
    assert float(bfp["step_ms"]) == pytest.approx(9.887184, rel=1e-9)
    assert bfp["rank"] == "" and bfp["measured_here"] == "no"
    assert bfp["not_measured"] == "codec rates in a step;efficiency allgather"
    # the library (no row: efficiency 1.5): 1.5 x (3 MiB at 1 Gbit/s + 2 x 100 us)
    assert by["library"]["rank"] == "" and by["library"]["not_measured"] == "efficiency allgather"
    assert float(by["library"]["step_ms"]) == pytest.approx(38.048736, rel=1e-9)
    assert [r["option"] for r in rows[2:]] == ["coll_compressed:bfp:rate=8", "library"]
    eff = next(
        i
        for i in inputs
        if i["option"] == "coll_compressed:bfp:rate=8" and i["input"] == "efficiency allgather"
    )
    assert float(eff["value"]) == pytest.approx(1.5) and eff["assumed"] == "yes"
    assert "worst measured of allgather, coll_compressed:fp16's" in eff["source"]
    printed = capsys.readouterr().out
    assert "advice: coll_compressed:fp16 (compression pays): predicted step 19 ms" in printed
    assert "lacks: codec rates in a step, efficiency allgather" in printed


def test_the_ring_and_the_library_are_always_in_the_table(tmp_path):
    measured_fp16_and_ring(tmp_path / "parts")
    rows, _ = run(tmp_path, "--codecs", "fp16", "--max-error", "fp16")
    assert {"ring", "library"} <= {r["option"] for r in rows}


def test_codec_rates_come_from_the_step_not_from_one_core_alone(tmp_path):
    # point-to-point fp16 alone on a core: 1e9 B/s. Its harness row (4 MiB OSU, 2 ranks
    # per core) timed 100.663296 ms of codec in the call: the model's codec for it from
    # the alone rate is 24 MiB (3 hops x 4 MiB encoded, as many decoded) / 1e9 x 2 =
    # 50.331648 ms, so a step runs the codec at 1e9 / 2 = 5e8 B/s. Against that rate
    # the row's floor is 50.331648 + 100.663296 ms, and its 181.1939328 ms is 1.2 x it
    folder = tmp_path / "parts"
    write(folder, "codecs.csv", [codec_row("fp16", 2.0, 1.0, 2e-4)], CODEC.names)
    row, columns = ranked_row(
        "p2p_compressed",
        "fp16",
        1.2 * 150994.944,
        compression_ratio=2.0,
        encode_us=50331.648,
        decode_us=50331.648,
        reduce_us=999.0,  # the point-to-point add is not codec time
        ranks_per_core=2.0,
    )
    write(folder, "p2p.csv", [row], columns)
    rows, inputs = run(tmp_path, "--codecs", "fp16", "--variants", "p2p_compressed")
    # the step's call, 1 MiB OSU on a declared link, one rank per core: wire 3 MiB / 2 at
    # 1 Gbit/s + 3 x 100 us = 12.882912 ms, codec 6 MiB / 5e8 = 12.582912 ms, in series
    assert float(rows[0]["step_ms"]) == pytest.approx(1.2 * (12.882912 + 12.582912), rel=1e-9)
    assert rows[0]["measured_here"] == "yes"
    got = {i["input"]: i for i in inputs if i["option"] == "p2p_compressed:fp16"}
    assert float(got["encode B/s"]["value"]) == pytest.approx(5e8, rel=1e-5)
    assert got["encode B/s"]["source"].startswith("in a step")
    assert got["codec rates in a step"]["value"] == "measured"
    # on the rows' own link (--network results) the ranks sharing a core are the rows'
    # (2): codec 6 MiB / 5e8 x 2 = 25.165824 ms, wire 3 MiB / 2 at 1 Gbit/s (no step cost
    # recorded: 0, assumed) = 12.582912 ms
    out = tmp_path / "r.csv"
    argv = ["--model", str(tmp_path / "t.json"), "--results", str(folder), "--csv", str(out)]
    assert advise.main([*argv, "--codecs", "fp16", "--variants", "p2p_compressed"]) == 0
    assert float(read(out)[0]["step_ms"]) == pytest.approx(1.2 * (12.582912 + 25.165824))
    share = next(i for i in read(tmp_path / "r-inputs.csv") if i["input"] == "ranks per codec core")
    assert float(share["value"]) == 2.0 and share["assumed"] == "no"
    # without the codec_throughput row: one rate from the row alone, 24 MiB x 2 ranks per
    # core over 100.663296 ms = 5e8 B/s; its error unknown, so the budget leaves it out
    (folder / "codecs.csv").unlink()
    rows, inputs = run(tmp_path, "--codecs", "fp16", "--variants", "p2p_compressed,ring")
    got = {i["input"]: i for i in inputs if i["option"] == "p2p_compressed:fp16"}
    assert float(got["decode B/s"]["value"]) == pytest.approx(5e8, rel=1e-5)
    assert got["round-trip rel L2"]["assumed"] == "yes"
    assert [r["option"] for r in rows] == ["ring"]


def test_rates_measured_only_alone_set_the_option_apart(tmp_path):
    measured_fp16_and_ring(tmp_path / "parts")
    _, inputs = run(tmp_path, "--codecs", "bfp:rate=8", "--variants", "coll_compressed,ring")
    got = {i["input"]: i for i in inputs if i["option"] == "coll_compressed:bfp:rate=8"}
    assert got["codec rates in a step"]["value"] == "alone on one core"
    assert got["codec rates in a step"]["assumed"] == "yes"
    assert got["encode B/s"]["source"].startswith("alone on one core")


def test_a_default_error_budget_leaves_out_what_training_did_not_show_harmless(tmp_path, capsys):
    measured_fp16_and_ring(tmp_path / "parts")
    # bfp:rate=4's round trip 0.1, once on the collective-level allgather's path: 0.1 per
    # step, over the default 0.0203; fp16's 2e-4 and bfp:rate=8's 1.1e-2 within it
    rows, _ = run(tmp_path, "--codecs", "fp16,bfp:rate=8,bfp:rate=4")
    options = {r["option"] for r in rows}
    assert "coll_compressed:bfp:rate=4" not in options
    assert {"coll_compressed:fp16", "coll_compressed:bfp:rate=8"} <= options
    printed = capsys.readouterr().out
    assert advise.DEFAULT_MAX_ERROR == pytest.approx(1.17e-2 * 3**0.5, abs=5e-5)
    assert (
        "left out: coll_compressed:bfp:rate=4: error 1.00e-01 per step over the default "
        "budget 0.0203" in printed
    )
    rows, _ = run(tmp_path, "--codecs", "bfp:rate=4", "--max-error", "0.2")
    assert "coll_compressed:bfp:rate=4" in {r["option"] for r in rows}


def test_the_advice_carries_its_checks_verdict(tmp_path, capsys, monkeypatch):
    measured_fp16_and_ring(tmp_path / "parts")
    monkeypatch.setattr(
        advise,
        "network_of",
        lambda opts, tables: (cm.Network(1e9, 100e-6), [], 1.0, "fake", 1.0),
    )
    measured = {"coll_compressed:fp16": 1.28 * 19.324368e-3, "ring": 20e-3}
    monkeypatch.setattr(
        advise_check,
        "replay_once",
        lambda cluster, ranks, trace, label, steps, csv_path: {
            "step": measured[label],
            "codec": 0.0,
        },
    )
    out = tmp_path / "a.csv"
    argv = ["--model", trace_file(tmp_path / "t.json"), "--results", str(tmp_path / "parts")]
    argv += ["--codecs", "fp16", "--csv", str(out), "--check", "--top", "1", "--rounds", "2"]
    assert advise.main(argv) == 0
    advice = capsys.readouterr().out.strip().splitlines()[-1]
    # fp16 predicted 19.324368 ms, measured 1.28 x that (predicted 1 / 1.28 - 1 = -22%
    # off); the ring measured 20 ms against 28.0124064 predicted (+40% off), the
    # fastest, its interval a point (equal rounds)
    assert advice.startswith("# advice: coll_compressed:fp16 (compression pays)")
    assert (
        "check failed: the advised option (coll_compressed:fp16) measured 25 ms "
        "(95% interval 25-25), 28% slower than predicted (19 ms) and outside the interval "
        "of the measured fastest, ring (20 ms, 20-20); 0 of 2 predictions within 15% of "
        "their measurement (off by more: coll_compressed:fp16 -22%, ring +40%)" in advice
    )
    check = {r["option"]: r for r in read(tmp_path / "a-check.csv")}
    assert check["coll_compressed:fp16"]["advised"] == "yes" and check["ring"]["advised"] == "no"


def test_measure_fills_in_what_was_not_measured_here_then_ranks(tmp_path, monkeypatch):
    from ccbench.scripts.advise import measure

    measured_fp16_and_ring(tmp_path / "parts")
    (tmp_path / "parts" / "ring.csv").unlink()  # neither the ring nor the library measured
    monkeypatch.setattr(
        advise,
        "network_of",
        lambda opts, tables: (cm.Network(1e9, 100e-6), [], 1.0, "fake", 1.0),
    )
    launched, asked = [], set()

    def fake_run(command, what):  # the harness launch: rows at 1.1 (ring), 1.2 (library)
        launched.append(what)
        harness = command[command.index("--") :]  # after `cluster run`'s own options
        sizes = harness[harness.index("--collective") :]  # after python's own -m
        asked.add((sizes[sizes.index("-m") + 1], sizes[sizes.index("--timing") + 1]))
        csv_path = command[command.index("--csv") + 1]
        algorithm = command[command.index("--algorithm") + 1]
        factor = 1.1 if algorithm == "ring" else 1.2
        row, columns = ranked_row("baseline", "none", factor * WIRE_4MIB_MS * 1e3)
        row["algorithm"] = algorithm
        write_csv_atomic(csv_path.replace(".csv", f"-{algorithm}.csv"), [row], columns)

    monkeypatch.setattr(measure, "_run", fake_run)
    rows, _ = run(
        tmp_path, "--codecs", "fp16", "--variants", "library,ring,coll_compressed", "--measure"
    )
    assert sorted(launched) == ["library allgather", "ring allgather"]
    # at the step's own call (a 4 MiB gathered buffer on 4 ranks: 1 MiB a rank), its calls
    # timed back to back as the step issues them
    assert asked == {("1048576:1048576", "batch")}  # `-m 1048576` alone: up to 1 MiB
    # all measured now: fp16 1.5 x 12.882912, the ring 1.1 x 25.465824, the library
    # 1.2 x (3 MiB at 1 Gbit/s + 2 x 100 us)
    assert [(r["rank"], r["option"]) for r in rows] == [
        ("1", "coll_compressed:fp16"),
        ("2", "ring"),
        ("3", "library"),
    ]
    assert [float(r["step_ms"]) for r in rows] == pytest.approx(
        [19.324368, 28.0124064, 30.4389888], rel=1e-9
    )


def test_the_parts_are_measured_at_each_of_the_steps_call_sizes():
    from ccbench.benchmarks.options import size_list
    from ccbench.scripts.advise.measure import step_sizes

    # 4 ranks: all-gathers of 4 MiB and 1 MiB gathered (OSU 1 MiB and 256 KiB a rank), a
    # reduce-scatter of 3 MiB (its OSU size: the whole input) twice
    calls = [("allgather", MIB), ("allgather", MIB // 4), ("reduce_scatter", 3 * MIB // 4)]
    calls.append(calls[-1])
    events = [
        Event("call", 0.0, id=i, collective=c, count=n, blocking=True)
        for i, (c, n) in enumerate(calls)
    ]
    sizes = step_sizes(Step(events=events, number=1), 4)
    # -m as the harness reads it: 256 KiB doubled twice is 1 MiB, so a list; one size alone
    # as MIN:MAX (`-m N` is every power of two up to N)
    assert sizes == {"allgather": "262144,1048576", "reduce_scatter": "3145728:3145728"}
    assert size_list(sizes["allgather"]) == [MIB // 4, MIB]
    assert size_list(sizes["reduce_scatter"]) == [3 * MIB]

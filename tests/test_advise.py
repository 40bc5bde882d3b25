"""`ccbench advise` (scripts/advise/command.py): a hand-worked step through the command, the
provenance of every input (measured rows named, missing ones assumed), the files it
writes, and bad input as one line and status 2. No MPI, no cluster: --check is measured
on the emulated cluster (docs/advise.md)."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from ccbench.benchmarks.results import CODEC, HARNESS, SCHEMA, write_csv_atomic
from ccbench.collectives import compression_model as cm
from ccbench.collectives import trace_files as tracefile
from ccbench.collectives.trace import Event, Step, Trace
from ccbench.kernels.errors import UsageError
from ccbench.scripts.advise import check as advise_check
from ccbench.scripts.advise import command as advise

MIB = 1 << 20


def one_allgather_trace(path):
    # one blocking allgather of a 4 MiB gathered buffer on 4 ranks: OSU size 1 MiB
    step = Step(
        events=[Event("call", 0.0, id=0, collective="allgather", count=MIB, blocking=True)],
        number=1,
    )
    tracefile.write(Trace(ranks=4, steps=[step], source={"kind": "built"}), path)


def parts(folder):
    folder.mkdir()
    codec = {c: "" for c in CODEC.names}
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
    coll_columns = HARNESS.variant_columns("coll_compressed")
    row = dict.fromkeys(coll_columns, "")
    row.update(
        {
            SCHEMA: HARNESS.tag,
            "run_id": "collrun",
            "variant": "coll_compressed",
            "algorithm": "ring",
            "collective": "allgather",
            "codec": "fp16",
            "ranks": 4,
            "size_bytes": 4 * MIB,
            "link_gbps": 1,
            "compression_ratio": 2.0,
            # 1.25 x the model's floor: 12 MiB / 2 at 1 Gbit/s (no step cost recorded)
            "avg_us": 1.25 * 50331.648,
            # the codec inside the call: 16 MiB through it (4 encoded, 12 decoded) in
            # 16.777216 us, 1000 x the 1e15 B/s measured alone: in a step, 1e12 B/s
            "encode_us": 4.194304,
            "decode_us": 12.582912,
            "reduce_us": 0.0,
            "ranks_per_core": 1.0,
        }
    )
    write_csv_atomic(folder / "coll.csv", [row], coll_columns)


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_hand_worked_step_and_its_inputs(tmp_path, capsys):
    trace = tmp_path / "t.json"
    one_allgather_trace(trace)
    parts(tmp_path / "parts")
    out = tmp_path / "advice.csv"
    status = advise.main(
        [
            "--model",
            str(trace),
            "--link",
            "1gbit",
            "--latency",
            "100us",
            "--results",
            str(tmp_path / "parts"),
            "--codecs",
            "fp16",
            "--variants",
            "ring,coll_compressed",
            "--csv",
            str(out),
        ]
    )
    assert status == 0
    rows = {r["option"]: r for r in read(out)}
    # fp16 halves the bytes; measured efficiency 1.25; its codec (1e12 B/s) is hidden
    assert float(rows["coll_compressed:fp16"]["step_ms"]) == pytest.approx(
        1.25 * 12.882912, rel=1e-9
    )
    assert rows["coll_compressed:fp16"]["rank"] == "1"
    assert rows["coll_compressed:fp16"]["measured_here"] == "yes"
    # ring: 3 MiB at 1 Gbit/s + 3 steps of 100 us; no ring row, so its efficiency is
    # the worst measured of the allgather (fp16's 1.25), never the floor's 1.0; and it
    # is listed apart, unranked, naming what it lacks
    assert float(rows["ring"]["step_ms"]) == pytest.approx(1.25 * 25.465824, rel=1e-9)
    assert rows["ring"]["rank"] == "" and rows["ring"]["measured_here"] == "no"
    assert rows["ring"]["not_measured"] == "efficiency allgather"
    assert float(rows["coll_compressed:fp16"]["speedup_vs_ring"]) == pytest.approx(
        25.465824 / 12.882912, rel=1e-9
    )
    inputs = read(tmp_path / "advice-inputs.csv")
    eff = next(
        i
        for i in inputs
        if i["option"] == "coll_compressed:fp16" and i["input"] == "efficiency allgather"
    )
    assert eff["assumed"] == "no" and "coll.csv run collrun" in eff["source"]
    ratio = next(i for i in inputs if i["input"] == "codec ratio")
    assert "codecs.csv run codecrun" in ratio["source"]
    encode = next(i for i in inputs if i["input"] == "encode B/s")
    assert float(encode["value"]) == pytest.approx(1e12, rel=1e-5)
    assert encode["source"].startswith("in a step")
    ring = next(i for i in inputs if i["option"] == "ring")
    assert ring["assumed"] == "yes" and float(ring["value"]) == pytest.approx(1.25)
    assert "efficiency allgather" in rows["ring"]["assumed_inputs"]
    assert (tmp_path / "advice-map.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "advice: coll_compressed:fp16 (compression pays)" in printed
    assert "not checked against replays" in printed


def test_an_error_budget_leaves_codecs_out(tmp_path, capsys):
    trace = tmp_path / "t.json"
    one_allgather_trace(trace)
    parts(tmp_path / "parts")
    out = tmp_path / "a.csv"
    assert (
        advise.main(
            [
                "--model",
                str(trace),
                "--link",
                "1gbit",
                "--latency",
                "0",
                "--results",
                str(tmp_path / "parts"),
                "--codecs",
                "fp16,bf16",
                "--max-error",
                "1e-5",
                "--csv",
                str(out),
            ]
        )
        == 0
    )
    assert {r["option"] for r in read(out)} == {"library", "ring"}
    assert "left out: coll_compressed:bf16: error not measured" in capsys.readouterr().out
    with pytest.raises(UsageError, match="every option is over the error budget"):
        advise.main(
            [
                "--model",
                str(trace),
                "--link",
                "1gbit",
                "--latency",
                "0",
                "--results",
                str(tmp_path / "parts"),
                "--codecs",
                "fp16",
                "--variants",
                "coll_compressed",
                "--max-error",
                "1e-9",
                "--csv",
                str(out),
            ]
        )


def test_the_check_judges_against_the_measured_interval():
    from ccbench.collectives.compression_model import StepPrediction, check_verdict

    predictions = {"a": StepPrediction(1.0, 0, 1, 0), "b": StepPrediction(1.5, 0, 1, 0)}
    rows = advise_check.check_rows(
        ["a", "b"], predictions, {"a": [1.1, 1.0, 1.0], "b": [1.0, 1.02, 0.98]}
    )
    assert rows[0]["within_goal"] and not rows[1]["within_goal"]
    # b: mean 1.0 s, sd 0.02 over 3 rounds, t(2) 4.303: 1.0 +- 0.0497; a's 1.0333 is inside;
    # b was predicted 1.5 s: 50% over its measurement, off the 15% goal: the check fails
    passed, words = check_verdict(rows, "a")
    assert not passed
    assert words == (
        "check failed: the advised option (a) measured 1033 ms (95% interval 890-1177), "
        "3% slower than predicted (1000 ms) and inside the interval of the measured "
        "fastest, b (1000 ms, 950-1050); 1 of 2 predictions within 15% of their "
        "measurement (off by more: b +50%)"
    )
    rows = advise_check.check_rows(["b"], predictions, {"b": [1.0, 1.0]}, {"b": [0.2, 0.2]})
    assert rows[0]["suspect_input"] == "codec rates"  # 0.2 s of codec, none predicted
    assert advise_check.replay_args("coll_compressed:bfp:rate=8") == [
        "--variant",
        "coll_compressed",
        "--codec",
        "bfp:rate=8",
    ]
    # a hierarchical option replays hierarchical (its layout: the cluster's nodes)
    assert advise_check.replay_args("library@node") == ["--algorithm", "mpi", "--hierarchy", "node"]


def check_row(option, predicted, measured, low, high):
    return {
        "option": option,
        "predicted_ms": predicted,
        "measured_ms": measured,
        "low_ms": low,
        "high_ms": high,
    }


def test_the_verdict_says_a_failed_check_in_words():
    # the case: the advised option 28% slower than predicted and outside the
    # interval of the measured fastest; off by more than 15%, the predictions' errors
    # over their measurements: 1000 / 1280 - 1 = -22% and 662 / 1000 - 1 = -34%
    rows = [
        check_row("coll_compressed:bfp:rate=4", 1000, 1280, 1220, 1340),
        check_row("p2p_compressed:bfp:rate=4", 662, 1000, 950, 1050),
        check_row("ring", 2000, 2050, 2000, 2100),
    ]
    passed, words = cm.check_verdict(rows, "coll_compressed:bfp:rate=4")
    assert not passed
    assert words == (
        "check failed: the advised option (coll_compressed:bfp:rate=4) measured 1280 ms "
        "(95% interval 1220-1340), 28% slower than predicted (1000 ms) and outside the "
        "interval of the measured fastest, p2p_compressed:bfp:rate=4 (1000 ms, 950-1050); "
        "1 of 3 predictions within 15% of their measurement (off by more: "
        "coll_compressed:bfp:rate=4 -22%, p2p_compressed:bfp:rate=4 -34%)"
    )
    # the fastest, every prediction within 15% (1100 / 1000: 10% slower): passed
    rows = [check_row("a", 1000, 1100, 1050, 1150), check_row("ring", 1900, 2000, 1900, 2100)]
    passed, words = cm.check_verdict(rows, "a")
    assert passed and words.startswith("check passed: the advised option (a) measured 1100")
    assert "10% slower than predicted" in words and "is the measured fastest" in words


def test_a_prediction_from_assumed_inputs_is_named_not_counted():
    # the ring not measured here (its efficiency assumed the worst measured): 2000 ms
    # predicted against 1500 measured, +33%, named beside the verdict but not counted
    rows = [
        check_row("a", 1000, 1050, 1000, 1100),
        check_row("b", 1200, 1300, 1250, 1350),
        {**check_row("ring", 2000, 1500, 1450, 1550), "measured_here": "no"},
    ]
    passed, words = cm.check_verdict(rows, "a")
    assert passed
    assert words.endswith(
        "2 of 2 predictions within 15% of their measurement; not counted (not measured "
        "here, inputs assumed): ring +33%"
    )
    # measured here, the same miss fails the check
    rows[2]["measured_here"] = "yes"
    passed, words = cm.check_verdict(rows, "a")
    assert not passed and "(off by more: ring +33%)" in words
    # the check's rows mark the options listed apart
    from ccbench.collectives.compression_model import StepPrediction

    predictions = {"a": StepPrediction(1.0, 0, 1, 0), "ring": StepPrediction(2.0, 0, 1, 0)}
    marked = advise_check.check_rows(
        ["a", "ring"], predictions, {"a": [1.0, 1.0], "ring": [1.5, 1.5]}, apart={"ring"}
    )
    assert [r["measured_here"] for r in marked] == ["yes", "no"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "traces/missing.json", "--link", "1gbit", "--latency", "0"], "no such trace"),
        (["--model", "lm-tiny", "--link", "fast", "--latency", "0"], "bad rate"),
        (
            ["--model", "lm-tiny", "--link", "1gbit", "--latency", "0", "--variants", "zip"],
            "variant",
        ),
        (["--model", "lm-tiny", "--link", "1gbit", "--latency", "0", "--codecs", "zip"], "codec"),
        (["--model", "lm-tiny", "--network", "no-such-cluster"], "no emulated cluster"),
        (["--model", "lm-tiny", "--network", "results"], "no harness row on an emulated link"),
        (
            ["--model", "lm-tiny", "--link", "1gbit", "--latency", "5us", "--check"],
            "--check replays on the emulated",
        ),
        (["--model", "lm-tiny", "--link", "1gbit"], "--link needs --latency"),
        (["--model", "lm-tiny", "--latency", "5us"], "--latency goes with --link"),
    ],
)
def test_bad_input_is_refused_before_any_work(argv, message, tmp_path):
    with pytest.raises(UsageError, match=message):
        advise.main([*argv, "--results", str(tmp_path), "--csv", str(tmp_path / "a.csv")])
    assert not (tmp_path / "a.csv").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "no-such-model", "--link", "1gbit", "--latency", "0"], "unknown model"),
        # a declared link without its step cost is refused, never costed 0 and "declared"
        (["--model", "lm-tiny", "--link", "1gbit"], "--link needs --latency"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, argv, message):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ccbench.scripts.cli",
            "advise",
            *argv,
            "--results",
            str(tmp_path),
            "--csv",
            str(tmp_path / "a.csv"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr


def test_a_real_clusters_rows_calibrate_against_the_declared_link(tmp_path):
    # a ring allgather of 1 MiB on 4 ranks measured at 1.5 x its floor on the declared
    # 1 Gbit/s, 100 us link (25.465824 ms): the rows of a SLURM sweep, no emulated link
    folder = tmp_path / "parts"
    folder.mkdir()
    row = {c: "" for c in HARNESS.names}
    row.update(
        {
            SCHEMA: HARNESS.tag,
            "run_id": "slurmrun",
            "variant": "baseline",
            "algorithm": "ring",
            "collective": "allgather",
            "codec": "none",
            "ranks": 4,
            "size_bytes": MIB,
            "avg_us": 1.5 * 25465.824,
        }
    )
    write_csv_atomic(folder / "baseline.csv", [row], HARNESS.names)
    trace = tmp_path / "t.json"
    one_allgather_trace(trace)
    out = tmp_path / "a.csv"
    assert (
        advise.main(
            [
                "--model",
                str(trace),
                "--link",
                "1gbit",
                "--latency",
                "100us",
                "--results",
                str(folder),
                "--variants",
                "ring",
                "--csv",
                str(out),
            ]
        )
        == 0
    )
    assert float(read(out)[0]["step_ms"]) == pytest.approx(1.5 * 25.465824, rel=1e-9)
    eff = next(i for i in read(tmp_path / "a-inputs.csv") if i["option"] == "ring")
    assert eff["assumed"] == "no" and "baseline.csv run slurmrun" in eff["source"]

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
    row = {c: "" for c in HARNESS.names}
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
        }
    )
    write_csv_atomic(folder / "coll.csv", [row], HARNESS.names)


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
    # ring: 3 MiB at 1 Gbit/s + 3 steps of 100 us (efficiency assumed 1.0)
    assert float(rows["ring"]["step_ms"]) == pytest.approx(25.465824, rel=1e-9)
    # fp16 halves the bytes; measured efficiency 1.25; its codec (1 PB/s) is hidden
    assert float(rows["coll_compressed:fp16"]["step_ms"]) == pytest.approx(
        1.25 * 12.882912, rel=1e-9
    )
    assert rows["coll_compressed:fp16"]["rank"] == "1"
    assert float(rows["coll_compressed:fp16"]["speedup_vs_ring"]) == pytest.approx(
        25.465824 / (1.25 * 12.882912), rel=1e-9
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
    ring = next(i for i in inputs if i["option"] == "ring")
    assert ring["assumed"] == "yes"  # no ring row: marked, not a crash
    assert "efficiency allgather" in rows["ring"]["assumed_inputs"]
    assert (tmp_path / "advice-map.png").stat().st_size > 0
    assert "advice: coll_compressed:fp16" in capsys.readouterr().out


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
    with pytest.raises(UsageError, match="every option is over --max-error"):
        advise.main(
            [
                "--model",
                str(trace),
                "--link",
                "1gbit",
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
    from ccbench.collectives.compression_model import StepPrediction

    predictions = {"a": StepPrediction(1.0, 0, 1, 0), "b": StepPrediction(1.5, 0, 1, 0)}
    rows = advise_check.check_rows(
        ["a", "b"], predictions, {"a": [1.1, 1.0, 1.0], "b": [1.0, 1.02, 0.98]}
    )
    assert rows[0]["within_goal"] and not rows[1]["within_goal"]
    assert "is within the interval of the measured fastest, b" in advise_check.verdict(rows, "a")
    rows = advise_check.check_rows(["b"], predictions, {"b": [1.0, 1.0]}, {"b": [0.2, 0.2]})
    assert rows[0]["suspect_input"] == "codec rates"  # 0.2 s of codec, none predicted
    assert advise_check.replay_args("coll_compressed:bfp:rate=8") == [
        "--variant",
        "coll_compressed",
        "--codec",
        "bfp:rate=8",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "traces/missing.json", "--link", "1gbit"], "no such trace file"),
        (["--model", "lm-tiny", "--link", "fast"], "bad rate"),
        (["--model", "lm-tiny", "--link", "1gbit", "--variants", "zip"], "unknown variant"),
        (["--model", "lm-tiny", "--link", "1gbit", "--codecs", "zip"], "unknown codec"),
        (["--model", "lm-tiny", "--network", "no-such-cluster"], "no emulated cluster"),
        (["--model", "lm-tiny", "--network", "results"], "no harness row on an emulated link"),
        (["--model", "lm-tiny", "--link", "1gbit", "--check"], "--check replays on the emulated"),
    ],
)
def test_bad_input_is_refused_before_any_work(argv, message, tmp_path):
    with pytest.raises(UsageError, match=message):
        advise.main([*argv, "--results", str(tmp_path), "--csv", str(tmp_path / "a.csv")])
    assert not (tmp_path / "a.csv").exists()


def test_bad_input_is_one_line_and_status_2(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ccbench.scripts.cli",
            "advise",
            "--model",
            "no-such-model",
            "--link",
            "1gbit",
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
    assert done.returncode == 2 and len(lines) == 1 and "unknown model" in lines[0], done.stderr


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

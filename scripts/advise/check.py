"""`ccbench advise --check`: the advised options and the uncompressed ring replayed on the
emulated cluster in interleaved rounds (each round runs every option once, in an order
rotated round by round, so that load drifts hit them alike); per option the predicted
step time beside the measured mean and its 95% interval across rounds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ccbench.benchmarks.results import read_rows
from ccbench.benchmarks.statistics import mean_interval
from ccbench.collectives import compression_model as cm
from ccbench.collectives import trace_files as tracefile
from ccbench.kernels.errors import UsageError
from ccbench.scripts.launchers import refuse_inside_mpi_launch

GOAL = cm.CHECK_GOAL  # a prediction within 15% of the measured step


def replay_args(label: str) -> list[str]:
    """trace_replay's options for an option's label (a hierarchical one: `--hierarchy
    node`, its layout from the cluster's nodes)."""
    variant, codec, hierarchical = cm.split_label(label)
    across = ["--hierarchy", "node"] if hierarchical else []
    if variant == cm.LIBRARY:
        return ["--algorithm", "mpi", *across]
    if variant == cm.RING:
        return ["--algorithm", "ring", *across]
    return ["--variant", variant, "--codec", codec, *across]


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def on_cluster(cluster: str, ranks: int, command: list[str]) -> list[str]:
    """``command`` launched on ``ranks`` ranks of the emulated ``cluster``."""
    cli = [sys.executable, "-m", "ccbench.scripts.cli", "cluster", "run"]
    return [*cli, "--name", cluster, "-n", str(ranks), "--", *command]


def replay_command(trace_path: Path, label: str) -> list[str]:
    """trace_replay of ``trace_path`` run the option ``label``'s way."""
    replay = [sys.executable, "-m", "ccbench.benchmarks.trace_replay", str(trace_path)]
    return [*replay, *replay_args(label)]


def replay_once(
    cluster: str, ranks: int, trace_path: Path, label: str, steps: int, csv_path: Path
) -> dict:
    """One launch of the replay: its summary row's mean step and codec times, seconds."""
    command = [
        *on_cluster(cluster, ranks, replay_command(trace_path, label)),
        "--steps",
        str(steps),
        "--warmup",
        "1",
        "--csv",
        str(csv_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"--check: the replay of {label} failed: {tail[0]}")
    _, rows = read_rows(csv_path)
    summary = [r for r in rows if r.get("row") == "summary"]
    return {
        "step": float(summary[-1]["step_us"]) * 1e-6,
        "codec": float(summary[-1]["codec_us"] or 0) * 1e-6,
    }


def suspect_input(error: float, codec_predicted: float, codec_measured: float) -> str:
    """The input a miss points at: the codec's rates where the replay's codec time is
    more than twice the predicted one (codec_throughput measured it alone on a core),
    else the overlap efficiency (measured on single calls, not a step's)."""
    if abs(error) <= GOAL:
        return ""
    return "codec rates" if codec_measured > 2 * codec_predicted else "efficiency"


def check_rows(labels, predictions, samples, codec_samples=None, apart=()) -> list[dict]:
    """One row per replayed option; ``apart``: the options not measured here (their
    inputs assumed), whose rows say so (`measured_here` no) and which the verdict shows
    but does not count."""
    rows = []
    for label in labels:
        mean, low, high = mean_interval(samples[label])
        predicted = predictions[label].step_s
        codec = float(sum((codec_samples or {}).get(label, [0.0]))) / max(
            1, len((codec_samples or {}).get(label, [0.0]))
        )
        error = (predicted - mean) / mean
        rows.append(
            {
                "option": label,
                "predicted_ms": predicted * 1e3,
                "measured_ms": mean * 1e3,
                "low_ms": low * 1e3,
                "high_ms": high * 1e3,
                "rounds": len(samples[label]),
                "error_pct": 100 * error,
                "within_goal": abs(error) <= GOAL,
                "predicted_codec_ms": predictions[label].codec_s * 1e3,
                "measured_codec_ms": codec * 1e3,
                "suspect_input": suspect_input(error, predictions[label].codec_s, codec),
                "measured_here": "no" if label in apart else "yes",
            }
        )
    return rows


def run_check(
    opts,
    cluster: str,
    trace,
    ranks: int,
    order: list[str],
    advised: str,
    predictions: dict,
    out: Path,
    apart=(),
) -> str:
    """Replay the top options (measured ones first) and the ring; write the check's rows
    and return its verdict in words (compression_model.check_verdict). ``apart``: the
    options not measured here."""
    refuse_inside_mpi_launch("ccbench advise --check")
    labels = list(order[: opts.top])
    if cm.RING in predictions and cm.RING not in labels:
        labels.append(cm.RING)
    trace_path = out.with_name(out.stem + "-trace.json")
    tracefile.write(trace, trace_path)
    replays = out.with_name(out.stem + "-replays.csv")
    samples = {label: [] for label in labels}
    codec_samples = {label: [] for label in labels}
    load_start = load_average()
    print(
        f"# check: {len(labels)} options x {opts.rounds} rounds of {opts.steps} steps on "
        f"cluster {cluster} ({ranks} ranks); load average {load_start}",
        flush=True,
    )
    for r in range(opts.rounds):
        turn = labels[r % len(labels) :] + labels[: r % len(labels)]
        for label in turn:
            got = replay_once(cluster, ranks, trace_path, label, opts.steps, replays)
            samples[label].append(got["step"])
            codec_samples[label].append(got["codec"])
            print(f"#   round {r + 1} {label}: {samples[label][-1] * 1e3:.0f} ms", flush=True)
    rows = check_rows(labels, predictions, samples, codec_samples, apart)
    load_end = load_average()
    print(
        f"{'option':<28} {'predicted ms':>12} {'measured ms':>12} {'95% interval':>21} "
        f"{'error':>7} {'codec ms pred/meas':>19}"
    )
    for row in rows:
        miss = f"  (over 15%: {row['suspect_input']})" if not row["within_goal"] else ""
        miss += "  (not measured here: its inputs assumed)" if row["measured_here"] == "no" else ""
        print(
            f"{row['option']:<28} {row['predicted_ms']:>12.0f} {row['measured_ms']:>12.0f} "
            f"{row['low_ms']:>10.0f}..{row['high_ms']:<10.0f} {row['error_pct']:>+6.1f}% "
            f"{row['predicted_codec_ms']:>9.0f}/{row['measured_codec_ms']:<9.0f}{miss}"
        )
    _, said = cm.check_verdict(rows, advised) if advised in labels else (False, "")
    if not advised:
        said = "check: no option was measured here to advise; the replays above measured them"
    elif advised not in labels:
        said = f"check: the advised option ({advised}) was not replayed: unchecked"
    print(f"# {said}; load average {load_start} -> {load_end}")
    import pandas as pd

    path = out.with_name(out.stem + "-check.csv")
    pd.DataFrame(
        [
            {
                **row,
                "advised": "yes" if row["option"] == advised else "no",
                "load_start": load_start,
                "load_end": load_end,
            }
            for row in rows
        ]
    ).to_csv(path, index=False)
    print(f"# wrote {path}")
    return said

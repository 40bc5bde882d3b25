"""`ccbench advise --measure`: the parts of the options not measured here, measured on
the emulated cluster at the rank count asked before they are ranked: the harness rows
(the library's collective, the ring, the compressed variants with each codec) of the
step's collectives at the step's own call sizes, timed back to back as a step issues
them, and `codec_throughput` for a codec without a row (docs/advise.md, "Measuring the
parts")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ccbench.benchmarks.options import format_sizes
from ccbench.collectives import compression_model as cm
from ccbench.collectives import trace_files
from ccbench.kernels.errors import UsageError
from ccbench.scripts.advise.check import load_average, on_cluster, replay_command
from ccbench.scripts.advise.turns import turn_trace
from ccbench.scripts.launchers import refuse_inside_mpi_launch

ITERATIONS, WARMUP = "50", "2"  # batch timing: 10 blocks of 5 calls back to back
TURN_ROUNDS = 5  # timed passes over the part trace of calls in turn, after one untimed
CODEC_ITERATIONS = "5"
ALIGN = 64  # bytes: every size a whole number of elements for any rank count up to 16


def step_sizes(step, ranks: int) -> dict:
    """Collective -> the OSU sizes of the step's calls of it, as `-m` takes them (each
    rounded down to whole elements of every rank's block)."""
    sizes: dict = {}
    for call in step.calls:
        size = int(cm.osu_size(call.collective, call.nbytes, ranks))
        size -= size % (ALIGN * ranks)
        if size > 0:
            sizes.setdefault(call.collective, set()).add(size)
    return {c: format_sizes(sorted(v)) for c, v in sizes.items()}


def harness_args(label: str, collective: str, sizes: str, csv_path: Path) -> list[str]:
    """The harness command measuring one option on one collective at ``sizes`` (`-m`),
    its calls timed back to back (`--timing batch`)."""
    variant, codec, hierarchical = cm.split_label(label)
    if variant in cm.UNCOMPRESSED:
        module = "baseline"
        extra = ["--algorithm", "mpi" if variant == cm.LIBRARY else "ring"]
    else:
        module, extra = variant, ["--codec", codec]
    if hierarchical:  # the nodes' layout from `ccbench cluster run`
        extra += ["--hierarchy", "node"]
    return [
        sys.executable,
        "-m",
        f"ccbench.benchmarks.{module}",
        "--collective",
        collective,
        *extra,
        "-m",
        sizes,
        "--timing",
        "batch",
        "-i",
        ITERATIONS,
        "-x",
        WARMUP,
        "--csv",
        str(csv_path),
    ]


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"--measure: {what} failed: {tail[0]}")


def measure_codecs(codecs: list[str], folder) -> Path:
    """codec_throughput of ``codecs`` on the corpus's gradients into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"# measure: codec_throughput of {', '.join(codecs)}", flush=True)
    command = [sys.executable, "-m", "ccbench.benchmarks.codec_throughput"]
    for spec in codecs:
        command += ["--codec", spec]
    command += ["-m", "4M:4M", "-i", CODEC_ITERATIONS, "--data", "gradient"]
    _run([*command, "--csv", str(folder / "codecs.csv")], "codec_throughput")
    return folder


def measure_harness(cluster: str, ranks: int, lacking: dict, sizes: dict, folder) -> Path:
    """Measure, into ``folder``, the harness rows of every option in ``lacking`` (label ->
    the inputs it lacks) on each collective it lacks an efficiency on (every collective
    where it lacks in-step codec rates), at ``sizes`` (collective -> `-m`, the step's:
    `step_sizes`), on the emulated ``cluster`` with ``ranks``."""
    collectives = sorted(sizes)
    refuse_inside_mpi_launch("ccbench advise --measure")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    jobs = []
    for label, names in lacking.items():
        wanted = {c for c in collectives if f"efficiency {c}" in names}
        if any(n.startswith("codec") for n in names):
            wanted = set(collectives)
        jobs += [(label, c) for c in sorted(wanted)]
    print(
        f"# measure: {len(jobs)} harness runs on cluster {cluster} ({ranks} ranks, the "
        f"step's sizes, timed back to back); load average {load_average()}",
        flush=True,
    )
    for label, collective in jobs:
        variant, _, hierarchical = cm.split_label(label)
        name = "baseline" if variant in cm.UNCOMPRESSED else variant
        name += "-node" if hierarchical else ""
        harness = harness_args(label, collective, sizes[collective], folder / f"{name}.csv")
        command = on_cluster(cluster, ranks, harness)
        _run(command, f"{label} {collective}")
        print(f"#   measured {label} {collective}", flush=True)
    return folder


def measure_turns(cluster: str, ranks: int, labels: list[str], step, folder) -> Path:
    """Replay, into ``folder``, the part trace of ``step``'s collectives in turn
    (turns.turn_trace) with no compute, once for each option in ``labels``, on the
    emulated ``cluster`` with ``ranks``; nothing for a step of one collective."""
    folder = Path(folder)
    trace = turn_trace(step, ranks)
    if trace is None or not labels:
        return folder
    refuse_inside_mpi_launch("ccbench advise --measure")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "turns-trace.json"
    trace_files.write(trace, path)
    passes = len(trace.steps)
    print(
        f"# measure: {len(labels)} replays of the step's collectives in turn on cluster "
        f"{cluster} (no compute); load average {load_average()}",
        flush=True,
    )
    for label in labels:
        replay = [
            *replay_command(path, label),
            "--compute-scale",
            "0",
            "--steps",
            str(TURN_ROUNDS * passes),
            "--warmup",
            str(passes),
            "--csv",
            str(folder / "turns.csv"),
        ]
        command = on_cluster(cluster, ranks, replay)
        _run(command, f"{label} in turn")
        print(f"#   measured {label} in turn", flush=True)
    return folder

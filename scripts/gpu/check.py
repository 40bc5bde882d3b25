"""The GPU acceptance run (scripts/gpu-check.sh): every variant with -c on device buffers,
over MPI (staged, and GPU-aware where the MPI is) and over NCCL, one FSDP and one DDP
step, the device tests; then the performance goals, each measured figure beside its
bound and goal; a report with pass, fail or skip (and why) per cell and per goal.

    scripts/gpu-check.sh                       # installs what is missing, then this
    scripts/gpu-check.sh --no-install          # a machine without a package index
    python -m ccbench.scripts.gpu.check --out results/gpu-check

Each collective cell is one launch of `--ranks` ranks (default: the GPUs of this node,
at least 2). Where ranks outnumber GPUs they share them: the MPI cells stage through
host memory as on any node, and the rows say the GPU is shared; NCCL refuses two ranks
on one GPU, so its cells give each rank its own NCCL_HOSTID on the loopback interface
(NCCL_SOCKET_IFNAME=lo, IB, shared memory and P2P off): NCCL then sees one host per
rank and runs its socket transport, functional coverage only. The correctness cells run
`--jobs` at a time; the performance cells run alone, after them.

The goals (GOALS): the codecs on the device against the device copy (codec_throughput,
64 MiB of fp32 gradient-like values); host staging against its bound of pinned copies
(benchmarks.staging_bound, where this tree has it); the compressed allgather against
NCCL's own (coll_compressed --codec fp16 against baseline's library allgather over
torch.distributed's NCCL, 16 MiB, 2 ranks). Where a cell cannot run here it is skipped
with the reason: no CUDA device, no cupy, a torch without CUDA or NCCL, an MPI without
CUDA support. Collective cells report their largest size with its busbw in nccl-tests'
definition (benchmarks/harness.py). Exit status: 1 when a cell that ran failed or a
goal was missed, else 0 (skips included).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.benchmarks.results import write_csv_atomic
from ccbench.kernels.vocabulary import COLLECTIVES
from ccbench.scripts.gpu.survey import Machine, describe, survey
from ccbench.scripts.launchers import mpiexec_command

BUFFERS = ("cupy", "torch-cuda")
# how the bytes move: (name, --transport options, environment)
TRANSPORTS = (
    ("mpi-staged", ["--transport", "mpi"], {"CCBENCH_GPU_AWARE": "0"}),
    ("mpi-gpu-aware", ["--transport", "mpi"], {"CCBENCH_GPU_AWARE": "1"}),
    ("nccl", ["--transport", "torch", "--backend", "nccl"], {}),
)
# NCCL on ranks that share a GPU: one host per rank to NCCL, over its socket transport
NCCL_SHARED_ENV = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_P2P_DISABLE": "1",
}
PER_RANK_HOSTID = 'NCCL_HOSTID=ccb-r${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}} exec "$@"'
NCCL_SHARED_NOTE = "functional only: per-rank NCCL_HOSTID, NCCL's socket transport"
SIZES = "1K:16M"
REPEAT = ["-i", "20", "-x", "5"]
CELL_ENV = {"PYTHONFAULTHANDLER": "1"}  # a crashed rank prints its Python stack
CODECS = ("fp16", "bf16", "bfp:rate=8")
GOAL_BYTES = 16 << 20  # the staging and compressed-allgather goals' size
# (figure, goal): codec rates as a fraction of the device copy's; staging time over its
# bound of pinned copies; NCCL's own allgather time over the compressed one's
GOALS = {
    "encode_vs_copy": (">=", 0.8),
    "decode_vs_copy": (">=", 0.8),
    "hop_vs_copy": (">=", 0.5),
    "staged_vs_bound": ("<=", 1.3),
    "speedup_vs_nccl": (">=", 1.5),
}
STAGING_MODULE = "ccbench.benchmarks.staging_bound"
COLUMNS = (
    "cell",
    "kind",
    "command",
    "buffer",
    "transport",
    "ranks",
    "sharing",
    "status",
    "reason",
    "size_bytes",
    "avg_us",
    "algbw_gbps",
    "busbw_gbps",
    "codec",
    "encode_gbps",
    "decode_gbps",
    "hop_gbps",
    "copy_gbps",
    "figure",
    "measured",
    "bound",
    "goal",
)
REPO = Path(__file__).resolve().parents[2]  # the checkout (tests/ beside scripts/)
TIMEOUT_S = float(os.environ.get("CCBENCH_GPU_CHECK_TIMEOUT", "900"))


@dataclass
class Cell:
    name: str
    kind: str  # collective, training, tests, codec, staging, compare
    argv: list[str]  # after `python -m ccbench.benchmarks.` (tests: pytest's)
    buffer: str = ""
    transport: str = ""
    ranks: int = 1
    env: dict = field(default_factory=dict)
    sharing: str = ""  # how the ranks share GPUs, where they do
    per_rank_hostid: bool = False


def _shared(cell: Cell, gpus: int) -> Cell:
    """`cell` on `gpus` GPUs: where its ranks outnumber them, marked as sharing, and over
    NCCL given one host id per rank."""
    if gpus < 1 or cell.ranks <= gpus:
        return cell
    cell.sharing = f"{cell.ranks} ranks share {gpus} GPU" + ("s" if gpus > 1 else "")
    if cell.transport == "nccl":
        cell.per_rank_hostid = True
        cell.env.update(NCCL_SHARED_ENV)
        cell.sharing += f"; {NCCL_SHARED_NOTE}"
    return cell


def cells(ranks: int, gpus: int | None = None) -> list[Cell]:
    """The correctness cells (collectives with -c, training, the device tests) and the
    performance cells, in the order they run."""
    gpus = ranks if gpus is None else gpus
    out = []
    for buffer in BUFFERS:
        for name, over, env in TRANSPORTS:
            own = "library" if name == "nccl" else "mpi"
            runs = [("baseline", ["--algorithm", own], c) for c in COLLECTIVES]
            runs += [
                ("baseline", ["--algorithm", "ring"], "allreduce"),
                ("p2p_compressed", ["--codec", "fp16"], "allreduce"),
            ]
            runs += [("coll_compressed", ["--codec", "fp16"], c) for c in COLLECTIVES]
            runs += [
                ("coll_compressed", ["--codec", "bfp:rate=8"], "allreduce"),
                (
                    "sparse_streaming",
                    ["--algorithm", "dense-ring" if name == "nccl" else "omnireduce"],
                    "allreduce",
                ),
            ]
            for variant, options, collective in runs:
                # sparse_streaming times its own block-sparse inputs (no --data)
                sparse = variant == "sparse_streaming"
                argv = [
                    variant,
                    *options,
                    "--collective",
                    collective,
                    "-d",
                    buffer,
                    *over,
                    "-m",
                    "1M:1M" if sparse else SIZES,
                    *REPEAT,
                    "-c",
                    *([] if sparse else ["--data", "gradient-like"]),
                ]
                label = " ".join([variant, *options, collective])
                out.append(
                    Cell(
                        f"{label} / {buffer} / {name}",
                        "collective",
                        argv,
                        buffer,
                        name,
                        ranks,
                        dict(env),
                    )
                )
    for framework in ("fsdp", "ddp"):
        for name, over in (
            ("mpi-staged", ["--transport", "mpi"]),
            ("nccl", ["--transport", "torch", "--backend", "nccl"]),
        ):
            out.append(
                Cell(
                    f"training {framework} / torch-cuda / {name}",
                    "training",
                    [
                        "training",
                        "--framework",
                        framework,
                        "--device",
                        "cuda",
                        "--model",
                        "digits-mlp",
                        "--steps",
                        "2",
                        "--warmup",
                        "1",
                        "--variant",
                        "coll_compressed",
                        "--codec",
                        "fp16",
                        *over,
                    ],
                    "torch-cuda",
                    name,
                    ranks,
                    {"CCBENCH_GPU_AWARE": "0"},
                )
            )
    out.append(
        Cell(
            "device tests (codec kernels, the double's matrix)",
            "tests",
            [
                "tests/test_codec_device.py",
                "tests/test_device_double.py",
                "-q",
                "-p",
                "no:cacheprovider",
            ],
        )
    )
    # performance: alone, after the correctness cells
    codecs = [a for c in CODECS for a in ("--codec", c)]
    for buffer in BUFFERS:
        out.append(
            Cell(
                f"codec_throughput / {buffer}",
                "codec",
                [
                    "codec_throughput",
                    "-d",
                    buffer,
                    *codecs,
                    "-m",
                    "64M:64M",
                    "--data",
                    "gradient-like",
                    "--kernels",
                    "fused",
                    "-i",
                    "10",
                ],
                buffer,
                "",
                1,
            )
        )
    out.append(
        Cell(
            "staging_bound 16M / cupy / mpi-staged",
            "staging",
            ["staging_bound", "-d", "cupy", "-m", "16M", "--rounds", "20"],
            "cupy",
            "mpi-staged",
            2,
            {"CCBENCH_GPU_AWARE": "0"},
        )
    )
    nccl = [
        "--collective",
        "allgather",
        "-d",
        "torch-cuda",
        "--transport",
        "torch",
        "--backend",
        "nccl",
        "-m",
        "16M:16M",
        "-i",
        "50",
        "-x",
        "10",
        "--data",
        "gradient-like",
    ]
    out.append(
        Cell(
            "baseline library allgather 16M / torch-cuda / nccl",
            "compare",
            ["baseline", *nccl],
            "torch-cuda",
            "nccl",
            2,
        )
    )
    out.append(
        Cell(
            "coll_compressed fp16 allgather 16M / torch-cuda / nccl",
            "compare",
            ["coll_compressed", "--codec", "fp16", *nccl],
            "torch-cuda",
            "nccl",
            2,
        )
    )
    return [_shared(c, gpus) for c in out]


def skip_reason(cell: Cell, m: Machine) -> str:
    """Why `cell` cannot run on this machine ('' when it can)."""
    if m.no_gpu:
        return m.no_gpu
    if cell.kind == "tests":  # the double's matrix launches MPI ranks
        if not (REPO / cell.argv[0]).is_file():
            return "the device tests are not in this tree (an installed ccbench)"
        if importlib.util.find_spec("pytest") is None:
            return "pytest is not installed"
        return m.no_mpi
    if cell.kind == "staging" and importlib.util.find_spec(STAGING_MODULE) is None:
        return "skipped: benchmarks.staging_bound not available"
    if cell.buffer == "cupy" and m.no_cupy:
        return m.no_cupy
    if (cell.buffer == "torch-cuda" or cell.transport == "nccl") and m.no_torch:
        return m.no_torch
    if cell.ranks > 1 and m.no_mpi:
        return m.no_mpi
    if cell.transport == "nccl" and m.no_nccl:
        return m.no_nccl
    if cell.transport == "mpi-gpu-aware" and m.no_gpu_aware:
        return m.no_gpu_aware
    return ""


def _base(cell: Cell) -> dict:
    return {
        "cell": cell.name,
        "kind": cell.kind,
        "command": " ".join(cell.argv),
        "buffer": cell.buffer,
        "transport": cell.transport,
        "ranks": cell.ranks,
        "sharing": cell.sharing,
    }


def command_of(cell: Cell, out: Path) -> list[str]:
    """The launch of `cell`, its CSV at `out`."""
    if cell.kind == "tests":
        return [sys.executable, "-m", "pytest", *cell.argv]
    command = [
        sys.executable,
        "-m",
        f"ccbench.benchmarks.{cell.argv[0]}",
        *cell.argv[1:],
        "--csv",
        str(out),
    ]
    if cell.per_rank_hostid:
        command = ["sh", "-c", PER_RANK_HOSTID, "sh", *command]
    if cell.ranks > 1:
        command = mpiexec_command(cell.ranks, command, bind=False)
    return command


def _why_failed(proc) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    # ccbench's own one-line error, not the launcher's notices after it (Open MPI)
    ours = [line for line in lines if line.startswith("ccbench")]
    return (ours or lines or [f"exit status {proc.returncode}"])[-1][:300]


def run_cell(cell: Cell, folder: Path, index: int | None = None) -> list[dict]:
    """Run one cell; its report rows (status pass or fail, the measurements). The rows
    of a performance cell keep its CSV rows under `rows` for the goals."""
    if index is None:
        index = len(list(folder.glob("*.csv")))
    out = folder / f"{index:03d}.csv"
    base = _base(cell)
    try:
        proc = subprocess.run(
            command_of(cell, out),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, **CELL_ENV, **cell.env},
            stdin=subprocess.DEVNULL,
            cwd=REPO if cell.kind == "tests" else None,
        )
    except subprocess.TimeoutExpired:
        return [{**base, "status": "fail", "reason": f"no end after {TIMEOUT_S:.0f} s"}]
    # the cell's whole output beside its CSV: a failure's reason is one line of it
    out.with_suffix(".log").write_text(
        f"$ {' '.join(command_of(cell, out))}\nexit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    )
    if cell.kind == "tests":
        summary = (proc.stdout.strip().splitlines() or [""])[-1][:300]
        return [{**base, "status": "pass" if proc.returncode == 0 else "fail", "reason": summary}]
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    if proc.returncode != 0 or not rows:
        return [{**base, "status": "fail", "reason": _why_failed(proc)}]
    if cell.kind == "codec":
        return [
            {
                **base,
                "status": "pass",
                "reason": "",
                "codec": r["codec"],
                "size_bytes": r["size_bytes"],
                "encode_gbps": r["encode_gbps"],
                "decode_gbps": r["decode_gbps"],
                "hop_gbps": r["hop_gbps"],
                "copy_gbps": r["copy_gbps"],
                "rows": [r],
            }
            for r in rows
        ]
    if cell.kind == "training":
        return [{**base, "status": "pass", "reason": ""}]
    if cell.kind == "staging":
        return [{**base, "status": "pass", "reason": "", "rows": rows}]
    # the collective cells ran with -c; the timing-only ones carry no validation
    failed = [
        r["size_bytes"] for r in rows if cell.kind == "collective" and r.get("validation") != "Pass"
    ]
    last = rows[-1]
    return [
        {
            **base,
            "status": "fail" if failed else "pass",
            "reason": f"validation failed at {', '.join(failed)} B" if failed else "",
            "size_bytes": last["size_bytes"],
            "avg_us": last["avg_us"],
            "algbw_gbps": last["algbw_gbps"],
            "busbw_gbps": last["busbw_gbps"],
            "rows": rows,
        }
    ]


# ---------------------------------------------------------------------------- goals


def _goal(
    name: str, figure: str, measured: float | None, bound: str, why: str = "", **base
) -> dict:
    """One goal's report row: `measured` against GOALS[figure]; skip when not measured."""
    sign, target = GOALS[figure]
    goal = f"{sign} {target:g}"
    row = {"cell": name, "kind": "goal", "figure": figure, "bound": bound, "goal": goal, **base}
    if measured is None:
        return {**row, "status": "skip", "reason": why}
    met = measured >= target if sign == ">=" else measured <= target
    return {
        **row,
        "status": "pass" if met else "fail",
        "measured": f"{measured:.3f}",
        "reason": why,
    }


def codec_goals(rows: list[dict], buffer: str) -> list[dict]:
    """Encode, decode and the reduce-scatter hop of each codec_throughput row against the
    device copy of the same buffer."""
    out = []
    for r in rows:
        copy = float(r["copy_gbps"])
        for piece in ("encode", "decode", "hop"):
            figure = f"{piece}_vs_copy"
            ratio = float(r[figure])
            out.append(
                _goal(
                    f"codec {r['codec']} {piece} / {buffer}",
                    figure,
                    ratio,
                    f"device copy {copy:.1f} GB/s",
                    f"{piece} {float(r[f'{piece}_gbps']):.1f} GB/s = {ratio:.2f}x the copy "
                    f"({r.get('kernels', '')} kernels, {int(r['size_bytes']) >> 20} MiB)",
                    buffer=buffer,
                    codec=r["codec"],
                    size_bytes=r["size_bytes"],
                )
            )
    return out


def staging_goal(rows: list[dict], name: str) -> dict:
    """Staged allgather time over its bound of pinned copies, at GOAL_BYTES on 2 ranks."""
    at = [
        r for r in rows if int(float(r["size_bytes"])) == GOAL_BYTES and int(float(r["ranks"])) == 2
    ]
    if not at:
        return {
            **_goal(name, "staged_vs_bound", None, ""),
            "status": "fail",
            "reason": f"no row at {GOAL_BYTES >> 20} MiB on 2 ranks",
        }
    r = at[-1]
    ratio = float(r["staged_vs_bound"])
    return _goal(
        name,
        "staged_vs_bound",
        ratio,
        f"d2h {float(r['d2h_pinned_us']):.0f} + host allgather "
        f"{float(r['host_allgather_us']):.0f} + h2d {float(r['h2d_pinned_us']):.0f}"
        f" = {float(r['bound_us']):.0f} us",
        f"staged {float(r['staged_us']):.0f} us = {ratio:.2f}x the bound",
        buffer=r["buffer"],
        size_bytes=str(GOAL_BYTES),
    )


def compressed_goal(nccl_rows: list[dict], compressed_rows: list[dict], name: str) -> dict:
    """NCCL's own allgather time over the fp16-compressed one's at GOAL_BYTES."""

    def at(rows):
        got = [r for r in rows if int(float(r["size_bytes"])) == GOAL_BYTES]
        return float(got[-1]["avg_us"]) if got else None

    own, compressed = at(nccl_rows), at(compressed_rows)
    if own is None or compressed is None:
        return {
            **_goal(name, "speedup_vs_nccl", None, ""),
            "status": "fail",
            "reason": f"no row at {GOAL_BYTES >> 20} MiB",
        }
    speedup = own / compressed
    return _goal(
        name,
        "speedup_vs_nccl",
        speedup,
        f"NCCL's allgather {own:.0f} us",
        f"compressed {compressed:.0f} us: {speedup:.2f}x faster",
        size_bytes=str(GOAL_BYTES),
    )


def goal_rows(results: dict[str, list[dict]], skipped: dict[str, str]) -> list[dict]:
    """The goals from the performance cells' report lines (by cell name); a goal whose
    cell was skipped or failed is skipped or failed with that cell's reason."""
    out = []
    for buffer in BUFFERS:
        name = f"codec_throughput / {buffer}"
        if name in skipped:
            out += [
                _goal(
                    f"codec {c} {piece} / {buffer}",
                    f"{piece}_vs_copy",
                    None,
                    "",
                    skipped[name],
                    buffer=buffer,
                    codec=c,
                )
                for c in CODECS
                for piece in ("encode", "decode", "hop")
            ]
            continue
        lines = results.get(name, [])
        if any(r["status"] == "fail" for r in lines) or not lines:
            out.append(
                {
                    **_goal(f"codec / {buffer}", "encode_vs_copy", None, ""),
                    "status": "fail",
                    "reason": "its cell failed",
                }
            )
            continue
        out += codec_goals([row for r in lines for row in r["rows"]], buffer)
    name = "staging / cupy / 16 MiB on 2 ranks"
    out.append(
        _outcome(
            name,
            ["staging_bound 16M / cupy / mpi-staged"],
            results,
            skipped,
            "staged_vs_bound",
            lambda rows: staging_goal(rows[0], name),
        )
    )
    name = "coll_compressed fp16 against NCCL's allgather / 16 MiB on 2 ranks"
    out.append(
        _outcome(
            name,
            [
                "baseline library allgather 16M / torch-cuda / nccl",
                "coll_compressed fp16 allgather 16M / torch-cuda / nccl",
            ],
            results,
            skipped,
            "speedup_vs_nccl",
            lambda rows: compressed_goal(rows[0], rows[1], name),
        )
    )
    return out


def _outcome(goal: str, names: list[str], results, skipped, figure, measure) -> dict:
    """A goal from the cells `names`: skipped or failed as they were."""
    for name in names:
        if name in skipped:
            return _goal(goal, figure, None, "", skipped[name])
        lines = results.get(name, [])
        if not lines or lines[0]["status"] != "pass":
            return {
                **_goal(goal, figure, None, ""),
                "status": "fail",
                "reason": f"{name} failed: " + (lines[0]["reason"] if lines else ""),
            }
    return measure([results[name][0]["rows"] for name in names])


# ---------------------------------------------------------------------------- report


def markdown(rows: list[dict], m: Machine) -> str:
    cells_ = [r for r in rows if r["kind"] != "goal"]
    goals = [r for r in rows if r["kind"] == "goal"]
    ran = [r for r in cells_ if r["status"] != "skip"]
    lines = [
        "# ccbench GPU check",
        "",
        *[f"- {line}" for line in describe(m)],
        "",
        f"{len(ran)} of {len(cells_)} report lines ran, "
        f"{sum(r['status'] == 'fail' for r in cells_)} failed; "
        f"{sum(r['status'] == 'pass' for r in goals)} of {len(goals)} goals met, "
        f"{sum(r['status'] == 'fail' for r in goals)} missed.",
        "",
        "## Goals",
        "",
        "| goal | figure | measured | bound | goal | status | how |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['cell']} | {r['figure']} | {r.get('measured') or ''} | "
        f"{r.get('bound') or ''} | {r['goal']} | {r['status']} | "
        f"{r.get('reason') or ''} |"
        for r in goals
    ]
    lines += [
        "",
        "## Cells",
        "",
        "Busbw in nccl-tests' definition at the largest size (GB/s).",
        "",
        "| cell | status | sharing | busbw GB/s | avg us | why |",
        "|---|---|---|---|---|---|",
    ]
    for r in cells_:
        if r["kind"] == "codec" and r["status"] == "pass":
            continue
        lines.append(
            f"| {r['cell']} | {r['status']} | {r.get('sharing') or ''} | "
            f"{r.get('busbw_gbps') or ''} | {r.get('avg_us') or ''} | "
            f"{r.get('reason') or ''} |"
        )
    codec = [r for r in cells_ if r["kind"] == "codec" and r["status"] == "pass"]
    if codec:
        lines += [
            "",
            "| buffer | codec | encode GB/s | decode GB/s | hop GB/s | copy GB/s |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['buffer']} | {r['codec']} | {float(r['encode_gbps']):.1f} | "
            f"{float(r['decode_gbps']):.1f} | {float(r['hop_gbps']):.1f} | "
            f"{float(r['copy_gbps']):.1f} |"
            for r in codec
        ]
    return "\n".join(lines) + "\n"


def _say(r: dict) -> None:
    if r["kind"] == "goal":
        figure = (
            f"{r['figure']} {r.get('measured') or '-'} (goal {r['goal']}; bound: "
            f"{r.get('bound') or '-'})"
        )
        print(
            f"{r['status']:<5} goal {r['cell']}: {figure}"
            + (f": {r['reason']}" if r.get("reason") else ""),
            flush=True,
        )
        return
    print(
        f"{r['status']:<5} {r['cell']}"
        + (f" ({r.get('codec')})" if r.get("codec") else "")
        + (f" [{r['sharing']}]" if r.get("sharing") else "")
        + (f": {r['reason']}" if r.get("reason") else ""),
        flush=True,
    )


def build_corpus() -> None:
    """Build the real-data corpus where it is missing (about a minute), as setup.sh does."""
    from ccbench.kernels.inputs import corpus_built

    if corpus_built():
        return
    print("# building the real-data corpus (ccbench corpus) for the device tests", flush=True)
    subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", "corpus"],
        check=False,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench gpu-check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="results/gpu-check", help="report folder")
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="ranks per collective (default: the GPUs of this node, at least 2)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="correctness cells run at once (default: CPU cores / 4, at most 4); "
        "the performance cells always run alone",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    folder = Path(opts.out)
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    m = survey()
    for line in describe(m):
        print(f"# {line}", flush=True)
    ranks = opts.ranks or max(2, m.gpus)
    jobs = opts.jobs or max(1, min(4, (os.cpu_count() or 1) // 4))
    plan = list(enumerate(cells(ranks, m.gpus)))
    lines: dict[int, list[dict]] = {}
    skipped: dict[str, str] = {}
    for i, cell in plan:
        why = skip_reason(cell, m)
        if why:
            skipped[cell.name] = why
            lines[i] = [{**_base(cell), "status": "skip", "reason": why}]
            _say(lines[i][0])
    if any(c.kind == "tests" and c.name not in skipped for _, c in plan):
        build_corpus()  # the double's matrix times the default data, the corpus
    # the device tests first: the double's matrix is the longest of them
    correctness = sorted(
        (
            (i, c)
            for i, c in plan
            if c.name not in skipped and c.kind in ("tests", "collective", "training")
        ),
        key=lambda ic: ic[1].kind != "tests",
    )
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_cell, c, folder / "runs", i): i for i, c in correctness}
        for future in concurrent.futures.as_completed(futures):
            lines[futures[future]] = future.result()
            for r in lines[futures[future]]:
                _say(r)
    for i, cell in plan:
        if i not in lines:
            lines[i] = run_cell(cell, folder / "runs", i)
            for r in lines[i]:
                _say(r)
    rows = [r for i, _ in plan for r in lines[i]]
    goals = goal_rows({c.name: lines[i] for i, c in plan}, skipped)
    for r in goals:
        _say(r)
    rows = [{k: v for k, v in r.items() if k != "rows"} for r in rows + goals]
    write_csv_atomic(folder / "report.csv", rows, list(COLUMNS))
    (folder / "report.md").write_text(markdown(rows, m))
    print(f"# report: {folder / 'report.md'} and {folder / 'report.csv'}", flush=True)
    return 1 if any(r["status"] == "fail" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

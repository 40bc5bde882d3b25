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
torch.distributed's NCCL, 16 MiB, 2 ranks); graph mode's (--cuda-graph): the host's
time per eager codec call, the codecs replayed at 1 MiB, the graphed compressed
allgather against NCCL's graphed one, a graphed pipeline in 1 MiB chunks against one
chunk per block (scripts/gpu/goals.py). Where a cell cannot run here it is skipped
with the reason: no CUDA device, no cupy, a torch without CUDA or NCCL, an MPI without
CUDA support. Collective cells report their largest size with its busbw in nccl-tests'
definition (benchmarks/harness.py). Exit status: 1 when a cell that ran failed or a
goal was missed, else 0 (skips included).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import os
import subprocess
import sys
from pathlib import Path

from ccbench.benchmarks.results import write_csv_atomic
from ccbench.benchmarks.switches import read as read_switches
from ccbench.scripts.gpu.goals import goal_rows
from ccbench.scripts.gpu.plan import REPO, Cell, cells, skip_reason
from ccbench.scripts.gpu.survey import Machine, describe, survey
from ccbench.scripts.launchers import mpiexec_command

# each rank its own NCCL_HOSTID, where ranks that share a GPU run over NCCL
PER_RANK_HOSTID = 'NCCL_HOSTID=ccb-r${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}} exec "$@"'
CELL_ENV = {"PYTHONFAULTHANDLER": "1"}  # a crashed rank prints its Python stack
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
    "host_us_per_call",
    "figure",
    "measured",
    "bound",
    "goal",
)
TIMEOUT_S = float(read_switches().gpu_check_timeout or "900")


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
                "host_us_per_call": r.get("host_us_per_call", ""),
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

"""The GPU acceptance run (scripts/gpu-check.sh): every variant with -c on device buffers,
over MPI (staged, and GPU-aware where the MPI is) and over NCCL, codec throughput on the
device, one FSDP and one DDP step; a report with pass, fail or skip (and why) per cell.

    scripts/gpu-check.sh                       # installs what is missing, then this
    python -m ccbench.scripts.gpu_check --out results/gpu-check

Each cell is one launch (mpiexec -n <GPUs on this node>, one rank per GPU; the codec
cell is one process). Where a cell cannot run here it is skipped with the reason: no
CUDA device, a single GPU (NCCL needs a device per rank), no cupy, a torch without CUDA
or NCCL, an MPI without CUDA support. The report (`report.md`, `report.csv` in --out)
gives each collective cell's largest size with its busbw in nccl-tests' definition
(algbw x 2(n-1)/n for allreduce, x (n-1)/n for allgather and reduce-scatter, algbw
being nccl-tests' whole-buffer size over time: benchmarks/harness.py) and the codecs'
encode and decode rates on the device. Exit status: 1 when a cell that ran failed,
else 0 (skips included).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.benchmarks.results import write_csv_atomic
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import COLLECTIVES
from ccbench.scripts.launch import OPEN_MPI, find_mpiexec, mpi_family, mpiexec_command

BUFFERS = ("cupy", "torch-cuda")
# how the bytes move: (name, --transport options, environment)
TRANSPORTS = (("mpi-staged", ["--transport", "mpi"], {"CCBENCH_GPU_AWARE": "0"}),
              ("mpi-gpu-aware", ["--transport", "mpi"], {"CCBENCH_GPU_AWARE": "1"}),
              ("nccl", ["--transport", "torch", "--backend", "nccl"], {}))
SIZES = "1K:16M"
REPEAT = ["-i", "20", "-x", "5"]
CODECS = ("fp16", "bf16", "bfp:rate=8")
COLUMNS = ("cell", "kind", "command", "buffer", "transport", "ranks", "status", "reason",
           "size_bytes", "avg_us", "algbw_gbps", "busbw_gbps", "codec", "encode_gbps",
           "decode_gbps", "hop_gbps", "copy_gbps")
TIMEOUT_S = float(os.environ.get("CCBENCH_GPU_CHECK_TIMEOUT", "900"))


@dataclass
class Machine:
    """What this node offers the GPU path, and why not where it does not."""

    gpus: int = 0
    no_gpu: str = ""           # why there is no CUDA device at all ('' when there is)
    no_torch: str = ""         # why torch cannot use the GPUs
    no_cupy: str = ""
    no_nccl: str = ""
    no_gpu_aware: str = ""
    no_mpi: str = ""
    facts: dict = field(default_factory=dict)


def _gpus() -> tuple[int, str]:
    """(CUDA devices the driver lists, why none)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "no CUDA device: nvidia-smi not found (no NVIDIA driver on this node)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0, "no CUDA device: nvidia-smi did not answer"
    listed = [line for line in out.splitlines() if line.startswith("GPU ")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed = listed[:len([v for v in visible.split(",") if v.strip()])]
    return len(listed), "" if listed else "no CUDA device: nvidia-smi lists none visible"


def _torch_facts() -> tuple[str, str]:
    """(why torch cannot use the GPUs, why it has no NCCL)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed", "torch is not installed"
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is a CPU build"
        return why, why
    if not torch.cuda.is_available():
        why = "torch sees no CUDA device (driver, CUDA_VISIBLE_DEVICES)"
        return why, why
    return "", "" if dist.is_available() and dist.is_nccl_available() else "torch has no NCCL"


def _cupy_facts() -> str:
    try:
        import cupy
    except ImportError:
        return "cupy is not installed (pip install 'ccbench[gpu]')"
    except Exception as exc:  # noqa: BLE001 - cupy without CUDA fails in many ways
        return f"cupy cannot load ({type(exc).__name__})"
    try:
        return "" if cupy.cuda.runtime.getDeviceCount() > 0 else "cupy sees no CUDA device"
    except Exception as exc:  # noqa: BLE001
        return f"cupy sees no CUDA device ({type(exc).__name__})"


def _gpu_aware(mpiexec: str) -> str:
    """Why this MPI cannot read device memory ('' when it can)."""
    if os.environ.get("CCBENCH_GPU_AWARE") == "1":
        return ""
    if mpi_family(mpiexec) == OPEN_MPI:
        info = shutil.which("ompi_info", path=str(Path(mpiexec).parent)) or \
            shutil.which("ompi_info")
        if info:
            out = subprocess.run([info, "--parsable", "--all"], capture_output=True,
                                 text=True, timeout=60).stdout
            if "mpi_built_with_cuda_support:value:true" in out:
                return ""
        return "this Open MPI was not built with CUDA support (ompi_info)"
    version = shutil.which("mpichversion", path=str(Path(mpiexec).parent))
    if version:
        out = subprocess.run([version], capture_output=True, text=True, timeout=60).stdout
        if "--with-cuda" in out or "with-device=ch4:ucx" in out and "cuda" in out:
            return ""
    return ("this MPI does not say it reads device memory (set CCBENCH_GPU_AWARE=1 if it "
            "does)")


def survey() -> Machine:
    m = Machine()
    m.gpus, m.no_gpu = _gpus()
    if not m.no_gpu:
        m.no_torch, m.no_nccl = _torch_facts()
        m.no_cupy = _cupy_facts()
    try:
        mpiexec = find_mpiexec()
    except UsageError as exc:
        m.no_mpi = str(exc)
    if not m.no_mpi and not m.no_gpu:
        m.no_gpu_aware = _gpu_aware(mpiexec)
    m.facts = {"gpus": m.gpus, "python": sys.executable,
               "mpiexec": "" if m.no_mpi else mpiexec}
    return m


@dataclass
class Cell:
    name: str
    kind: str                  # collective, codec, training
    argv: list[str]            # after `python -m ccbench.benchmarks.`
    buffer: str = ""
    transport: str = ""
    ranks: int = 1
    env: dict = field(default_factory=dict)


def cells(ranks: int) -> list[Cell]:
    out = []
    for buffer in BUFFERS:
        for name, over, env in TRANSPORTS:
            own = "library" if name == "nccl" else "mpi"
            runs = [("baseline", ["--algorithm", own], c) for c in COLLECTIVES]
            runs += [("baseline", ["--algorithm", "ring"], "allreduce"),
                     ("p2p_compressed", ["--codec", "fp16"], "allreduce")]
            runs += [("coll_compressed", ["--codec", "fp16"], c) for c in COLLECTIVES]
            runs += [("coll_compressed", ["--codec", "bfp:rate=8"], "allreduce"),
                     ("sparse_streaming", ["--algorithm",
                                           "dense-ring" if name == "nccl" else "omnireduce"],
                      "allreduce")]
            for variant, options, collective in runs:
                argv = [variant, *options, "--collective", collective, "-d", buffer, *over,
                        "-m", "1M:1M" if variant == "sparse_streaming" else SIZES, *REPEAT,
                        "-c", "--data", "gradient-like"]
                label = " ".join([variant, *options, collective])
                out.append(Cell(f"{label} / {buffer} / {name}", "collective", argv, buffer,
                                name, ranks, dict(env)))
        codecs = [a for c in CODECS for a in ("--codec", c)]
        out.append(Cell(f"codec_throughput / {buffer}", "codec",
                        ["codec_throughput", "-d", buffer, *codecs, "-m", "64M:64M",
                         "--data", "gradient-like", "--kernels", "fused", "-i", "10"],
                        buffer, "", 1))
    for framework in ("fsdp", "ddp"):
        for name, over in (("mpi-staged", ["--transport", "mpi"]),
                           ("nccl", ["--transport", "torch", "--backend", "nccl"])):
            out.append(Cell(f"training {framework} / torch-cuda / {name}", "training",
                            ["training", "--framework", framework, "--device", "cuda",
                             "--model", "digits-mlp", "--steps", "2", "--warmup", "1",
                             "--variant", "coll_compressed", "--codec", "fp16", *over],
                            "torch-cuda", name, ranks, {"CCBENCH_GPU_AWARE": "0"}))
    return out


def skip_reason(cell: Cell, m: Machine) -> str:
    """Why `cell` cannot run on this machine ('' when it can)."""
    if m.no_gpu:
        return m.no_gpu
    if cell.buffer == "cupy" and m.no_cupy:
        return m.no_cupy
    if (cell.buffer == "torch-cuda" or cell.transport == "nccl") and m.no_torch:
        return m.no_torch
    if cell.kind != "codec":
        if m.no_mpi:
            return m.no_mpi
        if m.gpus < 2:
            return (f"{m.gpus} GPU on this node: a collective needs a device per rank "
                    "(NCCL refuses two ranks on one GPU)")
    if cell.transport == "nccl" and m.no_nccl:
        return m.no_nccl
    if cell.transport == "mpi-gpu-aware" and m.no_gpu_aware:
        return m.no_gpu_aware
    return ""


def run_cell(cell: Cell, folder: Path) -> list[dict]:
    """Run one cell; its report rows (status pass or fail, the measurements)."""
    out = folder / f"{len(list(folder.glob('*.csv'))):03d}.csv"
    command = [sys.executable, "-m", f"ccbench.benchmarks.{cell.argv[0]}", *cell.argv[1:],
               "--csv", str(out)]
    if cell.kind != "codec":
        command = mpiexec_command(cell.ranks, command, bind=False)
    base = {"cell": cell.name, "kind": cell.kind, "command": " ".join(cell.argv),
            "buffer": cell.buffer, "transport": cell.transport, "ranks": cell.ranks}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**os.environ, **cell.env}, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [{**base, "status": "fail", "reason": f"no end after {TIMEOUT_S:.0f} s"}]
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    if proc.returncode != 0 or not rows:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        # ccbench's own one-line error, not the launcher's notices after it (Open MPI)
        ours = [line for line in lines if line.startswith("ccbench")]
        why = (ours or lines or [f"exit status {proc.returncode}"])[-1]
        return [{**base, "status": "fail", "reason": why[:300]}]
    if cell.kind == "codec":
        return [{**base, "status": "pass", "reason": "", "codec": r["codec"],
                 "size_bytes": r["size_bytes"], "encode_gbps": r["encode_gbps"],
                 "decode_gbps": r["decode_gbps"], "hop_gbps": r["hop_gbps"],
                 "copy_gbps": r["copy_gbps"]} for r in rows]
    if cell.kind == "training":
        return [{**base, "status": "pass", "reason": ""}]
    failed = [r["size_bytes"] for r in rows if r.get("validation") != "Pass"]
    last = rows[-1]
    return [{**base, "status": "fail" if failed else "pass",
             "reason": f"validation failed at {', '.join(failed)} B" if failed else "",
             "size_bytes": last["size_bytes"], "avg_us": last["avg_us"],
             "algbw_gbps": last["algbw_gbps"], "busbw_gbps": last["busbw_gbps"]}]


def markdown(rows: list[dict], m: Machine) -> str:
    ran = [r for r in rows if r["status"] != "skip"]
    lines = ["# ccbench GPU check", "",
             f"{m.gpus} GPU(s); {len(ran)} of {len(rows)} report lines ran, "
             f"{sum(r['status'] == 'fail' for r in rows)} failed.", "",
             "Busbw in nccl-tests' definition at the largest size (GB/s); codec rates on "
             "the device (GB/s of uncompressed data).", "",
             "| cell | status | busbw GB/s | avg us | why |", "|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "codec" and r["status"] == "pass":
            continue
        lines.append(f"| {r['cell']} | {r['status']} | {r.get('busbw_gbps') or ''} | "
                     f"{r.get('avg_us') or ''} | {r.get('reason') or ''} |")
    codec = [r for r in rows if r["kind"] == "codec" and r["status"] == "pass"]
    if codec:
        lines += ["", "| buffer | codec | encode GB/s | decode GB/s | hop GB/s | copy GB/s |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['buffer']} | {r['codec']} | {float(r['encode_gbps']):.1f} | "
                  f"{float(r['decode_gbps']):.1f} | {float(r['hop_gbps']):.1f} | "
                  f"{float(r['copy_gbps']):.1f} |" for r in codec]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ccbench gpu-check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/gpu-check", help="report folder")
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks per collective (default: the GPUs of this node)")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    folder = Path(opts.out)
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    m = survey()
    ranks = opts.ranks or max(2, m.gpus)
    rows = []
    for cell in cells(ranks):
        why = skip_reason(cell, m)
        if why:
            rows.append({"cell": cell.name, "kind": cell.kind, "command": " ".join(cell.argv),
                         "buffer": cell.buffer, "transport": cell.transport,
                         "ranks": cell.ranks, "status": "skip", "reason": why})
            print(f"skip  {cell.name}: {why}", flush=True)
            continue
        got = run_cell(cell, folder / "runs")
        rows += got
        for r in got:
            print(f"{r['status']:<5} {cell.name}"
                  + (f" ({r.get('codec')})" if r.get("codec") else "")
                  + (f": {r['reason']}" if r.get("reason") else ""), flush=True)
    write_csv_atomic(folder / "report.csv", rows, list(COLUMNS))
    (folder / "report.md").write_text(markdown(rows, m))
    print(f"# report: {folder / 'report.md'} and {folder / 'report.csv'}", flush=True)
    return 1 if any(r["status"] == "fail" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

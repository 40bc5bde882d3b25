"""The plan of the GPU acceptance run (scripts/gpu/check.py): which cells it runs, in
what order, and whether each can run on this machine. A cell is one launch: a variant on
a device buffer over a transport (MPI staged, MPI GPU-aware, NCCL) with -c, a training
step, the device tests, or a performance cell whose CSV feeds the goals
(scripts/gpu/goals.py). Where ranks outnumber the GPUs they share them, and the NCCL
cells get one host id per rank; `skip_reason` names what this machine lacks for a cell
(from the survey, scripts/gpu/survey.py), or nothing when it can run. Graph mode's cells
(--cuda-graph) time the same calls replayed from CUDA graphs (docs/gpu.md).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.kernels.vocabulary import COLLECTIVES
from ccbench.scripts.gpu.survey import Machine

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
NCCL_SHARED_NOTE = "functional only: per-rank NCCL_HOSTID, NCCL's socket transport"
SIZES = "1K:16M"
REPEAT = ["-i", "20", "-x", "5"]
CODECS = ("fp16", "bf16", "bfp:rate=8")
STAGING_MODULE = "ccbench.benchmarks.staging_bound"
REPO = Path(__file__).resolve().parents[2]  # the checkout (tests/ beside scripts/)


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
    out += graph_cells()
    return [_shared(c, gpus) for c in out]


GRAPH_REPLAYS = "20"  # --cuda-graph: replays per timed iteration
GRAPH_SIZES = "1M,16M,64M"
GRAPH_CODECS = ("fp16", "bfp:rate=8")


def graphed_codec_cell(buffer: str) -> str:
    return f"codec_throughput graphed / {buffer}"


def graph_compare_cell(variant: str, collective: str, graphed: bool) -> str:
    """`variant`: 'baseline' (NCCL's own) or a codec (the compressed collective)."""
    what = "baseline library" if variant == "baseline" else f"coll_compressed {variant}"
    return f"{what} {collective} {'graphed' if graphed else 'eager'} / torch-cuda / nccl"


def pipeline_cell(chunk: str) -> str:
    return f"coll_compressed fp16 ring allgather 16M chunk {chunk} graphed / torch-cuda / nccl"


def graph_cells() -> list[Cell]:
    """Graph mode's performance cells: the codecs graphed at 1 and 64 MiB; compressed
    allgather and reduce-scatter (fp16, bfp:rate=8) against NCCL's own, each eager and
    graphed, at 1, 16 and 64 MiB; a graphed 16 MiB pipeline in 1 MiB chunks and in one
    chunk per block."""
    graph = ["--cuda-graph", GRAPH_REPLAYS]
    codecs = [a for c in CODECS for a in ("--codec", c)]
    out = [
        Cell(
            graphed_codec_cell(buffer),
            "codec",
            ["codec_throughput", "-d", buffer, *codecs, "-m", "1M,64M", "--data", "gradient-like"]
            + ["--kernels", "fused", "-i", "10", *graph],
            buffer,
            "",
            1,
        )
        for buffer in BUFFERS
    ]
    nccl = ["-d", "torch-cuda", "--transport", "torch", "--backend", "nccl"]
    timed = ["-i", "50", "-x", "10", "--data", "gradient-like"]
    for collective in ("allgather", "reduce_scatter"):
        for graphed in (False, True):
            for variant in ("baseline", *GRAPH_CODECS):
                argv = (
                    ["baseline"]
                    if variant == "baseline"
                    else ["coll_compressed", "--codec", variant]
                )
                argv += ["--collective", collective, *nccl, "-m", GRAPH_SIZES, *timed]
                out.append(
                    Cell(
                        graph_compare_cell(variant, collective, graphed),
                        "compare",
                        argv + (graph if graphed else []),
                        "torch-cuda",
                        "nccl",
                        2,
                    )
                )
    for chunk in ("1M", "0"):
        argv = ["coll_compressed", "--codec", "fp16", "--algorithm", "ring", "--chunk-bytes", chunk]
        argv += ["--collective", "allgather", *nccl, "-m", "16M:16M", *timed, *graph]
        out.append(Cell(pipeline_cell(chunk), "compare", argv, "torch-cuda", "nccl", 2))
    return out


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

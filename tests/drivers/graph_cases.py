"""Graph mode (--cuda-graph) of every capturable variant on the device double, in one launch.

    mpiexec -n 2 python -m mpi4py -m tests.drivers.graph_cases

Each case runs a variant with -c --cuda-graph REPLAYS on -d double over torch.distributed
(which reads the double's memory itself, as NCCL reads a GPU's): rank 0 prints one JSON
line with the exit status, the rows, its error line (the refused cases) and every rank's
counts of the double (launches, allocations, synchronisations, replays).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

from mpi4py import MPI

from tests.drivers.transport_cases import rows_of, run_case

REPLAYS = 3
ITERATIONS, WARMUP = 2, 1
SIZES = "1K,16K"  # two sizes: every count below is per launch of a case
COMMON = ["-i", str(ITERATIONS), "-x", str(WARMUP), "-c", "--data", "gradient-like"]
OVER = ["--transport", "torch", "-d", "double", "--cuda-graph", str(REPLAYS), "-m", SIZES]


def graph_cases() -> list[tuple[str, str, list[str]]]:
    """(case id, entry point, options): every variant and algorithm graph mode takes."""
    cases = []
    for collective in ("allgather", "reduce_scatter", "allreduce"):
        on = [*OVER, "--collective", collective]
        for algorithm in ("library", "ring"):
            cases.append(
                (f"baseline-{algorithm}-{collective}", "baseline", [*on, "--algorithm", algorithm])
            )
        for codec in ("fp16", "bf16", "bfp:rate=8"):
            cases.append((f"p2p-{codec}-{collective}", "p2p_compressed", [*on, "--codec", codec]))
            ring = ["--algorithm", "ring", "--chunk-bytes", "4K"]
            cases.append(
                (
                    f"coll-ring-{codec}-{collective}",
                    "coll_compressed",
                    [*on, "--codec", codec, *ring],
                )
            )
            library = ["--algorithm", "library"]
            cases.append(
                (
                    f"coll-library-{codec}-{collective}",
                    "coll_compressed",
                    [*on, "--codec", codec, *library],
                )
            )
    # the ring's chunk chosen at start-up: graphed, launches cost the host nothing
    auto = ["--codec", "fp16", "--algorithm", "ring", "--chunk-bytes", "auto"]
    cases.append(("coll-ring-auto", "coll_compressed", [*OVER, "--collective", "allgather", *auto]))
    for algorithm in ("dense", "dense-ring"):
        on = [*OVER, "--collective", "allreduce", "--algorithm", algorithm]
        cases.append((f"sparse-{algorithm}", "sparse_streaming", on))
    return cases


# what graph mode refuses, each in one line (exit 2); the last needs the array-API path
REFUSED = [
    ("refused-mpi", "baseline", ["-d", "double", "--cuda-graph", "2", "-m", "1K"]),
    ("refused-host", "baseline", ["--transport", "torch", "--cuda-graph", "2", "-m", "1K"]),
    ("refused-no-warmup", "baseline", [*OVER[:-2], "-m", "1K", "-x", "0"]),
    (
        "refused-sparse",
        "sparse_streaming",
        [*OVER, "--collective", "allreduce", "--algorithm", "allgather-sparse"],
    ),
    ("refused-staged", "baseline", [*OVER, "--collective", "allreduce"]),
    ("refused-reference-kernels", "coll_compressed", [*OVER, "--codec", "fp16"]),
]
REFUSED_ENV = {
    "refused-staged": ("CCBENCH_TORCH_STAGE", "1"),
    "refused-reference-kernels": ("CCBENCH_DOUBLE_KERNELS", "0"),
}


def sidecar_graph(out: Path) -> list:
    """The graph mode each run in the CSV's sidecar recorded."""
    path = Path(f"{out}.json")
    if not path.exists():
        return []
    return [run.get("cuda_graph") for run in json.loads(path.read_text())["runs"].values()]


def main() -> None:
    import tests.devicedouble as double
    from ccbench.collectives.comm import Communicator

    world = MPI.COMM_WORLD
    folder = Path(
        world.bcast(tempfile.mkdtemp(prefix="ccbench-graph-") if world.rank == 0 else None, root=0)
    )
    comm = Communicator(world.Dup())
    for cid, entry, argv in graph_cases() + REFUSED:
        out = folder / f"{cid}.csv"
        name, value = REFUSED_ENV.get(cid, (None, None))
        if name:
            os.environ[name] = value
        double.STATS.reset()
        err = io.StringIO()
        args = argv if cid.startswith("refused") else [*argv, *COMMON]
        if entry == "sparse_streaming":  # it times its own block-sparse inputs
            args = [a for a in args if a not in ("--data", "gradient-like")]
        with contextlib.redirect_stderr(err):
            status = run_case(entry, args, out, comm)
        if name:
            del os.environ[name]
        counts = world.allgather(double.STATS.snapshot())
        statuses = world.allgather(status)
        if world.rank == 0:
            line = {
                "case": cid,
                "status": max(statuses),
                "rows": rows_of(out),
                "sidecar": sidecar_graph(out),
                "stderr": err.getvalue(),
                "double": counts,
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("CCBENCH_TEST_BACKENDS", "tests.devicedouble")
    main()

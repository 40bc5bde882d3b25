"""Cases for tests/test_trace_replay.py: traces captured from real FSDP2, DDP and MG-WFBP
steps on 2 ranks, replayed through every variant, in one launch.

Run on 2 ranks with ``CCBENCH_TRACE_DIR`` set (``python -m tests.drivers.trace_cases``):
the traces and the replays' CSVs are written there, and rank 0 prints one JSON line per
case (its exit status and its rows).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STEPS, WARMUP = 3, 1
CAPTURES = {
    "fsdp": ["--framework", "fsdp"],
    "ddp": ["--framework", "ddp", "--bucket-cap-mb", "0.1"],
    "mgwfbp": [
        "--framework",
        "mgwfbp",
        "--strategy",
        "wfbp",
        "--fit-seconds",
        "0.01",
        "--profile-iterations",
        "1",
    ],
}
REPLAYS = {  # case -> (trace, options)
    "fsdp-baseline-mpi": ("fsdp", ["--algorithm", "mpi"]),
    "fsdp-baseline-ring": ("fsdp", ["--algorithm", "ring"]),
    "fsdp-p2p-fp16": ("fsdp", ["--variant", "p2p_compressed", "--codec", "fp16"]),
    "fsdp-coll-fp16": ("fsdp", ["--variant", "coll_compressed", "--codec", "fp16"]),
    "fsdp-coll-bfp-cpu": (
        "fsdp",
        ["--variant", "coll_compressed", "--codec", "bfp:rate=8", "--compute", "busy-cpu"],
    ),
    "fsdp-torch-sleep": ("fsdp", ["--variant", "torch", "--compute", "sleep"]),
    # hierarchical: 2 nodes of 1 rank (the collective across nodes is the flat one), and
    # 1 node of 2 through its leader (everything inside the node)
    "fsdp-coll-fp16-node": (
        "fsdp",
        ["--variant", "coll_compressed", "--codec", "fp16", "--hierarchy", "node"]
        + ["--ranks-per-node", "1"],
    ),
    "fsdp-ring-leader": (
        "fsdp",
        ["--algorithm", "ring", "--hierarchy", "leader", "--ranks-per-node", "2"],
    ),
    "ddp-ring-mgwfbp": (
        "ddp",
        ["--algorithm", "ring", "--merge", "mgwfbp", "--fit-seconds", "0.01"],
    ),
    "ddp-coll-single": (
        "ddp",
        [
            "--variant",
            "coll_compressed",
            "--codec",
            "fp16",
            "--merge",
            "single",
            "--fit-seconds",
            "0.01",
        ],
    ),
    "ddp-sparse": ("ddp", ["--variant", "sparse_streaming"]),
    "mgwfbp-ring": ("mgwfbp", ["--algorithm", "ring"]),
    "param-ring": ("param", ["--algorithm", "ring"]),
    "sparse-omnireduce": ("sparse", ["--variant", "sparse_streaming"]),
    "built-ring": ("model:lm-tiny:ddp", ["--algorithm", "ring"]),
    "subgroup": ("subgroup", []),
}


def handmade(path: Path, groups: bool) -> None:
    """A step of two allreduces, the second sparse (10% of its blocks non-zero); with
    ``groups`` the first runs on a process group of rank 0 alone."""
    from ccbench.collectives.trace import Event, Step, Trace
    from ccbench.collectives.trace_files import write

    events = [
        Event("call", 100.0, None, 0, "allreduce", 4096, group=1 if groups else 0),
        Event("call", 50.0, None, 1, "allreduce", 65536, sparse=True, density=0.1),
        Event("drain", 10.0),
    ]
    trace = Trace(
        ranks=2,
        steps=[Step(events, tail_us=20.0)],
        source={"kind": "handmade"},
        groups={0: None, 1: [0]} if groups else {0: None},
    )
    write(trace, path)


def main() -> None:
    from ccbench.benchmarks import trace_replay, training
    from ccbench.benchmarks.results import read_rows
    from ccbench.collectives.comm import Communicator
    from ccbench.collectives.trace_files import read, write

    comm = Communicator()
    root = comm.rank == 0
    folder = Path(os.environ["CCBENCH_TRACE_DIR"])
    common = ["--model", "lm-tiny", "--algorithm", "ring", "--steps", "4", "--warmup", "2"]
    for name, options in CAPTURES.items():
        trace = folder / f"{name}.json"
        status = training.main([*common, *options, "--trace", str(trace)])
        if root:
            print(json.dumps({"case": f"capture-{name}", "status": status}), flush=True)
    if root:
        write(read(folder / "ddp.json"), folder / "param.json", param=True)
        handmade(folder / "sparse.json", groups=False)
        handmade(folder / "subgroup.json", groups=True)
    comm.barrier()
    for case, (trace, options) in REPLAYS.items():
        source = trace if trace.startswith("model:") else str(folder / f"{trace}.json")
        csv = folder / f"{case}.csv"
        status = trace_replay.main(
            [
                source,
                *options,
                "--steps",
                str(STEPS),
                "--warmup",
                str(WARMUP),
                "-c",
                "--csv",
                str(csv),
            ]
        )
        if root:
            rows = read_rows(csv)[1] if csv.exists() else []
            print(json.dumps({"case": case, "status": status, "rows": rows}), flush=True)


if __name__ == "__main__":
    main()

"""Every variant validated over the torch transport (gloo), in one launch per rank count.

    mpiexec -n 4 python -m mpi4py -m tests.drivers.transport_cases

Each case runs a variant's entry point in this process, as a user would (-c, --csv), and
rank 0 prints one JSON line: the exit status, each row's validation, algorithm,
transport, backend, device and host synchronisations per call. Host buffers over
--transport torch (gloo); the library-backed compressed collectives also over MPI, in
the same launch (cases `mpi-...`); tests/drivers/double_cases.py runs the same matrix on
the strict device double.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import tempfile
from pathlib import Path

from mpi4py import MPI

COMMON = ["-i", "2", "-x", "1", "-c"]
# sizes: one partial bfp tile, several chunks of 4 KiB; for allreduce also a count whose
# blocks differ by one element, so neighbouring blocks have different numbers of chunks
SIZES = {"allgather": "1K,16K", "reduce_scatter": "1K,16K", "allreduce": "1K,16388"}
COLLECTIVES = tuple(SIZES)
CODECS = ("fp16", "bf16", "bfp:rate=8")


def sized(collective: str) -> list[str]:
    return ["--collective", collective, "-m", SIZES[collective]]


def torch_cases(profile: str) -> list[tuple[str, str, list[str]]]:
    """(case id, entry point, options) over --transport torch on host buffers."""
    cases = []
    over = ["--transport", "torch"]
    for collective in COLLECTIVES:
        for algorithm in ("library", "ring"):
            cases.append(
                (
                    f"baseline-{algorithm}-{collective}",
                    "baseline",
                    [*over, "--algorithm", algorithm, *sized(collective)],
                )
            )
        for codec in (*CODECS, "zstd"):
            cases.append(
                (
                    f"p2p-{codec}-{collective}",
                    "p2p_compressed",
                    [*over, "--codec", codec, *sized(collective)],
                )
            )
            ring = ["--algorithm", "ring", "--chunk-bytes", "4K"]
            cases.append(
                (
                    f"coll-{codec}-{collective}",
                    "coll_compressed",
                    [*over, "--codec", codec, *ring, *sized(collective)],
                )
            )
            # the library-backed algorithm: the default over torch; named over MPI
            cases.append(
                (
                    f"coll-library-{codec}-{collective}",
                    "coll_compressed",
                    [*over, "--codec", codec, *sized(collective)],
                )
            )
            cases.append(
                (
                    f"mpi-coll-library-{codec}-{collective}",
                    "coll_compressed",
                    ["--algorithm", "library", "--codec", codec, *sized(collective)],
                )
            )
    cases += [
        (
            "baseline-library-allreduce-bfloat16",
            "baseline",
            [*over, "-d", "torch", "-T", "bfloat16", *sized("allreduce")],
        ),
        (
            "coll-fp16-allreduce-no-fuse",
            "coll_compressed",
            [
                *over,
                "--codec",
                "fp16",
                "--algorithm",
                "ring",
                "--no-fuse",
                "--chunk-bytes",
                "4K",
                *sized("allreduce"),
            ],
        ),
        (
            "coll-fp16-allgather-one-chunk",
            "coll_compressed",
            [
                *over,
                "--codec",
                "fp16",
                "--algorithm",
                "ring",
                "--chunk-bytes",
                "0",
                *sized("allgather"),
            ],
        ),
        (
            "coll-bf16-reduce_scatter-torch-buffers",
            "coll_compressed",
            [
                *over,
                "--codec",
                "bf16",
                "-d",
                "torch",
                "--algorithm",
                "ring",
                "--chunk-bytes",
                "4K",
                *sized("reduce_scatter"),
            ],
        ),
        (
            "coll-library-bf16-allreduce-torch-bfloat16",
            "coll_compressed",
            [*over, "--codec", "bf16", "-d", "torch", "-T", "bfloat16", *sized("allreduce")],
        ),
    ]
    for algorithm in ("dense", "dense-ring", "allgather-sparse"):
        cases.append(
            (
                f"sparse-{algorithm}",
                "sparse_streaming",
                [*over, "--algorithm", algorithm, "-m", "64K:64K", "--density", "0.1,1"],
            )
        )
    for name in ("torch", "torch:ring", "torch:coll:fp16"):
        cases.append(
            (
                f"mgwfbp-{name}",
                "merged_gradient",
                [
                    "--allreduce",
                    name,
                    "--profile",
                    profile,
                    "--strategy",
                    "wfbp,mgwfbp",
                    "-i",
                    "1",
                    "-x",
                    "0",
                    "-c",
                    "--fit-seconds",
                    "0.01",
                ],
            )
        )
    for framework in ("fsdp", "ddp"):
        cases.append(
            (
                f"training-{framework}",
                "training",
                [
                    *over,
                    "--model",
                    "digits-mlp",
                    "--framework",
                    framework,
                    "--variant",
                    "coll_compressed",
                    "--codec",
                    "fp16",
                    "--steps",
                    "2",
                ],
            )
        )
    return cases


def double_cases() -> list[tuple[str, str, list[str], dict]]:
    """(case id, entry point, options, communicator options) on -d double."""
    cases = []
    transports = {
        "mpi": (["--transport", "mpi"], {}),
        "mpi-gpu-aware": (["--transport", "mpi"], {"gpu_aware": True}),
        "torch": (["--transport", "torch"], {}),
    }
    for tname, (over, comm_options) in transports.items():
        on = [*over, "-d", "double"]
        for collective in COLLECTIVES:
            own = "library" if tname == "torch" else "mpi"
            for algorithm in (own, "ring"):
                cases.append(
                    (
                        f"{tname}-baseline-{algorithm}-{collective}",
                        "baseline",
                        [*on, "--algorithm", algorithm, *sized(collective)],
                        comm_options,
                    )
                )
            for codec in CODECS:
                cases.append(
                    (
                        f"{tname}-p2p-{codec}-{collective}",
                        "p2p_compressed",
                        [*on, "--codec", codec, *sized(collective)],
                        comm_options,
                    )
                )
                cases.append(
                    (
                        f"{tname}-coll-{codec}-{collective}",
                        "coll_compressed",
                        [
                            *on,
                            "--codec",
                            codec,
                            "--algorithm",
                            "ring",
                            "--chunk-bytes",
                            "4K",
                            *sized(collective),
                        ],
                        comm_options,
                    )
                )
                if tname == "torch" or codec == "bfp:rate=8":
                    cases.append(
                        (
                            f"{tname}-coll-library-{codec}-{collective}",
                            "coll_compressed",
                            [*on, "--codec", codec, "--algorithm", "library", *sized(collective)],
                            comm_options,
                        )
                    )
        algorithms = ["dense", "dense-ring", "allgather-sparse"]
        if tname != "torch":
            algorithms.append("omnireduce")
        for algorithm in algorithms:
            cases.append(
                (
                    f"{tname}-sparse-{algorithm}",
                    "sparse_streaming",
                    [*on, "--algorithm", algorithm, "-m", "64K:64K", "--density", "0.1"],
                    comm_options,
                )
            )
    return cases


def tiny_profile(folder: Path) -> str:
    """A small layer profile for merged_gradient (24 gradients, odd sizes included)."""
    from ccbench.benchmarks.results import PROFILE

    path = folder / "tiny.csv"
    sizes = [1 + (i * 7919) % 30000 for i in range(24)]
    sizes[5] = 3
    ready, rows = 0.0, []
    for i, n in enumerate(sizes):
        ready += 100.0
        rows.append(
            {
                "model": "tiny",
                "order": i,
                "param": f"layer{i}.weight",
                "shape": str(n),
                "numel": n,
                "dtype": "float32",
                "bytes": 4 * n,
                "backward_us": 100.0,
                "ready_us": ready,
                "forward_us": 200.0,
                "batch": 1,
                "width": 1,
                "device": "cpu",
                "iterations": 1,
            }
        )
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, PROFILE.names)
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def run_case(entry: str, argv: list[str], out: Path, comm=None) -> int:
    """The entry point's main, in this process, its stdout kept out of the JSON lines."""
    module = importlib.import_module(f"ccbench.benchmarks.{entry}")
    with contextlib.redirect_stdout(io.StringIO()):
        if comm is None:
            return module.main([*argv, "--csv", str(out)])
        from ccbench.benchmarks.harness import run_variant

        variant = next(
            v()
            for v in vars(module).values()
            if isinstance(v, type) and getattr(v, "name", None) == entry
        )
        return run_variant(variant, [*argv, "--csv", str(out)], comm)


def rows_of(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open())) if path.exists() else []


def summary(status: int, rows: list[dict], entry: str) -> dict:
    keep = (
        "size_bytes",
        "validation",
        "algorithm",
        "transport",
        "backend",
        "device",
        "host_syncs",
        "compression_ratio",
        "strategy",
        "framework",
        "row",
    )
    return {
        "status": status,
        "rows": [{k: r[k] for k in keep if k in r} for r in rows],
        "entry": entry,
    }


def main() -> None:
    world = MPI.COMM_WORLD
    folder = Path(
        world.bcast(
            tempfile.mkdtemp(prefix="ccbench-transport-") if world.rank == 0 else None, root=0
        )
    )
    profile = world.bcast(tiny_profile(folder) if world.rank == 0 else None, root=0)
    for cid, entry, argv in torch_cases(profile):
        out = folder / f"{cid}.csv"
        own = entry in ("merged_gradient", "training")  # their own repetitions
        status = run_case(entry, argv if own else [*argv, *COMMON], out)
        statuses = world.allgather(status)
        if world.rank == 0:
            print(
                json.dumps({"case": cid, **summary(max(statuses), rows_of(out), entry)}), flush=True
            )


if __name__ == "__main__":
    main()

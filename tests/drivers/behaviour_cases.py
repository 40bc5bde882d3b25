"""Variants run as a user runs them, several in one launch; rank 0 prints each run's CSV rows.

    mpiexec -n 4 python -m tests.drivers.behaviour_cases   # busbw, OmniReduce slots
    mpiexec -n 2 python -m tests.drivers.behaviour_cases   # the time breakdown

One JSON line per case: {"case": id, "status": exit status, "rows": [CSV rows]}. The
expected values live in tests/test_behaviours_ranks.py, worked out there by hand.
The breakdown cases run coll_compressed and p2p_compressed with a stub codec: fp16 whose
encode or decode first sleeps STUB_SLEEP_S (on every rank, or on rank 1 only), so the
time is known to lie in the one column it belongs to.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

STUB_SLEEP_S = 0.05
QUICK = ["-i", "3", "-x", "1"]


def baseline_case(collective: str):
    from ccbench.benchmarks.baseline import Baseline

    return Baseline(), [
        "--collective",
        collective,
        "--algorithm",
        "ring",
        "-m",
        "1K,64K",
        "--data",
        "gradient-like",
        *QUICK,
    ]


def slots_case(slots: int):
    from ccbench.benchmarks.sparse_streaming import SparseStreaming

    # 64 KiB of float32: 64 blocks of 256; every block non-zero on every rank
    return SparseStreaming(), [
        "-m",
        "64K:64K",
        "--density",
        "1",
        "--overlap",
        "all",
        "--fusion",
        "4",
        "--slots",
        str(slots),
        "-c",
        *QUICK,
    ]


def stub_case(variant: str, slow: str, ranks: tuple[int, ...]):
    """An allgather of `variant`, fp16 with a slow encode or decode on `ranks`: coll, one
    chunk per block of 2 KiB; coll-pieces, one chunk per block of 1 MiB, its codec work
    cut in two pieces of 512 KiB (testall progress); p2p, every hop compressed."""
    from ccbench.benchmarks.coll_compressed import CollCompressed
    from ccbench.benchmarks.p2p_compressed import P2PCompressed

    base, options = {
        "coll": (CollCompressed, ["--chunk-bytes", "0", "-m", "4K:4K"]),
        "coll-pieces": (
            CollCompressed,
            ["--chunk-bytes", "0", "--progress", "testall", "-m", "2M:2M"],
        ),
        "p2p": (P2PCompressed, ["--threshold", "0", "-m", "4K:4K"]),
    }[variant]

    class Stub(base):
        def check_options(self, opts, nranks):
            super().check_options(opts, nranks)
            codec, here = self.codec, MPI.COMM_WORLD.rank in ranks
            encode, decode = codec.encode, codec.decode

            def slow_encode(x, out=None):
                if here and slow == "encode":
                    time.sleep(STUB_SLEEP_S)
                return encode(x, out)

            def slow_decode(payload, out):
                if here and slow == "decode":
                    time.sleep(STUB_SLEEP_S)
                return decode(payload, out)

            codec.encode, codec.decode = slow_encode, slow_decode

    return Stub(), [
        "--collective",
        "allgather",
        "--codec",
        "fp16",
        *options,
        "--data",
        "gradient-like",
        *QUICK,
    ]


CASES = {
    4: {
        **{f"busbw-{c}": (baseline_case, c) for c in ("allgather", "reduce_scatter", "allreduce")},
        **{f"slots-{s}": (slots_case, s) for s in (1, 2, 4)},
    },
    2: {
        f"breakdown-{variant}-{case}": (stub_case, variant, slow, ranks)
        for variant in ("coll", "coll-pieces", "p2p")
        for case, slow, ranks in (
            ("slow-encode", "encode", (0, 1)),
            ("slow-decode-rank1", "decode", (1,)),
        )
    },
}


def main() -> int:
    from ccbench.benchmarks.harness import run_variant

    world = MPI.COMM_WORLD
    folder = world.bcast(
        tempfile.mkdtemp(prefix="ccbench-behaviours-") if world.rank == 0 else None, root=0
    )
    try:
        for case, (make, *params) in CASES.get(world.size, {}).items():
            variant, argv = make(*params)
            out = Path(folder) / f"{case}.csv"
            status = run_variant(variant, [*argv, "--csv", str(out)])
            world.Barrier()
            if world.rank == 0:
                rows = list(csv.DictReader(out.open())) if out.exists() else []
                print(json.dumps({"case": case, "status": status, "rows": rows}), flush=True)
    finally:
        world.Barrier()
        if world.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

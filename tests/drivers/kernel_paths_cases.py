"""The collective-level compressed collectives on the fused kernels and on the reference:
bit for bit the same results on every rank (the reduce-scatter's hops run fused).

    mpiexec -n 4 python -m tests.drivers.kernel_paths_cases

Rank 0 prints one JSON line per case: {"case": ..., "ok": ..., "checks": {name: bool}}.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from ccbench.collectives.comm import Communicator
from ccbench.collectives.compressed import bind_compressed
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.inputs import values
from tests.helpers.drivers import case_line, on_every_rank

SPECS = ("fp16", "bf16", "bfp:rate=8", "bfp:rate=3,block=8", "bfp:rate=16")
SETTINGS = (
    {"chunk_bytes": 64 << 10},
    {"chunk_bytes": 128 << 10, "progress": "testall", "sub_chunk_bytes": 32 << 10},
)


def run(comm, spec: str, kernels: str, collective: str, count: int, options: dict):
    codec = parse_codec(spec)
    codec.kernels = kernels
    send = values("gradient-like", count, comm.rank, comm.size, seed=4).astype(np.float32)
    size = count // comm.size if collective == "reduce_scatter" else count
    recv = np.full(size, np.nan, np.float32)
    bind_compressed(comm, "coll", collective, codec, send, recv, **options)()
    return recv, codec.kernel_path(send)


def main() -> int:
    comm = Communicator(MPI.COMM_WORLD)
    count = comm.size * (3 * 8192 + 1000)  # several chunks, a partial tile per block
    for spec in SPECS:
        for collective in ("reduce_scatter", "allreduce"):
            for i, options in enumerate(SETTINGS):
                fused, path = run(comm, spec, "auto", collective, count, options)
                reference, _ = run(comm, spec, "reference", collective, count, options)
                same = bool(np.array_equal(fused.view(np.uint32), reference.view(np.uint32)))
                mine = {"same bits as the reference": same, "fused path taken": path == "fused"}
                gathered = comm.mpi.gather(mine, root=0)
                if comm.rank == 0:
                    line = case_line(f"{spec}-{collective}-{i}", on_every_rank(gathered), path=path)
                    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

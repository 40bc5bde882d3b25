"""Run in a scratch copy holding the made-up additions (tests/extension/additions.py):
checks that each is wired in, and prints one JSON line {kind: {check: ok}}.

Every expected value is worked by hand here, not read from the code under test."""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class RingOfThreads:
    """One rank of a world of threads: sendrecv to any rank through queues."""

    def __init__(self, rank, size, queues):
        self.rank, self.size, self.queues, self.wire_bytes = rank, size, queues, 0

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        self.queues[self.rank, dest].put(sendbuf.copy())
        self.wire_bytes += sendbuf.nbytes
        recvbuf[:] = self.queues[source, self.rank].get(timeout=10)


def run_ring(name: str, inputs, recv_count: int):
    from ccbench.collectives.ring import ring_collective, ring_scratch
    from ccbench.collectives.spec import spec

    described, size = spec(name), len(inputs)
    queues = {(a, b): queue.Queue() for a in range(size) for b in range(size)}
    comms = [RingOfThreads(r, size, queues) for r in range(size)]
    outs = [np.zeros(recv_count, np.float32) for _ in range(size)]

    def rank_main(r):
        scratch = ring_scratch(described, inputs[r], size)
        ring_collective(comms[r], described, inputs[r], outs[r], scratch)

    with ThreadPoolExecutor(size) as pool:
        list(pool.map(rank_main, range(size)))
    return [o.tolist() for o in outs]


def collective() -> dict:
    from ccbench.benchmarks.timing_c import source_text
    from ccbench.collectives.compressed_error import compressions_on_path
    from ccbench.kernels.vocabulary import COLLECTIVES

    inputs = [np.arange(6, dtype=np.float32) + 10 * r for r in range(3)]
    total = [30, 33, 36, 39, 42, 45]  # 0+10+20, 1+11+21, ...
    return {
        "named": "sum_all" in COLLECTIVES,
        "ring": run_ring("sum_all", inputs, 6) == [total] * 3,
        # p2p: the reduce phase's 2 hops and the gather phase's 2
        "error model": compressions_on_path("p2p", "sum_all", 3) == 4,
        "C loop": "/* sum_all */\n        return MPI_Allreduce(send, recv, count" in source_text(),
    }


def phase() -> dict:
    from ccbench.benchmarks.timing_c import source_text
    from ccbench.collectives.compressed import bind_compressed
    from ccbench.collectives.compressed_error import compressions_on_path
    from ccbench.kernels.codecs import parse_codec
    from ccbench.kernels.errors import UsageError

    inputs = [np.arange(6, dtype=np.float32) + 10 * r for r in range(3)]
    # rank r receives block r (2 values) of ranks 0, 1, 2
    by_hand = [[0, 1, 10, 11, 20, 21], [2, 3, 12, 13, 22, 23], [4, 5, 14, 15, 24, 25]]
    refused = ""
    try:
        comm = RingOfThreads(0, 3, {})
        bind_compressed(comm, "p2p", "alltoall", parse_codec("fp16"), inputs[0], np.zeros(6))
    except UsageError as exc:
        refused = str(exc)
    return {
        "ring": run_ring("alltoall", inputs, 6) == by_hand,
        # a block travels one hop: one round trip even where every message is re-encoded
        "error model": compressions_on_path("p2p", "alltoall", 3) == 1,
        "compressed walks refuse it in one line": "cannot run the exchange phase" in refused,
        "C loop": "MPI_Alltoall(send, count, type, recv, count, type, comm)" in source_text(),
    }


def variant() -> dict:
    from ccbench.kernels.variants import REGISTRY
    from ccbench.scripts.cli import VARIANTS

    registered = [v for v in REGISTRY if v.name == "ring_echo"]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ccbench.benchmarks.ring_echo",
            "-m",
            "4:8",
            "-i",
            "2",
            "-x",
            "1",
            "-c",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {
        "registry": len(registered) == 1 and registered[0].harness,
        "command": "ring_echo" in VARIANTS,
        "runs and validates on one rank": run.returncode == 0,
    }


def transport() -> dict:
    from ccbench.benchmarks.options import add_transport, resolve_transport
    from ccbench.collectives.launch import communicator_for
    from ccbench.collectives.ring import ring_collective
    from ccbench.collectives.spec import spec

    parser = argparse.ArgumentParser()
    add_transport(parser)
    opts = parser.parse_args(["--transport", "loop"])
    opts.buffer = "numpy"
    resolve_transport(opts)
    comm = communicator_for(None, opts.transport, opts.backend)
    send, recv = np.arange(5, dtype=np.float32), np.zeros(5, np.float32)
    ring_collective(comm, spec("allgather"), send, recv)
    return {
        "option": opts.backend == "loop",
        "communicator": comm.transport == "loop",
        "ring on one rank": recv.tolist() == [0, 1, 2, 3, 4],
    }


if __name__ == "__main__":
    checks = {"collective": collective, "phase": phase, "variant": variant, "transport": transport}
    print(json.dumps({kind: check() for kind, check in checks.items()}))

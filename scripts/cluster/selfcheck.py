"""The cluster's self-check: TCP streams between ranks, a plain MPI_Allgather and a ring
step of MPI_Sendrecv at a few sizes, each run inside the cluster's namespaces (``python -m
ccbench.scripts.cluster _tcp-flow``, ``_mpi-allgather``, ``_mpi-ring-step``); the first two
are judged against the configured rate, the last gives the fixed cost of a ring step that
the floor of a call adds per step (collectives/costmodel.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

from ccbench.collectives.costmodel import wire_floor_s
from ccbench.scripts.cluster.jobs import mpiexec_command
from ccbench.scripts.cluster.layout import (
    Cluster,
    ClusterError,
    load_state,
    save_state,
    state_lock,
)
from ccbench.scripts.cluster.netns import enter_command
from ccbench.scripts.launchers import find_mpiexec

SELFCHECK_PORT = 18515  # inside the cluster's namespaces only, so it never clashes
# message sizes of the ring step: below, near and past the default burst (1 ms at the rate)
RING_STEP_BYTES = (64 << 10, 256 << 10, 1 << 20)


def selfcheck(cluster: Cluster, nbytes: int, mpi_bytes: int, step: bool = True) -> bool:
    """TCP streams of `nbytes` (rank 0 to 1, then a ring all at once) and, unless
    `mpi_bytes` is 0, an MPI_Allgather of `mpi_bytes` per rank, each printed with its
    verdict against the configured rate; True when every verdict is ok (`nbytes` 0: no
    streams). The slowest TCP stream's rate is kept in the state as the cluster's goodput
    and, with `step`, the fixed cost of a ring step (ring_step_cost)."""
    rate = cluster.rate_bps
    ceiling = cluster.tcp_goodput_bps()
    print(
        f"configured rate {rate / 1e9:.3f} Gbit/s; TCP payload ceiling at MTU {cluster.mtu}: "
        f"{ceiling / 1e9:.3f} Gbit/s (Ethernet+IP+TCP headers)"
    )
    ok = nbytes <= 0 or tcp_check(cluster, nbytes, ceiling)
    if cluster.ranks_per_node > 1 and (nbytes or mpi_bytes):
        intra_node_check(cluster)
    if mpi_bytes:
        ok &= mpi_check(cluster, mpi_bytes)
    if step:
        step_s = ring_step_cost(cluster, ceiling)
        with state_lock():  # the floor adds it per step from now on (CCBENCH_LINK_STEP_US)
            current = load_state(cluster.name)
            if current is not None and current.keeper_pid == cluster.keeper_pid:
                current.step_us = step_s * 1e6
                save_state(current)
    return ok


def tcp_check(cluster: Cluster, nbytes: int, ceiling: float) -> bool:
    """TCP streams of `nbytes`, rank 0 to 1 and a ring, judged against the ceiling."""
    rate = cluster.rate_bps
    ok = True

    def judge(bps: float) -> str:
        nonlocal ok
        good = 0.9 * ceiling <= bps <= 1.02 * ceiling
        ok &= good
        return f"{bps / 1e9:.3f} Gbit/s = {bps / rate:.1%} of rate  {'ok' if good else 'OFF'}"

    nodes = cluster.nodes
    what = "node" if cluster.ranks_per_node > 1 else "rank"
    if nodes > 1:
        one = tcp_flows(cluster, [(0, 1)], nbytes)
        print(f"tcp  {what} 0 -> 1, {nbytes} B:            {judge(one[0])}")
        ring = [(i, (i + 1) % nodes) for i in range(nodes)]
        worst = min(tcp_flows(cluster, ring, nbytes).values())
        print(f"tcp  ring of {nodes} {what}s (all at once), slowest: {judge(worst)}")
    else:
        worst = 0.0
    if not worst:
        return ok
    # the compressed variants' floor uses this rate from now on (CCBENCH_LINK_GOODPUT_GBPS)
    with state_lock():
        current = load_state(cluster.name)
        if current is not None and current.keeper_pid == cluster.keeper_pid:
            current.goodput_bps = float(worst)
            save_state(current)
    return ok


INTRA_NODE_BYTES = 4 << 20  # each way, between two ranks of node 0


def intra_node_check(cluster: Cluster) -> float:
    """The rate between two ranks of node 0 through MPI (shared memory: the path a
    node's ranks take), in bit/s: the fastest of 15 MPI_Sendrecv exchanges of
    INTRA_NODE_BYTES each way; printed, and kept in the state (`run` exports it as
    CCBENCH_INTRA_NODE_GBPS, the intra-node level's rate of the hierarchical floor)."""
    out = subprocess.run(
        mpiexec_command(
            cluster,
            [
                sys.executable,
                "-m",
                "ccbench.scripts.cluster",
                "_mpi-ring-step",
                "--bytes",
                str(INTRA_NODE_BYTES),
            ],
            2,
            find_mpiexec(),
        ),
        capture_output=True,
        text=True,
        env=dict(os.environ),
        check=False,
        timeout=120,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"MPI intra-node self-check failed: {tail}")
    bps = INTRA_NODE_BYTES * 8 / json.loads(lines[-1])["best_s"][0]
    print(
        f"mpi  within node 0 (2 ranks, shared memory, unshaped), {INTRA_NODE_BYTES} B each "
        f"way: fastest {bps / 1e9:.3f} Gbit/s = {bps / cluster.rate_bps:.1f}x the link "
        "between nodes"
    )
    with state_lock():
        current = load_state(cluster.name)
        if current is not None and current.keeper_pid == cluster.keeper_pid:
            current.intra_bps = float(bps)
            save_state(current)
    return bps


def mpi_check(cluster: Cluster, size: int) -> bool:
    """MPI_Allgather of `size` bytes per rank, judged against the link bound: the ring's
    (P-1) blocks through each node's link (with several ranks per node, each ring step
    still crosses every node's link once; the rest stays in its shared memory)."""
    rate = cluster.rate_bps
    cores = len(os.sched_getaffinity(0))
    bound = (cluster.ranks - 1) * size * 8 / rate if cluster.nodes > 1 else 0.0
    out = subprocess.run(
        mpiexec_command(
            cluster,
            [
                sys.executable,
                "-m",
                "ccbench.scripts.cluster",
                "_mpi-allgather",
                "--bytes",
                str(size),
            ],
            cluster.ranks,
            find_mpiexec(),
        ),
        capture_output=True,
        text=True,
        env=dict(os.environ),
        check=False,
        timeout=120 + 40 * bound,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"MPI self-check failed: {tail}")
    res = json.loads(lines[-1])
    if not bound:  # one node: no link to judge against
        print(f"mpi  MPI_Allgather {cluster.ranks} ranks x {size} B: mean {res['mean_s']:.4f} s")
        return True
    ratio = res["mean_s"] / bound
    good = ratio <= 1.10
    print(
        f"mpi  MPI_Allgather {cluster.ranks} ranks x {size} B: mean {res['mean_s']:.4f} s, "
        f"link bound (n-1) x size / rate {bound:.4f} s, ratio {ratio:.3f}  "
        f"{'ok' if good else 'OFF'}"
    )
    share = min(1.0, cores / cluster.ranks)
    print(
        f"     rank CPU busy {res['cpu_busy']:.2f} s/s (about {share:.2f} = ranks polling "
        "on all cores; much less = the host is busy with other work)"
    )
    return good


def ring_step_cost(cluster: Cluster, ceiling_bps: float) -> float:
    """The fixed cost of one ring step, in seconds: per size of RING_STEP_BYTES, P-1 steps
    back to back after a barrier (every rank sends to the next at once, as a ring
    collective does; they last until the slowest rank is done), the fastest of 15; the
    floor of that (costmodel.wire_floor_s: its bytes past the burst at the payload ceiling,
    plus P-1 fixed costs) solved for the fixed cost; the least over the sizes. The
    fastest, not a typical run: ranks that share cores with other work are descheduled at
    times, and a floor must not count that."""
    steps = cluster.ranks - 1
    out = subprocess.run(
        mpiexec_command(
            cluster,
            [
                sys.executable,
                "-m",
                "ccbench.scripts.cluster",
                "_mpi-ring-step",
                "--bytes",
                ",".join(map(str, RING_STEP_BYTES)),
                "--steps",
                str(steps),
            ],
            cluster.ranks,
            find_mpiexec(),
        ),
        capture_output=True,
        text=True,
        env=dict(os.environ),
        check=False,
        timeout=120,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"MPI ring-step self-check failed: {tail}")
    report = json.loads(lines[-1])
    residuals = []
    for nbytes, best, median in zip(
        RING_STEP_BYTES, report["best_s"], report["median_s"], strict=True
    ):
        wire = wire_floor_s(steps * nbytes, ceiling_bps, cluster.burst_bytes)
        residuals.append(max(best - wire, 0.0) / steps)
        print(
            f"mpi  {steps} ring steps of {nbytes} B: fastest {best * 1e6:.0f} us (median "
            f"{median * 1e6:.0f}), wire floor {wire * 1e6:.0f} us, fixed cost "
            f"{residuals[-1] * 1e6:.0f} us per step"
        )
    step = min(residuals)
    print(
        f"     fixed cost of a ring step (the least): {step * 1e6:.0f} us, added per step "
        "to the floor of a call"
    )
    return step


def mpi_ring_step_main(argv: list[str]) -> int:
    """Helper run as an MPI job in the cluster: per size, the fastest and the median time
    of --steps ring steps back to back (MPI_Sendrecv to the next rank, from the previous)
    after a barrier, each time its slowest rank's."""
    import numpy as np
    from mpi4py import MPI

    p = argparse.ArgumentParser(prog="ccbench.scripts.cluster _mpi-ring-step")
    p.add_argument("--bytes", required=True, help="sizes, comma-separated")
    p.add_argument("--iterations", type=int, default=15)
    p.add_argument("--steps", type=int, default=1, help="ring steps back to back, timed as one")
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    best, medians = [], []
    for nbytes in map(int, a.bytes.split(",")):
        send, recv = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        comm.Sendrecv(send, right, 0, recv, left, 0)  # sets up the connections: not timed
        times = []
        for _ in range(a.iterations):
            comm.Barrier()
            time.sleep(2e-3)  # the shaper's bucket fills again (1 ms at the rate by default)
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(a.steps):
                comm.Sendrecv(send, right, 0, recv, left, 0)
            times.append(MPI.Wtime() - t0)
        slowest = np.empty(len(times))
        comm.Allreduce(np.array(times), slowest, op=MPI.MAX)
        best.append(float(slowest.min()))
        medians.append(float(np.median(slowest)))
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "best_s": best, "median_s": medians}), flush=True)
    return 0


def tcp_flows(cluster: Cluster, pairs: list[tuple[int, int]], nbytes: int) -> dict[int, float]:
    """Run TCP streams src -> dst (all at once); return bit/s per source rank."""
    receivers = sorted({dst for _, dst in pairs})
    senders = {src: dst for src, dst in pairs}
    procs = {}
    env = dict(os.environ)
    helper = [sys.executable, "-m", "ccbench.scripts.cluster", "_tcp-flow", "--bytes", str(nbytes)]
    for rank in sorted(set(receivers) | set(senders)):
        args = [*enter_command(cluster), "ip", "netns", "exec", cluster.namespaces[rank], *helper]
        if rank in receivers:
            args += [
                "--listen",
                cluster.addresses[rank],
                "--peers",
                str(sum(1 for _, d in pairs if d == rank)),
            ]
        if rank in senders:
            args += ["--send-to", cluster.addresses[senders[rank]]]
        procs[rank] = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    timeout = 30 + 20 * nbytes * 8 / cluster.rate_bps
    results, errors = {}, []
    try:
        for rank, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                tail = err.strip().splitlines() or ["no output"]
                errors.append(f"rank {rank}: {tail[-1]}")
                continue
            report = json.loads(out.strip().splitlines()[-1])
            if "bps" in report:
                results[rank] = report["bps"]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors:
        raise ClusterError("TCP self-check failed: " + "; ".join(errors))
    return results


def tcp_flow_main(argv: list[str]) -> int:
    """Helper run inside a namespace: receive from --peers senders and/or send --bytes."""
    p = argparse.ArgumentParser(prog="ccbench.scripts.cluster _tcp-flow")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--listen")
    p.add_argument("--peers", type=int, default=1)
    p.add_argument("--send-to")
    a = p.parse_args(argv)
    server = None
    if a.listen:
        server = socket.create_server((a.listen, SELFCHECK_PORT), backlog=a.peers)
        sinks = [threading.Thread(target=_sink, args=(server,)) for _ in range(a.peers)]
        for t in sinks:
            t.start()
    report = {}
    if a.send_to:
        report["bps"] = _source(a.send_to, a.bytes)
    if server is not None:
        for t in sinks:
            t.join()
        server.close()
    print(json.dumps(report), flush=True)
    return 0


def _sink(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn:
        buf = memoryview(bytearray(1 << 20))
        while conn.recv_into(buf):
            pass
        conn.sendall(b"k")  # everything arrived: the sender stops its clock


def _source(host: str, nbytes: int) -> float:
    deadline = time.monotonic() + 10
    while True:  # the sink may still be starting
        try:
            conn = socket.create_connection((host, SELFCHECK_PORT), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        conn.settimeout(None)
        data = memoryview(bytes(min(nbytes, 16 << 20)))
        start = time.perf_counter()
        left = nbytes
        while left:
            n = min(left, len(data))
            conn.sendall(data[:n])
            left -= n
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
        return nbytes * 8 / (time.perf_counter() - start)


def mpi_allgather_main(argv: list[str]) -> int:
    """Helper run as an MPI job in the cluster: plain MPI_Allgather, best and mean time."""
    import numpy as np
    from mpi4py import MPI

    p = argparse.ArgumentParser(prog="ccbench.scripts.cluster _mpi-allgather")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--iterations", type=int, default=5)
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    send = np.ones(a.bytes, np.uint8)
    recv = np.empty(a.bytes * comm.size, np.uint8)
    times = []
    comm.Allgather(send, recv)  # sets up the connections: not timed
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(a.iterations):
        comm.Barrier()
        t0 = MPI.Wtime()
        comm.Allgather(send, recv)
        times.append(MPI.Wtime() - t0)
    # CPU seconds per wall second of this rank: 1.0 = it busy-polled the whole time
    busy = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    mine = np.array([*times, busy])
    slowest = np.empty_like(mine)
    comm.Reduce(mine, slowest, op=MPI.MAX, root=0)
    if comm.rank == 0:
        print(
            json.dumps(
                {
                    "ranks": comm.size,
                    "bytes": a.bytes,
                    "mean_s": float(slowest[:-1].mean()),
                    "min_s": float(slowest[:-1].min()),
                    "cpu_busy": float(slowest[-1]),
                }
            ),
            flush=True,
        )
    return 0

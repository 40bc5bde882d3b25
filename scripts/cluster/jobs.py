"""MPI jobs in the cluster: the ranks of a node in its namespace, MPICH over TCP on the
shaped links between nodes and through shared memory within one (MPICH, told which
ranks share a node).

``run`` starts the ``mpiexec`` next to the running Python (else the one on PATH) in the
host namespace; Hydra's proxy forks every rank as ``ip netns exec <name>-<i> COMMAND``.
The rank inherits its PMI connection to the proxy as a file descriptor (``PMI_FD``), so
the launch needs no network between namespaces, while MPI traffic is forced onto TCP over
``<name>-eth``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

from ccbench.kernels.errors import UsageError
from ccbench.scripts.cluster.layout import Cluster
from ccbench.scripts.cluster.netns import enter_command
from ccbench.scripts.launchers import MPICH, binding_enabled, placement_args
from ccbench.scripts.process_tree import stop_tree, stops_deferred

# Checked with the mpich wheel (MPICH 5, ch4:ucx,ofi): without NOLOCAL the ranks, all on
# one host as far as MPICH knows, talk through shared memory; without the ofi/tcp
# settings the ucx netmod bypasses the shaped interface. Either way no bytes cross tc.
MPICH_TCP_ENV = {
    "MPIR_CVAR_NOLOCAL": "1",
    "MPIR_CVAR_CH4_NETMOD": "ofi",
    "FI_PROVIDER": "tcp",
}


def check_hydra(mpiexec: str) -> None:
    proc = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, check=False)
    if "HYDRA" not in proc.stdout:
        raise UsageError(
            f"{mpiexec} is not MPICH's Hydra; `ccbench cluster run` drives MPICH "
            "(see docs/emulated-cluster.md for the Open MPI equivalent)"
        )


def rank_environment(cluster: Cluster, nranks: int) -> dict[str, str]:
    # the payload rate the compressed variants' floor uses: measured by `selfcheck`,
    # else the TCP ceiling of the configured rate
    goodput = cluster.goodput_bps or cluster.tcp_goodput_bps()
    env = {
        **MPICH_TCP_ENV,
        # several ranks per node: Hydra's hosts tell MPICH which ranks share a node, and
        # those talk through shared memory (node_hosts); only one rank per node needs it
        **({"MPIR_CVAR_NOLOCAL": "0"} if cluster.ranks_per_node > 1 else {}),
        "FI_TCP_IFACE": cluster.rank_iface,
        "CCBENCH_LINK_GBPS": f"{cluster.link_gbps:g}",
        # the layout: rows record it, and hierarchical collectives split by it
        "CCBENCH_NODES": str(-(-nranks // cluster.ranks_per_node)),
        "CCBENCH_RANKS_PER_NODE": str(cluster.ranks_per_node),
        # the rate between two ranks of a node (shared memory), once `selfcheck` measured it
        **(
            {"CCBENCH_INTRA_NODE_GBPS": f"{cluster.intra_bps / 1e9:.6g}"}
            if cluster.intra_bps
            else {}
        ),
        "CCBENCH_LINK_GOODPUT_GBPS": f"{goodput / 1e9:.6g}",
        # what a lower bound on a transfer's time needs: the fastest payload rate the
        # shaper allows and the bytes its token bucket passes at once after a pause
        "CCBENCH_LINK_CEILING_GBPS": f"{cluster.tcp_goodput_bps() / 1e9:.6g}",
        "CCBENCH_LINK_BURST_BYTES": str(cluster.burst_bytes),
        # and the fixed cost of each ring step, once `selfcheck` has measured it
        **({"CCBENCH_LINK_STEP_US": f"{cluster.step_us:.6g}"} if cluster.step_us else {}),
    }
    if "OMP_NUM_THREADS" not in os.environ:
        # the emulated nodes share the host's cores: no rank should spawn a thread per core
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // nranks))
    return env


def mpiexec_command(
    cluster: Cluster, command: list[str], nranks: int, mpiexec: str, bind: bool | None = None
) -> list[str]:
    """Hydra MPMD launch: segment i is rank i, run inside the namespace of its node
    (consecutive ranks share one)."""
    if command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]  # the Python with mpi4py, even under sudo
    # Hydra binds each rank to a core of the host the emulated nodes share
    args = [*enter_command(cluster), mpiexec, "-launcher", "fork"]
    cores = []
    if cluster.ranks_per_node > 1:
        args += ["-hosts", node_hosts(cluster, nranks)]
        # each fake host's proxy would bind its ranks from core 0 up: taskset binds
        # rank i to the i-th core of this process's affinity instead
        args += placement_args(MPICH, nranks, False)
        if binding_enabled(bind):
            cores = sorted(os.sched_getaffinity(0))
    else:
        args += placement_args(MPICH, nranks, bind)
    for key, value in rank_environment(cluster, nranks).items():
        args += ["-genv", key, value]
    for i in range(nranks):
        if i:
            args.append(":")
        pin = ["taskset", "-c", str(cores[i % len(cores)])] if cores else []
        namespace = cluster.namespaces[cluster.node_of(i)]
        args += ["-n", "1", "ip", "netns", "exec", namespace, *pin, *command]
    return args


def node_hosts(cluster: Cluster, nranks: int) -> str:
    """Hydra's `-hosts`: one made-up host per node (its namespace's name) with its ranks'
    slots. With the fork launcher every proxy runs here, but MPICH takes the ranks of one
    host for one node: shared memory between them (MPI_COMM_TYPE_SHARED is the node),
    the network module, over the node's shaped link, to the others (checked with the
    mpich wheel: Sendrecv between two ranks of a node moved no bytes through the link)."""
    nodes = -(-nranks // cluster.ranks_per_node)
    return ",".join(f"{ns}:{cluster.ranks_per_node}" for ns in cluster.namespaces[:nodes])


def launch(args: list[str]) -> int:
    """Run mpiexec in the foreground. On Ctrl-C let Hydra stop the ranks, then kill it;
    on SIGTERM or SIGHUP (a sweep's timeout, a killed `ccbench compare`), which reach
    this process alone, stop mpiexec and every rank below it (Hydra starts each in a
    session of its own, out of reach of a signal to our group), so no rank is left
    running in the cluster's namespaces."""
    proc = None
    terminated = []

    def on_terminate(signum, frame):
        terminated.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    main = threading.current_thread() is threading.main_thread()
    old = (
        {s: signal.signal(s, on_terminate) for s in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    )
    try:
        with stops_deferred():  # a stop that comes now finds `proc` held
            proc = subprocess.Popen(args)
        return proc.wait()
    except KeyboardInterrupt:
        if proc is None:
            return 128 + terminated[0] if terminated else 130
        if terminated:
            stop_tree(proc)
            return 128 + terminated[0]
        # The terminal sent SIGINT to mpiexec too; Hydra forwards it to the ranks.
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=10)
        stop_tree(proc, grace_s=1.0)
        return 130
    finally:
        for s, h in old.items():
            signal.signal(s, h)

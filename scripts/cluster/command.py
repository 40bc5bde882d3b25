"""Emulated bandwidth-limited cluster on one host: ``ccbench cluster up|down|status|run|selfcheck``.

The command line and its actions; the cluster itself lives in modules of one job each:

- ``layout``: names, addresses and shaping, parsed from the options' units and
  kept in a state file;
- ``netns``: what this host allows, and the namespaces, veth links and tc shaping
  (built on the host as root, or by the keeper);
- ``keeper``: the keeper that holds a cluster built without root in a user
  namespace;
- ``jobs``: MPI jobs with one rank per namespace, MPICH over TCP;
- ``selfcheck``: TCP streams and an MPI_Allgather measured against the rate, and
  the fixed cost of a ring step;
- ``regime``: a link rate matched to a codec's throughput on this host.

The hidden actions ``_keeper``, ``_tcp-flow``, ``_mpi-allgather`` and ``_mpi-ring-step``
are the processes the cluster starts of itself (``python -m ccbench.scripts.cluster
_ACTION ...``): the keeper, and the self-check's helpers inside the ranks' namespaces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import signal
import sys
import threading
import time
from dataclasses import asdict

from ccbench.benchmarks.options import add_compression, add_no_bind
from ccbench.kernels.errors import UsageError
from ccbench.scripts.cluster.jobs import check_hydra, launch, mpiexec_command
from ccbench.scripts.cluster.keeper import keeper_alive, keeper_main, start_keeper, stop_keeper
from ccbench.scripts.cluster.layout import (
    MAX_NODES,
    ROOT,
    USERNS,
    Cluster,
    ClusterError,
    check_name,
    default_burst,
    default_limit,
    describe,
    load_state,
    parse_bytes,
    parse_delay,
    parse_rate,
    save_state,
    state_lock,
    state_path,
)
from ccbench.scripts.cluster.netns import (
    build,
    entered,
    leftover_namespaces,
    list_namespaces,
    qdisc_stats,
    require_tools_and_privileges,
    sh,
    tsq_bytes,
)
from ccbench.scripts.cluster.regime import describe_regime, regime_rate
from ccbench.scripts.cluster.selfcheck import (
    mpi_allgather_main,
    mpi_ring_step_main,
    selfcheck,
    tcp_flow_main,
)
from ccbench.scripts.launchers import find_mpiexec, refuse_inside_mpi_launch

DEFAULT_NAME = "ccb"
DEFAULT_RATE = "1gbit"


# ----------------------------------------------------------------------------- either mode


def teardown(name: str, mode: str = ROOT) -> list[str]:
    """Delete every namespace of cluster `name` (links and qdiscs go with them). A
    userns cluster's namespaces live as long as its keeper: stopping it removes them."""
    if mode == USERNS:
        cluster = load_state(name)
        names = []
        if cluster is not None and cluster.mode == USERNS:
            if keeper_alive(cluster):
                names = [*cluster.namespaces, cluster.switch_namespace]
            stop_keeper(cluster.keeper_pid)
        state_path(name).unlink(missing_ok=True)
        state_path(name).with_suffix(".log").unlink(missing_ok=True)
        return names
    names = leftover_namespaces(name)  # the state's names all match this pattern
    for ns in names:
        proc = sh("ip", "netns", "del", ns, check=False)
        if proc.returncode != 0 and ns in list_namespaces():
            raise ClusterError(f"`ip netns del {ns}` failed: {proc.stderr.strip()}")
    state_path(name).unlink(missing_ok=True)
    return names


def intact(cluster: Cluster) -> bool:
    if cluster.mode == USERNS and not keeper_alive(cluster):
        return False
    with entered(cluster):
        return {*cluster.namespaces, cluster.switch_namespace} <= list_namespaces()


def require_cluster(name: str) -> Cluster:
    cluster = load_state(name)
    if cluster is None:
        raise UsageError(
            f"cluster {name!r} is not up; start it with `ccbench cluster up "
            f"--name {name} --ranks N --rate 1gbit`, or --nodes N --ranks-per-node M"
        )
    if not intact(cluster):
        raise UsageError(
            f"cluster {name!r} is broken (namespaces missing); run `ccbench "
            f"cluster down --name {name}` and `up` again"
        )
    return cluster


# ----------------------------------------------------------------------------- commands


@contextlib.contextmanager
def terminate_as_interrupt():
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so a killed `up` still cleans up."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cmd_up(opts) -> int:
    mode = require_tools_and_privileges(opts.userns)
    ranks, per_node = node_layout(opts)
    regime = None
    if (opts.codec is None) != (opts.codec_ratio is None):
        raise UsageError(
            "--codec and --codec-ratio go together: the link rate is the "
            "codec's throughput on this host divided by the ratio"
        )
    if opts.codec is not None:
        if opts.rate is not None:
            raise UsageError("give --rate or --codec with --codec-ratio, not both")
        if not opts.codec_ratio > 0:
            raise UsageError("--codec-ratio must be positive")
        regime = regime_rate(opts.codec, opts.codec_ratio, ranks)
        print(describe_regime(regime, ranks))
        rate = regime["rate_bps"]
    else:
        rate = parse_rate(opts.rate or DEFAULT_RATE)
    delay = parse_delay(opts.delay)
    if not 576 <= opts.mtu <= 65000:
        raise UsageError("--mtu must be between 576 and 65000")
    burst = parse_bytes(opts.burst) if opts.burst else default_burst(rate, opts.mtu)
    limit = parse_bytes(opts.limit) if opts.limit else default_limit(rate, burst)
    if burst < opts.mtu + 14:
        raise UsageError(f"--burst must hold one frame ({opts.mtu + 14} bytes)")
    want = Cluster(
        opts.name,
        ranks,
        rate,
        delay,
        opts.mtu,
        burst,
        limit,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        mode=mode,
        regime=regime,
        ranks_per_node=per_node,
    )
    with state_lock(), terminate_as_interrupt():
        have = load_state(opts.name)
        if have is not None and have.shaping() == want.shaping() and intact(have):
            print(f"cluster {opts.name} is already up: {describe(have)}")
            return 0
        stray = mode == ROOT and leftover_namespaces(opts.name)
        if have is not None or stray:
            removed = teardown(opts.name, have.mode if have is not None else mode)
            print(f"cluster {opts.name}: removed the previous layout ({len(removed)} namespaces)")
        try:
            if mode == USERNS:
                want.keeper_pid = start_keeper(want)
            else:
                build(want)
            save_state(want)
        except BaseException:
            if mode == USERNS:
                stop_keeper(want.keeper_pid)
                state_path(opts.name).unlink(missing_ok=True)
            else:
                teardown(opts.name)
            raise
    print(f"cluster {opts.name} is up: {describe(want)}")
    return 0


def node_layout(opts) -> tuple[int, int]:
    """(ranks, ranks per node) from `--ranks N` (N nodes of one rank each) or `--nodes N
    --ranks-per-node M`."""
    per_node = 1 if opts.ranks_per_node is None else opts.ranks_per_node
    if opts.nodes is not None:
        if opts.ranks is not None:
            raise UsageError("give --ranks, or --nodes with --ranks-per-node, not both")
        nodes = opts.nodes
    elif opts.ranks is not None:
        if opts.ranks_per_node not in (None, 1):
            raise UsageError(
                "--ranks-per-node goes with --nodes (--ranks N is N nodes of one rank)"
            )
        nodes = opts.ranks
    else:
        raise UsageError("give --ranks N, or --nodes N with --ranks-per-node M")
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes (--ranks) must be between 1 and {MAX_NODES}")
    if not 1 <= per_node <= 64:
        raise UsageError("--ranks-per-node must be between 1 and 64")
    return nodes * per_node, per_node


def cmd_down(opts) -> int:
    mode = require_tools_and_privileges()
    with state_lock(), terminate_as_interrupt():
        have = load_state(opts.name)
        removed = teardown(opts.name, have.mode if have is not None else mode)
    if removed:
        print(f"cluster {opts.name} is down ({len(removed)} namespaces removed)")
    else:
        print(f"cluster {opts.name} was not up; nothing to remove")
    return 0


def cmd_status(opts) -> int:
    mode = require_tools_and_privileges()
    cluster = load_state(opts.name)
    if cluster is not None:
        with entered(cluster):
            return _status(opts, cluster)
    stray = leftover_namespaces(opts.name) if mode == ROOT else []
    if cluster is None:
        info = {"name": opts.name, "up": False, "stray_namespaces": stray}
        if opts.json:
            print(json.dumps(info))
        else:
            extra = f" (stray namespaces: {' '.join(stray)}; run `down`)" if stray else ""
            print(f"cluster {opts.name} is not up{extra}")
        return 1
    return _status(opts, cluster)


def _status(opts, cluster: Cluster) -> int:
    alive = cluster.mode != USERNS or keeper_alive(cluster)
    present = list_namespaces() if alive else set()
    ranks = []
    for i, (ns, port, addr) in enumerate(
        zip(cluster.namespaces, cluster.ports, cluster.addresses, strict=True)
    ):
        ok = ns in present and cluster.switch_namespace in present
        ranks.append(
            {
                "rank": i,  # the namespace's index: its node (its rank where one per node)
                "node": i,
                "mpi_ranks": list(
                    range(i * cluster.ranks_per_node, (i + 1) * cluster.ranks_per_node)
                ),
                "namespace": ns,
                "present": ns in present,
                "address": addr,
                "sent": qdisc_stats(ns, cluster.rank_iface) if ok else {},
                "received": qdisc_stats(cluster.switch_namespace, port) if ok else {},
            }
        )
    up = intact(cluster)
    if opts.json:
        print(
            json.dumps(
                {
                    **asdict(cluster),
                    "up": up,
                    "link_gbps": cluster.link_gbps,
                    "nodes": cluster.nodes,
                    "ranks_detail": ranks,
                }
            )
        )
        return 0 if up else 1
    print(
        f"cluster {cluster.name}: {'up' if up else 'BROKEN (namespaces missing)'}, "
        f"{describe(cluster)}"
    )
    print(
        f"  tbf burst {cluster.burst_bytes} B, queue limit {cluster.limit_bytes} B, "
        f"tcp_limit_output_bytes {tsq_bytes(cluster)}; "
        f"bridge {cluster.bridge} in {cluster.switch_namespace}; "
        f"rank interface {cluster.rank_iface}; state {state_path(cluster.name)}"
    )
    what = "node" if cluster.ranks_per_node > 1 else "rank"
    print(f"  {what:>4}  {'namespace':<12} {'address':<15} {'sent B':>14} {'recv B':>14} drops")
    for r in ranks:
        drops = r["sent"].get("drops", 0) + r["received"].get("drops", 0)
        print(
            f"  {r['rank']:>4}  {r['namespace']:<12} {r['address']:<15} "
            f"{r['sent'].get('bytes', '-'):>14} {r['received'].get('bytes', '-'):>14} {drops}"
        )
    return 0 if up else 1


def cmd_run(opts) -> int:
    require_tools_and_privileges()
    command = list(opts.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("nothing to run: ccbench cluster run [--name N] [-n K] -- COMMAND ...")
    cluster = require_cluster(opts.name)
    nranks = opts.np or cluster.ranks
    if not 1 <= nranks <= cluster.ranks:
        raise UsageError(f"-n {nranks}: cluster {cluster.name} has {cluster.ranks} ranks")
    mpiexec = find_mpiexec()
    check_hydra(mpiexec)
    args = mpiexec_command(cluster, command, nranks, mpiexec, bind=False if opts.no_bind else None)
    if opts.dry_run:
        print(shlex.join(args))
        return 0
    return launch(args)


def cmd_check(opts) -> int:
    """One line: how clusters are built here, or why they cannot be (exit 1)."""
    try:
        mode = require_tools_and_privileges()
    except UsageError as exc:
        print(str(exc))
        return 1
    print(
        "root: namespaces on the host"
        if mode == ROOT
        else "unprivileged: namespaces inside a user namespace (unshare -Urnm)"
    )
    return 0


def cmd_selfcheck(opts) -> int:
    require_tools_and_privileges()
    cluster = require_cluster(opts.name)
    if cluster.ranks < 2:
        raise UsageError("the self-check needs a cluster of at least 2 ranks")
    nbytes = 0 if opts.step_only else parse_bytes(opts.bytes)
    mpi_bytes = parse_bytes(opts.mpi_bytes) if opts.mpi and not opts.step_only else 0
    print(f"cluster {cluster.name}: {describe(cluster)}")
    ok = selfcheck(cluster, nbytes, mpi_bytes, step=opts.step)
    print("self-check passed" if ok else "self-check: measured rates are off the configuration")
    return 0 if ok else 1


# ----------------------------------------------------------------------------- entry


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ccbench cluster",
        description="Emulated bandwidth-limited cluster on one host (needs root and iproute2).",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(action: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(action, help=help_text, description=help_text)
        p.add_argument(
            "--name",
            default=DEFAULT_NAME,
            type=check_name,
            help=f"cluster name, prefix of its namespaces and links (default {DEFAULT_NAME})",
        )
        return p

    up = add("up", "create the namespaces, bridge, veth links and tc shaping")
    up.add_argument(
        "--ranks", "-n", type=int, help="number of ranks, one per node (namespace); = --nodes N"
    )
    up.add_argument(
        "--nodes", type=int, help="number of nodes (namespaces, each with one shaped link)"
    )
    up.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="M",
        help="ranks per node (default 1): they share the node's namespace, and MPI "
        "between them goes through shared memory, unshaped; consecutive ranks share a node",
    )
    up.add_argument("--rate", help=f"link rate per direction (default {DEFAULT_RATE})")
    add_compression(
        up,
        default=None,
        codec_help="with --codec-ratio: set the rate from this codec's throughput here",
    )
    up.add_argument(
        "--codec-ratio",
        type=float,
        metavar="R",
        help="the codec's throughput per rank over the link rate (the paper's "
        "regime: a GPU codec several times faster than the network)",
    )
    up.add_argument(
        "--userns",
        action="store_true",
        help="build inside a user namespace even as root (what users without "
        "root get; nothing is added to the host's /run/netns)",
    )
    up.add_argument("--delay", default="0", help="extra one-way delay, e.g. 50us (needs netem)")
    up.add_argument("--mtu", type=int, default=9000, help="link MTU (default 9000, jumbo frames)")
    up.add_argument("--burst", help="token bucket size in bytes (default: 1 ms at the rate)")
    up.add_argument("--limit", help="queue limit in bytes (default: 20 ms at the rate, >= 1 MiB)")
    add("down", "remove everything `up` created")
    add("check", "say whether clusters can be built here (root, user namespaces) or why not")
    st = add("status", "show the cluster, its addresses and per-link byte and drop counters")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    run = add("run", "run COMMAND as an MPI job, one rank per namespace, MPICH over TCP")
    run.add_argument("-n", "--np", type=int, help="ranks to start (default: all)")
    run.add_argument("--dry-run", action="store_true", help="print the mpiexec command only")
    add_no_bind(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sc = add("selfcheck", "measure TCP (and MPI) throughput against the configured rate")
    sc.add_argument("--bytes", default="64m", help="bytes per TCP stream (default 64m)")
    sc.add_argument("--mpi-bytes", default="16m", help="MPI allgather bytes per rank (default 16m)")
    sc.add_argument(
        "--no-mpi", dest="mpi", action="store_false", help="skip the MPI_Allgather check"
    )
    sc.add_argument(
        "--no-step",
        dest="step",
        action="store_false",
        help="skip measuring the fixed cost of a ring step (the floor's)",
    )
    sc.add_argument(
        "--step-only",
        action="store_true",
        help="measure only the fixed cost of a ring step (the floor's)",
    )
    return parser


COMMANDS = {
    "up": cmd_up,
    "down": cmd_down,
    "status": cmd_status,
    "run": cmd_run,
    "check": cmd_check,
    "selfcheck": cmd_selfcheck,
}
HELPERS = {
    "_tcp-flow": tcp_flow_main,
    "_mpi-allgather": mpi_allgather_main,
    "_mpi-ring-step": mpi_ring_step_main,
    "_keeper": keeper_main,
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in HELPERS:
        return HELPERS[argv[0]](argv[1:])
    refuse_inside_mpi_launch("ccbench cluster")
    try:
        opts = build_parser().parse_args(argv)
        return COMMANDS[opts.action](opts)
    except (UsageError, ClusterError) as exc:
        print(f"ccbench cluster: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print("ccbench cluster: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

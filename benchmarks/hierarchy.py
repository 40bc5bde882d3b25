"""The hierarchical options of the baseline and the compressed variants (`--hierarchy
node`, `--hierarchy leader`): options, binding, and the per-level columns of their rows.

With `--hierarchy node` the variant's collective runs across nodes only, one
communicator per local index, and an uncompressed ring inside each node
(collectives/hierarchical.py); with `--hierarchy leader` it runs among the nodes' first
ranks on their node's data (collectives/hierarchical_leader.py). The baseline runs the
same shapes uncompressed.
"""

from __future__ import annotations

from ccbench.benchmarks.environment import link_bound
from ccbench.collectives.costmodel import floor_steps, hierarchical_floor
from ccbench.collectives.hierarchical import Hierarchical, node_layout
from ccbench.collectives.hierarchies import HIERARCHIES, INTRA_NODE, check_intra_node, design
from ccbench.kernels import switches
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import HIERARCHY_MARKS

HIERARCHY_HELP = (
    "flat: one collective over all ranks (default); node: uncompressed inside each node "
    "(the ring of point-to-point calls over the node's ranks: it takes blocks of unequal "
    "length and counts its bytes, where hierarchical libraries call their own "
    "collective), the variant's collective across nodes among the ranks of each local "
    "index (every rank's link carries its share), levels in series (overlapped through "
    "shared memory with the collective-level ring across); leader: the node's "
    "data gathered to its first rank, the variant's collective among those leaders, the "
    "result sent back inside the node. Nodes: --ranks-per-node, else `ccbench cluster "
    "run`'s or SLURM's layout, else the ranks' host names"
)


def add_hierarchy_options(parser) -> None:
    group = parser.add_argument_group("hierarchy")
    group.add_argument("--hierarchy", choices=HIERARCHIES, default="flat", help=HIERARCHY_HELP)
    group.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        metavar="M",
        help="with --hierarchy node or leader: M consecutive ranks per node (on one host this "
        "fakes nodes; default: the launch's layout)",
    )
    group.add_argument(
        "--intra-node",
        choices=INTRA_NODE,
        default="auto",
        help="with --hierarchy node, the level inside a node: shm (each rank reads its "
        "peers' segments of the host's shared memory: one copy per block, no rank waits "
        "for a peer to poll), ring (MPI messages between the node's ranks), auto (shm "
        "where every node's ranks share memory, else ring; the default)",
    )


def check_hierarchy(opts, ranks: int) -> None:
    """One clear line for a layout that cannot be split (before any rank starts work)."""
    check_intra_node(opts.hierarchy, getattr(opts, "intra_node", "auto"))
    if opts.hierarchy == "flat":
        if opts.ranks_per_node is not None:
            raise UsageError("--ranks-per-node goes with --hierarchy node or leader")
        return
    if getattr(opts, "transport", "mpi") != "mpi":
        raise UsageError(f"--hierarchy {opts.hierarchy} runs over MPI (--transport mpi)")
    if getattr(opts, "buffer", "numpy") != "numpy":
        raise UsageError(f"--hierarchy {opts.hierarchy} runs on numpy buffers (-d numpy)")
    m = opts.ranks_per_node
    if m is not None and (m < 1 or ranks % m):
        raise UsageError(f"--ranks-per-node {m}: {ranks} ranks do not make whole nodes")


def hierarchical_algorithm(opts, algorithm: str) -> str:
    """The row's `algorithm`: the inter-node one, marked with its design."""
    return HIERARCHY_MARKS.get(opts.hierarchy, "") + algorithm


def is_hierarchical(opts) -> bool:
    return opts.hierarchy != "flat"


def bind_hierarchical(comm, opts, collective: str, send, recv, bind_inter) -> Hierarchical:
    layout = node_layout(comm, opts.ranks_per_node)
    chosen = design(opts.hierarchy, getattr(opts, "intra_node", "auto"))
    return chosen(comm, layout, collective, send, recv, bind_inter)


def intra_node_gbps() -> float | None:
    """The rate between two ranks of a node, as `ccbench cluster selfcheck` measured it
    (`ccbench cluster run` exports it); None where unknown."""
    value = switches.current().intra_node_gbps
    return float(value) if value else None


LEVEL_COLUMNS = (
    "ranks_per_node",
    "intra_node",
    "levels",
    "intra_wire_bytes",
    "inter_wire_bytes",
    "node_link_bytes",
    "intra_floor_us",
    "inter_floor_us",
    "intra_us",
    "inter_us",
    "intra_node_gbps",
)


def level_columns(
    comm, run: Hierarchical, collective: str, inter_algorithm: str, base: dict, timed=(0, None)
):
    """The per-level columns of a hierarchical row, and its floor in place of the flat
    one (costmodel.hierarchical_floor): the most any rank sent inside its node, the most
    any rank sent across, the most any node's link carried (its ranks' inter-node bytes,
    summed: they share it), the inter-node steps of the collective across N nodes, the
    codec's floor as `base` (compressed_base.breakdown_columns) found it; and each
    level's time, the slowest rank's mean over the `timed` calls; the levels' floors
    added, or the larger taken where the levels overlapped (`levels`). Collective."""
    intra_s, inter_s = (comm.allreduce_value(t, op="max") for t in run.level_seconds(*timed))
    intra = comm.allreduce_value(run.intra_wire_bytes, op="max")
    inter = comm.allreduce_value(run.inter_wire_bytes, op="max")
    link_bytes = comm.allreduce_value(run.intra.allreduce_value(run.inter_wire_bytes), op="max")
    layout = run.layout
    levels = ",".join(sorted(set(comm.allgather_obj(run.levels))))
    rate = base.get("floor_link_gbps")
    intra_rate = intra_node_gbps()
    bound = link_bound()
    us = 1e6
    codec_s = (base.get("codec_floor_us") or 0.0) / us
    floor = hierarchical_floor(
        intra,
        intra_rate * 1e9 if intra_rate else None,
        link_bytes,
        rate * 1e9 if rate else None,
        codec_s,
        1.0,
        bound["link_burst_bytes"] or 0.0,
        floor_steps(collective, layout.nodes, "ring" if inter_algorithm == "ring" else "library"),
        (bound["link_step_us"] or 0.0) * 1e-6,
        overlapped=levels == "overlapped",
    )
    call_us = base.get("call_us")
    return {
        "ranks_per_node": layout.ranks_per_node,
        "intra_node": ",".join(sorted(set(comm.allgather_obj(run.intra_node)))),
        "levels": levels,
        "intra_wire_bytes": intra,
        "inter_wire_bytes": inter,
        "node_link_bytes": link_bytes,
        "intra_floor_us": floor["intra"] * us,
        "inter_floor_us": floor["inter"] * us if floor["inter"] is not None else None,
        "intra_us": intra_s * us,
        "inter_us": inter_s * us,
        "intra_node_gbps": intra_rate,
        "wire_floor_us": floor["wire"] * us if floor["wire"] is not None else None,
        "floor_us": floor["floor"] * us,
        "overlap_efficiency": call_us / (floor["floor"] * us)
        if call_us and floor["floor"] > 0
        else None,
    }

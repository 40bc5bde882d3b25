"""The hierarchical designs by name: `--hierarchy node|leader` with `--intra-node
auto|ring|shm` (docs/hierarchical.md). One table for every caller (the benchmarks,
trace replay, the training loops' gradient communicator)."""

from __future__ import annotations

from ccbench.collectives.hierarchical import Hierarchical
from ccbench.collectives.hierarchical_leader import LeaderHierarchical
from ccbench.collectives.hierarchical_shared import (
    RequiredSharedHierarchical,
    SharedHierarchical,
)
from ccbench.kernels.errors import UsageError

HIERARCHIES = ("flat", "node", "leader")
# auto: shared memory where every node's ranks share it, else the ring
INTRA_NODE = ("auto", "ring", "shm")


def check_intra_node(hierarchy: str, intra_node: str) -> None:
    """UsageError where `intra_node` is chosen for a hierarchy without that level's choice
    (flat, leader)."""
    if intra_node != "auto" and hierarchy != "node":
        raise UsageError(f"--intra-node {intra_node} goes with --hierarchy node")


def design(hierarchy: str, intra_node: str = "auto") -> type[Hierarchical]:
    """The class that runs `hierarchy` (node or leader) with `intra_node`."""
    check_intra_node(hierarchy, intra_node)
    if hierarchy == "leader":
        return LeaderHierarchical
    if hierarchy != "node":
        raise UsageError(f"--hierarchy {hierarchy}: no hierarchical design of that name")
    return {"auto": SharedHierarchical, "shm": RequiredSharedHierarchical}.get(
        intra_node, Hierarchical
    )

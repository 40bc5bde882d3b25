"""Trace-based simulation of data-parallel iterations from 4 to thousands of ranks.

The trace is a measured layer profile (per-tensor gradient bytes and backward times);
the network is a ``LinkModel`` whose allreduce alpha and beta grow with the rank count
(ring: alpha = 2(p-1) hop latencies, beta = 2(p-1)/p per byte of link). For each rank
count the planner of ``collectives.mgwfbp`` groups the gradients and lays out the
timeline; scaling efficiency is the single-rank iteration (forward + backward, no
communication) over the simulated one, as in weak scaling.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ccbench.collectives.costmodel import AlphaBeta, LinkModel
from ccbench.collectives.mgwfbp import Plan, Profile, Strategy, parse_strategy, plan


@dataclass(frozen=True)
class SimulatedIteration:
    model: str
    strategy: str
    ranks: int
    cost: AlphaBeta
    plan: Plan

    @property
    def scaling_efficiency(self) -> float:
        compute = self.plan.forward_us + self.plan.backward_us
        return compute / self.plan.iteration_us if self.plan.iteration_us > 0 else 1.0


def scale_compute(profile: Profile, speedup: float) -> Profile:
    """The same trace on a device ``speedup`` times faster (sizes unchanged)."""
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    return Profile(
        profile.model,
        profile.params,
        profile.nbytes,
        profile.backward_us / speedup,
        profile.forward_us / speedup,
    )


def powers_of_two(low: int, high: int) -> list[int]:
    """low, 2 low, 4 low, ... up to high."""
    out, p = [], low
    while p <= high:
        out.append(p)
        p *= 2
    return out


def simulate(
    profile: Profile,
    network: LinkModel,
    ranks: Iterable[int],
    strategies: Sequence[Strategy | str],
    algorithm: str = "ring",
) -> list[SimulatedIteration]:
    """One simulated iteration per (rank count, strategy)."""
    parsed = [s if isinstance(s, Strategy) else parse_strategy(s) for s in strategies]
    out = []
    for p in ranks:
        cost = network.allreduce(int(p), algorithm)
        for strategy in parsed:
            out.append(
                SimulatedIteration(
                    profile.model, strategy.label, int(p), cost, plan(strategy, profile, cost)
                )
            )
    return out

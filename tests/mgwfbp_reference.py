"""A reference MG-WFBP planner for the tests, written from the paper and
docs/merged-gradient.md without collectives.mgwfbp: the paper's merge rule in forward
layer order, each strategy's groups, the timeline a plan predicts, and a check of a
written CSV row (ccbench simulate, benchmarks.merged_gradient) against all three. The
planner tests set collectives.mgwfbp against it; the command-line tests check the rows
the tools write with it."""

from __future__ import annotations

import csv

import numpy as np
import pytest


def paper_mgwfbp(sizes_fwd, tb_fwd, alpha, beta):
    """The merge rule exactly as the paper states it, in forward layer order 0..L-1.

    Independent of collectives.mgwfbp: full recomputation of tau_b and tau_c after every
    merge; merged layers keep a zero-cost communication. Returns stops in backward order.
    """
    n = len(sizes_fwd)
    p = [float(s) for s in sizes_fwd]
    tb = [float(t) for t in tb_fwd]
    merged = [False] * n  # merged[l]: layer l's gradient travels with layer l-1's

    def taus():
        tau_b = [0.0] * n
        for layer in range(n - 2, -1, -1):
            tau_b[layer] = tau_b[layer + 1] + tb[layer + 1]
        tc = [0.0 if merged[layer] else alpha + beta * p[layer] for layer in range(n)]
        tau_c = [0.0] * n
        tau_c[n - 1] = tau_b[n - 1] + tb[n - 1]
        for layer in range(n - 2, -1, -1):
            tau_c[layer] = max(tau_c[layer + 1] + tc[layer + 1], tau_b[layer] + tb[layer])
        return tau_b, tau_c

    for layer in range(n - 1, 0, -1):
        tau_b, tau_c = taus()
        if tau_b[layer - 1] + tb[layer - 1] < tau_c[layer] + alpha:
            p[layer - 1] += p[layer]
            p[layer] = 0.0
            merged[layer] = True
    # backward index i holds layer n-1-i; a group ends after i unless layer n-1-i merged
    return [i + 1 for i in range(n) if n - 1 - i == 0 or not merged[n - 1 - i]]


def reference_timeline(stops, nbytes, backward_us, forward_us, alpha, beta):
    """(iteration, non-overlapped, time in allreduces) of groups ending at `stops`, from
    the docs' timeline: a group starts once its last tensor is ready and the previous
    group is done, and takes alpha + beta * its bytes."""
    ready = np.cumsum(backward_us)
    end, comm, first = 0.0, 0.0, 0
    for stop in stops:
        took = alpha + beta * float(np.sum(nbytes[first:stop]))
        end = max(end, ready[stop - 1]) + took
        comm, first = comm + took, stop
    nonoverlapped = end - ready[-1]
    return forward_us + ready[-1] + nonoverlapped, nonoverlapped, comm


def reference_stops(strategy, nbytes, backward_us, forward_us, alpha, beta):
    """A strategy's groups (stops in backward order) from docs/merged-gradient.md, written
    without collectives.mgwfbp; the optimum by a dynamic program of its own."""
    n = len(nbytes)
    if strategy == "wfbp":
        return list(range(1, n + 1))
    if strategy == "single":
        return [n]
    if strategy == "mgwfbp":
        return paper_mgwfbp(nbytes[::-1], backward_us[::-1], alpha, beta)
    kind, _, cap = strategy.partition(":")
    if kind in ("fixed", "ddp"):
        cap = int(cap.removesuffix("MB")) << 20
        stops, held = [], 0
        for i, b in enumerate(nbytes):
            if kind == "fixed" and held and held + b > cap:  # would overflow: next buffer
                stops.append(i)
                held = 0
            held += b
            bucket_cap = min(1 << 20, cap) if not stops else cap  # DDP's small first bucket
            if kind == "ddp" and held >= bucket_cap:
                stops.append(i + 1)
                held = 0
        return stops if stops and stops[-1] == n else [*stops, n]
    assert strategy == "optimal"
    ready = np.cumsum(backward_us)
    best, last_cut = [0.0] + [np.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(1, j + 1):  # the last group is tensors i-1 .. j-1
            end = max(best[i - 1], ready[j - 1]) + alpha + beta * float(np.sum(nbytes[i - 1 : j]))
            if end < best[j]:
                best[j], last_cut[j] = end, i - 1
    stops, j = [], n
    while j:
        stops.append(j)
        j = last_cut[j]
    return stops[::-1]


def check_row_against_reference(r, nbytes, backward_us, forward_us):
    """A CSV row's plan and predictions against the reference planner and timeline."""
    alpha, beta = float(r["alpha_us"]), float(r["beta_us_per_byte"])
    stops = [int(x) for x in r["plan"].split()]
    want = reference_stops(r["strategy"], nbytes, backward_us, forward_us, alpha, beta)
    iteration, nonoverlapped, comm = reference_timeline(
        want, nbytes, backward_us, forward_us, alpha, beta
    )
    if r["strategy"] == "optimal":  # ties may pick other groups of the same time
        assert reference_timeline(stops, nbytes, backward_us, forward_us, alpha, beta)[
            0
        ] == pytest.approx(iteration, rel=1e-9)
    else:
        assert stops == want, r["strategy"]
    assert int(r["groups"]) == len(stops)
    assert float(r["predicted_us"]) == pytest.approx(iteration, rel=1e-9, abs=1e-3)
    assert float(r["nonoverlapped_us"]) == pytest.approx(nonoverlapped, rel=1e-9, abs=1e-3)
    assert float(r["comm_us"]) == pytest.approx(comm, rel=1e-9, abs=1e-3)
    return iteration


def profile_arrays(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    nbytes = np.array([int(r["bytes"]) for r in rows])
    backward = np.array([float(r["backward_us"]) for r in rows])
    return nbytes, backward, float(rows[0]["forward_us"])

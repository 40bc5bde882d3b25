"""MG-WFBP: planner properties, cost model, simulator closed forms, profiles, execution."""

from __future__ import annotations

import csv
import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ccbench.collectives.costmodel import AlphaBeta, LinkModel, fit_alpha_beta
from ccbench.collectives.mgwfbp import (
    DEFAULT_STRATEGIES,
    PROFILE_COLUMNS,
    Profile,
    comm_timeline,
    evaluate,
    parse_bytes,
    parse_strategies,
    parse_strategy,
    plan,
    read_profile,
)
from ccbench.collectives.simulator import powers_of_two, simulate
from ccbench.kernels.errors import UsageError
from tests.mpirun import REPO, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

PROFILES = REPO / "results" / "profiles"
TENSORS = {"resnet50": 161, "vgg16": 32, "bert": 201, "lstm": 11}


# ---------------------------------------------------------------- helpers


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


def brute_force_best(profile, cost):
    """Minimum iteration time over all 2^(L-1) contiguous groupings."""
    n = profile.ntensors
    best = np.inf
    for cuts in itertools.product((False, True), repeat=n - 1):
        stops = [i + 1 for i, c in enumerate(cuts) if c] + [n]
        best = min(best, evaluate(profile, cost, stops).iteration_us)
    return best


profiles = st.integers(2, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 4_000_000), min_size=n, max_size=n),
        st.lists(st.one_of(st.just(0.0), st.floats(0, 5000)), min_size=n, max_size=n),
        st.floats(0, 1000),
    )
)
costs = st.tuples(st.floats(0, 2000), st.floats(0, 0.05))


def make(raw):
    sizes, tb, fwd = raw
    return Profile.from_arrays("random", sizes, tb, fwd)


# ---------------------------------------------------------------- planner


@settings(max_examples=150, deadline=None)
@given(profiles, costs)
def test_every_strategy_covers_every_tensor_once_in_order(raw, ab):
    profile, cost = make(raw), AlphaBeta(*ab)
    for spec in (*DEFAULT_STRATEGIES, "fixed:1MB", "ddp:512KB"):
        p = plan(spec, profile, cost)
        starts = [a for a, _ in p.groups]
        assert starts[0] == 0 and p.stops[-1] == profile.ntensors
        assert all(b > a for a, b in p.groups)
        assert [b for _, b in p.groups[:-1]] == starts[1:]
        assert p.group_bytes.sum() == profile.total_bytes
        assert np.all(p.start_us >= p.ready_us) and np.all(np.diff(p.start_us) >= 0)
        assert p.iteration_us >= profile.forward_us + profile.total_backward_us


@settings(max_examples=150, deadline=None)
@given(profiles, costs)
def test_wfbp_and_single_are_the_extremes_and_optimal_is_never_worse(raw, ab):
    profile, cost = make(raw), AlphaBeta(*ab)
    plans = {s: plan(s, profile, cost) for s in DEFAULT_STRATEGIES}
    assert plans["wfbp"].ngroups == profile.ntensors
    assert plans["single"].ngroups == 1
    assert all(1 <= p.ngroups <= profile.ntensors for p in plans.values())
    best = plans["optimal"].iteration_us
    for p in plans.values():
        assert best <= p.iteration_us * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 9).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 1000), min_size=n, max_size=n),
            st.lists(st.floats(0, 500), min_size=n, max_size=n),
            st.just(0.0),
        )
    ),
    costs,
)
def test_optimal_equals_brute_force(raw, ab):
    profile, cost = make(raw), AlphaBeta(ab[0], ab[1] * 10)
    assert plan("optimal", profile, cost).iteration_us == pytest.approx(
        brute_force_best(profile, cost), rel=1e-12, abs=1e-9
    )


@settings(max_examples=200, deadline=None)
@given(profiles, costs)
def test_mgwfbp_equals_the_papers_algorithm(raw, ab):
    profile, cost = make(raw), AlphaBeta(*ab)
    fwd_sizes, fwd_tb = profile.nbytes[::-1], profile.backward_us[::-1]
    expected = paper_mgwfbp(fwd_sizes, fwd_tb, cost.alpha_us, cost.beta_us_per_byte)
    assert list(plan("mgwfbp", profile, cost).stops) == expected


def test_mgwfbp_hand_worked_example():
    # ready at 5, 10, 40, 45 us; alpha 10 us, 1 us per byte, 10 bytes each.
    # t0 starts at 5; t1 ready at 10 < 5 + 10: merge (start 10). t2 ready at 40 is not
    # < 10 + 10: the group [t0, t1] ends at 10 + 10 + 20 = 40. t2 starts at 40; t3 ready
    # at 45 < 40 + 10: merge, start 45, end 45 + 10 + 20 = 75.
    profile = Profile.from_arrays("hand", [10, 10, 10, 10], [5, 5, 30, 5], forward_us=100)
    cost = AlphaBeta(10, 1)
    p = plan("mgwfbp", profile, cost)
    assert p.stops == (2, 4)
    assert list(p.end_us) == [40, 75]
    assert p.nonoverlapped_us == 30 and p.iteration_us == 175
    # the others by hand: wfbp ends 25, 45, 65, 85; single starts at 45, ends at 95
    assert list(plan("wfbp", profile, cost).end_us) == [25, 45, 65, 85]
    assert plan("single", profile, cost).nonoverlapped_us == 50
    assert plan("optimal", profile, cost).nonoverlapped_us == 30


def test_mgwfbp_merges_a_tensor_that_is_ready_while_the_link_is_busy():
    # t1 is ready (at 2) long after t0's group could start (1) + alpha (1): no merge;
    # but t2 is ready (3) before t1's allreduce can start (t0's ends at 1 + 1 + 100):
    # merging it saves one alpha at no cost.
    profile = Profile.from_arrays("busy", [100, 10, 10], [1, 1, 1])
    p = plan("mgwfbp", profile, AlphaBeta(1, 1))
    assert p.stops == (1, 3)
    assert p.end_us[-1] == 102 + 1 + 20


def test_limits_of_the_model():
    rng = np.random.default_rng(3)
    sizes, tb = rng.integers(1, 10_000, 50), rng.uniform(0, 100, 50)
    # no start-up cost: one allreduce per tensor is as good as anything
    free = AlphaBeta(0.0, 0.01)
    profile = Profile.from_arrays("x", sizes, tb)
    assert plan("wfbp", profile, free).iteration_us == pytest.approx(
        plan("optimal", profile, free).iteration_us
    )
    assert plan("mgwfbp", profile, free).iteration_us == pytest.approx(
        plan("optimal", profile, free).iteration_us
    )
    # every gradient ready at once: nothing to overlap, one allreduce is best
    instant = Profile.from_arrays("y", sizes, np.zeros(50))
    cost = AlphaBeta(50.0, 0.01)
    assert plan("mgwfbp", instant, cost).stops == (50,)
    assert plan("optimal", instant, cost).iteration_us == pytest.approx(
        plan("single", instant, cost).iteration_us
    )


def test_fixed_fusion_never_overflows_its_buffer():
    sizes = [300, 300, 500, 1200, 100, 100, 100]
    p = plan("fixed:1000", Profile.from_arrays("f", sizes, [1] * 7), AlphaBeta(1, 0))
    assert p.stops == (2, 3, 4, 7)  # 600 | 500 | 1200 alone | 300
    assert list(p.group_bytes) == [600, 500, 1200, 300]


def test_ddp_buckets_match_torch():
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not hasattr(dist, "_compute_bucket_assignment_by_size"):
        pytest.skip("this torch has no DDP bucket assignment")
    rng = np.random.default_rng(7)
    for _ in range(20):
        numel = rng.integers(1, 3_000_000, rng.integers(1, 60))
        tensors = [torch.empty(int(n), device="meta") for n in numel]  # sizes only
        cap = int(rng.choice([25 << 20, 4 << 20, 2 << 20]))
        buckets, _ = dist._compute_bucket_assignment_by_size(
            tensors, [dist._DEFAULT_FIRST_BUCKET_BYTES, cap], [False] * len(tensors)
        )
        expected = [max(b) + 1 for b in buckets]
        profile = Profile.from_arrays("ddp", numel * 4, np.ones(numel.size))
        assert list(plan(f"ddp:{cap}", profile, AlphaBeta(1, 0)).stops) == expected


def test_comm_timeline_closed_form_equals_the_recurrence():
    rng = np.random.default_rng(1)
    ready = np.cumsum(rng.exponential(10, 100))
    d = rng.exponential(12, 100)
    start, end = comm_timeline(ready, d)
    prev = 0.0
    for k in range(100):
        s = max(prev, ready[k])
        assert start[k] == pytest.approx(s) and end[k] == pytest.approx(s + d[k])
        prev = s + d[k]


@pytest.mark.parametrize(
    "spec, label",
    [
        ("wfbp", "wfbp"),
        ("single", "single"),
        ("mgwfbp", "mgwfbp"),
        ("optimal", "optimal"),
        ("fixed", "fixed:64MB"),
        ("ddp", "ddp:25MB"),
        ("fixed:64MB", "fixed:64MB"),
        ("ddp:25MiB", "ddp:25MB"),
        ("FIXED:512k", "fixed:512KB"),
        ("ddp:1000", "ddp:1000"),
    ],
)
def test_parse_strategy(spec, label):
    assert parse_strategy(spec).label == label


@pytest.mark.parametrize(
    "spec", ["", "mg", "fixed:", "fixed:-1", "ddp:12XB", "wfbp:1MB", "fixed:0", "single,bogus"]
)
def test_parse_strategy_rejects_bad_specs(spec):
    with pytest.raises(UsageError):
        parse_strategies(spec)


def test_parse_strategies_all_and_bytes():
    assert [s.label for s in parse_strategies("all")] == list(DEFAULT_STRATEGIES)
    assert [s.label for s in parse_strategies("mgwfbp,wfbp,mgwfbp")] == ["mgwfbp", "wfbp"]
    assert parse_bytes("64MB") == 64 << 20 and parse_bytes("1.5K") == 1536


# ---------------------------------------------------------------- cost model


def test_fit_recovers_a_line_exactly_and_within_noise():
    sizes = 2.0 ** np.arange(12, 26)
    truth = AlphaBeta(120.0, 0.012)
    fit = fit_alpha_beta(sizes, truth.time_us(sizes))
    assert fit.model.alpha_us == pytest.approx(120.0, rel=1e-9)
    assert fit.model.beta_us_per_byte == pytest.approx(0.012, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.max_rel_err < 1e-9
    noisy = truth.time_us(sizes) * np.random.default_rng(0).uniform(0.97, 1.03, sizes.size)
    fit = fit_alpha_beta(sizes, noisy)
    assert fit.model.alpha_us == pytest.approx(120.0, rel=0.05)
    assert fit.model.beta_us_per_byte == pytest.approx(0.012, rel=0.05)
    assert fit.max_rel_err < 0.07


def test_fit_never_returns_a_negative_coefficient():
    fit = fit_alpha_beta([1000, 2000, 4000], [9.0, 20.0, 42.0])  # line through -2 us
    assert fit.model.alpha_us == 0.0 and fit.model.beta_us_per_byte > 0
    with pytest.raises(ValueError):
        fit_alpha_beta([100, 100], [1.0, 2.0])


def test_link_model_ring_allreduce_and_its_inverse():
    link = LinkModel(link_gbps=10.0, hop_latency_us=5.0)
    c = link.ring_allreduce(8)
    assert c.alpha_us == 2 * 7 * 5.0
    # 1 GB at 10 Gbit/s is 800 ms; a ring allreduce moves 2(p-1)/p of it per link
    assert c.time_us(1e9) - c.alpha_us == pytest.approx(2 * 7 / 8 * 800_000)
    back = LinkModel.from_ring_allreduce(c, 8)
    assert back.link_gbps == pytest.approx(10.0) and back.hop_latency_us == pytest.approx(5.0)
    assert link.ring_allreduce(1) == AlphaBeta(0.0, 0.0)


# ---------------------------------------------------------------- simulator


def test_simulator_single_merge_closed_form():
    # every gradient ready at the end of backward: single = F + B + alpha(p) + beta(p) S
    profile = Profile.from_arrays("c", [4000] * 10, [1000.0] + [0] * 9, forward_us=500)
    link = LinkModel(1.0, 10.0)
    ranks = powers_of_two(4, 2048)
    assert ranks[0] == 4 and ranks[-1] == 2048 and len(ranks) == 10
    for sim in simulate(profile, link, ranks, ["single", "mgwfbp"]):
        alpha = 2 * (sim.ranks - 1) * 10.0
        comm = alpha + 2 * (sim.ranks - 1) / sim.ranks * 40_000 * 8e-3
        assert sim.plan.iteration_us == pytest.approx(1500 + comm)
        assert sim.scaling_efficiency == pytest.approx(1500 / (1500 + comm))


def test_simulator_wfbp_hides_everything_but_the_last_tensor():
    # each tensor's allreduce fits in the next tensor's backward time
    profile = Profile.from_arrays("w", [1000] * 20, [10_000.0] * 20)
    link = LinkModel(10.0, 1.0)
    for sim in simulate(profile, link, [4, 64, 2048], ["wfbp"]):
        assert sim.plan.nonoverlapped_us == pytest.approx(sim.cost.time_us(1000))


# ---------------------------------------------------------------- profiles and models


@pytest.mark.parametrize("model", sorted(TENSORS))
def test_tracked_profiles(model):
    profile = read_profile(PROFILES / f"{model}.csv")
    assert profile.model == model and profile.ntensors == TENSORS[model]
    assert np.all(profile.backward_us >= 0) and profile.total_backward_us > 0
    assert profile.forward_us > 0
    with open(PROFILES / f"{model}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == PROFILE_COLUMNS
    assert all(int(r["bytes"]) == 4 * int(r["numel"]) for r in rows)
    assert [int(r["order"]) for r in rows] == list(range(len(rows)))
    ready = np.cumsum([float(r["backward_us"]) for r in rows])
    assert np.allclose(ready, [float(r["ready_us"]) for r in rows], atol=0.01 * len(rows))


def test_models_keep_the_real_tensor_count():
    pytest.importorskip("torch")
    from ccbench.benchmarks.results import profile_names
    from ccbench.training.profile_models import MODELS

    assert set(profile_names()) == set(MODELS)  # every model has its tracked profile
    for name, spec in MODELS.items():
        model = spec.build(0.05)
        assert len(list(model.parameters())) == TENSORS[name], name


def test_profile_layers_writes_backward_order(tmp_path):
    pytest.importorskip("torch")
    from ccbench.scripts.profile_layers import main

    assert (
        main(
            [
                "--model",
                "lstm",
                "--width",
                "0.05",
                "--batch",
                "2",
                "--warmup",
                "0",
                "--iterations",
                "2",
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    profile = read_profile(tmp_path / "lstm.csv")
    assert profile.params[:2] == ("decoder.bias", "decoder.weight")
    assert profile.params[-1] == "encoder.weight"
    assert np.all(profile.backward_us >= 0) and profile.forward_us > 0
    assert main(["--model", "nope", "--out-dir", str(tmp_path)]) == 2


# ---------------------------------------------------------------- command lines


def write_profile(path, sizes, tb, forward_us):
    rows, ready = [], 0.0
    for i, (n, t) in enumerate(zip(sizes, tb, strict=True)):
        ready += t
        rows.append(
            {
                "model": "tiny",
                "order": i,
                "param": f"layer{i}.weight",
                "shape": str(n),
                "numel": n,
                "dtype": "float32",
                "bytes": 4 * n,
                "backward_us": t,
                "ready_us": ready,
                "forward_us": forward_us,
                "batch": 1,
                "width": 1,
                "device": "cpu",
                "iterations": 1,
            }
        )
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, PROFILE_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("profile") / "tiny.csv"
    sizes = rng.integers(1, 40_000, 24)
    sizes[5] = 3  # odd sizes: groups must not need to split evenly over ranks
    write_profile(path, sizes, rng.uniform(0, 300, 24), 200.0)
    return path


def test_simulate_cli(tiny_profile, tmp_path, capsys):
    from ccbench.scripts.simulate import main

    out = tmp_path / "sim.csv"
    assert (
        main(
            [
                "--profile",
                str(tiny_profile),
                "--ranks",
                "4:2048",
                "--csv",
                str(out),
                "--show-groups",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 10 * len(DEFAULT_STRATEGIES)
    nbytes, backward, forward = profile_arrays(tiny_profile)
    for r in rows:
        # the default network, 10 Gbit/s and 5 us per hop, as a ring allreduce on p ranks
        p = int(r["ranks"])
        assert float(r["alpha_us"]) == pytest.approx(2 * (p - 1) * 5.0, rel=1e-12)
        assert float(r["beta_us_per_byte"]) == pytest.approx(2 * (p - 1) / p * 8 / 10e3, rel=1e-12)
        iteration = check_row_against_reference(r, nbytes, backward, forward)
        efficiency = (forward + backward.sum()) / iteration
        assert float(r["scaling_efficiency"]) == pytest.approx(efficiency, abs=1e-6)  # 6 digits
    assert sorted({int(r["ranks"]) for r in rows}) == [2**k for k in range(2, 12)]
    assert "stops:" in capsys.readouterr().out
    assert main(["--profile", str(tiny_profile), "--strategy", "fixed:huge"]) == 2
    assert main(["--profile", str(tmp_path / "missing.csv")]) == 2
    assert main(["--profile", str(tiny_profile), "--measured", str(tmp_path / "no.csv")]) == 2


def test_simulate_from_a_measured_fit(tiny_profile, tmp_path):
    from ccbench.benchmarks.results import MGWFBP_COLUMNS as COLUMNS
    from ccbench.scripts.simulate import main

    measured = tmp_path / "mg.csv"
    row = dict.fromkeys(COLUMNS, "")
    cost = LinkModel(1.0, 50.0).ring_allreduce(4)
    row.update(
        ranks=4, measured_us=1000, alpha_us=cost.alpha_us, beta_us_per_byte=cost.beta_us_per_byte
    )
    with open(measured, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerow(row)
    out = tmp_path / "sim.csv"
    assert (
        main(
            [
                "--profile",
                str(tiny_profile),
                "--measured",
                str(measured),
                "--ranks",
                "4,8",
                "--strategy",
                "single",
                "--csv",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(open(out)))
    assert float(rows[0]["link_gbps"]) == pytest.approx(1.0)
    assert float(rows[0]["hop_latency_us"]) == pytest.approx(50.0)
    assert float(rows[0]["alpha_us"]) == pytest.approx(cost.alpha_us)  # 4 ranks: as measured
    assert float(rows[1]["alpha_us"]) == pytest.approx(2 * 7 * 50.0)


@pytest.mark.parametrize(
    "module",
    [
        "ccbench.scripts.simulate",
        "ccbench.benchmarks.merged_gradient",
        "ccbench.scripts.profile_layers",
    ],
)
def test_help_lists_the_models(module):
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    for name in TENSORS:
        assert name in out.stdout


@pytest.fixture(scope="module")
def execution(tiny_profile, tmp_path_factory):
    out = tmp_path_factory.mktemp("mg") / "mg.csv"
    proc = mpirun(
        2,
        [
            *variant_module("merged_gradient"),
            "--profile",
            str(tiny_profile),
            "--strategy",
            "all",
            "-i",
            "3",
            "-x",
            "1",
            "-c",
            "--fit-seconds",
            "0.02",
            "--csv",
            str(out),
        ],
        timeout=120,
    )
    return proc, out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", DEFAULT_STRATEGIES)
def test_execution_on_two_ranks(execution, tiny_profile, strategy):
    proc, out = execution
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "alpha =" in proc.stdout and "R^2" in proc.stdout
    rows = {r["strategy"]: r for r in csv.DictReader(open(out))}
    r = rows[strategy]
    assert r["validation"] == "Pass" and r["ranks"] == "2" and r["transport"] == "mpi"
    assert float(r["alpha_us"]) >= 0 and float(r["beta_us_per_byte"]) >= 0  # a fit
    nbytes, backward, forward = profile_arrays(tiny_profile)
    check_row_against_reference(r, nbytes, backward, forward)
    # the replay cannot finish before the compute it replays
    assert float(r["measured_us"]) >= 0.99 * (forward + backward.sum())
    assert float(r["measured_nonoverlapped_us"]) >= 0
    assert float(r["measured_comm_us"]) > 0


@pytest.mark.timeout(150)
def test_execution_other_allreduces_and_bad_input(tiny_profile, tmp_path):
    out = tmp_path / "ring.csv"
    proc = mpirun(
        2,
        [
            *variant_module("merged_gradient"),
            "--profile",
            str(tiny_profile),
            "--strategy",
            "wfbp,mgwfbp",
            "--allreduce",
            "ring",
            "-i",
            "1",
            "-x",
            "0",
            "-c",
            "--fit-seconds",
            "0.01",
            "--csv",
            str(out),
        ],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("Pass") == 2
    assert {r["transport"] for r in csv.DictReader(open(out))} == {"ring"}  # its column
    # a lossy compressed allreduce, by the option's former name: checked against the
    # compressed ring's error bound
    proc = mpirun(
        2,
        [
            *variant_module("merged_gradient"),
            "--profile",
            str(tiny_profile),
            "--strategy",
            "single,optimal",
            "--transport",
            "coll:bfp:rate=8",
            "-i",
            "1",
            "-x",
            "0",
            "-c",
            "--fit-seconds",
            "0.01",
        ],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("Pass") == 2 and "(coll:bfp:rate=8)" in proc.stdout
    proc = mpirun(
        2,
        [
            *variant_module("merged_gradient"),
            "--profile",
            str(tiny_profile),
            "--strategy",
            "mgwfbp,fixed:lots",
        ],
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("error") == 1 and "Traceback" not in proc.stderr

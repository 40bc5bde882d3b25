"""MG-WFBP's model: planner properties (every strategy against the reference planner,
brute force and the paper's rule), the alpha-beta cost model, the simulator's closed
forms, and the tracked layer profiles and the models they come from. The command lines
and the execution on MPI ranks are in tests/test_mgwfbp_cli.py."""

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
from tests.mgwfbp_reference import paper_mgwfbp
from tests.mpirun import REPO

PROFILES = REPO / "results" / "profiles"
TENSORS = {"resnet50": 161, "vgg16": 32, "bert": 201, "lstm": 11}


# ---------------------------------------------------------------- helpers


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

"""The Rabenseifner allreduce model (recursive halving, then recursive doubling), worked by
hand, on its own, inside the simulator and through `ccbench simulate`.

Thakur, Rabenseifner and Gropp (2005): on p = 2**k ranks, the reduce-scatter halves the
data in lg p steps and the allgather doubles it back in lg p steps, so
alpha = 2 lg p hops and beta = 2 (p - 1) / p of the data per link. At 10 Gbit/s a byte
takes 8e-3 / 10 = 8e-4 us.
"""

from __future__ import annotations

import csv

import pytest

from ccbench.collectives.costmodel import AlphaBeta, LinkModel
from ccbench.collectives.mgwfbp import PROFILE_COLUMNS, Profile
from ccbench.collectives.simulator import simulate

LINK = LinkModel(link_gbps=10.0, hop_latency_us=5.0)

# p: (alpha us, beta us/B), by hand: alpha = 2 lg p x 5 us, beta = 2 (p-1)/p x 8e-4
HAND = {
    2: (2 * 1 * 5.0, 2 * (1 / 2) * 8e-4),  # 10 us, 8e-4
    4: (2 * 2 * 5.0, 2 * (3 / 4) * 8e-4),  # 20 us, 1.2e-3
    8: (2 * 3 * 5.0, 2 * (7 / 8) * 8e-4),  # 30 us, 1.4e-3
    1024: (2 * 10 * 5.0, 2 * (1023 / 1024) * 8e-4),  # 100 us
}


@pytest.mark.parametrize("p", sorted(HAND))
def test_rabenseifner_alpha_and_beta_worked_by_hand(p):
    alpha, beta = HAND[p]
    for cost in (LINK.rabenseifner_allreduce(p), LINK.allreduce(p, "rabenseifner")):
        assert cost.alpha_us == pytest.approx(alpha, rel=1e-12)
        assert cost.beta_us_per_byte == pytest.approx(beta, rel=1e-12)
    # 1 GB: 1e9 x beta on top of alpha; at p = 8, 1.4e6 us + 30 us
    if p == 8:
        assert LINK.allreduce(8, "rabenseifner").time_us(1e9) == pytest.approx(1_400_030.0)
    assert LINK.rabenseifner_allreduce(1) == AlphaBeta(0.0, 0.0)


def test_rabenseifner_moves_what_the_ring_moves_in_fewer_steps():
    # the same bytes per link as the ring; at 8 ranks 6 hops instead of the ring's 14
    ring, halving = LINK.allreduce(8, "ring"), LINK.allreduce(8, "rabenseifner")
    assert halving.beta_us_per_byte == pytest.approx(ring.beta_us_per_byte, rel=1e-12)
    assert (ring.alpha_us, halving.alpha_us) == (pytest.approx(70.0), pytest.approx(30.0))


def test_rabenseifner_takes_powers_of_two_only():
    # its halving pairs rank r with r xor 2**i: 6 ranks have no lg p steps to count
    for p in (3, 6, 100):
        with pytest.raises(ValueError, match="power of two"):
            LINK.rabenseifner_allreduce(p)


def test_simulator_single_merge_under_rabenseifner_closed_form():
    # every gradient ready at the end of backward: one allreduce of all 40,000 bytes after
    # F + B = 500 + 1000 us; at 1 Gbit/s (8e-3 us/B) and 10 us per hop on p ranks:
    # iteration = 1500 + 2 lg p x 10 + 2 (p-1)/p x 40,000 x 8e-3
    profile = Profile.from_arrays("c", [4000] * 10, [1000.0] + [0] * 9, forward_us=500)
    link = LinkModel(1.0, 10.0)
    expected = {
        4: 1500 + 40 + 480.0,
        64: 1500 + 120 + 2 * 63 / 64 * 320,
        2048: 1500 + 220 + 2 * 2047 / 2048 * 320,
    }
    sims = simulate(profile, link, sorted(expected), ["single"], algorithm="rabenseifner")
    assert [s.ranks for s in sims] == sorted(expected)
    for sim in sims:
        assert sim.plan.iteration_us == pytest.approx(expected[sim.ranks], rel=1e-12)


def _profile(path) -> None:
    rows = [
        {
            "model": "two",
            "order": i,
            "param": f"w{i}",
            "shape": "1000",
            "numel": 1000,
            "dtype": "float32",
            "bytes": 4000,
            "backward_us": 100.0,
            "ready_us": 100.0 * (i + 1),
            "forward_us": 50.0,
            "batch": 1,
            "width": 1,
            "device": "cpu",
            "iterations": 1,
        }
        for i in range(2)
    ]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, PROFILE_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def test_simulate_cli_writes_the_rabenseifner_model(tmp_path, capsys):
    from ccbench.scripts.simulate import main

    profile, out = tmp_path / "two.csv", tmp_path / "sim.csv"
    _profile(profile)
    assert (
        main(
            [
                "--profile",
                str(profile),
                "--ranks",
                "2:1024",
                "--strategy",
                "single",
                "--algorithm",
                "rabenseifner",
                "--csv",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(open(out)))
    assert [int(r["ranks"]) for r in rows] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    for r in rows:
        p = int(r["ranks"])
        lg = p.bit_length() - 1  # p = 2**lg
        assert r["algorithm"] == "rabenseifner"
        assert float(r["alpha_us"]) == pytest.approx(2 * lg * 5.0, rel=1e-12)
        assert float(r["beta_us_per_byte"]) == pytest.approx(2 * (p - 1) / p * 8e-4, rel=1e-12)
    # a rank count the model has no steps for is refused, not extrapolated
    assert (
        main(
            ["--profile", str(profile), "--ranks", "4,6", "--algorithm", "rabenseifner", "--quiet"]
        )
        == 2
    )
    assert "power of two" in capsys.readouterr().err

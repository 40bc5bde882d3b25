"""MG-WFBP from the command line: `ccbench simulate` on a small profile (its rows
against the reference planner, a measured fit as its network) and
benchmarks.merged_gradient executing every strategy's plan on two MPI ranks, with other
allreduces and bad input."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from ccbench.collectives.costmodel import LinkModel
from ccbench.collectives.mgwfbp import DEFAULT_STRATEGIES, PROFILE_COLUMNS
from tests.mgwfbp_reference import check_row_against_reference, profile_arrays
from tests.mpirun import mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


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

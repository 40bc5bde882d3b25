"""`ccbench gate` and `ccbench compare` end to end, on a throw-away clone of this checkout.

The slowdown the gate must catch is made a hundred times larger than any noise (a sleep
in every call of the gated collective), so the verdict does not depend on the host's
speed; no test asserts a time.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpirun import REPO

SPEC = """
[gate]
ranks = 2
rounds = 3
threshold = 1.3
[[benchmark]]
name = "ring allgather"
command = "baseline --algorithm ring --collective allgather"
sizes = "4K:4K"
options = ["-i", "30", "-x", "3"]
"""


def ccbench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccbench.scripts.cli", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A clone of this checkout's HEAD, whose working tree the tests edit."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    path = tmp_path_factory.mktemp("gate") / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(path)], check=True)
    return path


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "gate.toml"
    path.write_text(SPEC)
    return path


@pytest.mark.timeout(300)
def test_gate_passes_an_unchanged_tree(clone, spec, tmp_path):
    out = tmp_path / "gate.csv"
    proc = ccbench("gate", "--repo", str(clone), "--spec", str(spec), "--csv", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["size_bytes"] for r in rows] == ["4096"] and rows[0]["rounds"] == "3"
    assert "0 failed" in proc.stdout


@pytest.mark.timeout(300)
def test_gate_fails_a_tree_that_slows_the_collective(clone, spec):
    ring = clone / "collectives" / "ring.py"
    original = ring.read_text()
    slowed = original.replace("def ring_allgather(comm, sendbuf, recvbuf) -> None:\n",
                              "def ring_allgather(comm, sendbuf, recvbuf) -> None:\n"
                              "    __import__('time').sleep(0.003)\n", 1)
    assert slowed != original
    ring.write_text(slowed)
    try:
        proc = ccbench("gate", "--repo", str(clone), "--spec", str(spec))
    finally:
        ring.write_text(original)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "uncommitted changes" in proc.stdout


@pytest.mark.parametrize("args, words", [
    (["--only", "nothing-like-this"], "matches no gated benchmark"),
    (["--base", "no-such-revision"], "no-such-revision"),
    (["--rounds", "1"], "at least 2"),
])  # fmt: skip
def test_gate_bad_input_exits_2(clone, spec, args, words):
    proc = ccbench("gate", "--repo", str(clone), "--spec", str(spec), *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_gate_bad_spec_exits_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[gate]\nrounds = 5\n")
    proc = ccbench("gate", "--spec", str(bad), timeout=60)
    assert proc.returncode == 2 and "no [[benchmark]]" in proc.stderr


@pytest.mark.timeout(300)
def test_compare_two_variants_writes_ratios(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench("compare", "baseline --algorithm mpi", "baseline --algorithm ring",
                   "-m", "4K,64K", "--rounds", "2", "--csv", str(out), "--",
                   "--collective", "allreduce", "-i", "20", "-x", "2")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["size_bytes"] for r in rows] == ["4096", "65536"]
    for r in rows:
        # the geometric means of the rounds and their ratio agree with each other
        assert float(r["ratio"]) == pytest.approx(float(r["b_us"]) / float(r["a_us"]), rel=1e-9)
        assert float(r["ratio_low"]) <= float(r["ratio"]) <= float(r["ratio_high"])
        assert r["verdict"] in ("faster", "slower", "no difference")
        assert r["a"] == "baseline --algorithm mpi" and r["b"] == "baseline --algorithm ring"


@pytest.mark.parametrize("args, words", [
    (["nosuch"], "unknown variant"),
    (["baseline"], "give two commands"),
    (["baseline", "baseline", "--rounds", "1"], "at least 2"),
    (["baseline", "baseline --csv x.csv"], "set by ccbench compare"),
])  # fmt: skip
def test_compare_bad_input_exits_2(args, words):
    proc = ccbench("compare", *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_compare_reads_unsized_benchmarks_from_their_own_rows():
    """Training compares on its summary row's mean step time, MG-WFBP per strategy."""
    from ccbench.scripts.compare import Comparison, Side

    a, b = Side("A", ["training"]), Side("B", ["training", "--variant", "coll_compressed"])
    comparison = Comparison(a, b, "avg", 0.03)
    for ta, tb in [(100.0, 50.0), (200.0, 100.0)]:
        steps = [{"row": "step", "step_us": "999"}, {"row": "step", "step_us": "1"}]
        comparison.add(a, [*steps, {"row": "summary", "step_us": str(ta), "steps": "20"}])
        comparison.add(b, [*steps, {"row": "summary", "step_us": str(tb), "steps": "20"}])
    (point,) = comparison.points()
    assert point == (0, "step")
    r = comparison.ratio(point)
    assert (r.ratio, r.low, r.high) == pytest.approx((0.5, 0.5, 0.5))

    mg = Comparison(Side("A", ["merged_gradient"]), Side("B", ["merged_gradient"]), "avg", 0.03)
    for side in (mg.a, mg.b):
        mg.add(side, [{"strategy": "wfbp", "measured_us": "10", "iterations": "5"},
                      {"strategy": "mgwfbp", "measured_us": "8", "iterations": "5"}])
    assert [p[1] for p in mg.points()] == ["strategy=mgwfbp", "strategy=wfbp"]

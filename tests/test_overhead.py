"""`ccbench overhead` is an MPI program like the variants: started under mpiexec it times
in place (it launches nothing), reports every method, and refuses bad input in one line."""

from __future__ import annotations

import json

import pytest

from ccbench.benchmarks import timing_c
from tests.mpirun import mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


@pytest.mark.timeout(120)
def test_runs_in_place_under_mpiexec(tmp_path):
    out = tmp_path / "overhead.json"
    proc = mpirun(
        2,
        [
            *variant_module("overhead"),
            "-m",
            "1:2",
            "-i",
            "200",
            "--rounds",
            "2",
            "--json",
            str(out),
        ],
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ranks"] == 2 and [r["size"] for r in result["rows"]] == [1, 2]
    methods = {"bare", "harness", "bare_batch", "batch"}
    if timing_c.find_mpicc() is not None:
        methods |= {"c", "c_batch"}
    for row in result["rows"]:
        assert methods <= set(row) and all(row[m] > 0 for m in methods), row
    # one table line per size, printed by rank 0 only
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert [line.split()[0] for line in lines] == ["1", "2"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args, words",
    [
        (["--rounds", "0"], "at least 1"),
        (["-m", "4:2"], "greater than MAX"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_input_one_line(args, words):
    proc = mpirun(2, [*variant_module("overhead"), *args], timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr

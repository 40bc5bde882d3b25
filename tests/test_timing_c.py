"""The compiled timing loop (benchmarks/timing_c.py): built on first use against the MPI in
use, it runs the library's collectives it is given, the harness reports which loop
timed each row, and a bad request is one line."""

from __future__ import annotations

import csv
import json

import pytest

from ccbench.benchmarks import timing_c
from ccbench.benchmarks.switches import read as read_switches
from tests.helpers.drivers import failed_checks
from tests.mpirun import case_results, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

needs_mpicc = pytest.mark.skipif(
    timing_c.find_mpicc() is None, reason="no mpicc beside this Python or on PATH"
)

CASES = [
    "allgather-per-call-float32",
    "reduce_scatter-batch-float64",
    "allreduce-per-call-int32",
    "allgather-batch-int8",
    "recognises-only-library-calls",
]


@needs_mpicc
@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", CASES)
def test_compiled_loop_runs_the_collective(case):
    result = case_results("tests.drivers.timing_c_cases", 2, timeout=180).get(case)
    assert failed_checks(result) == [], json.dumps(result)


@needs_mpicc
def test_cache_key_follows_the_source(tmp_path):
    """A changed source is a new library; the same source finds the built one."""
    mpicc = timing_c.find_mpicc()
    source = tmp_path / "loop.c"
    source.write_text(timing_c.SOURCE.read_text())
    first = timing_c.library_path(mpicc, source, tmp_path / "cache")
    assert timing_c.library_path(mpicc, source, tmp_path / "cache") == first
    source.write_text(timing_c.SOURCE.read_text() + "\n/* changed */\n")
    assert timing_c.library_path(mpicc, source, tmp_path / "cache") != first
    built = timing_c.build(mpicc, first, timing_c.SOURCE)
    assert built.exists() and not list(built.parent.glob(".*"))  # no temporary left over
    timing_c.load(built)  # reports the MPI mpi4py loaded


def test_a_broken_source_is_unavailable_not_a_crash(tmp_path):
    mpicc = timing_c.find_mpicc()
    if mpicc is None:
        pytest.skip("no mpicc")
    source = tmp_path / "bad.c"
    source.write_text("this is not C\n")
    with pytest.raises(timing_c.Unavailable, match="failed"):
        timing_c.build(mpicc, tmp_path / "bad.so", source)


def test_requested_timer():
    assert timing_c.requested_timer(read_switches({})) == "auto"
    assert timing_c.requested_timer(read_switches({"CCBENCH_TIMER": "Python"})) == "python"
    with pytest.raises(Exception, match="CCBENCH_TIMER='fast'"):
        timing_c.requested_timer(read_switches({"CCBENCH_TIMER": "fast"}))


def baseline_rows(tmp_path, algorithm: str, env: dict | None = None, name: str = "b"):
    out = tmp_path / f"{name}.csv"
    proc = mpirun(
        2,
        [
            *variant_module("baseline"),
            "--algorithm",
            algorithm,
            "-T",
            "int8",
            "-m",
            "1:64",
            "-i",
            "50",
            "-x",
            "5",
            "-c",
            "--csv",
            str(out),
        ],
        env={"CCBENCH_CACHE": str(tmp_path / "cache"), **(env or {})},
        timeout=120,
    )
    return proc, list(csv.DictReader(out.open())) if out.exists() else []


@needs_mpicc
@pytest.mark.timeout(200)
def test_the_timer_column(tmp_path):
    """The library's collectives are timed in C (built into an empty cache on first use),
    unless CCBENCH_TIMER=python; the hand-written ring always in Python."""
    proc, rows = baseline_rows(tmp_path, "mpi")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {r["timer"] for r in rows} == {"c"} and {r["validation"] for r in rows} == {"Pass"}
    assert len(list((tmp_path / "cache").glob("timing_c-*.so"))) == 1
    proc, rows = baseline_rows(tmp_path, "mpi", {"CCBENCH_TIMER": "python"}, "py")
    assert proc.returncode == 0 and {r["timer"] for r in rows} == {"python"}
    proc, rows = baseline_rows(tmp_path, "ring", name="ring")
    assert proc.returncode == 0 and {r["timer"] for r in rows} == {"python"}


@pytest.mark.timeout(120)
def test_bad_timer_request_is_one_line(tmp_path):
    proc, _ = baseline_rows(tmp_path, "mpi", {"CCBENCH_TIMER": "fast"})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "CCBENCH_TIMER='fast'" in lines[0], proc.stderr


@pytest.mark.timeout(120)
def test_c_timer_without_a_compiler_is_one_line(tmp_path):
    """CCBENCH_TIMER=c where no mpicc can be found: one line, exit 2; auto falls back."""
    env = {"CCBENCH_TIMER": "c", "PATH": "/nonexistent"}
    code = (
        "import sys; from ccbench.benchmarks import timing_c as t; "
        "t.find_mpicc = lambda: None; from ccbench.benchmarks.baseline import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    args = ["-c", code, "-T", "int8", "-m", "1:4", "-i", "5", "-x", "1"]
    proc = mpirun(2, args, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no mpicc" in lines[0], proc.stderr
    out = tmp_path / "fallback.csv"
    proc = mpirun(2, [*args, "--csv", str(out)], env={**env, "CCBENCH_TIMER": "auto"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert {r["timer"] for r in csv.DictReader(out.open())} == {"python"}


def test_the_c_calls_are_written_from_the_specs(monkeypatch):
    """timing_c.c names no collective: one case per spec, its MPI call with the arguments
    of its kind; a spec whose kind the loop does not know is left out, with its reason."""
    import dataclasses

    from ccbench.collectives import spec as spec_module

    text = timing_c.source_text()
    assert "/* CALLS */" not in text
    indent = "\n        return "
    assert (
        f"case 0: /* allgather */{indent}MPI_Allgather(send, count, type, recv, count, type, comm);"
        in text
    )
    assert (
        f"case 1: /* reduce_scatter */{indent}"
        "MPI_Reduce_scatter_block(send, recv, count, type, op, comm);" in text
    )
    assert (
        "case 2: /* allreduce */\n        return MPI_Allreduce(send, recv, count, type, op, comm);"
        in text
    )
    assert "Allgather" not in timing_c.SOURCE.read_text().split("#include <string.h>")[1]
    odd = dataclasses.replace(
        spec_module.SPECS["reduce_scatter"],
        name="scatterv",
        mpi_call="Scatterv",
        mpi_arguments="vector",
    )
    monkeypatch.setitem(spec_module.SPECS, "scatterv", odd)
    assert timing_c.c_refusal(odd) == (
        "the C timing loop cannot call scatterv's MPI_Scatterv: its argument list (vector) "
        "is none of the loop's (gathered, reduced)"
    )
    assert [s.name for s in timing_c.c_collectives()] == [
        "allgather",
        "reduce_scatter",
        "allreduce",
    ]
    assert "Scatterv" not in timing_c.source_text()


# the allreduce spec given an argument list the C loop has no call for
_UNCALLABLE = (
    "import dataclasses, sys; from ccbench.collectives import spec as s; "
    "s.SPECS['allreduce'] = dataclasses.replace(s.SPECS['allreduce'], mpi_arguments='vector'); "
    "from ccbench.benchmarks.baseline import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.timeout(120)
def test_a_collective_the_c_loop_cannot_call_is_refused_with_its_reason(tmp_path):
    """CCBENCH_TIMER=c for a collective the C loop has no call for: one line with the
    reason, exit 2; auto times it in Python and says why."""
    args = ["-c", _UNCALLABLE, "--collective", "allreduce", "-T", "int8", "-m", "4:4", "-i", "3"]
    proc = mpirun(2, [*args, "-x", "1"], env={"CCBENCH_TIMER": "c"}, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "cannot call allreduce's MPI_Allreduce: its argument list (vector)" in lines[0]
    out = tmp_path / "auto.csv"
    proc = mpirun(
        2, [*args, "-x", "1", "--csv", str(out)], env={"CCBENCH_TIMER": "auto"}, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert {r["timer"] for r in csv.DictReader(out.open())} == {"python"}

"""The harness as a user meets it: OSU output, CSV and JSON, bad input, failing ranks."""

from __future__ import annotations

import csv
import json

import pytest

from ccbench.benchmarks.results import COMMON_COLUMNS
from tests.mpirun import mpirun, variant_module

QUICK = ["-i", "5", "-x", "1"]


def parse_osu(stdout: str) -> list[list[str]]:
    """What a parser written for OSU's C benchmarks does: skip '#', split on blanks."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        int(fields[0])
        float(fields[1])  # average latency
        rows.append(fields)
    return rows


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_full_validated_sweep_writes_osu_rows_csv_and_json(tmp_path, collective):
    out = tmp_path / "out.csv"
    report = tmp_path / "run.json"
    proc = mpirun(2, [*variant_module("baseline"), "--collective", collective, "-m", "1:64K",
                      "-f", "-c", "--csv", out, "--json", report, *QUICK], timeout=100)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    title = {"allgather": "Allgather", "reduce_scatter": "Reduce_scatter",
             "allreduce": "Allreduce"}[collective]  # fmt: skip
    assert lines[0] == f"# OSU MPI {title} Latency Test v7.4"
    header = next(line for line in lines if line.startswith("# Size"))
    assert header.startswith("# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)"
                             "  Iterations        Validation")
    rows = parse_osu(proc.stdout)
    smallest = {"allgather": 4, "reduce_scatter": 8, "allreduce": 4}[collective]
    assert [int(r[0]) for r in rows] == [2**k for k in range(17) if 2**k >= smallest]
    assert all(r[4] == "5" and r[5] == "Pass" for r in rows)
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[: len(COMMON_COLUMNS)] == list(COMMON_COLUMNS)
    assert len(table) == len(rows)
    big = table[-1]
    assert int(big["size_bytes"]) == 65536 and big["validation"] == "Pass"
    assert big["ranks"] == "2" and big["codec"] == "none" and big["algorithm"] == "mpi"
    per_rank, total = {"allgather": (65536, 131072), "reduce_scatter": (32768, 65536),
                       "allreduce": (65536, 65536)}[collective]  # fmt: skip
    assert (int(big["bytes_per_rank"]), int(big["total_bytes"])) == (per_rank, total)
    factor = 1.0 if collective == "allreduce" else 0.5  # nccl-tests' busbw factor on 2 ranks
    assert float(big["busbw_gbps"]) == pytest.approx(float(big["algbw_gbps"]) * factor)
    assert float(big["algbw_gbps"]) == pytest.approx(total / float(big["avg_us"]) / 1e3)
    from mpi4py import MPI  # the library this test's Python loads, as the ranks do

    assert big["mpi_library"] == MPI.Get_library_version().replace("\0", "").splitlines()[0]
    sidecar = json.loads((tmp_path / "out.csv.json").read_text())
    (run,) = sidecar["runs"].values()
    assert run["ranks"] == 2 and run["versions"]["mpi4py"]
    assert len(json.loads(report.read_text())["results"]) == len(rows)


@pytest.mark.timeout(120)
def test_ring_reports_measured_wire_bytes_and_appends(tmp_path):
    out = tmp_path / "ring.csv"
    for _ in range(2):  # a second run appends; the first run's rows stay
        proc = mpirun(4, [*variant_module("baseline"), "--collective", "allreduce",
                          "--algorithm", "ring", "-m", "4K:4K", "-c", "--csv", out, *QUICK])
        assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2 and table[0]["run_id"] != table[1]["run_id"]
    # ring allreduce: 2 (P-1) blocks of N/P elements leave every rank
    assert int(table[0]["wire_bytes_per_rank"]) == 2 * 3 * 4096 // 4


@pytest.mark.timeout(120)
def test_batch_timing_is_recorded(tmp_path):
    out = tmp_path / "batch.csv"
    proc = mpirun(2, [*variant_module("baseline"), "-m", "1:8", "--timing", "batch",
                      "-T", "float64", "--csv", out, *QUICK])
    assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["timing"] == "batch" and row["p50_us"] == "" and float(row["avg_us"]) > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("nranks", "args", "needle"),
    [
        (2, ["-m", "8:4"], "greater than MAX"),
        (2, ["-m", "1:1Q"], "bad message size"),
        (2, ["-d", "gpu"], "invalid choice"),
        (2, ["--collective", "alltoall"], "invalid choice"),
        (2, ["-i", "0"], "must be at least 1"),
        (4, ["--collective", "reduce_scatter", "-m", "24:24"], "cannot be split over 4 ranks"),
        (2, ["--collective", "allgather", "-m", "6:6"], "not a whole number of float32"),
        (2, ["-T", "bfloat16"], "numpy buffers cannot hold bfloat16"),
        (2, ["-m", "1:2"], "no size in -m 1:2 holds one float32"),
    ],
)
def test_bad_input_is_one_line_from_rank_0_and_exit_2(nranks, args, needle):
    proc = mpirun(nranks, [*variant_module("baseline"), *args, *QUICK], timeout=50)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ccbench: error: ") and needle in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(60)
def test_csv_of_another_schema_is_refused_and_kept(tmp_path):
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    proc = mpirun(2, [*variant_module("baseline"), "-m", "4:4", "--csv", out, *QUICK])
    assert proc.returncode == 2 and "other columns" in proc.stderr
    assert out.read_text() == "a,b\n1,2\n"


@pytest.mark.timeout(60)
def test_validation_failure_prints_fail_and_exits_1():
    proc = mpirun(2, ["-m", "tests.drivers.faulty_variants", "wrong", "-m", "4:16", "-c",
                      *QUICK])
    assert proc.returncode == 1, proc.stderr
    assert [r[2] for r in parse_osu(proc.stdout)] == ["Fail", "Fail", "Fail"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["die", "raise"])
def test_a_failing_rank_ends_the_job_instead_of_hanging(fault):
    proc = mpirun(2, ["-m", "tests.drivers.faulty_variants", fault, "-m", "4:4", "-i", "50"],
                  timeout=50)
    assert proc.returncode != 0
    if fault == "raise":
        assert "ccbench: error: rank 1: RuntimeError: injected failure" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_help_is_printed_once():
    proc = mpirun(2, [*variant_module("baseline"), "--help"])
    assert proc.returncode == 0
    assert proc.stdout.count("usage:") == 1 and "--message-size" in proc.stdout

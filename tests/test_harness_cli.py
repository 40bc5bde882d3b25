"""The harness as a user meets it: OSU output, CSV and JSON, bad input, failing ranks."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tests.helpers.cli import parse_osu
from tests.helpers.drivers import failed_checks
from tests.mpirun import case_results, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

QUICK = ["-i", "5", "-x", "1"]
# The README's Results table; the harness may add columns of its own
DOCUMENTED_COLUMNS = (
    "run_id",
    "timestamp",
    "variant",
    "algorithm",
    "collective",
    "codec",
    "dtype",
    "buffer",
    "ranks",
    "nodes",
    "size_bytes",
    "bytes_per_rank",
    "total_bytes",
    "count",
    "iterations",
    "warmup",
    "timing",
    "avg_us",
    "min_us",
    "max_us",
    "p50_us",
    "p99_us",
    "algbw_gbps",
    "busbw_gbps",
    "wire_bytes_per_rank",
    "compression_ratio",
    "max_abs_err",
    "max_rel_err",
    "error_bound",
    "validation",
    "link_gbps",
    "mpi_library",
    "hostname",
    "git_sha",
)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_full_validated_sweep_writes_osu_rows_csv_and_json(tmp_path, collective):
    out = tmp_path / "out.csv"
    report = tmp_path / "run.json"
    proc = mpirun(
        2,
        [
            *variant_module("baseline"),
            "--collective",
            collective,
            "-m",
            "1:64K",
            "-f",
            "-c",
            "--csv",
            out,
            "--json",
            report,
            *QUICK,
        ],
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    title = {
        "allgather": "Allgather",
        "reduce_scatter": "Reduce_scatter",
        "allreduce": "Allreduce",
    }[collective]
    assert lines[0] == f"# OSU MPI {title} Latency Test v7.4"
    header = next(line for line in lines if line.startswith("# Size"))
    assert header.startswith(
        "# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)"
        "  Iterations        Validation"
    )
    rows = parse_osu(proc.stdout)
    smallest = {"allgather": 4, "reduce_scatter": 8, "allreduce": 4}[collective]
    assert [int(r[0]) for r in rows] == [2**k for k in range(17) if 2**k >= smallest]
    assert all(r[4] == "5" and r[5] == "Pass" for r in rows)
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    header = list(table[0])
    assert header[:2] == ["schema", "run_id"] and len(set(header)) == len(header)
    assert {r["schema"] for r in table} == {"harness/6"}
    assert [c for c in DOCUMENTED_COLUMNS if c not in header] == []
    assert len(table) == len(rows)
    big = table[-1]
    assert int(big["size_bytes"]) == 65536 and big["validation"] == "Pass"
    assert big["ranks"] == "2" and big["codec"] == "none" and big["algorithm"] == "mpi"
    assert (big["variant"], big["collective"], big["dtype"], big["buffer"], big["timing"]) == (
        "baseline",
        collective,
        "float32",
        "numpy",
        "per-call",
    )
    assert (big["iterations"], big["warmup"], big["nodes"]) == ("5", "1", "1")
    assert int(big["count"]) == 65536 // 4  # float32 elements in size_bytes
    per_rank, total = {
        "allgather": (65536, 131072),
        "reduce_scatter": (32768, 65536),
        "allreduce": (65536, 65536),
    }[collective]
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
        proc = mpirun(
            4,
            [
                *variant_module("baseline"),
                "--collective",
                "allreduce",
                "--algorithm",
                "ring",
                "-m",
                "4K:4K",
                "-c",
                "--csv",
                out,
                *QUICK,
            ],
        )
        assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2 and table[0]["run_id"] != table[1]["run_id"]
    # ring allreduce: 2 (P-1) blocks of N/P elements leave every rank
    assert int(table[0]["wire_bytes_per_rank"]) == 2 * 3 * 4096 // 4
    # nccl-tests' bandwidths on 4 ranks, worked by hand: algbw = 4096 B / avg, and the
    # allreduce bus factor 2 (4 - 1) / 4 = 1.5 (on 2 ranks it is 1, which hides errors)
    row = table[0]
    assert float(row["algbw_gbps"]) == pytest.approx(4096 / (float(row["avg_us"]) * 1e-6) / 1e9)
    assert float(row["busbw_gbps"]) == pytest.approx(1.5 * float(row["algbw_gbps"]))


@pytest.mark.timeout(120)
def test_batch_timing_is_recorded(tmp_path):
    out = tmp_path / "batch.csv"
    proc = mpirun(
        2,
        [
            *variant_module("baseline"),
            "-m",
            "1:8",
            "--timing",
            "batch",
            "-T",
            "float64",
            "--csv",
            out,
            *QUICK,
        ],
    )
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
    proc = mpirun(2, ["-m", "tests.drivers.faulty_variants", "wrong", "-m", "4:16", "-c", *QUICK])
    assert proc.returncode == 1, proc.stderr
    assert [r[2] for r in parse_osu(proc.stdout)] == ["Fail", "Fail", "Fail"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["die", "raise"])
def test_a_failing_rank_ends_the_job_instead_of_hanging(fault):
    """Rank 1 fails in the middle of the timed loop: the job ends (the timeout would tell
    a hang). A rank that raises says so in one line and aborts with 1; a rank that dies
    without a word leaves the status to the launcher, never 0."""
    proc = mpirun(
        2, ["-m", "tests.drivers.faulty_variants", fault, "-m", "4:4", "-i", "50"], timeout=50
    )
    if fault == "raise":
        assert proc.returncode == 1, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines == ["ccbench: error: rank 1: RuntimeError: injected failure"], lines
    else:
        assert proc.returncode not in (0, 1, 2, 3), proc.stderr  # not a status of ours
        assert "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_an_interrupted_rank_ends_the_job_with_130():
    proc = mpirun(
        2, ["-m", "tests.drivers.faulty_variants", "interrupt", "-m", "4:4", "-i", "50"], timeout=50
    )
    assert proc.returncode == 130, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["ccbench: error: rank 1: interrupted"], lines


@pytest.mark.timeout(90)
def test_time_budget_rounds_agree_when_rank_clocks_disagree():
    """Each rank timing its own count of calls deadlocks or truncates the gather."""
    result = case_results("tests.drivers.budget_cases", 2, timeout=60).get("budget-clocks-apart")
    assert failed_checks(result) == [], result


@pytest.mark.timeout(30)  # a hang guard: the launch must end well before its own timeout
def test_a_rank_raising_in_a_case_driver_ends_the_launch():
    with pytest.raises(AssertionError, match="RuntimeError: injected failure in a case"):
        case_results("tests.drivers.raising_cases", 2, timeout=25)


def test_list_says_which_variants_run_without_mpiexec():
    proc = subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.strip()}
    assert "no mpiexec" in lines["codec_throughput"]  # one process, no MPI
    for variant in ("baseline", "coll_compressed", "sparse_streaming", "training"):
        assert "no mpiexec" not in lines[variant]


@pytest.mark.timeout(60)
def test_help_is_printed_once():
    proc = mpirun(2, [*variant_module("baseline"), "--help"])
    assert proc.returncode == 0
    assert proc.stdout.count("usage:") == 1 and "--message-size" in proc.stdout

"""The exit-status table of docs/exit-status.md: every row names a test that exists, and
the rows no other module covers are tested here."""

from __future__ import annotations

import ast
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpirun import REPO, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

TABLE = REPO / "docs" / "exit-status.md"


def table_rows() -> list[list[str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] != "program":
                rows.append(cells)
    return rows


def test_every_row_names_a_test_that_exists():
    rows = table_rows()
    assert len(rows) >= 30
    for program, status, _, test in rows:
        assert re.fullmatch(r"\d+( / \d+)?", status), (program, status)
        match = re.fullmatch(r"`(tests/test_\w+\.py)::(test_\w+)`", test)
        assert match, (program, status, test)
        path, name = REPO / match.group(1), match.group(2)
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"{program} {status}: {path.name} has no {name}"


def test_every_tool_of_the_cli_has_a_row():
    from ccbench.scripts.cli import SUBCOMMANDS, VARIANTS

    text = TABLE.read_text()
    for name in [*SUBCOMMANDS, *VARIANTS]:
        if name == "list":
            continue
        assert f"ccbench {name}" in text or f"`{name}`" in text, name


# ---------------------------------------------------------------- rows tested here


def malformed_sidecar(csv_path: Path) -> Path:
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    sidecar = Path(f"{csv_path}.json")
    sidecar.write_text('{"runs": {"r1": {"argv": [')  # a run cut off while written
    return sidecar


@pytest.mark.timeout(60)
def test_a_variant_refuses_a_malformed_sidecar_before_any_work(tmp_path):
    out = tmp_path / "b.csv"
    sidecar = malformed_sidecar(out)
    before = sidecar.read_bytes()
    proc = mpirun(
        2, [*variant_module("baseline"), "-m", "4K:4K", "-i", "2", "-x", "0", "--csv", out]
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{sidecar} is not valid JSON" in lines[0], proc.stderr
    assert not out.exists() and sidecar.read_bytes() == before  # nothing written over it


def test_the_launch_says_its_size_and_rank_by_the_launchers_variables():
    from ccbench.collectives.launch import launched_rank, launched_size

    hydra = {"PMI_SIZE": "4", "PMI_RANK": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert (launched_size(hydra), launched_rank(hydra)) == (4, 3)  # mpiexec in a batch job
    prterun = {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5"}
    assert (launched_size(prterun), launched_rank(prterun)) == (8, 5)
    step = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    assert (launched_size(step), launched_rank(step)) == (2, 1)
    batch = {"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}  # a batch script is one process
    assert (launched_size(batch), launched_rank(batch)) == (None, 0)
    assert (launched_size({}), launched_rank({})) == (None, 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("procid, printed", [("0", 1), ("1", 0)])
def test_a_world_smaller_than_the_launch_is_refused_in_one_line(tmp_path, procid, printed):
    """srun started 2 tasks but this MPI cannot join srun's job (Open MPI 5 under
    --mpi=pmi2, any MPI under --mpi=none): each task is a world of 1 and would time itself
    alone. Both exit 2; only the launch's rank 0 says why; no CSV is written."""
    out = tmp_path / "b.csv"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI", "OMPI_", "SLURM_", "MASTER_"))
    }
    env.update(SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2", SLURM_PROCID=procid)
    proc = subprocess.run(
        [sys.executable, *variant_module("baseline"), "-m", "1K", "--csv", out],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == printed, proc.stderr
    if printed:
        assert lines[0].startswith(
            "ccbench: error: the launcher started 2 processes but MPI sees a world of 1"
        ), lines
    assert not out.exists()


def sweep(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cli", "sweep", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


def two_task_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "s.toml"
    spec.write_text(f"""
[sweep]
name = "exits"
output = "{tmp_path / "out"}"
sizes = "1K:2K"
iterations = 2
warmup = 0
[[points]]
variant = "baseline"
collective = "allgather"
algorithm = ["mpi", "ring"]
""")
    return spec


@pytest.mark.timeout(120)
def test_a_sweep_refuses_a_malformed_sidecar(tmp_path):
    spec = two_task_spec(tmp_path)
    sidecar = malformed_sidecar(tmp_path / "out" / "baseline_mpi_r2.csv")
    (tmp_path / "out" / "baseline_mpi_r2.csv").write_text("run_id,size_bytes\nx,1024\n")
    proc = sweep(str(spec))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{sidecar} is not valid JSON" in lines[0], proc.stderr
    assert not (tmp_path / "out" / "baseline_ring_r2.csv").exists()  # nothing ran


@pytest.mark.timeout(120)
def test_merge_only_names_the_tasks_that_did_not_finish(tmp_path):
    """The SLURM merge job runs after every array task ended, however they ended: with
    one task's results missing it merges the rest, names the task and fails."""
    spec = two_task_spec(tmp_path)
    ran = sweep(str(spec), "--task", "0")
    assert ran.returncode == 0, ran.stderr
    proc = sweep(str(spec), "--merge-only")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "task 1 baseline_ring_r2 did not finish" in proc.stderr
    with open(tmp_path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["algorithm"] for r in rows} == {"mpi"} and len(rows) == 2
    finished = sweep(str(spec), "--task", "1")
    assert finished.returncode == 0, finished.stderr
    assert sweep(str(spec), "--merge-only").returncode == 0


def test_merge_refuses_a_malformed_sidecar(tmp_path, capsys):
    from ccbench.benchmarks.results import COMMON_COLUMNS, write_csv_atomic
    from ccbench.scripts.sweeps import merge

    good = tmp_path / "in" / "a.csv"
    write_csv_atomic(
        good,
        [
            {
                "schema": "harness/3",
                "run_id": "r1",
                "variant": "baseline",
                "collective": "allgather",
                "size_bytes": 4,
            }
        ],
        COMMON_COLUMNS,
    )
    sidecar = malformed_sidecar(good)
    assert merge.main([str(tmp_path / "in"), "-o", str(tmp_path / "m.csv")]) == 2
    err = capsys.readouterr().err
    assert f"{sidecar} is not valid JSON" in err
    assert not (tmp_path / "m.csv.json").exists()


def test_plot_names_a_file_whose_sidecar_is_malformed_and_draws_the_rest(tmp_path, capsys):
    from ccbench.plots import cli
    from tests.plot_benchmark_rows import seed000_rows
    from tests.plot_fixtures import write

    write(tmp_path / "good.csv", seed000_rows([1 << 20], ranks=2, link=0, run="r1"))
    bad = tmp_path / "bad.csv"
    # rows of a launch outside a sweep: its sidecar is read for the sweep it may belong to
    write(bad, seed000_rows([1 << 20], ranks=4, link=0, run="r2", sweep=""))
    malformed_sidecar(bad)
    status = cli.main(
        [
            str(tmp_path / "good.csv"),
            str(bad),
            "-o",
            str(tmp_path / "out"),
            "--only",
            "allgather",
            "--format",
            "png",
            "--dpi",
            "40",
        ]
    )
    captured = capsys.readouterr()
    assert status == 1
    assert f"{bad}.json is not valid JSON" in captured.err
    assert (tmp_path / "out" / "seed000_allgather_latency.png").exists()


@pytest.mark.parametrize(
    "exc, waits",
    [
        # gloo on a rank whose peer failed first and is taking the job down
        (RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (RuntimeError("injected failure"), False),  # the rank that failed first
        (ValueError("Connection closed by peer"), False),  # not a transport's error
    ],
)
def test_a_rank_whose_peer_went_away_lets_the_first_failure_end_the_job(
    monkeypatch, capsys, exc, waits
):
    from ccbench.benchmarks import agreement

    events = []

    class Comm:
        rank = 0

        def abort(self, status):
            events.append(("abort", status))

    monkeypatch.setattr(agreement.time, "sleep", lambda s: events.append(("sleep", s)))
    agreement._abort(Comm(), exc)
    line = capsys.readouterr().err.strip()
    grace = [e for e in events if e == ("sleep", agreement.PEER_GONE_GRACE_S)]
    assert bool(grace) == waits
    # the line still comes (where the job outlived the grace), once, then the abort
    assert line.count("ccbench: error: rank 0:") == 1 and events[-1] == ("abort", 1)

"""Sweeps that run: killed half way and resumed, a failed task reported while the others
run, link-rate points on the emulated cluster, and every shipped sweep's tasks checked by
their variants' own option parsers."""

from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ccbench.benchmarks.results import (
    read_rows,
    write_csv_atomic,
)
from ccbench.kernels.errors import UsageError
from ccbench.scripts.sweeps import tasks as sweep_spec
from tests.mpirun import hydra_skip
from tests.test_sweep import REPO, SPEC, write_spec

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

# ----------------------------------------------------------------------------- real runs


def run_sweep(spec: Path, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.sweeps.sweep", str(spec), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


_RANK = """
import pathlib, signal, sys, time
if sys.argv[1] == "slow":  # ends a second after SIGTERM
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), sys.exit(0)))
else:  # ignores SIGTERM: only SIGKILL ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[2]).touch()
while True:
    time.sleep(0.05)
"""
_LAUNCHER = """
import pathlib, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
while not pathlib.Path(sys.argv[3]).exists():
    time.sleep(0.02)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("rank", ["slow", "deaf"])
def test_kill_group_returns_once_no_rank_of_the_launch_runs(tmp_path, rank):
    """A launcher that dies at once on SIGTERM while its rank takes a second to end, or
    never ends on SIGTERM: kill_group returns only once the rank is gone too."""
    from ccbench.scripts.launchers import kill_group

    ready = tmp_path / f"rank-{rank}-ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, _RANK, rank, str(ready)],
        stdout=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert len(processes_mentioning(str(ready))) == 2  # the launcher and its rank
        start = time.monotonic()
        kill_group(proc, grace_s=3.0)
        assert processes_mentioning(str(ready)) == []
        # the slow rank ended by itself within the grace; the deaf one needed SIGKILL
        assert time.monotonic() - start < 10
    finally:
        if processes_mentioning(str(ready)):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()


def data_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(240)
def test_sweep_killed_half_way_resumes_and_merges(tmp_path):
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "t.toml", SPEC.format(out=out))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccbench.scripts.sweeps.sweep", str(spec)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    # kill it once the second task has started: the first is finished
    second_log = out / "logs" / "baseline_allgather_ring_r2.log"
    deadline = time.monotonic() + 90
    while not second_log.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert processes_mentioning(str(out)) == []  # no rank left running
    first = out / "baseline_allgather_mpi_r2.csv"
    assert [r["size_bytes"] for r in data_rows(first)] == ["1024", "2048", "4096", "8192"]
    first_log = (out / "logs" / "baseline_allgather_mpi_r2.log").read_text()

    done = run_sweep(spec)
    assert done.returncode == 0, done.stderr
    # the finished task was skipped (its log is untouched), the others ran
    assert (out / "logs" / "baseline_allgather_mpi_r2.log").read_text() == first_log
    assert "16/16 points, 4/4 tasks" in done.stderr and "left" in done.stderr
    merged = data_rows(tmp_path / "out.csv")
    assert len(merged) == 16
    assert {r["validation"] for r in merged} == {"Pass"}
    keys = {(r["collective"], r["algorithm"], r["size_bytes"]) for r in merged}
    assert len(keys) == 16

    # a task killed while measuring 4K: its rows stop there and its run never finished
    task = out / "baseline_allreduce_ring_r2.csv"
    header, rows = read_rows(task)
    write_csv_atomic(task, rows[:3], header)
    Path(f"{task}.json").unlink()
    listing = run_sweep(spec, "--list")
    assert "partial  baseline_allreduce_ring_r2" in listing.stdout
    again = run_sweep(spec)
    assert again.returncode == 0, again.stderr
    log = (out / "logs" / "baseline_allreduce_ring_r2.log").read_text()
    assert log.splitlines()[0].startswith("$ ") and " -m 4096:8192 " in log.splitlines()[0]
    assert [r["size_bytes"] for r in data_rows(task)] == ["1024", "2048", "4096", "4096", "8192"]
    assert len(data_rows(tmp_path / "out.csv")) == 16  # the repeated 4K row merged away


@pytest.mark.timeout(120)
def test_failed_task_is_reported_and_others_still_run(tmp_path):
    spec = write_spec(
        tmp_path / "t.toml",
        f"""
[sweep]
output = "{tmp_path / "out"}"
sizes = "1K:2K"
iterations = 2
warmup = 0
[[points]]
variant = "baseline"
collective = ["allgather"]
algorithm = ["nosuch", "mpi"]
""",
    )
    proc = run_sweep(spec)
    assert proc.returncode == 1
    assert "task 0 baseline_allgather_nosuch_r2 failed" in proc.stderr
    assert len(data_rows(tmp_path / "out" / "baseline_allgather_mpi_r2.csv")) == 2
    assert (
        "invalid choice"
        in (tmp_path / "out" / "logs" / "baseline_allgather_nosuch_r2.log").read_text()
    )
    # the failed task's 2 sizes are not progress: 2 of 4 points, and the failure is counted
    last = [ln for ln in proc.stderr.splitlines() if ln.startswith("sweep: ")][-1]
    assert last.startswith("sweep: 2/4 points, 2/2 tasks, 1 failed,"), proc.stderr
    # -v on a task that is complete says so instead of printing nothing
    again = run_sweep(spec, "--task", "1", "-v")
    assert again.returncode == 0, again.stderr
    assert "nothing to do: the 2 points of 1 task(s) are already in" in again.stderr
    assert again.stdout == ""


@pytest.mark.root
@pytest.mark.timeout(180)
@pytest.mark.skipif(hydra_skip() is not None, reason=str(hydra_skip()))
def test_link_rate_points_run_on_the_emulated_cluster(tmp_path):
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs root and iproute2 for the emulated cluster")
    spec = write_spec(
        tmp_path / "t.toml",
        f"""
[sweep]
output = "{tmp_path / "out"}"
link_gbps = [0.5]
sizes = "64K:128K"
iterations = 3
warmup = 1
[[points]]
variant = "baseline"
collective = ["allgather"]
""",
    )
    proc = run_sweep(spec, timeout=150)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = data_rows(tmp_path / "out.csv")
    assert [(r["size_bytes"], r["link_gbps"]) for r in rows] == [
        ("65536", "0.5"),
        ("131072", "0.5"),
    ]
    # the fixed cost of a ring step, measured when the sweep brought the cluster up
    assert all(r["link_step_us"] and float(r["link_step_us"]) >= 0 for r in rows), rows
    log = (tmp_path / "out" / "logs" / "baseline_allgather_r2_0.5gbps.log").read_text()
    # the cluster the log names is the one the ranks ran on, and the sweep took it down
    named = re.search(r"^# emulated cluster ([a-z0-9]+) ", log, re.M)
    assert named, log
    name = named.group(1)
    assert name not in ("ccb", "ccbsweep")
    assert f"ccbench.scripts.cluster run --name {name} -n 2 --" in log.splitlines()[0]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{name}-" not in namespaces


@pytest.mark.root
@pytest.mark.timeout(240)
@pytest.mark.skipif(hydra_skip() is not None, reason=str(hydra_skip()))
def test_a_timed_out_task_leaves_no_rank_in_the_cluster(tmp_path):
    """A comparison on the emulated cluster killed at the spec's timeout: its paired
    ranks (started by Hydra in sessions of their own, below `ccbench compare` and
    `cluster run`) end with it. They carry the comparison's scratch folder (TMPDIR)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs root and iproute2 for the emulated cluster")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # 4 MiB a call on a 20 Mbit/s link: 1.7 s a call, 40 calls, far past the timeout
    spec = write_spec(
        tmp_path / "t.toml",
        f"""
[sweep]
output = "{tmp_path / "out"}"
link_gbps = [0.02]
timeout = 30
[[points]]
variant = "compare"
a = "baseline --algorithm mpi"
b = "baseline --algorithm ring"
collective = ["allgather"]
sizes = "4M:4M"
rounds = 20
iterations = 1
warmup = 0
""",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccbench.scripts.sweeps.sweep", str(spec)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    seen = set()
    try:
        while proc.poll() is None:
            for pid in processes_mentioning(str(scratch)):
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if argv[1:3] == [b"-m", b"ccbench.benchmarks.paired"]:
                        seen.add(pid)  # a rank, not a launcher naming it
            time.sleep(0.2)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        left = processes_mentioning(str(scratch))
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert "failed" in err
    log = next((tmp_path / "out" / "logs").glob("compare_*.log")).read_text()
    assert "killed after 30 s" in log
    # each launch of the pair starts its 2 ranks (a resumed or retried round starts more)
    assert len(seen) >= 2, "the paired ranks never started: nothing was checked"
    assert left == []


def test_each_sweep_output_gets_its_own_cluster(tmp_path):
    """Two sweeps into two folders, run at once, must not share (and take down) one
    emulated cluster: each link task's command names its folder's own, a valid name."""
    from ccbench.scripts.cluster.layout import check_name
    from ccbench.scripts.sweeps import sweep

    names = []
    for folder in ("one", "two"):
        spec = sweep_spec.load_spec(
            write_spec(
                tmp_path / f"{folder}.toml",
                f"""
[sweep]
output = "{tmp_path / folder}"
link_gbps = [0.5]
sizes = "1K:2K"
[[points]]
variant = "baseline"
collective = ["allgather"]
""",
            )
        )
        (task,) = spec.tasks
        cmd = sweep.launch_command(spec, task, [], tmp_path / "x.csv", "mpiexec")
        name = cmd[cmd.index("--name") + 1]
        assert check_name(name) == name
        # the same folder, loaded again, names the same cluster: a resumed sweep finds it
        again = sweep_spec.load_spec(tmp_path / f"{folder}.toml")
        assert sweep.launch_command(again, task, [], tmp_path / "x.csv", "mpiexec") == cmd
        names.append(name)
    assert len(set(names)) == 2 and "ccbsweep" not in names


SIZED_VARIANTS = {
    "baseline": "Baseline",
    "p2p_compressed": "P2PCompressed",
    "coll_compressed": "CollCompressed",
    "sparse_streaming": "SparseStreaming",
}


SWEEP_SPECS = sorted(p for p in (REPO / "sweeps").glob("*.toml") if p.name != "gate.toml")


@pytest.mark.parametrize("path", SWEEP_SPECS, ids=lambda p: p.name)
def test_every_shipped_sweeps_tasks_pass_their_variants_option_checks(path):
    """Each task of a shipped sweep, through the driver's own option checks on rank 0 of its
    rank count (no launch): an option a variant refuses (--data given to sparse streaming,
    which times its own inputs) fails here, not an hour into a sweep."""
    import importlib
    from types import SimpleNamespace

    from ccbench.benchmarks import harness
    from ccbench.kernels import inputs

    for task in sweep_spec.load_spec(path).tasks:
        if task.variant not in SIZED_VARIANTS:
            continue
        module = importlib.import_module(f"ccbench.benchmarks.{task.variant}")
        variant = getattr(module, SIZED_VARIANTS[task.variant])()
        comm = SimpleNamespace(rank=0, size=task.ranks)
        try:
            harness.parse_options(variant, [*task.args, "--csv", "unused.csv"], comm)
        except UsageError as exc:
            # what this machine lacks, not what the task asks for: the corpus (the default
            # data, built by set-up) or a device (the GPU cluster's sweeps)
            missing = (
                "needs the real-data corpus" in str(exc)
                and not inputs.corpus_built()
                or "no CUDA device" in str(exc)
                or "not installed" in str(exc)
            )
            if not missing:
                raise AssertionError(f"{path.name}: {task.slug}: {exc}") from None


@pytest.mark.parametrize("path", SWEEP_SPECS, ids=lambda p: p.name)
def test_every_shipped_sweeps_trace_replays_pass_their_option_checks(path):
    """Each trace_replay task of a shipped sweep, through the replay's own option checks
    on rank 0 (no launch), and its trace: a file of the checkout, or model:NAME[:FRAMEWORK]
    naming a model and framework that ccbench trace build knows."""
    from types import SimpleNamespace

    from ccbench.benchmarks import trace_replay
    from ccbench.training import trace_build

    for task in sweep_spec.load_spec(path).tasks:
        if task.variant != "trace_replay":
            continue
        comm = SimpleNamespace(rank=0, size=task.ranks)
        try:
            opts = trace_replay.parse_options([*task.args, "--csv", "unused.csv"], comm)
        except UsageError as exc:
            raise AssertionError(f"{path.name}: {task.slug}: {exc}") from None
        if opts.trace.startswith("model:"):
            name, _, framework = opts.trace[len("model:") :].partition(":")
            assert name in trace_build.models(), f"{path.name}: {task.slug}: {name}"
            assert (framework or "fsdp") in trace_build.FRAMEWORKS, f"{task.slug}: {framework}"
        else:
            assert (REPO / opts.trace).is_file(), f"{path.name}: {task.slug}: {opts.trace}"


def test_the_pages_seed000_headline_pairs_are_the_docs_comparisons():
    """The main job's headline pairs (sweeps/main.toml) and the tables of
    docs/compression.md (sweeps/seed000-tables.toml) are one procedure: the same
    comparisons, sizes, rounds, turns, interval target and calls at 1 Gbit/s on 4 ranks."""
    repo = Path(__file__).resolve().parents[1]
    main = sweep_spec.load_spec(repo / "sweeps" / "main.toml")
    tables = sweep_spec.load_spec(repo / "sweeps" / "seed000-tables.toml")

    def seed000_pairs(spec):
        return {
            (t.ranks, t.link_gbps, t.args)
            for t in spec.tasks
            if t.variant == "compare"
            and t.link_gbps
            and "coll_compressed" in t.args[1]
            and t.args[0].split()[0] in ("baseline", "p2p_compressed")
        }

    page = seed000_pairs(main)
    # by hand: {fp16, bfp:rate=8} x {against MPI, against p2p} x {allgather, reduce-scatter}
    assert len(page) == 8
    for ranks, link, args in page:
        assert (ranks, link) == (4, 1.0)
        words = " ".join(args)
        assert "-m 16M:16M" in words and "--ci-target 3 --max-rounds 10" in words, words
        assert "--rounds 5" in words and "-i 5 -x 1" in words, words
    assert page <= seed000_pairs(tables)
    # and the docs print the command the tables ran, with the same rounds and target
    doc = (repo / "docs" / "compression.md").read_text()
    assert "-m 16M:16M --rounds 5 --turns 6 --ci-target 3 --max-rounds 10" in doc
    assert "ccbench sweep sweeps/seed000-tables.toml" in doc


def test_time_left_comes_from_the_tasks_costs():
    """Worked by hand: tasks still to run cost what finished tasks of their kind took,
    else what the spec declares, else the mean of every finished task."""
    import io

    from ccbench.scripts.sweeps.progress_report import Progress

    idle = dict(load=lambda: None)  # no load average: no slowdown
    progress = Progress(4, 4, io.StringIO(), plan=[(("a",), 100.0), (("b",), 50.0)], **idle)
    assert progress.seconds_left() == 150.0  # declared only, nothing measured yet
    progress = Progress(4, 4, io.StringIO(), plan=[(("a",), 100.0), (("c",), None)], **idle)
    assert progress.seconds_left() is None  # "c" declares nothing and nothing is measured
    progress.took = {("a",): [10.0, 30.0]}  # two "a" tasks took 20 s on average
    # "a" at its measured 20 (not the declared 100); "c" at the mean of all finished, 20
    assert progress.seconds_left() == 40.0
    assert "~0:40 left" in progress.line()


def test_time_left_scales_with_the_hosts_load(tmp_path):
    """Idle-host costs times the load over the cores (at least 1), by hand: 150 s of
    tasks at load 5 on 2 cores take 375 s; below the core count, no slowdown. A task that
    took 300 s at load 6 on 2 cores cost 100 s on an idle host, recorded for the next
    run of the same output folder."""
    import io

    from ccbench.scripts.sweeps.progress_report import (
        Progress,
        read_costs,
        record_cost,
        slowdown,
    )

    plan = [(("a",), 100.0), (("b",), 50.0)]
    load = [5.0]
    progress = Progress(4, 4, io.StringIO(), plan=plan, load=lambda: load[0], cores=2)
    assert progress.seconds_left() == 375.0
    assert "(load 5.0 on 2 cores: tasks x2.5)" in progress.line()
    load[0] = 1.5
    assert progress.seconds_left() == 150.0
    assert (slowdown(6.0, 2), slowdown(0.5, 2), slowdown(None, 2)) == (3.0, 1.0, 1.0)
    record_cost(tmp_path, "compare_x", 300.0, slowdown(6.0, 2))
    record_cost(tmp_path, "baseline_y", 20.0, 0.5)  # never below an idle host's factor
    assert read_costs(tmp_path) == {"compare_x": 100.0, "baseline_y": 20.0}


def test_a_long_task_prints_its_progress_while_it_runs():
    """The heartbeat: a line saying the task still runs, without waiting for its end."""
    import io

    from ccbench.scripts.sweeps.progress_report import Progress

    stream = io.StringIO()
    progress = Progress(1, 1, stream, plan=[(("a",), 100.0)], load=lambda: None)
    progress.label = "compare_fsdp"
    progress.task_started_now(heartbeat_s=0.02)
    deadline = time.monotonic() + 30
    while "running" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.task_done()
    progress.close()
    beat = next(x for x in stream.getvalue().splitlines() if "running" in x)
    assert beat.startswith("sweep: 0/1 points, 0/1 tasks") and "compare_fsdp; running" in beat


def test_a_spec_declares_a_tasks_cost(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        '[[points]]\nvariant = "baseline"\nsizes = "1K:1K"\ncost_s = 12\n'
        '[[points]]\nvariant = "baseline"\nsizes = "2K:2K"\n'
    )
    first, second = sweep_spec.load_spec(path).tasks
    assert (first.cost_s, second.cost_s) == (12.0, None)
    assert "cost_s" not in " ".join(first.args) and "--cost" not in " ".join(first.args)
    path.write_text('[[points]]\nvariant = "baseline"\ncost_s = -1\n')
    with pytest.raises(UsageError, match="cost_s must be a positive number"):
        sweep_spec.load_spec(path)

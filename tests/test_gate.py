"""`ccbench gate` and `ccbench compare` end to end, on throw-away clones of this checkout.

The gate times the working tree against the accepted revision recorded in the clone, so
its tests commit their changes, as a contributor would. The slowdowns are sleeps in
every encode (20 ms in the base, then 30 ms or 23 ms), far longer than the rest of a 4 KiB
call, so the ratio the gate sees (about 1.5 or 1.15) does not depend on the host's
speed; no test asserts a time, only the gate's verdict on a known ratio.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ccbench.scripts.comparisons.revisions import kernel_path, link_rooms
from tests.helpers.cli import ccbench
from tests.mpirun import REPO

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

SPEC = """
[gate]
ranks = 2
rounds = 3
threshold = 1.3
[[benchmark]]
name = "coll fp16 allgather"
command = "coll_compressed --codec fp16 --collective allgather"
sizes = "4K:4K"
options = ["-i", "8", "-x", "1", "--data", "gradient-like"]
"""
ENCODE = Path("kernels") / "codec_base.py"
# Codec.encode's docstring: the sleep goes right after it, in the base class's encode
ENCODE_DEF = (
    '        """Compress the 1-D array `x`; returns the payload (a view of `out` if given)."""\n'
)


def interruptible() -> None:
    """In the child: Ctrl-C as a terminal delivers it, even where this test runs in the
    background of a shell (which starts its jobs with SIGINT ignored, and Python keeps an
    ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def clone(tmp_path) -> Path:
    """A clone of this checkout's HEAD, with an identity to commit as."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    path = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(path)], check=True)
    git(path, "config", "user.email", "ci@example.invalid")
    git(path, "config", "user.name", "ccbench tests")
    return path


@pytest.fixture
def spec(tmp_path) -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def state(tmp_path) -> dict:
    return {"CCBENCH_STATE": str(tmp_path / "state")}


def commit_encode_sleep(clone: Path, seconds: float) -> str:
    """Commit a change that makes every codec's encode sleep `seconds`; its commit."""
    path = clone / ENCODE
    text = path.read_text()
    text = re.sub(r"\n        __import__\('time'\)\.sleep\([0-9.]+\)  # gate test\n", "\n", text)
    assert text.count(ENCODE_DEF) == 1
    path.write_text(
        text.replace(
            ENCODE_DEF,
            ENCODE_DEF + f"        __import__('time').sleep({seconds})  # gate test\n",
            1,
        )
    )
    git(clone, "commit", "--quiet", "-am", f"every encode sleeps {seconds} s")
    return git(clone, "rev-parse", "HEAD")


def accept(clone: Path) -> str:
    proc = ccbench("gate", "--accept", "--repo", str(clone))
    assert proc.returncode == 0, proc.stderr
    git(clone, "add", "results/reference/gate-base")
    git(clone, "commit", "--quiet", "-m", "gate: accept")
    return (clone / "results" / "reference" / "gate-base").read_text()


def ratios(stdout: str) -> list[float]:
    return [
        float(m)
        for m in re.findall(
            r"^coll fp16 allgather\s+4096\s+\S+\s+\S+\s+(\S+)", stdout, re.MULTILINE
        )
    ]


@pytest.mark.timeout(420)
def test_a_committed_slowdown_near_the_threshold_fails_against_the_accepted_revision(
    clone, spec, state
):
    base = commit_encode_sleep(clone, 0.02)
    assert base in accept(clone)
    commit_encode_sleep(clone, 0.03)  # about 1.5x: above the 1.3 threshold
    out = clone.parent / "gate.csv"
    proc = ccbench("gate", "--repo", str(clone), "--spec", str(spec), "--csv", str(out), env=state)
    # the base was built as its install builds it: its own compiled kernels, where this
    # checkout has them (the clone's tree, never built, borrows them or runs none)
    if kernel_path(link_rooms(REPO, clone.parent / "here")) == "fused":
        assert "# codec kernels: base fused, tree " in proc.stdout, proc.stdout
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first, second = proc.stdout.splitlines()[:2]
    # the first lines say what is compared with what, and by which rule
    assert f"against {base[:12]}, the accepted revision (results/reference/gate-base)" in first
    assert "working tree (" in first and "uncommitted" not in first
    assert "fails at B/A >= 1.3 with its 95% interval above 1; 3 rounds" in second
    assert "FAIL: slower" in proc.stdout and "1 failed" in proc.stdout
    assert all(r >= 1.3 for r in ratios(proc.stdout)), proc.stdout
    # measured again before it fails: 3 more rounds of that benchmark, 6 in the verdict
    assert (
        "# 1 benchmark(s) past the threshold after 3 rounds: 3 more rounds of them; a "
        "point fails only if it stays past it over all 6"
    ) in proc.stdout, proc.stdout
    # ... and they ran: the row's verdict is over 6 rounds
    assert [r["rounds"] for r in csv.DictReader(out.open())] == ["6"]


@pytest.mark.timeout(420)
def test_a_committed_slowdown_below_the_threshold_passes(clone, spec, state):
    commit_encode_sleep(clone, 0.02)
    accept(clone)
    commit_encode_sleep(clone, 0.023)  # about 1.15x: slower, but below 1.3
    proc = ccbench("gate", "--repo", str(clone), "--spec", str(spec), env=state)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 failed" in proc.stdout and "FAIL" not in proc.stdout
    assert all(1.0 < r < 1.3 for r in ratios(proc.stdout)), proc.stdout
    assert "more rounds" not in proc.stdout  # nothing past the threshold: no second look


def test_an_accepted_revision_the_clone_lacks_is_one_line_exit_2(clone, spec):
    (clone / "results" / "reference" / "gate-base").write_text("0" * 40 + "\n")
    proc = ccbench("gate", "--repo", str(clone), "--spec", str(spec), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not in this clone" in lines[0], proc.stderr


@pytest.mark.timeout(420)
def test_an_interrupted_gate_keeps_its_rounds_and_resumes(clone, spec, state, tmp_path):
    accept(clone)
    command = [
        sys.executable,
        "-m",
        "ccbench.scripts.cli",
        "gate",
        "--repo",
        str(clone),
        "--spec",
        str(spec),
        "--csv",
        str(tmp_path / "gate.csv"),
    ]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **state},
        stdin=subprocess.DEVNULL,
        preexec_fn=interruptible,
    )
    checkpoints = Path(state["CCBENCH_STATE"])
    deadline = time.monotonic() + 240
    while not list(checkpoints.glob("gate-*.json")):  # a round has finished
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert re.fullmatch(
        r"ccbench gate: interrupted after [12] of 3 rounds; the [12] "
        r"finished kept: run the same command to resume",
        lines[0],
    ), err
    assert not (tmp_path / "gate.csv").exists()
    again = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **state},
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"^# resuming: [12] round\(s\) already measured", again.stdout, re.M)
    (row,) = list(csv.DictReader((tmp_path / "gate.csv").open()))
    assert row["rounds"] == "3"
    assert not list(checkpoints.glob("gate-*.json"))  # done: nothing left to resume


@pytest.mark.parametrize(
    "args, words",
    [
        (["--only", "nothing-like-this"], "matches no gated benchmark"),
        (["--base", "no-such-revision"], "no-such-revision"),
        (["--rounds", "1"], "at least 2"),
    ],
)
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


def test_this_checkout_records_an_accepted_revision_in_its_history():
    """CI's gate has a base that is not the commit under test, found in this history."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    from ccbench.scripts.comparisons.gate import read_accepted

    accepted = read_accepted(REPO)
    assert accepted is not None
    assert (
        subprocess.run(
            ["git", "-C", str(REPO), "merge-base", "--is-ancestor", accepted, "HEAD"]
        ).returncode
        == 0
    )


# ---------------------------------------------------------------- compare's exit status


def tree_of(clone: Path, tmp_path: Path) -> dict:
    """The environment that runs ccbench from the clone's working tree."""
    from ccbench.scripts.comparisons.revisions import link_rooms

    root = link_rooms(clone, tmp_path / "import")
    return {"PYTHONPATH": str(root), "CCBENCH_STATE": str(tmp_path / "state")}


@pytest.mark.timeout(300)
def test_compare_exits_1_and_marks_the_side_that_fails_validation(clone, tmp_path):
    ring = clone / "collectives" / "ring.py"
    text = ring.read_text()
    broken = text.replace(
        # the gather phase of the ring the baseline runs (ring_collective)
        "        ring_allgather_inplace(comm, recvbuf, bounds)\n",
        "        ring_allgather_inplace(comm, recvbuf, bounds)\n        recvbuf[0] += 1\n",
        1,
    )
    assert broken != text
    ring.write_text(broken)
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline --algorithm mpi",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "-c",
        "-i",
        "5",
        "-x",
        "1",
        cwd=clone,
        env=tree_of(clone, tmp_path),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert row["validation"] == "Fail: B"
    assert "(validation Fail: B)" in proc.stdout
    assert "validation failed at 1 of 1 points" in proc.stderr


@pytest.mark.timeout(300)
def test_compare_records_pass_when_both_sides_validate(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline --algorithm mpi",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "2",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "-c",
        "-i",
        "5",
        "-x",
        "1",
        env={"CCBENCH_STATE": str(tmp_path / "state")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert row["validation"] == "Pass"


@pytest.mark.timeout(300)
def test_an_interrupted_compare_keeps_its_rounds_and_resumes(tmp_path):
    state = {"CCBENCH_STATE": str(tmp_path / "state")}
    out = tmp_path / "cmp.csv"
    command = [
        sys.executable,
        "-m",
        "ccbench.scripts.cli",
        "compare",
        "baseline",
        "baseline --algorithm ring",
        "-m",
        "4K:4K",
        "--rounds",
        "5",
        "--turns",
        "2",
        "--csv",
        str(out),
        "--",
        "-i",
        "400",
        "-x",
        "1",
    ]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **state},
        stdin=subprocess.DEVNULL,
        preexec_fn=interruptible,
    )
    checkpoints = Path(state["CCBENCH_STATE"])
    deadline = time.monotonic() + 200
    while not list(checkpoints.glob("compare-*.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        r"ccbench compare: interrupted after [1-4] of 5 rounds; the [1-4] finished kept: "
        r"run the same command to resume",
        lines[0],
    ), err
    assert not out.exists()
    again = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **state},
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert again.returncode == 0, again.stderr
    assert re.search(r"^# resuming: [1-4] round\(s\) already measured", again.stdout, re.M)
    (row,) = list(csv.DictReader(out.open()))
    assert row["rounds"] == "5"


@pytest.mark.timeout(300)
def test_compare_two_variants_writes_ratios(tmp_path):
    out = tmp_path / "cmp.csv"
    proc = ccbench(
        "compare",
        "baseline --algorithm mpi",
        "baseline --algorithm ring",
        "-m",
        "4K,64K",
        "--rounds",
        "2",
        "--csv",
        str(out),
        "--",
        "--collective",
        "allreduce",
        "-i",
        "20",
        "-x",
        "2",
        env={"CCBENCH_STATE": str(tmp_path / "state")},
    )
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["size_bytes"] for r in rows] == ["4096", "65536"]
    for r in rows:
        # the geometric means of the rounds and their ratio agree with each other
        assert float(r["ratio"]) == pytest.approx(float(r["b_us"]) / float(r["a_us"]), rel=1e-9)
        assert float(r["ratio_low"]) <= float(r["ratio"]) <= float(r["ratio_high"])
        assert r["verdict"] in ("faster", "slower", "no difference")
        assert r["a"] == "baseline --algorithm mpi" and r["b"] == "baseline --algorithm ring"


@pytest.mark.parametrize(
    "args, words",
    [
        (["nosuch"], "unknown variant"),
        (["baseline"], "give two commands"),
        (["baseline", "baseline", "--rounds", "1"], "at least 2"),
        (["baseline", "baseline --csv x.csv"], "set by ccbench compare"),
    ],
)
def test_compare_bad_input_exits_2(args, words):
    proc = ccbench("compare", *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_compare_reads_unsized_benchmarks_from_their_own_rows():
    """Training compares on its summary row's mean step time, MG-WFBP per strategy."""
    from ccbench.scripts.comparisons.rounds import Comparison, Side

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
        mg.add(
            side,
            [
                {"strategy": "wfbp", "measured_us": "10", "iterations": "5"},
                {"strategy": "mgwfbp", "measured_us": "8", "iterations": "5"},
            ],
        )
    assert [p[1] for p in mg.points()] == ["strategy=mgwfbp", "strategy=wfbp"]


def test_compare_reads_codec_throughput_as_time_per_call_of_each_step():
    """A rate becomes a time per call: 4 MB at 8 GB/s is 500 us, at 4 GB/s 1000 us; a
    doubled encode reads B/A = 2 on its own point, and a missing rate is no point."""
    from ccbench.scripts.comparisons.rounds import Comparison, Side
    from ccbench.scripts.launchers import Launcher

    a, b = Side("A", ["codec_throughput"]), Side("B", ["codec_throughput"])
    comparison = Comparison(a, b, "p50", 0.03)

    def row(encode_gbps):
        return {
            "codec": "bfp:rate=8",
            "kernels": "fused",
            "data": "gradient-like",
            "size_bytes": "4000000",
            "repeats": "10",
            "encode_gbps": str(encode_gbps),
            "decode_gbps": "4",
            "hop_gbps": "",
        }

    for _ in range(2):
        comparison.add(a, [row(8)])
        comparison.add(b, [row(4)])
    where = "codec=bfp:rate=8,kernels=fused,data=gradient-like"
    encode, decode = (4_000_000, f"{where},step=encode"), (4_000_000, f"{where},step=decode")
    assert comparison.times[encode] == {"A": [500.0, 500.0], "B": [1000.0, 1000.0]}
    assert comparison.ratio(encode).ratio == pytest.approx(2.0)
    assert comparison.ratio(decode).ratio == pytest.approx(1.0)
    assert comparison.ratio((4_000_000, f"{where},step=hop")) is None  # no hop rate
    # one process, not an MPI launch of the gate's ranks (each rank would write the CSV)
    command = Launcher(2).command(a, ["-m", "4M:4M"], Path("out.csv"))
    assert command[:3] == [sys.executable, "-m", "ccbench.benchmarks.codec_throughput"]

"""`ccbench gate`, end to end on throw-away clones of this checkout, and its own records.

The gate times the working tree against the accepted revision recorded in the clone, so
its tests commit their changes, as a contributor would. The slowdowns are sleeps in
every encode (20 ms in the base, then 30 ms or 23 ms), far longer than the rest of a 4 KiB
call, so the ratio the gate sees (about 1.5 or 1.15) does not depend on the host's
speed; no test asserts a time, only the gate's verdict on a known ratio.

Its records, without launching ranks: the second look at a point past the threshold
counted in the rounds its rows say ran (not in the message it prints), and the codec
kernels each side runs, recorded and compared. The rounds are run by a recording
launcher with set times (B/A about 1.5 for one benchmark, 1.0 for the other), so the
count of launches and rounds is worked by hand; the kernels are asked of real revisions'
code.
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

from ccbench.kernels.errors import UsageError
from ccbench.scripts.comparisons import gate, revisions
from ccbench.scripts.comparisons.revisions import kernel_path, link_rooms
from tests.helpers.cli import ccbench
from tests.helpers.repo import git, interruptible
from tests.mpirun import REPO

# launches MPI ranks (the gate's interleaved timing runs): the Open MPI leg runs it too
pytestmark = pytest.mark.mpi

# @pytest.mark.mpi: the test launches MPI ranks (the Open MPI leg runs it too)


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


# the same, and bf16's allgather: one gate run checks a point past the threshold and one
# below it
TWO_SPEC = (
    SPEC
    + """[[benchmark]]
name = "coll bf16 allgather"
command = "coll_compressed --codec bf16 --collective allgather"
sizes = "4K:4K"
options = ["-i", "8", "-x", "1", "--data", "gradient-like"]
"""
)
ENCODE = Path("kernels") / "codec_base.py"


# Codec.encode's docstring: the sleep goes right after it, in the base class's encode
ENCODE_DEF = (
    '        """Compress the 1-D array `x`; returns the payload (a view of `out` if given)."""\n'
)


@pytest.fixture
def spec(tmp_path) -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def state(tmp_path) -> dict:
    return {"CCBENCH_STATE": str(tmp_path / "state")}


def commit_encode_sleep(clone: Path, seconds: float, by_codec: dict | None = None) -> str:
    """Commit a change that makes every codec's encode sleep `seconds` (those named in
    `by_codec` their own time); its commit."""
    path = clone / ENCODE
    text = path.read_text()
    text = re.sub(r"\n        __import__\('time'\)\.sleep\(.*\)  # gate test\n", "\n", text)
    assert text.count(ENCODE_DEF) == 1
    sleep = f"{by_codec or {}!r}.get(self.name, {seconds})"
    path.write_text(
        text.replace(
            ENCODE_DEF,
            ENCODE_DEF + f"        __import__('time').sleep({sleep})  # gate test\n",
            1,
        )
    )
    git(clone, "commit", "--quiet", "-am", f"every encode sleeps {sleep} s")
    return git(clone, "rev-parse", "HEAD")


def accept(clone: Path) -> str:
    proc = ccbench("gate", "--accept", "--repo", str(clone))
    assert proc.returncode == 0, proc.stderr
    git(clone, "add", "results/reference/gate-base")
    git(clone, "commit", "--quiet", "-m", "gate: accept")
    return (clone / "results" / "reference" / "gate-base").read_text()


def ratios(stdout: str, name: str = "coll fp16 allgather") -> list[float]:
    return [
        float(m) for m in re.findall(rf"^{name}\s+4096\s+\S+\s+\S+\s+(\S+)", stdout, re.MULTILINE)
    ]


@pytest.mark.one_mpi  # its verdicts over many rounds; the other tests launch under Open MPI
@pytest.mark.mpi
@pytest.mark.timeout(600)  # a hang guard: the run of both benchmarks (9 rounds in all)
def test_a_committed_slowdown_near_the_threshold_fails_and_one_below_it_passes(
    clone, tmp_path, state
):
    """One gate run of two benchmarks: fp16's encode made about 1.5x slower (above the 1.3
    threshold) fails after a second look; bf16's about 1.15x (slower, but below it) passes
    without one."""
    spec = tmp_path / "two.toml"
    spec.write_text(TWO_SPEC)
    base = commit_encode_sleep(clone, 0.02)
    assert base in accept(clone)
    commit_encode_sleep(clone, 0.02, {"fp16": 0.03, "bf16": 0.023})
    out = clone.parent / "gate.csv"
    proc = ccbench(
        "gate", "--repo", str(clone), "--spec", str(spec), "--csv", str(out), env=state, timeout=540
    )
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
    below = ratios(proc.stdout, "coll bf16 allgather")
    assert below and all(1.0 < r < 1.3 for r in below), proc.stdout
    assert not re.search(r"^coll bf16 allgather .*FAIL", proc.stdout, re.M), proc.stdout
    # measured again before it fails: 3 more rounds of that benchmark alone, 6 in the
    # verdict; the one below the threshold gets no second look
    assert (
        "# 1 benchmark(s) past the threshold after 3 rounds: 3 more rounds of them; a "
        "point fails only if it stays past it over all 6"
    ) in proc.stdout, proc.stdout
    # ... and they ran: the rows' verdicts are over 6 and 3 rounds
    assert [r["rounds"] for r in csv.DictReader(out.open())] == ["6", "3"]


@pytest.mark.mpi
def test_an_accepted_revision_the_clone_lacks_is_one_line_exit_2(clone, spec):
    (clone / "results" / "reference" / "gate-base").write_text("0" * 40 + "\n")
    proc = ccbench("gate", "--repo", str(clone), "--spec", str(spec), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not in this clone" in lines[0], proc.stderr


@pytest.mark.mpi
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


@pytest.mark.mpi
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


@pytest.mark.mpi
def test_gate_bad_spec_exits_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[gate]\nrounds = 5\n")
    proc = ccbench("gate", "--spec", str(bad), timeout=60)
    assert proc.returncode == 2 and "no [[benchmark]]" in proc.stderr


@pytest.mark.mpi
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


# ------------------------------------------------------------ the gate's own records


RECORDED_SPEC = """
[gate]
ranks = 2
rounds = 3
threshold = 1.3
[[benchmark]]
name = "slower"
command = "p2p_compressed --codec fp16"
sizes = "4K:4K"
[[benchmark]]
name = "same"
command = "baseline --algorithm ring"
sizes = "4K:4K"
"""


# per round k, B's time over A's: about 1.5 and 1.0, a little apart round to round so
# that each interval has a width
FACTORS = {
    "p2p_compressed": (1.48, 1.52, 1.5, 1.49, 1.51, 1.5),
    "baseline": (0.99, 1.01, 1.0, 1.02, 0.98, 1.0),
}


class RecordingLauncher:
    """Stands in for the launches: each side's row of a 4 KiB point, A 10 us, B 10 us
    times the factor of that benchmark's round; every launch recorded."""

    launches: list = []
    printed = ""

    def __init__(self, ranks, bind=True):
        self.bind = bind

    def run(self, side, common, out, env=None):
        variant = side.variant
        k = sum(1 for v, label, _ in self.launches if v == variant and label == side.label)
        self.launches.append((variant, side.label, k))
        us = 10.0 * (FACTORS[variant][k] if side.label == "B" else 1.0)
        return [
            {
                "size_bytes": "4096",
                "iterations": "8",
                "p50_us": repr(us),
                "avg_us": repr(us),
                "timer": "python",
                "validation": "",
                "collective": "allgather",
                "ranks": "2",
            }
        ]


@pytest.fixture
def recorded(tmp_path, monkeypatch, capsys):
    """The gate of RECORDED_SPEC on this checkout against HEAD, its launches recorded; the base's
    code is the tree's own (nothing to build)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    RecordingLauncher.launches = []
    monkeypatch.setattr(gate, "Launcher", RecordingLauncher)
    monkeypatch.setattr(
        gate, "materialize", lambda rev, into, repo: revisions.link_rooms(repo, into / "import")
    )
    monkeypatch.setenv("CCBENCH_STATE", str(tmp_path / "state"))
    spec = tmp_path / "gate.toml"
    spec.write_text(RECORDED_SPEC)
    out = tmp_path / "gate.csv"
    status = gate.main(["--spec", str(spec), "--base", "HEAD", "--no-bind", "--csv", str(out)])
    RecordingLauncher.printed = capsys.readouterr().out
    return status, list(csv.DictReader(out.open())), RecordingLauncher.launches


def test_both_sides_kernels_are_recorded(recorded):
    """Both sides are this checkout's code here: the same kernels, printed once each."""
    (line,) = [
        x for x in RecordingLauncher.printed.splitlines() if x.startswith("# codec kernels:")
    ]
    base, tree = line.removeprefix("# codec kernels: base ").split(", tree ")
    assert base == tree and base in ("fused", "reference", "borrowed")


def test_a_point_past_the_threshold_runs_as_many_rounds_again(recorded):
    status, rows, launches = recorded
    assert status == 1
    by_name = {r["b"].split()[0]: r for r in rows}
    # 3 rounds of both, then 3 more of the one past 1.3 only: its verdict is over 6
    assert by_name["p2p_compressed"]["rounds"] == "6"
    assert by_name["baseline"]["rounds"] == "3"
    count = {(v, s): sum(1 for x in launches if x[:2] == (v, s)) for v, s, _ in launches}
    assert count == {
        ("p2p_compressed", "A"): 6,
        ("p2p_compressed", "B"): 6,
        ("baseline", "A"): 3,
        ("baseline", "B"): 3,
    }
    # the extra rounds alternate the first side as the first three did: A B, B A, ...
    firsts = [s for (v, s, k) in launches if v == "p2p_compressed"][::2]
    assert firsts == ["A", "B", "A", "B", "A", "B"]
    # over all 6 rounds: the geometric mean of the six factors
    assert float(by_name["p2p_compressed"]["ratio"]) == pytest.approx(
        (1.48 * 1.52 * 1.5 * 1.49 * 1.51 * 1.5) ** (1 / 6)
    )


def test_each_sides_kernels_are_asked_of_its_own_code(tmp_path):
    """This checkout, built, runs its own compiled kernels; its export without the built
    extension does not (tests/test_gate.py checks that a materialized base is built)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    if revisions.kernel_path(revisions.link_rooms(REPO, tmp_path / "tree")) != "fused":
        pytest.skip("this checkout's compiled kernels are not built")
    plain = tmp_path / "plain"
    (plain / "src").mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(plain / "src")], input=archive, check=True)
    # not its own: the reference kernels, or an editable install's compiled ones
    assert revisions.kernel_path(revisions.link_rooms(plain / "src", plain / "import")) in (
        "reference",
        "borrowed",
    )


def test_a_base_without_the_trees_compiled_kernels_is_refused(capsys):
    with pytest.raises(UsageError, match="base revision's codecs run its array-API"):
        gate.check_kernels("reference", "fused")
    assert "# codec kernels: base reference, tree fused" in capsys.readouterr().out
    with pytest.raises(UsageError, match="compiled kernels of another tree"):
        gate.check_kernels("borrowed", "fused")
    capsys.readouterr()
    gate.check_kernels("fused", "fused")
    assert capsys.readouterr().out == "# codec kernels: base fused, tree fused\n"
    gate.check_kernels("fused", "reference")  # the tree slower: loud, not hidden
    assert "# warning: the tree runs the reference codec kernels" in capsys.readouterr().out

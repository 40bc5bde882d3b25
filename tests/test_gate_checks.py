"""`ccbench gate`'s own records: the second look at a point past the threshold counted in
the rounds its rows say ran (not in the message it prints), and the codec kernels each
side runs, recorded and compared. The rounds are run by a recording launcher with set
times (B/A about 1.5 for one benchmark, 1.0 for the other), so the count of launches and
rounds is worked by hand; the kernels are asked of real revisions' code."""

from __future__ import annotations

import csv
import subprocess

import pytest

from ccbench.kernels.errors import UsageError
from ccbench.scripts.comparisons import gate, revisions
from tests.mpirun import REPO

SPEC = """
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
    """The gate of SPEC on this checkout against HEAD, its launches recorded; the base's
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
    spec.write_text(SPEC)
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

"""What adding a collective, a phase, a variant or a transport costs, counted: a made-up
one of each (tests/extension/additions.py) is written into a scratch copy of the tree,
the files each touched are counted against the table of docs/architecture.md ("What an
addition touches"), and each is checked to be wired in (tests/extension/wired.py: the
registry and command table, the ring on threads, the error model, the C loop's calls, a
one-rank run; the project's own registration checks in the copy)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extension.additions import ADDITIONS, apply
from tests.helpers.repo import git

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("kernels", "collectives", "training", "benchmarks", "plots", "scripts")
KINDS = tuple(ADDITIONS)


def documented() -> dict[str, tuple[int, set[str]]]:
    """{kind: (count, files)} from docs/architecture.md's table of additions."""
    table = {}
    for line in (REPO / "docs/architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and cells[0] in KINDS:
            table[cells[0]] = (int(cells[2]), set(re.findall(r"`([^`]+)`", cells[3])))
    return table


def as_author(root: Path, *args: str) -> str:
    """git in the scratch copy, with an identity to commit as."""
    return git(root, "-c", "user.name=t", "-c", "user.email=t@localhost", *args)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the tree with each addition committed on its own: (root, env, {kind:
    files its commit touched})."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    listing = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        timeout=120,
    )
    if listing.returncode != 0:
        pytest.skip("not a git checkout")
    base = tmp_path_factory.mktemp("extension")
    root = base / "tree"
    for name in filter(None, listing.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file() and not name.startswith("results/"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    as_author(root, "init", "-q")
    as_author(root, "add", "-A")
    as_author(root, "commit", "-q", "-m", "the tree")
    touched = {}
    for kind, edits in ADDITIONS.items():
        written = apply(root, edits)
        as_author(root, "add", "-A")
        changed = set(as_author(root, "diff", "--cached", "--name-only").split())
        assert changed == written, (kind, changed, written)
        as_author(root, "commit", "-q", "-m", f"a made-up {kind}")
        touched[kind] = changed
    package = base / "import" / "ccbench"  # `ccbench.<room>` is the copy's folder
    package.mkdir(parents=True)
    for room in ROOMS:
        (package / room).symlink_to(root / room)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCBENCH_")}
    env.update(PYTHONPATH=str(package.parent), OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    return root, env, touched


@pytest.mark.parametrize("kind", KINDS)
def test_the_files_an_addition_touches_are_the_documented_ones(scratch, kind):
    _, _, touched = scratch
    count, files = documented()[kind]
    # the table names a new file by its pattern: benchmarks/<name>.py
    named = {
        f.replace("ring_echo", "<name>").replace("comm_loop", "comm_<name>") for f in touched[kind]
    }
    assert named == files, f"{kind}: touched {sorted(touched[kind])}"
    assert count == len(files)


@pytest.fixture(scope="module")
def wired(scratch):
    root, env, _ = scratch
    proc = subprocess.run(
        [sys.executable, "-m", "tests.extension.wired"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", KINDS)
def test_each_addition_is_wired_in(wired, kind):
    failed = [check for check, ok in wired[kind].items() if not ok]
    assert wired[kind] and not failed, f"{kind}: {failed}"


@pytest.mark.timeout(400)
def test_the_projects_own_checks_accept_the_additions(scratch):
    """The registration checks of the copy's own tests: floors and variants
    (test_layers), the exit-status table (test_exit_status), no branch on a phase or
    collective name (test_phase_branches)."""
    root, env, _ = scratch
    checks = [
        "tests/test_layers.py::test_benchmarks_hold_the_harness_and_variants_only",
        "tests/test_layers.py::test_the_registry_says_which_variants_the_harness_drives",
        "tests/test_layers.py::test_collective_names_are_defined_once",
        "tests/test_layers.py::test_only_the_collectives_description_branches_on_a_collective",
        "tests/test_exit_status.py::test_every_row_names_a_test_that_exists",
        "tests/test_exit_status.py::test_every_tool_of_the_cli_has_a_row",
        "tests/test_phase_branches.py",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *checks],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]

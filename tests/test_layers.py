"""The house's layering, read from the source: imports point down the data's path, no loops.

Floors, from the bottom (docs/architecture.md):

    kernels (errors, vocabulary at its very bottom) <- collectives <- training
        <- benchmarks <- plots <- scripts

Every import of a ccbench module, at module level or inside a function, counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLOORS = {"kernels": 1, "collectives": 2, "training": 3, "benchmarks": 4, "plots": 5, "scripts": 6}
# The bottom of the bottom floor: they import nothing of ccbench.
FOUNDATION = {"ccbench.kernels.errors", "ccbench.kernels.vocabulary", "ccbench.kernels.variants"}


def modules() -> dict[str, Path]:
    """ccbench module name -> file, by the folders pyproject.toml maps to `ccbench.*`."""
    from ccbench.scripts.comparisons.revisions import rooms

    found = {}
    for room, folder in rooms(REPO).items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("ccbench", room, *parts))] = path
    return found


def test_every_room_pyproject_maps_has_a_floor():
    from ccbench.scripts.comparisons.revisions import rooms

    assert set(rooms(REPO)) == set(FLOORS)


MODULES = modules()


def imports_of(path: Path) -> set[str]:
    """Every module named by an import statement anywhere in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from ccbench.kernels import arrays` names the module ccbench.kernels.arrays
            names.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in MODULES
            )
    return names


def ccbench_imports(path: Path) -> set[str]:
    return {name for name in imports_of(path) if name.startswith("ccbench.")}


def floor(module: str) -> int:
    return FLOORS[module.split(".")[1]]


def test_every_room_has_modules():
    for room in FLOORS:
        assert any(m.split(".")[1] == room for m in MODULES), room


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    path = MODULES[module]
    for target in ccbench_imports(path):
        assert target.split(".")[1] in FLOORS, f"{module} imports {target}, outside the house"
        assert floor(target) <= floor(module), (
            f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)}): "
            "an arrow that runs back up"
        )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_of_the_old_top_level_names(module):
    """Installed names live under ccbench only; a bare `benchmarks` would collide."""
    for name in imports_of(MODULES[module]):
        assert name.split(".")[0] not in FLOORS, f"{module} imports {name}"


def test_the_foundation_imports_nothing_of_ccbench():
    for module in FOUNDATION:
        assert ccbench_imports(MODULES[module]) == set(), module


def test_no_import_loops():
    graph = {
        m: {t for t in ccbench_imports(p) if t in MODULES and t != m} for m, p in MODULES.items()
    }
    # a package's __init__ is imported on the way to its modules: not an edge of the data
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                loop = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import loop: " + " -> ".join(loop))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_benchmarks_hold_the_harness_and_variants_only():
    """No tool in benchmarks/: its modules are the harness pieces and the variants."""
    harness = {
        "__init__",
        "harness",
        "options",
        "osu_format",
        "results",
        "environment",
        "compressed_base",
        "hierarchy",
        "progress",
        "statistics",
        "accuracy",
        "timing_c",
        "timing",
        "graphs",
        "agreement",
        "schemas",
        "schema_model",
        "paired",
        "switches",
        "mpi_start",
    }  # paired: two variants in one launch, for ccbench compare
    from ccbench.scripts.cli import VARIANTS

    names = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    assert names - harness == set(VARIANTS), names - harness - set(VARIANTS)


def test_no_variant_imports_another_variant():
    from ccbench.scripts.cli import VARIANTS

    variants = {f"ccbench.benchmarks.{name}" for name in VARIANTS}
    for module in variants:
        others = ccbench_imports(MODULES[module]) & (variants - {module})
        assert not others, f"{module} imports {others}"


def test_collective_names_are_defined_once():
    from ccbench.kernels.vocabulary import COLLECTIVES

    literal = "(" + ", ".join(f'"{name}"' for name in COLLECTIVES) + ")"
    holders = [m for m, p in MODULES.items() if literal in p.read_text()]
    assert holders == ["ccbench.kernels.vocabulary"], holders


def test_the_transport_contract_imports_neither_library():
    """comm_torch.py builds on the contract; loading it must not load mpi4py (nor torch)."""
    import subprocess
    import sys

    probe = (
        "import sys, ccbench.collectives.communicator, ccbench.collectives.comm_torch; "
        "print(sorted({'mpi4py', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"


# The registry of variants (kernels/variants.py) is the only module that lists them.
# Only communicators move bytes through mpi4py or torch.distributed. These modules may
# still import either library, each for its reason; the list may only shrink.
LIBRARY_IMPORTERS = {
    "ccbench.collectives.comm": "the MPI communicator",
    "ccbench.collectives.mpi_staging": "the MPI communicator's staged device requests",
    "ccbench.collectives.comm_torch": "the torch.distributed communicator (MPI_Abort of an "
    "mpiexec launch)",
    "ccbench.collectives.launch": "the launcher: tells mpiexec, torchrun and srun apart",
    "ccbench.benchmarks.mpi_start": "the MPI thread level, set just before mpi4py.MPI is "
    "first imported",
    "ccbench.benchmarks.environment": "the MPI library's version and thread level, reported",
    "ccbench.benchmarks.overhead": "MPI's own bare loop, timed (MPI runs only)",
    "ccbench.benchmarks.timing_c": "OSU's C loop on MPI's communicator, timed (MPI runs only)",
    "ccbench.training.rendezvous": "torch.distributed's default group from the MPI launch",
    "ccbench.training.frameworks": "stock FSDP2 and DDP on torch.distributed's group",
    "ccbench.training.torch_hooks": "FSDP2's and DDP's communication hooks and their types",
    "ccbench.training.comm_stream": "a dist.Work for FSDP to wait on",
    "ccbench.scripts.cluster.selfcheck": "the emulated cluster's self-check times plain MPI",
    "ccbench.scripts.gpu.survey": "reports the MPI library and torch's NCCL",
}


def library_imports(source: str) -> set[str]:
    """ "mpi4py" and "torch.distributed" where the source imports them (anywhere)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            for library in ("mpi4py", "torch.distributed"):
                if name == library or name.startswith(library + "."):
                    found.add(library)
    return found


def test_only_the_listed_modules_import_mpi4py_or_torch_distributed():
    importing = {m for m, p in MODULES.items() if library_imports(p.read_text())}
    new = importing - set(LIBRARY_IMPORTERS)
    assert not new, (
        f"{sorted(new)} import mpi4py or torch.distributed: move the data "
        "through the communicator (collectives/communicator.py)"
    )
    done = set(LIBRARY_IMPORTERS) - importing
    assert not done, f"{sorted(done)} no longer import either library: take them off the list"


def test_the_library_scan_sees_imports_inside_functions():
    inside = "def f():\n    from mpi4py import MPI\n    import torch.distributed as dist\n"
    assert library_imports(inside) == {"mpi4py", "torch.distributed"}
    assert library_imports("from torch import distributed\n") == {"torch.distributed"}
    assert library_imports("import torch\nimport numpy\n") == set()


REGISTRY_MODULE = "ccbench.kernels.variants"


def _variant_names() -> set[str]:
    from ccbench.kernels.variants import NAMES

    return set(NAMES)


def variant_lists(path: Path, names: set[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of every tuple, list, set or dict literal in the file whose own
    elements (a dict's keys) name three or more variants."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elements = node.elts
        elif isinstance(node, ast.Dict):
            elements = [k for k in node.keys if k is not None]
        else:
            continue
        named = {e.value for e in elements if isinstance(e, ast.Constant) and e.value in names}
        if len(named) >= 3:
            found.append((node.lineno, sorted(named)))
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_variants_are_listed_only_in_the_registry(module):
    if module == REGISTRY_MODULE:
        return
    lists = variant_lists(MODULES[module], _variant_names())
    assert not lists, f"{module} lists variants itself at {lists}: read them from {REGISTRY_MODULE}"


def test_the_variant_check_sees_a_list():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.py"
        path.write_text(
            'ORDER = {"baseline": 0, "p2p_compressed": 1, "coll_compressed": 2}\n'
            'PAIR = ("baseline", "torch")\n'
        )
        assert variant_lists(path, _variant_names()) == [
            (1, ["baseline", "coll_compressed", "p2p_compressed"])
        ]


def _declares_variant(path: Path, name: str) -> bool:
    """Whether the file defines a class whose `name` is `name` (a harness Variant)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.value, ast.Constant)
                    and item.value.value == name
                    and any(getattr(t, "id", "") == "name" for t in item.targets)
                ):
                    return True
    return False


def test_the_registry_says_which_variants_the_harness_drives():
    from ccbench.kernels.variants import COMMANDS, HARNESS_VARIANTS

    driven = {
        name for name in COMMANDS if _declares_variant(MODULES[f"ccbench.benchmarks.{name}"], name)
    }
    assert driven == set(HARNESS_VARIANTS)


# Collectives: what differs between them is a field or a function of their entry in
# collectives/spec.py; only it and the vocabulary may name one to branch on it.
COLLECTIVE_OWNERS = {"ccbench.collectives.spec", "ccbench.kernels.vocabulary"}


def _names_a_collective(node: ast.AST) -> bool:
    """A collective's name as a literal, or a tuple, list or set literal holding one."""
    from ccbench.kernels.vocabulary import COLLECTIVES

    if isinstance(node, ast.Constant):
        return node.value in COLLECTIVES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(isinstance(e, ast.Constant) and e.value in COLLECTIVES for e in node.elts)
    return False


def collective_comparisons(path: Path) -> list[int]:
    """Lines of the file that compare something with a collective's name: == or != a
    name, `in` or `not in` a literal collection of names (or a name `in` something), and
    a `match` with a case on a name."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
                if isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) and (
                    _names_a_collective(left) or _names_a_collective(right)
                ):
                    lines.append(node.lineno)
                    break
        elif isinstance(node, ast.match_case):
            if any(
                isinstance(p, ast.MatchValue) and _names_a_collective(p.value)
                for p in ast.walk(node.pattern)
            ):
                lines.append(node.pattern.lineno)
    return sorted(set(lines))


def test_only_the_collectives_description_branches_on_a_collective():
    branching = {
        m: collective_comparisons(p) for m, p in MODULES.items() if m not in COLLECTIVE_OWNERS
    }
    branching = {m: lines for m, lines in branching.items() if lines}
    assert not branching, (
        f"{branching} (module: lines) compare a collective's name: make "
        "it a field or a function of collectives/spec.py's entries"
    )


def test_the_collectives_description_has_no_branch_on_a_name():
    assert collective_comparisons(MODULES["ccbench.collectives.spec"]) == []


def test_the_collective_check_sees_every_spelling(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        'if c == "allgather":\n    pass\n'
        'if "allreduce" != c:\n    pass\n'
        'if c in ("reduce_scatter", "allreduce"):\n    pass\n'
        'if c not in {"allgather"}:\n    pass\n'
        'match c:\n    case "x" | "allgather":\n        pass\n'
        'if c == "broadcast" or c in ("a", "b") or c is None:\n    pass\n'
        'f(c, "allgather")\n'
    )
    assert collective_comparisons(path) == [1, 3, 5, 7, 10]


LONGEST_FILE = 600


def test_no_source_or_test_file_is_over_600_lines():
    """A module that outgrows a reader's sitting splits by what its parts are."""
    files = [*MODULES.values(), *sorted((REPO / "tests").rglob("*.py"))]
    long = {
        str(p.relative_to(REPO)): n
        for p in files
        if (n := len(p.read_text().splitlines())) > LONGEST_FILE
    }
    assert not long, f"over {LONGEST_FILE} lines: {long}"

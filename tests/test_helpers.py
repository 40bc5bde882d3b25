"""The helpers shared by test modules are defined once under tests/: a module imports
`ccbench`, `git`, `harness_row`, `failed_checks`... from tests/helpers/ and gets
`fresh_counts` and `clone` from conftest.py, never keeps a copy of its own (copies drift:
three `ccbench()` wrappers had three timeouts)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HELPERS = sorted((TESTS / "helpers").glob("*.py"))
# conftest.py's fixtures that were once copied into modules (the plotting ones never were)
SHARED_FIXTURES = {"fresh_counts", "clone"}


def module_level_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    ]


def definitions(root: Path, names: set[str]) -> Counter:
    """How many modules under `root` define each of `names` at their top level."""
    found = (name for path in root.rglob("*.py") for name in module_level_functions(path))
    return Counter(name for name in found if name in names)


def test_each_shared_helper_is_defined_once_under_tests():
    shared = {name for path in HELPERS for name in module_level_functions(path)}
    shared |= SHARED_FIXTURES
    assert {"ccbench", "git", "harness_row", "failed_checks"} <= shared
    defined = definitions(TESTS, shared)
    assert {name: n for name, n in defined.items() if n != 1} == {}


def test_a_copy_in_a_module_is_counted(tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "cli.py").write_text("def ccbench(*args):\n    pass\n")
    (tmp_path / "test_x.py").write_text("def ccbench(*args, timeout=60):\n    pass\n")
    (tmp_path / "test_y.py").write_text("class Runner:\n    def ccbench(self):\n        pass\n")
    assert definitions(tmp_path, {"ccbench"}) == {"ccbench": 2}  # a method is not a copy

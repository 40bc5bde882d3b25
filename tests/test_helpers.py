"""The helpers shared by test modules are defined once under tests/: a module imports
`ccbench`, `harness_row`, `fresh_counts`... from tests/helpers/ or conftest.py, never
keeps a copy of its own (copies drift: three `ccbench()` wrappers had three timeouts)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = [*sorted((TESTS / "helpers").glob("*.py")), TESTS / "conftest.py"]


def module_level_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    ]


def test_each_shared_helper_is_defined_once_under_tests():
    shared = {name for path in SHARED for name in module_level_functions(path)}
    assert {"ccbench", "harness_row", "fresh_counts", "failed_checks"} <= shared
    defined = Counter(
        name
        for path in TESTS.rglob("*.py")
        for name in module_level_functions(path)
        if name in shared
    )
    assert {name: n for name, n in defined.items() if n != 1} == {}


def test_the_check_counts_a_second_definition(tmp_path):
    """The counter above sees a copy: a module that defines `ccbench` again is one more."""
    copy = tmp_path / "test_copy.py"
    copy.write_text("import subprocess\n\n\ndef ccbench(*args):\n    return None\n")
    assert module_level_functions(copy) == ["ccbench"]

"""No module outside the collectives' description branches on a phase or a collective by
name: what differs between phases is a field of the phase (collectives/phases.py), what
differs between collectives a field of their spec (collectives/spec.py).

The scan counts a comparison (==, !=, is, is not, in, not in) or a match case whose one
side is a phase's or a collective's name as a literal (or a literal collection holding
one) or a phase object named by its constant (REDUCE, GATHER ...). Run as a script
(`python tests/test_phase_branches.py [ROOT]`) it prints the modules that do, with lines.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("kernels", "collectives", "training", "benchmarks", "plots", "scripts")

# The modules that declare phases and collectives: only they may name one to branch on it.
OWNERS = {"collectives/phases.py", "collectives/spec.py", "kernels/vocabulary.py"}
# Modules that may, each with its reason (the list may only shrink).
EXCEPTIONS: dict[str, str] = {}

# the names phases had before they were objects (strings in collectives/spec.py)
_OLD_PHASE_CONSTANTS = {"REDUCE_PHASE", "GATHER_PHASE"}


def phase_vocabulary(root: Path) -> tuple[set[str], set[str]]:
    """(names, constants): the phases' and collectives' names as strings, and the module
    constants bound to a phase, read from the tree at `root` (before phases were objects,
    the string constants of spec.py)."""
    names, constants = set(), set(_OLD_PHASE_CONSTANTS)
    vocabulary = ast.parse((root / "kernels/vocabulary.py").read_text())
    for node in ast.walk(vocabulary):
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "COLLECTIVES" for t in node.targets
        ):
            names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    phases = root / "collectives/phases.py"
    if phases.exists():
        for node in ast.walk(ast.parse(phases.read_text())):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", "") == "Phase"
            ):
                constants |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                first = node.value.args[0] if node.value.args else None
                if isinstance(first, ast.Constant):
                    names.add(first.value)
    else:
        names |= {"reduce", "gather"}
    return names, constants


def _names_one(node: ast.AST, names: set[str], constants: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.Attribute):
        return node.attr in constants
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_one(e, names, constants) for e in node.elts)
    return False


_COMPARISONS = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn)


def phase_branches(path: Path, names: set[str], constants: set[str]) -> list[int]:
    """Lines of the file that compare something with a phase or a collective by name."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
                if isinstance(op, _COMPARISONS) and (
                    _names_one(left, names, constants) or _names_one(right, names, constants)
                ):
                    lines.append(node.lineno)
                    break
        elif isinstance(node, ast.match_case):
            if any(
                isinstance(p, ast.MatchValue) and _names_one(p.value, names, constants)
                for p in ast.walk(node.pattern)
            ):
                lines.append(node.pattern.lineno)
    return sorted(set(lines))


def scan(root: Path) -> dict[str, list[int]]:
    """{module path: lines} of every module outside the owners that branches on a name."""
    names, constants = phase_vocabulary(root)
    found = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative in OWNERS:
                continue
            lines = phase_branches(path, names, constants)
            if lines:
                found[relative] = lines
    return found


def test_no_module_outside_the_spec_branches_on_a_phase_or_collective_name():
    found = {m: lines for m, lines in scan(REPO).items() if m not in EXCEPTIONS}
    assert not found, (
        f"{found} (module: lines) compare a phase or a collective by name: make it a "
        "field of the phase (collectives/phases.py) or of the spec (collectives/spec.py)"
    )


def test_every_exception_still_branches():
    """An exception that no longer branches leaves the list."""
    found = scan(REPO)
    assert all(m in found for m in EXCEPTIONS), set(EXCEPTIONS) - set(found)


def test_the_scan_sees_every_spelling(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        'if p == "gather":\n    pass\n'  # 1
        "if REDUCE in phases:\n    pass\n"  # 3
        "if phase is spec_module.GATHER:\n    pass\n"  # 5
        'if c not in ("allreduce", "x"):\n    pass\n'  # 7
        'match p:\n    case "reduce":\n        pass\n'  # 9, 10
        'if p.reduces or p == "exchange" or c is None:\n    pass\n'  # 12: not a name
        'f(REDUCE, "gather")\n'  # 14: not a comparison
    )
    names = {"reduce", "gather", "allreduce"}
    assert phase_branches(path, names, {"REDUCE", "GATHER"}) == [1, 3, 5, 7, 10]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO
    result = scan(root)
    for module, lines in result.items():
        print(module, lines)
    print(f"{len(result)} modules outside the spec branch on a phase or collective name")

"""A case driver's checks by name (tests/drivers/*_cases.py), so that a failing case
says which of its checks broke, not only that it did.

A driver builds each case's line with `case_line(case, checks, **detail)`: `checks` maps
a check's name to whether it held (on every rank: `on_every_rank`), and `ok` is all of
them. The test module asserts `failed_checks(line) == []`."""

from __future__ import annotations


def on_every_rank(per_rank: list[dict]) -> dict[str, bool]:
    """Each check held on every rank (the ranks' dicts gathered on rank 0)."""
    names = dict.fromkeys(name for checks in per_rank for name in checks)
    return {name: all(bool(checks.get(name, False)) for checks in per_rank) for name in names}


def case_line(case: str, checks: dict, **detail) -> dict:
    """One JSON line of a case: its named checks, `ok` when all of them held."""
    checks = {name: bool(held) for name, held in checks.items()}
    return {"case": case, "ok": all(checks.values()), "checks": checks, **detail}


def failed_checks(line: dict | None) -> list[str]:
    """The names of a case's checks that did not hold; a case that printed no line, or a
    line without named checks, fails as such."""
    if line is None:
        return ["(the case did not report)"]
    if not line.get("checks"):
        return ["(the case named no checks)"]
    return [name for name, held in line["checks"].items() if not held]

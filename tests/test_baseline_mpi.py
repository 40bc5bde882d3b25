"""The baseline collectives on real ranks (2 and 4), checked exactly against numpy."""

from __future__ import annotations

import json

import pytest

from tests.drivers.baseline_cases import cases
from tests.mpirun import mpirun

CASE_IDS = [case_id for case_id, _ in cases()]
_RESULTS: dict[int, dict] = {}


def results(nranks: int) -> dict:
    """All cases run in one mpiexec launch per rank count, shared by the tests."""
    if nranks not in _RESULTS:
        proc = mpirun(nranks, ["-m", "tests.drivers.baseline_cases"], timeout=240)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        _RESULTS[nranks] = {line["case"]: line for line in lines}
    return _RESULTS[nranks]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_baseline_matches_numpy(nranks, case_id):
    result = results(nranks).get(case_id)
    assert result is not None, f"{case_id} did not report"
    assert result["ok"], result["detail"]

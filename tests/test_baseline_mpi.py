"""The baseline collectives on real ranks (2 and 4), checked exactly against numpy."""

from __future__ import annotations

import pytest

from tests.drivers.baseline_cases import cases
from tests.helpers.drivers import failed_checks
from tests.mpirun import case_results

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

CASE_IDS = [case_id for case_id, _ in cases()]


def results(nranks: int) -> dict:
    """All cases in one launch per rank count, shared by the parametrized tests."""
    return case_results("tests.drivers.baseline_cases", nranks, timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_baseline_matches_numpy(nranks, case_id):
    result = results(nranks).get(case_id)
    assert failed_checks(result) == [], result

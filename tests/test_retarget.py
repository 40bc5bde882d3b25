"""A bound compressed collective retargeted to a fresh receive buffer (the gradient
communicator does so for each of FSDP's calls, whose outputs are new tensors) writes its
whole result into that buffer: every variant and collective, on MPI and, in posting
order, on gloo; and the gradient communicator called as FSDP calls it. Cases and their
exact expected results: tests/drivers/retarget_cases.py.
"""

from __future__ import annotations

import json

import pytest

from tests.drivers.retarget_cases import CASES
from tests.mpirun import case_results

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


@pytest.fixture(scope="module")
def results() -> dict:
    pytest.importorskip("torch")
    return case_results("tests.drivers.retarget_cases", 2, timeout=200)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES)
def test_retargeted_result_lands_in_the_fresh_buffer(results, case):
    result = results.get(case)
    assert result is not None, f"{case} did not report"
    assert result["ok"], json.dumps(result)

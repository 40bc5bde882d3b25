"""What `ccbench advise` reads from the rows and the trace, against values worked by hand:
the link a harness row ran on (its step cost recorded in microseconds, the model's in
seconds) and the collective that sets the step's break-even size (the one carrying most
of the step's bytes over all its calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccbench.collectives.trace import Event, Step
from ccbench.scripts.advise import parts
from ccbench.scripts.advise.table import main_collective


def emulated_row(**extra) -> dict:
    return {
        "timestamp": "2026-01-01T00:00:00",
        "run_id": "r1",
        "link_gbps": "1",
        "link_ceiling_gbps": "0.94",
        "link_step_us": "250",
        "link_burst_bytes": "3000",
        **extra,
    }


def test_a_rows_link_step_cost_is_read_as_microseconds():
    network = parts.row_network(emulated_row())
    assert network.rate_bps == pytest.approx(0.94e9)  # the measured ceiling, not the nominal
    assert network.step_s == pytest.approx(250e-6)  # 250 us
    assert network.burst_bytes == pytest.approx(3000)


def test_the_newest_emulated_rows_link_is_the_advices_link():
    tables = parts.Tables(
        {
            "harness": [
                (Path("old.csv"), emulated_row(timestamp="2025-01-01", link_step_us="900")),
                (Path("new.csv"), emulated_row()),
                (Path("shm.csv"), {"timestamp": "2027-01-01", "link_gbps": ""}),  # no link
            ]
        }
    )
    network, inputs = parts.link_from_results(tables)
    assert network.step_s == pytest.approx(250e-6)
    assert network.rate_bps == pytest.approx(0.94e9)
    (step,) = [i for i in inputs if i.name == "ring step cost s"]
    assert step.value == pytest.approx(250e-6) and not step.assumed
    assert "new.csv" in step.source


def call(collective: str, mib: int) -> Event:
    return Event("call", collective=collective, count=mib << 18, blocking=True)  # float32


def test_the_steps_main_collective_is_the_one_with_most_bytes_over_all_calls():
    # four reduce-scatters of 3 MiB (12 MiB) against one allgather of 10 MiB, called last
    step = Step([call("reduce_scatter", 3) for _ in range(4)] + [call("allgather", 10)])
    assert main_collective(step) == "reduce_scatter"
    # one more allgather of 4 MiB: 14 MiB against 12
    step.events.insert(0, call("allgather", 4))
    assert main_collective(step) == "allgather"

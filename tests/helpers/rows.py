"""A harness CSV row of known values, for tests that build results by hand."""

from __future__ import annotations

from ccbench.benchmarks.results import COMMON_COLUMNS, HARNESS


def harness_row(columns=COMMON_COLUMNS, **changes) -> dict:
    """Every column of `columns` (the harness's common ones unless given), empty but for
    one 4 KiB baseline allgather on 2 ranks that passed; `changes` set the rest."""
    row = dict.fromkeys(columns, "")
    row.update(
        schema=HARNESS.tag,
        run_id="r1",
        sweep_id="s1",
        timestamp="2026-01-01T00:00:00",
        variant="baseline",
        algorithm="mpi",
        collective="allgather",
        codec="none",
        dtype="float32",
        buffer="numpy",
        ranks="2",
        nodes="1",
        size_bytes="4096",
        iterations="100",
        timing="per-call",
        timer="c",
        data="gradient",
        avg_us="10.0",
        validation="Pass",
    )
    row.update(changes)
    return row

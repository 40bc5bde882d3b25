"""Staging device buffers through pinned host memory (collectives/comm.py), on the strict
device double: what the host waits for, what is copied, what is allocated.

Counted by hand for each call: a staged send waits once for its D2H copy (a library
collective: once per piece of `stage_chunk_bytes`), a receive's H2D copy is never waited
for by the host, and a timed call allocates nothing once the mirrors exist. The double's
copies land only when something waits for them, so a staged path that skipped a wait
would read stale bytes: every result here is checked too. The 2-rank cases run in the
double's driver (tests/drivers/double_cases.py, `staging-*`).
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
from mpi4py import MPI

import tests.devicedouble as double
from ccbench.collectives.comm import Communicator
from ccbench.kernels import arrays
from tests.mpirun import case_results

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("fresh_counts")]


def device(values, dtype="float32"):
    return arrays.from_numpy("double", np.asarray(values), dtype)


def timed_call(call) -> dict:
    """The double's counts and the declared host syncs of one call in a timed region."""
    double.STATS.reset()
    declared = arrays.SYNCS.count
    double.STATS.in_region = True
    try:
        call()
    finally:
        double.STATS.in_region = False
    counts = double.STATS.snapshot()
    counts["declared"] = arrays.SYNCS.count - declared
    return counts


# ---------------------------------------------------------------- the double's copies


def test_copies_land_only_when_waited_for():
    b = arrays.backend("double")
    x = device(np.arange(8.0))
    stream, event = b.copy_stream(), b.copy_event()
    host = np.zeros(32, np.uint8)
    b.copy_out_async(b.byte_view(x), host, stream)
    b.record(event, stream)
    assert not host.any()  # under way
    assert not b.event_done(event)  # the first poll: still under way
    assert b.event_done(event)  # the second: landed, the host waited once
    assert np.array_equal(host.view(np.float32), np.arange(8.0))
    y = device(np.zeros(8))
    b.copy_in_async(host, b.byte_view(y), stream)
    b.record(event, stream)
    assert not np.any(y.get())  # nobody waited: the old bytes
    b.stream_wait(event)  # the consumer's stream waits: it lands
    assert np.array_equal(y.get(), np.arange(8.0))
    assert double.STATS.copy_waits == {"d2h": 1, "h2d": 0}
    assert double.STATS.copies == {"d2h": 1, "h2d": 1}


def test_a_d2h_copy_must_wait_for_the_kernel_that_wrote_its_buffer():
    """The double's landing rule, by hand: a copy stream reads a buffer only after waiting
    for an event the current stream recorded behind the buffer's last kernel."""
    b = arrays.backend("double")
    x = device(np.arange(8.0))
    x += 1  # a kernel on the current stream
    stream, produced = b.copy_stream(), b.copy_event()
    host = np.zeros(32, np.uint8)
    with pytest.raises(RuntimeError, match="not yet written"):
        b.copy_out_async(b.byte_view(x), host, stream)
    b.record(produced)  # on the current stream, behind the kernel
    b.stream_wait(produced)  # the current stream waits: orders nothing on the copy stream
    with pytest.raises(RuntimeError, match="not yet written"):
        b.copy_out_async(b.byte_view(x), host, stream)
    b.stream_wait(produced, stream)
    b.copy_out_async(b.byte_view(x), host, stream)  # now ordered behind the kernel
    x *= 2
    with pytest.raises(RuntimeError, match="not yet written"):  # a later kernel: wait again
        b.copy_out_async(b.byte_view(x), host, stream)


def test_only_the_reading_streams_wait_lands_an_h2d_copy():
    b = arrays.backend("double")
    y = device(np.zeros(4))
    stream, landed = b.copy_stream(), b.copy_event()
    b.copy_in_async(np.arange(4.0, dtype=np.float32).view(np.uint8), b.byte_view(y), stream)
    b.record(landed, stream)
    b.stream_wait(landed, b.copy_stream())  # another copy stream waits: not the reader
    assert not np.any(y.get())
    b.stream_wait(landed)  # the current stream, which reads y, waits: landed
    assert np.array_equal(y.get(), np.arange(4.0))


def test_a_staged_send_of_a_kernels_output_is_ordered_behind_the_kernel():
    """The D2H copy's stream waits for the producer: the bytes sent are the kernel's."""
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    x, out = device(np.arange(16.0)), device(np.zeros(16))
    x *= 3  # written by a kernel just before the send stages it
    comm.sendrecv(x, 0, out, 0)
    assert np.array_equal(out.get(), 3 * np.arange(16.0))
    y = device(np.zeros(16))
    y += 5
    request = comm.isend(y, 0, tag=2)
    comm.recv(out, 0, tag=2)
    comm.wait(request)
    assert np.array_equal(out.get(), np.full(16, 5.0))


def test_a_staged_receive_is_readable_on_the_current_stream_at_once():
    """After a staged receive the current stream waited for its H2D copy: the next kernel
    (here a device-side sum) reads the received bytes, with no host wait in between."""
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    x, out = device(np.arange(1.0, 9.0)), device(np.zeros(8))
    request = comm.irecv(out, 0, tag=3)
    comm.send(x, 0, tag=3)
    comm.wait(request)
    total = out.sum()  # a kernel on the current stream
    assert double.STATS.copy_waits["h2d"] == 0  # the host never waited for the copy
    assert total.get() == 36.0


def test_a_staged_receive_copies_the_message_not_its_slot():
    """A variable-size payload shorter than its slot (an MPI receive may be longer than
    its message): only the message's bytes, as MPI's status counts them, reach the device;
    the slot's tail keeps what it held, not the mirror's bytes of an earlier message."""
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    slot = device(np.zeros(8))
    for message, before, expected in (
        (np.full(8, 9.0), np.zeros(8), np.full(8, 9.0)),  # fills the mirror with 9s
        (np.arange(1.0, 4.0), np.full(8, -1.0), [1, 2, 3, -1, -1, -1, -1, -1]),
    ):
        slot.set(before.astype(np.float32))
        request = comm.irecv(slot, 0, tag=4)
        comm.send(device(message), 0, tag=4)
        comm.wait(request)
        assert np.array_equal(slot.get(), np.asarray(expected, np.float32)), message


# ---------------------------------------------------------------- staging, counted


def test_a_device_buffer_is_staged_by_default(monkeypatch, switch):
    switch("CCBENCH_GPU_AWARE", None)
    comm = Communicator(MPI.COMM_SELF)
    assert comm.gpu_aware is False

    def refuse(x):
        raise AssertionError("device memory handed to MPI")

    monkeypatch.setattr(arrays.backend("double"), "direct", refuse)
    x, y = device(np.arange(64.0)), device(np.zeros(64))
    call = comm.library_call("allgather", x, y)
    counts = timed_call(call)
    assert counts["copies"] == {"d2h": 1, "h2d": 1}
    assert np.array_equal(y.get(), np.arange(64.0))
    out = device(np.zeros(64))
    comm.sendrecv(x, 0, out, 0)
    assert np.array_equal(out.get(), np.arange(64.0))


@pytest.mark.parametrize(
    "count, chunk, pieces", [(4096, 4096, 4), (4097, 4096, 5), (4096, 0, 1), (4096, 1 << 21, 1)]
)
def test_a_staged_library_allgather_waits_once_per_piece(count, chunk, pieces):
    """Hand count (1 rank): `pieces` = ceil(4 count / chunk) D2H copies, each waited for
    once by the host; as many H2D copies (one per rank per piece), none waited for; no
    allocation, no synchronous copy; the mirrors were made when the call was bound."""
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False, stage_chunk_bytes=chunk)
    values = np.arange(count, dtype=np.float32)
    x, y = device(values), device(np.zeros(count))
    double.STATS.reset()
    call = comm.library_call("allgather", x, y)
    assert double.STATS.pinned == 2  # the send's mirror and the result's
    for _ in range(2):  # the second call reuses everything the first found
        counts = timed_call(call)
        assert counts["copies"] == {"d2h": pieces, "h2d": pieces}
        assert counts["copy_waits"] == {"d2h": pieces, "h2d": 0}
        assert counts["declared"] == pieces and counts["undeclared"] == 0
        assert counts["timed_allocs"] == 0 and counts["timed_transfers"] == 0
        assert np.array_equal(y.get(), values)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_staged_reductions_wait_for_their_sends_only(collective):
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False, stage_chunk_bytes=4096)
    values = np.arange(3000, dtype=np.float32)
    x, y = device(values), device(np.zeros(3000))
    counts = timed_call(comm.library_call(collective, x, y))
    pieces = 3 if collective == "allreduce" else 1  # 12000 B in 4096 B pieces; whole
    assert counts["copy_waits"] == {"d2h": pieces, "h2d": 0}
    assert counts["copies"] == {"d2h": pieces, "h2d": pieces}
    assert np.array_equal(y.get(), values)


def test_a_nonblocking_send_is_posted_by_the_progress_loop():
    """isend starts the D2H copy and returns; MPI gets the send only when a test finds
    the copy landed (the double's first poll finds it under way): one host wait for the
    send, none for the receive, whose H2D copy the current stream waits for."""
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    x, out = device(np.arange(256.0)), device(np.zeros(256))
    warm = [comm.irecv(out, 0, 3), comm.isend(x, 0, 3)]
    comm.waitall(warm)  # first use: the mirrors
    requests: list = []
    tests: list = []

    def exchange():
        requests[:] = [comm.irecv(out, 0, 4), comm.isend(x, 0, 4)]
        while True:
            done = comm.testall(requests)
            tests.append(done)
            if done:
                break

    out[...] = device(np.zeros(256))
    counts = timed_call(exchange)
    assert tests[0] is False  # the D2H copy was under way: nothing posted yet
    assert counts["copies"] == {"d2h": 1, "h2d": 1}
    assert counts["copy_waits"] == {"d2h": 1, "h2d": 0}
    assert counts["declared"] == 1 and counts["undeclared"] == 0
    assert counts["timed_allocs"] == 0 and counts["timed_transfers"] == 0
    assert np.array_equal(out.get(), np.arange(256.0))


def test_testsome_reports_a_staged_send_once_posted_and_done():
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    x, out = device(np.arange(16.0)), device(np.zeros(16))
    requests = [comm.irecv(out, 0, 5), comm.isend(x, 0, 5)]
    seen: list[int] = []
    for _ in range(100):
        seen += comm.testsome(requests)
        if len(seen) == 2:
            break
    assert sorted(seen) == [0, 1]
    assert comm.completed(requests[0]) and comm.completed(requests[1])
    assert np.array_equal(out.get(), np.arange(16.0))


def test_a_receive_never_overwrites_a_mirror_an_h2d_copy_still_reads():
    """A second receive into the same device buffer while the first one's H2D copy has
    not landed takes another mirror (the host does not wait for the copy)."""
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    out = device(np.zeros(4))
    first, second = device([1.0, 2, 3, 4]), device([5.0, 6, 7, 8])
    mirror = comm._recv_mirror(out)
    comm.sendrecv(first, 0, out, 0)
    assert np.array_equal(out.get(), [1, 2, 3, 4])  # the current stream waited for it
    assert comm._recv_mirror(out) is mirror  # landed: reused
    mirror.in_event.record(comm._stager(out).h2d)  # as if a copy were still under way
    comm._stager(out).h2d.enqueue("h2d", lambda: None)
    mirror.in_event.record(comm._stager(out).h2d)
    comm.sendrecv(second, 0, out, 0)
    assert len(comm._mirrors(out)) == 2
    assert np.array_equal(out.get(), [5, 6, 7, 8])
    assert double.STATS.copy_waits["h2d"] == 0  # polled, never waited for


def test_a_staged_ring_step_waits_for_its_send_only():
    """One sendrecv of a ring: one D2H copy waited for, one H2D copy not waited for."""
    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    x, out = device(np.arange(100.0)), device(np.zeros(100))
    comm.sendrecv(x, 0, out, 0)  # first use: the mirrors
    counts = timed_call(lambda: comm.sendrecv(x, 0, out, 0))
    assert counts["copy_waits"] == {"d2h": 1, "h2d": 0}
    assert counts["copies"] == {"d2h": 1, "h2d": 1}
    assert counts["declared"] == 1 and counts["timed_allocs"] == 0
    assert np.array_equal(out.get(), np.arange(100.0))


def test_omnireduce_headers_stay_on_the_host():
    """A staged message's header goes into the send mirror on the host and comes out of
    the receive mirror on the host: no transfer of it to or from the device."""
    from ccbench.collectives.omnireduce_layout import make_layout
    from ccbench.collectives.omnireduce_streams import HEADER_FIELDS, Message

    comm = Communicator(MPI.COMM_SELF, gpu_aware=False)
    like = device(np.zeros(256))
    layout = make_layout(256, 16, 1, fusion=4)
    out, back = Message(like, layout, comm), Message(like, layout, comm)
    assert out.staged and back.staged
    out.blocks(2, 2)[...] = device(np.arange(32.0).reshape(2, 16))
    out.raw[: HEADER_FIELDS * 4] = 0
    double.STATS.reset()
    out.write(2, 7, 0, np.array([3, 9]), nexts=np.array([4, 10]))
    requests = [back.receive(comm, 0, 11), out.send(comm, 0, 11)]
    while not comm.testall(requests):
        pass
    k, next_position, _, positions = back.read()
    counts = double.STATS.snapshot()
    assert (k, next_position, list(positions), list(back.nexts())) == (2, 7, [3, 9], [4, 10])
    # no header written to or read from the device: only the staging copies
    assert counts["transfers"] == 0 and counts["syncs"] == 0, counts
    assert counts["copies"] == {"d2h": 1, "h2d": 1}, counts
    assert not np.any(out.raw[: HEADER_FIELDS * 4].get())
    assert np.array_equal(arrays.to_numpy(back.blocks(2, 2)), np.arange(32.0).reshape(2, 16))


# ---------------------------------------------------------------- 2 ranks


def staging_case(name: str) -> dict:
    got = case_results("tests.drivers.double_cases", 2, timeout=600).get(f"staging-{name}")
    assert got is not None, f"staging-{name} did not report"
    return got


@pytest.mark.timeout(660)
def test_two_ranks_staged_allgather_counts_by_hand():
    """4097 float32 per rank in pieces of 4096 B: 5 pieces; each rank: 5 D2H copies and
    5 host waits, 5 x 2 H2D copies and none waited for, nothing allocated."""
    got = staging_case("allgather")
    for rank in got["ranks"]:
        assert rank["ok"], got
        assert rank["copies"] == {"d2h": 5, "h2d": 10}, rank
        assert rank["copy_waits"] == {"d2h": 5, "h2d": 0}, rank
        assert rank["declared"] == 5 and rank["undeclared"] == 0, rank
        assert rank["timed_allocs"] == 0 and rank["timed_transfers"] == 0, rank


@pytest.mark.timeout(660)
def test_two_ranks_ring_and_pipelined_sends_wait_for_sends_only():
    """A ring allgather on 2 ranks is one sendrecv step; 6 isends each way through the
    progress loop: a host wait per send, none per receive, nothing allocated."""
    ring = staging_case("ring")
    for rank in ring["ranks"]:
        assert rank["ok"] and rank["copies"] == {"d2h": 1, "h2d": 1}, rank
        assert rank["copy_waits"] == {"d2h": 1, "h2d": 0}, rank
        assert rank["declared"] == 1 and rank["timed_allocs"] == 0, rank
    sends = staging_case("isend")
    for rank in sends["ranks"]:
        assert rank["ok"] and rank["copies"] == {"d2h": 6, "h2d": 6}, rank
        assert rank["copy_waits"] == {"d2h": 6, "h2d": 0}, rank
        assert rank["declared"] == 6 and rank["timed_allocs"] == 0, rank


@pytest.mark.timeout(660)
def test_two_ranks_stage_by_default():
    got = staging_case("default")
    assert [r["gpu_aware"] for r in got["ranks"]] == [False, False]
    assert all(r["ok"] and r["copies"]["d2h"] == 1 for r in got["ranks"]), got


@pytest.mark.timeout(660)
def test_staging_bound_rows_are_complete_and_add_up():
    got = staging_case("bound")
    assert got["status"] == 0, got
    rows = got["rows"]
    assert [int(r["size_bytes"]) for r in rows] == [4096, 65536]
    for row in rows:
        assert row["buffer"] == "double" and row["ranks"] == "2"
        parts = [float(row[c]) for c in ("d2h_pinned_us", "host_allgather_us", "h2d_pinned_us")]
        assert all(p > 0 for p in parts), row
        assert float(row["bound_us"]) == pytest.approx(sum(parts), abs=2e-3)
        assert float(row["staged_us"]) > 0 and float(row["staged_whole_us"]) > 0, row
        assert float(row["staged_vs_bound"]) == pytest.approx(
            float(row["staged_us"]) / float(row["bound_us"]), rel=1e-4
        )
    with open(got["csv"]) as f:
        header = next(csv.reader(f))
    for column in (
        "buffer",
        "size_bytes",
        "ranks",
        "d2h_pinned_us",
        "host_allgather_us",
        "h2d_pinned_us",
        "bound_us",
        "staged_us",
        "staged_vs_bound",
    ):
        assert column in header


def test_staging_bound_refuses_a_host_buffer_in_one_line(capsys):
    from ccbench.benchmarks import staging_bound
    from ccbench.benchmarks.agreement import run_main

    status = run_main(staging_bound.body, ["-d", "numpy"], Communicator(MPI.COMM_SELF))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith("ccbench: error: -d numpy: staging_bound times device buffers")


def test_staging_bound_exits_1_on_a_wrong_staged_result(monkeypatch, capsys, tmp_path):
    from ccbench.benchmarks import staging_bound
    from ccbench.benchmarks.agreement import run_main

    # a staged call that leaves a wrong result behind
    monkeypatch.setattr(staging_bound.Setup, "staged_allgather", lambda self: self.recv.fill(1))
    out = tmp_path / "bound.csv"
    status = run_main(
        staging_bound.body,
        ["-d", "double", "-m", "4K", "--rounds", "1", "--csv", str(out)],
        Communicator(MPI.COMM_SELF),
    )
    assert status == 1
    assert "wrong result on ranks [0]: not timed" in capsys.readouterr().out
    assert not out.exists()


def test_a_staging_bound_part_is_the_slowest_ranks_time(monkeypatch):
    """Each part of the bound is timed on every rank at once and reduced with max: the
    call took as long as its slowest rank. Worked by hand: this rank's clock reads 2 ms,
    the other two ranks' 5 ms and 1 ms, so the part took 5000 us."""
    from ccbench.benchmarks import staging_bound

    class ThreeRanks:
        def barrier(self):
            pass

        def allreduce_value(self, value, op="sum"):
            everyone = [value, 0.005, 0.001]
            return {"max": max, "min": min, "sum": sum}[op](everyone)

    readings = [10.0, 10.002]  # before and after the call on this rank
    monkeypatch.setattr(staging_bound.time, "perf_counter", lambda: readings.pop(0))
    assert staging_bound.timed(ThreeRanks(), lambda: None) == pytest.approx(5000.0)

"""Device correctness without a GPU: the training communication thread's CUDA ordering
(through a recording stand-in for torch.cuda), the time breakdown's device events read
outside the timed region (on the device double), which default group training starts,
and the refusal of NCCL on ranks that share a GPU. The CUDA calls themselves run only
on a GPU (scripts/gpu-check.sh)."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import torch

import tests.devicedouble as double
from ccbench.benchmarks.options import compression_of
from ccbench.collectives import comm_torch, pipeline
from ccbench.kernels import arrays
from ccbench.kernels.errors import UsageError
from ccbench.kernels.stopwatch import Stopwatch
from ccbench.training.comm_stream import CommStream

# ------------------------------------------------------------ the communication thread


class RecordingCuda:
    """The torch.cuda calls CommStream makes, logged as (thread, call, objects)."""

    def __init__(self):
        self.log: list = []
        self.lock = threading.Lock()
        self.current: dict = {}  # thread -> its current stream (torch's is per thread)

    def note(self, *what):
        with self.lock:
            self.log.append((threading.current_thread().name, *what))

    def set_device(self, device):
        self.note("set_device", device)

    def Stream(self, device=None):  # noqa: N802 - torch.cuda's name
        cuda = self

        class Stream:
            def wait_event(self, event):
                cuda.note("wait_event", self, event)

            def synchronize(self):
                cuda.note("host waits for the device", self)

        return Stream()

    def Event(self):  # noqa: N802
        cuda = self

        class Event:
            def record(self, stream):
                cuda.note("record", self, stream)

            def synchronize(self):
                cuda.note("host waits for the device", self)

        return Event()

    def current_stream(self, device=None):
        name = threading.current_thread().name
        with self.lock:
            if name not in self.current:
                self.current[name] = self.Stream(device)
            return self.current[name]

    def stream(self, s):
        cuda, name = self, threading.current_thread().name

        class Context:
            def __enter__(self):
                self.before = cuda.current.get(name)
                cuda.current[name] = s

            def __exit__(self, *exc):
                cuda.current[name] = self.before

        return Context()

    def synchronize(self, device=None):
        self.note("host waits for the device", device)


def test_the_comm_thread_takes_the_device_and_orders_its_work_on_events():
    cuda = RecordingCuda()
    device = torch.device("cuda", 1)
    stream = CommStream(overlap=True, device=device, cuda=cuda)
    ran_on = []

    def collective():  # what the call sees as its current stream
        ran_on.append(cuda.current_stream(device))
        cuda.note("collective")
        return "reduced"

    try:
        caller = cuda.current_stream(device)
        ticket = stream.submit(collective, "allreduce")
        assert stream.wait(ticket) == "reduced"
    finally:
        stream.close()
    log = cuda.log
    steps = [entry[1] for entry in log]
    # the thread set the caller's device before anything else it did
    comm_thread = [e for e in log if e[0] == "ccbench-comm"]
    assert comm_thread[0][1:] == ("set_device", device)
    # on submission: an event recorded on the caller's stream, by the caller
    (ready,) = [e for e in log if e[1] == "record" and e[3] is caller]
    assert ready[0] == threading.current_thread().name
    ready_event = ready[2]
    # the comm stream waits for it before the call, which runs on the comm stream
    (side,) = {s for s in ran_on}
    assert side is not caller
    wait_ready = steps.index("wait_event")
    assert log[wait_ready][2] is side and log[wait_ready][3] is ready_event
    assert wait_ready < steps.index("collective")
    # after the call, its completion event on the comm stream; the caller's stream waits
    # for it (a stream wait, not the host)
    (done,) = [e for e in log if e[1] == "record" and e[3] is side]
    assert steps.index("collective") < log.index(done)
    (caller_waits,) = [e for e in log if e[1] == "wait_event" and e[2] is caller]
    assert caller_waits[3] is done[2] and log.index(done) < log.index(caller_waits)
    assert "host waits for the device" not in steps


def test_on_the_cpu_or_inline_the_thread_touches_no_cuda():
    cuda = RecordingCuda()
    for stream in (
        CommStream(overlap=True, device=torch.device("cpu"), cuda=cuda),
        CommStream(overlap=False, device=torch.device("cuda", 0), cuda=cuda),
    ):
        try:
            assert stream.wait(stream.submit(lambda: 7)) == 7
        finally:
            stream.close()
    assert cuda.log == []


def test_a_device_the_thread_cannot_take_fails_the_call_not_the_process():
    cuda = RecordingCuda()

    def refuse(device):
        raise RuntimeError("invalid device ordinal")

    cuda.set_device = refuse
    stream = CommStream(overlap=True, device=torch.device("cuda", 7), cuda=cuda)
    try:
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            stream.wait(stream.submit(lambda: 7))
    finally:
        stream.close()


# --------------------------------------------------------------- the time breakdown


class ReadCounter:
    """Event reads and creations of a backend, inside and outside the timed regions."""

    def __init__(self, backend, monkeypatch):
        self.reads_in_region = self.reads = self.created_in_region = 0
        event, elapsed, done = backend.event, backend.elapsed_s, backend.event_done

        def counted(fn, kind):
            def wrapper(*args):
                if kind == "create":
                    self.created_in_region += double.STATS.in_region
                else:
                    self.reads += 1
                    self.reads_in_region += double.STATS.in_region
                return fn(*args)

            return wrapper

        monkeypatch.setattr(backend, "event", counted(event, "create"))
        monkeypatch.setattr(backend, "elapsed_s", counted(elapsed, "read"))
        monkeypatch.setattr(backend, "event_done", counted(done, "read"))


def test_breakdown_events_are_read_after_each_timed_region_and_reused(monkeypatch):
    like = arrays.empty("double", 8, "float32")
    counter = ReadCounter(arrays.backend_of(like), monkeypatch)
    breakdown = pipeline.Breakdown(None, like)
    watch = Stopwatch("double")
    calls = 6
    watch.prepare(calls)

    def call():  # one timed collective: two encodes and a decode
        started = breakdown.start()
        for field in (pipeline.ENCODE, pipeline.ENCODE, pipeline.DECODE):
            breakdown.timed(field, lambda: None)
        breakdown.finish(started)

    for i in range(calls):
        watch.begin(i)
        call()
        watch.end(i)
        watch.settle()
    assert counter.reads > 0 and counter.reads_in_region == 0
    # events of the first call only were created inside a call; the others reuse them
    per_call = 2 + 2 * 3
    assert counter.created_in_region == per_call
    mean = breakdown.mean()
    rows = np.array(breakdown.rows)
    # every call resolved from its own events: call time present, pieces inside it
    assert (rows[:, pipeline.CALL] > 0).all()
    assert (rows[:, pipeline.CODEC_CPU] <= rows[:, pipeline.CALL]).all()
    np.testing.assert_allclose(
        rows[:, pipeline.CODEC_CPU], rows[:, pipeline.ENCODE] + rows[:, pipeline.DECODE]
    )
    assert mean[pipeline.CALL] == pytest.approx(rows[:, pipeline.CALL].mean())


# ------------------------------------------------------------- default process groups


def test_training_under_mpi_starts_a_gloo_default_group_on_a_gpu_model(monkeypatch):
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator
    from ccbench.training import comm_stream, frameworks, loop, rendezvous

    started, streams = [], []
    monkeypatch.setattr(
        rendezvous, "init_torch_distributed", lambda comm, backend=None: started.append(backend)
    )
    monkeypatch.setattr(
        comm_stream, "CommStream", lambda overlap, device: streams.append(device) or "stream"
    )
    monkeypatch.setattr(frameworks, "DDPTrainer", lambda *args: args)
    config = loop.TrainConfig(
        framework="ddp",
        variant="coll_compressed",
        compression=compression_of("fp16", variant="coll_compressed"),
    )
    cuda = torch.device("cuda", 0)
    loop._build_stream_trainer(Communicator(MPI.COMM_SELF), config, None, None, 0.1, None, cuda)
    assert started == ["gloo"] and streams == [cuda]
    # over torch.distributed: the communicator's own group (NCCL where it runs NCCL)
    torch_comm = types.SimpleNamespace(transport="torch", torch_backend="nccl")
    assert loop.default_group_backend(torch_comm) == "nccl"


class TwoRanksOneProcess:
    """An MPI communicator's allgather and bcast, as two ranks with this rank's values."""

    def allgather(self, value):
        return [value, value]

    def bcast(self, value, root=0):
        return value


def test_nccl_on_two_ranks_of_one_gpu_is_refused_before_nccl_starts(monkeypatch):
    started = []
    props = types.SimpleNamespace(uuid="GPU-0123")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: started.append(a))
    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    with pytest.raises(UsageError, match=r"ranks 0, 1 share one GPU .*NCCL_HOSTID"):
        comm_torch.init_default_group("nccl", 0, 2, 0, mpi_comm=TwoRanksOneProcess())
    assert started == []


def test_which_ranks_nccl_sees_on_one_gpu():
    gpu = "GPU-0123"
    comm_torch.refuse_shared_gpu(
        [("node1", "GPU-a"), ("node1", "GPU-b"), ("node2", "GPU-a"), ("node2", "GPU-b")]
    )
    comm_torch.refuse_shared_gpu([("ccb-r0", gpu), ("ccb-r1", gpu)])  # per-rank host ids
    with pytest.raises(UsageError, match="ranks 1, 3 share one GPU on node1"):
        comm_torch.refuse_shared_gpu(
            [("node1", "GPU-a"), ("node1", gpu), ("node2", gpu), ("node1", gpu)]
        )

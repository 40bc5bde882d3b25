"""The engine under the compressed rings: a call's time breakdown, MPI progress while the
codec works, and an optional codec thread.

A collective-level compressed call is a set of posted receives, each with a handler, and
queues of work: `wire` work produces bytes another rank waits for (encode and send,
forward), `local` work only fills this rank's result (decode). `Engine.run` polls the
receives (`Testsome`), runs wire work before local work, and waits, yielding the core,
only when nothing is ready. How MPI keeps moving bytes while the codec runs is an option:

* ``progress="chunk"``: MPI is entered between chunks only; a chunk's codec work runs
  start to finish (the first design).
* ``progress="testall"``: codec work is cut into sub-chunks of ``SUB_CHUNK_BYTES`` and
  ``Testall`` over the posted receives runs between them, so rendezvous hand-shakes and
  socket refills are served while a chunk is being encoded (codecs whose payload of a
  range is the concatenation of its pieces' payloads only; others run whole).
* ``codec_threads=1``: codec work runs in a worker thread (numpy and torch release the
  GIL inside their kernels) while the calling thread polls MPI every ``POLL_S``.

MPICH's own progress thread (``MPIR_CVAR_ASYNC_PROGRESS=1`` in the launch environment)
combines with any of them; `async_progress()` reports whether it is on. A rank with
nothing to do polls and yields its core (``wait="yield"``), or after SPIN_S sleeps
POLL_S between polls (``wait="sleep"``, the default: measured faster when ranks share
cores with each other and with other work).

Every call records its breakdown (`Breakdown`): wall time in encode, decode and reduce,
the time the rank waited with no codec work left to do (the wire), the codec's CPU time,
the time spent staging device buffers through host memory, and the call's wall time;
the rest is idle (bookkeeping, MPI calls, descheduling). On a device a host clock would
time kernel launches, not kernels: encode, decode, reduce and the call are then timed
by device events (read once the device has passed them, outside the timed calls),
`codec_cpu` is the codec kernels' device time, and the wait is the rest of the call.

The engine talks to its transport through the communicator (collectives/comm.py):
`testsome` and `testall` drive its progress, so it needs a transport whose requests can
be tested (MPI); over torch.distributed the pipelines run in posting order instead
(collectives/compressed_ordered.py).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque

import numpy as np

from ccbench.kernels import arrays, stopwatch
from ccbench.kernels.cuda_graph import capturing

PROGRESS_MODES = ("chunk", "testall")
WAIT_MODES = ("sleep", "yield")
DEFAULT_WAIT = "sleep"
DEFAULT_PROGRESS = "chunk"
SUB_CHUNK_BYTES = 512 << 10  # uncompressed bytes of codec work between two Testall calls
POLL_S = 50e-6  # a waiting rank's poll interval once it sleeps
SPIN_S = 200e-6  # how long a waiting rank polls without sleeping

# the breakdown's fields, per call, in seconds
FIELDS = ("call", "encode", "decode", "reduce", "wait", "codec_cpu", "stage")
CALL, ENCODE, DECODE, REDUCE, WAIT, CODEC_CPU, STAGE = range(len(FIELDS))


def async_progress() -> bool:
    """True when MPICH's asynchronous progress thread was asked for at launch."""
    return os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0").strip().lower() in (
        "1",
        "yes",
        "true",
        "on",
    )


def idle_wait(since: float, mode: str = DEFAULT_WAIT) -> None:
    """Between two polls of a rank with nothing to do: give the core away (ranks may
    outnumber cores). "sleep": after SPIN_S of waiting, sleep POLL_S instead of spinning,
    which leaves the core to the kernel's network work and to other ranks' codecs."""
    if mode == "sleep" and time.perf_counter() - since > SPIN_S:
        time.sleep(POLL_S)
    else:
        os.sched_yield()


UNSETTLED_CALLS = 256  # calls whose events may wait for a settle (none comes in training)


class Breakdown:
    """Per-call time records of one bound collective: one row of FIELDS per call.

    `comm` (optional) supplies the staging time; `like` (optional) an array whose backend,
    when a device, times the pieces with its events."""

    def __init__(self, comm=None, like=None):
        self.rows: list = []
        self._now = np.zeros(len(FIELDS))
        self._lock = threading.Lock()
        self.comm = comm
        backend = arrays.backend_of(like) if like is not None else None
        self.device = backend if backend is not None and backend.device else None
        self._spans: list = []  # this call's (field, start event, stop event)
        self._pending: list = []  # (row index, spans, call start, call stop)
        self._free: list = []  # events whose times have been read
        self._stage0 = 0.0
        self._call_start = None
        self._capture = False
        if self.device is not None:
            # the events are read after each timed region's settle, never inside a call;
            # they are reused from there on, so no call after the first creates any
            stopwatch.on_settle(self)

    def _event(self):
        return self._free.pop() if self._free else self.device.event()

    def settled(self) -> None:
        """The device has passed every recorded event (kernels/stopwatch.py, outside the
        timed region): read the finished calls' events and free them for reuse."""
        self._resolve(wait=False)

    def start(self) -> float:
        # a call being captured in a CUDA graph: events there would not time the replays
        self._capture = capturing()
        self._now = np.zeros(len(FIELDS))
        if self._capture:
            return time.perf_counter()
        self._stage0 = self.comm.stage_s if self.comm is not None else 0.0
        if self.device is not None:
            if len(self._pending) >= UNSETTLED_CALLS:  # nobody settles (training)
                self._resolve(wait=False)
            self._spans = []
            self._call_start = self._event()
            self._call_start.record()
        return time.perf_counter()

    def add(self, field: int, seconds: float, cpu: float = 0.0) -> None:
        with self._lock:  # the codec thread and the MPI thread both add
            self._now[field] += seconds
            self._now[CODEC_CPU] += cpu

    def timed(self, field: int, fn, *args):
        """fn(*args), its time added to `field` of the running call: wall and CPU time
        on the host, device events around it on a device."""
        if self._capture:
            return fn(*args)
        if self.device is not None and field != WAIT:  # the wait is what the rest leaves
            begin, end = self._event(), self._event()
            begin.record()
            out = fn(*args)
            end.record()
            self._spans.append((field, begin, end))
            return out
        if self.device is not None:
            return fn(*args)
        t0, c0 = time.perf_counter(), time.thread_time()
        out = fn(*args)
        self.add(field, time.perf_counter() - t0, time.thread_time() - c0)
        return out

    def finish(self, started: float) -> None:
        if self._capture:  # no row: the replays are timed by the harness alone
            return
        self._now[CALL] = time.perf_counter() - started
        if self.comm is not None:
            self._now[STAGE] = self.comm.stage_s - self._stage0
        self.rows.append(self._now)
        if self.device is not None:
            stop = self._event()
            stop.record()
            self._pending.append((len(self.rows) - 1, self._spans, self._call_start, stop))
            self._spans = []

    def _resolve(self, wait: bool) -> None:
        """Device times of the calls whose events the device has passed (all of them,
        after one declared wait, with `wait`); their events are reused."""
        if not self._pending:
            return
        if wait:
            with arrays.declared():
                self.device.synchronize()
        device, kept = self.device, []
        for index, spans, begin, stop in self._pending:
            if not wait and not device.event_done(stop):
                kept.append((index, spans, begin, stop))
                continue
            row = self.rows[index]
            row[ENCODE : REDUCE + 1] = 0.0
            for field, a, b in spans:
                row[field] += device.elapsed_s(a, b)
                self._free += [a, b]
            row[CALL] = device.elapsed_s(begin, stop)
            row[CODEC_CPU] = row[ENCODE] + row[DECODE] + row[REDUCE]
            row[WAIT] = max(0.0, row[CALL] - row[CODEC_CPU] - row[STAGE])
            self._free += [begin, stop]
        self._pending = kept

    def mean(self, first: int = 0, last: int | None = None) -> np.ndarray:
        """Mean per call of rows[first:last] (the timed calls), in seconds."""
        if self.device is not None:
            self._resolve(wait=True)
        rows = self.rows[first:last] or self.rows[-1:]
        if not rows:
            return np.zeros(len(FIELDS))
        return np.mean(rows, axis=0)

    def fastest(self, first: int = 0, last: int | None = None) -> np.ndarray:
        """Least value per field over rows[first:last] (the timed calls), in seconds: the
        codec floor takes the fastest call's codec time (costmodel.codec_floor_s)."""
        if self.device is not None:
            self._resolve(wait=True)
        rows = self.rows[first:last] or self.rows[-1:]
        if not rows:
            return np.zeros(len(FIELDS))
        return np.min(rows, axis=0)


def timed(breakdown: Breakdown, field: int, fn, *args):
    """fn(*args), its time added to `field` of the running call (Breakdown.timed)."""
    return breakdown.timed(field, fn, *args)


class _Worker:
    """One codec thread per process, shared by every bound collective (tasks run in the
    order they are given; one at a time)."""

    def __init__(self):
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = threading.Event()
        self.idle.set()
        self.error: BaseException | None = None
        threading.Thread(target=self._loop, name="codec", daemon=True).start()

    def _loop(self) -> None:
        while True:
            task = self.tasks.get()
            try:
                task()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the MPI thread
                self.error = exc
            self.idle.set()

    def submit(self, task) -> None:
        self.idle.clear()
        self.tasks.put(task)


_WORKER: _Worker | None = None


def worker() -> _Worker:
    global _WORKER
    if _WORKER is None:
        _WORKER = _Worker()
    return _WORKER


class Engine:
    """One call's receives, work queues and sends; `run` drives them to completion."""

    def __init__(
        self,
        comm,
        breakdown: Breakdown,
        codec_threads: int = 0,
        wait: str = DEFAULT_WAIT,
        side=None,
    ):
        self.comm = comm
        self.breakdown = breakdown
        self.threads = codec_threads
        self.wait = wait
        self.requests: list = []  # the transport's requests of the posted receives
        self.handlers: list = []
        self.done: list[bool] = []
        self.left = 0
        self.wire: deque = deque()  # arrivals' work whose result goes on the wire
        self.first: deque = deque()  # the rank's own encodes, after arrivals' work
        self.local: deque = deque()  # decodes into this rank's result
        self.sends: list = []
        self.outbox: deque = deque()  # sends prepared by the codec thread
        self.owner = threading.get_ident()
        # work of the caller's that runs where this call would wait (inline only): one
        # piece per call of side(), which says whether it found any
        self.side = None if codec_threads else side

    # set-up ------------------------------------------------------------------------

    def post(self, request, handler) -> None:
        """A posted receive; `handler()` runs in this thread when it has arrived."""
        self.requests.append(request)
        self.handlers.append(handler)
        self.done.append(False)
        self.left += 1

    def poke(self) -> None:
        """Drive MPI's progress engine between sub-chunks of codec work (inline only: with
        a codec thread the calling thread polls, and handlers stay in that thread)."""
        if not self.threads and self.left and self.comm.testall(self.requests):
            self._arrived(range(len(self.requests)))

    def send(self, post, *args) -> None:
        """`post(*args)` starts a send; from the codec thread it is handed to this one."""
        if self.threads and threading.get_ident() != self.owner:
            self.outbox.append((post, args))
        else:
            self.sends.append(post(*args))

    # the loop ----------------------------------------------------------------------

    def _arrived(self, indices) -> None:
        for i in sorted(indices):
            if self.done[i]:
                continue
            self.done[i] = True
            self.left -= 1
            self.handlers[i]()

    def poll(self) -> None:
        if self.left:
            indices = self.comm.testsome(self.requests)  # staged ones are copied in
            if indices:
                self._arrived(indices)

    def _next(self):
        for work in (self.wire, self.first, self.local):
            if work:
                return work.popleft()
        return None

    def _ready(self) -> bool:
        return bool(self.wire or self.first or self.local)

    def run(self) -> None:
        if self.threads:
            self._run_threaded()
        else:
            self._run_inline()
        self._finish_sends()

    def _run_inline(self) -> None:
        waited = 0.0
        while True:
            self.poll()
            task = self._next()
            if task is not None:
                task()
                continue
            if not self.left:
                break
            t0 = time.perf_counter()
            while self.left and not self._ready():
                self._idle(t0)
                self.poll()
            waited += time.perf_counter() - t0
        self.breakdown.add(WAIT, waited)

    def _idle(self, since: float) -> None:
        """Nothing of this call's to do: the caller's side work, else give the core away."""
        if self.side is None or not self.side():
            idle_wait(since, self.wait)

    def _run_threaded(self) -> None:
        pool = worker()
        waited = 0.0
        while True:
            self.poll()
            self._post_outbox()
            if pool.error is not None:
                error, pool.error = pool.error, None
                raise error
            if pool.idle.is_set():
                task = self._next()
                if task is not None:
                    pool.submit(task)
                    continue
                if not self.left:
                    break
                t0 = time.perf_counter()  # nothing to encode or decode: the wire
                pool.idle.wait(POLL_S)
                waited += time.perf_counter() - t0
            else:
                pool.idle.wait(POLL_S)
        self._post_outbox()
        self.breakdown.add(WAIT, waited)

    def _post_outbox(self) -> None:
        while self.outbox:
            send, args = self.outbox.popleft()
            self.sends.append(send(*args))

    def _finish_sends(self) -> None:
        t0 = time.perf_counter()
        while self.sends and not self.comm.testall(self.sends):
            self._idle(t0)
        self.breakdown.add(WAIT, time.perf_counter() - t0)


def splittable(codec, dtype: str, count: int) -> bool:
    """True when the payload of `count` values followed by more is the concatenation of
    their payloads (fixed size, linear in the count: every codec here at whole granules;
    checked, not assumed)."""
    if not codec.fixed_size or count % codec.granularity:
        return False
    one = codec.encoded_nbytes(count, dtype)
    return all(codec.encoded_nbytes(k * count, dtype) == k * one for k in (2, 3))


def sub_ranges(count: int, piece: int) -> list[tuple[int, int]]:
    """[0, count) in pieces of `piece` values (the last shorter)."""
    if piece <= 0 or piece >= count:
        return [(0, count)]
    return [(a, min(a + piece, count)) for a in range(0, count, piece)]

"""A sweep's progress: points and tasks done, failures, time left.

A tqdm-like bar on a terminal; one log line per finished task, and one a minute inside a
long task, when stderr is not a terminal (CI, SLURM output files). The time left comes
from measured task costs scaled by the host's load. Failed tasks' missing points are never
progress.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def host_load() -> float | None:
    """The host's 1-minute load average, None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def slowdown(load: float | None, cores: int) -> float:
    """How much longer a task takes at this load than on an idle host of these cores:
    each runnable process gets cores / load of a core once the load passes the cores."""
    if load is None or cores <= 0:
        return 1.0
    return max(1.0, load / cores)


# A heartbeat line inside a long task, at least this often, when stderr is not a terminal.
HEARTBEAT_S = 60.0


class Progress:
    """Points and tasks done, failures, time left: a tqdm bar on a terminal, and one log
    line per finished task when stderr is not a terminal (CI, SLURM output files), and a
    line at least once a minute while a long task runs.

    Time left: each task still to run at its cost on an idle host (what tasks of its kind
    took in this sweep, else what an earlier run of the same task took, recorded in the
    output folder, else the spec's cost_s, else the mean of every finished task), times
    the host's slowdown now (`slowdown`: the load average over the cores). A finished
    task's time is divided by the slowdown it ran at, so costs from a loaded host and from
    an idle one are comparable."""

    def __init__(
        self,
        total_points: int,
        total_tasks: int,
        stream=sys.stderr,
        plan: list[tuple[tuple, float | None]] | None = None,
        load=host_load,
        cores: int | None = None,
    ):
        from tqdm import tqdm

        self.total, self.tasks_total = total_points, total_tasks
        self.done = self.tasks_done = self.tasks_failed = 0
        self.measured = 0  # points measured by this process
        # (kind, idle-host seconds or None) of each task still to run, and the idle-host
        # seconds each finished task of a kind took
        self.plan = list(plan or [])
        self.took: dict[tuple, list[float]] = {}
        self.task_started: float | None = None
        self.task_slowdown = 1.0
        self.last_task: tuple[float, float] | None = None  # (seconds, slowdown) of the last
        self.load, self.cores = load, cores or os.cpu_count() or 1
        self.start = time.monotonic()
        self.stream = stream
        self.bar = tqdm(
            total=total_points,
            unit="point",
            file=stream,
            dynamic_ncols=True,
            disable=None,
            leave=True,
            desc="sweep",
        )
        self.tty = not self.bar.disable
        self.label = ""
        self._beat: threading.Event | None = None
        self._lock = threading.Lock()

    def slowdown_now(self) -> float:
        return slowdown(self.load(), self.cores)

    def _advance(self, points: int) -> None:
        points = max(0, min(points, self.total - self.done))
        self.done += points
        self.bar.update(points)  # a no-op when the bar is off

    def skipped(self, points: int) -> None:
        """Points found in the output already."""
        self._advance(points)

    def point(self) -> None:
        self.measured += 1
        self._advance(1)

    def task_started_now(self, heartbeat_s: float | None = HEARTBEAT_S) -> None:
        self.task_started = time.monotonic()
        self.task_slowdown = self.slowdown_now()
        if heartbeat_s:
            self._beat = threading.Event()
            threading.Thread(
                target=self._heartbeat, args=(self._beat, heartbeat_s), daemon=True
            ).start()

    def _heartbeat(self, stop: threading.Event, every: float) -> None:
        while not stop.wait(every):
            if self.tty:
                self.draw()
            else:
                self.write(self.line(running=True))

    def task_done(self, points_not_seen: int = 0, failed: bool = False) -> None:
        if self._beat is not None:
            self._beat.set()
            self._beat = None
        # sizes a variant skips (too small for the ranks) print no row
        self._advance(points_not_seen)
        if self.task_started is not None:
            seconds = time.monotonic() - self.task_started
            # the slowdown it ran at: the mean of the load at its start and its end
            factor = (self.task_slowdown + self.slowdown_now()) / 2
            self.last_task = (seconds, factor)
            if self.plan:
                kind, _ = self.plan.pop(0)
                self.took.setdefault(kind, []).append(seconds / factor)
            self.task_started = None
        self.tasks_done += 1
        self.tasks_failed += int(failed)
        self.draw(final=not self.tty)

    def seconds_left(self) -> float | None:
        """The tasks still to run, each at its idle-host cost (the class's docstring)
        times the slowdown now; less what the running task has spent, never below a
        tenth of its own estimate while it runs. None when nothing says."""
        finished = [t for times in self.took.values() for t in times]
        overall = sum(finished) / len(finished) if finished else None
        costs = []
        for kind, declared in self.plan:
            mine = self.took.get(kind)
            cost = sum(mine) / len(mine) if mine else declared if declared else overall
            if cost is None:
                return None
            costs.append(cost)
        factor = self.slowdown_now()
        total = sum(costs) * factor
        if self.task_started is not None and costs:
            running = costs[0] * factor
            spent = time.monotonic() - self.task_started
            total -= running - max(running - spent, 0.1 * running)
        return max(total, 0.0)

    def line(self, running: bool = False) -> str:
        elapsed = time.monotonic() - self.start
        seconds = self.seconds_left()
        left = "?" if seconds is None else _clock(seconds)
        failed = f", {self.tasks_failed} failed" if self.tasks_failed else ""
        load = self.load()
        host = (
            f" (load {load:.1f} on {self.cores} cores: tasks x{slowdown(load, self.cores):.1f})"
            if load is not None
            else ""
        )
        doing = ""
        if running and self.task_started is not None:
            doing = f"; running {_clock(time.monotonic() - self.task_started)}"
        return (
            f"sweep: {self.done}/{self.total} points, {self.tasks_done}/{self.tasks_total} "
            f"tasks{failed}, {_clock(elapsed)} elapsed, ~{left} left{host}  {self.label}{doing}"
        )

    def write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def draw(self, final: bool = False) -> None:
        if self.tty:
            failed = f", {self.tasks_failed} failed" if self.tasks_failed else ""
            seconds = self.seconds_left()
            left = "?" if seconds is None else _clock(seconds)
            self.bar.set_postfix_str(
                f"{self.tasks_done}/{self.tasks_total} tasks{failed}, ~{left} left {self.label}"
            )
        elif final:
            self.write(self.line())

    def close(self) -> None:
        if self._beat is not None:
            self._beat.set()
        self.bar.close()


class RowCounter:
    """Advances the bar once per new size in the OSU result lines (a variant with
    configurations prints several lines per size), at most once per size of the task."""

    def __init__(self, progress: Progress, sizes: int):
        self.progress, self.sizes, self.counted, self.last = progress, sizes, 0, None

    def __call__(self, size: str) -> None:
        if size != self.last and self.counted < self.sizes:
            self.last = size
            self.counted += 1
            self.progress.point()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


# Where a sweep keeps what each of its tasks took on an idle host (seconds divided by the
# slowdown they ran at), for the next run's estimate.
COSTS_FILE = ".task-costs.json"


def read_costs(folder) -> dict[str, float]:
    """slug -> idle-host seconds recorded by earlier runs into this output folder."""
    import json
    from pathlib import Path

    path = Path(folder) / COSTS_FILE
    try:
        costs = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in costs.items() if isinstance(v, (int, float)) and v > 0}


def record_cost(folder, slug: str, seconds: float, factor: float) -> None:
    import json
    from pathlib import Path

    costs = read_costs(folder)
    costs[slug] = round(seconds / max(factor, 1.0), 1)
    (Path(folder) / COSTS_FILE).write_text(json.dumps(costs, indent=1, sort_keys=True) + "\n")

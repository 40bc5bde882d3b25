"""A sweep's progress: points and tasks done, failures, time left.

A tqdm-like bar on a terminal; one log line per finished task when stderr is not a
terminal (CI, SLURM output files). Failed tasks' missing points are never progress.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """Points and tasks done, failures, time left: a tqdm bar on a terminal, and one log
    line per finished task when stderr is not a terminal (CI, SLURM output files)."""

    def __init__(
        self,
        total_points: int,
        total_tasks: int,
        stream=sys.stderr,
        plan: list[tuple[tuple, float | None]] | None = None,
    ):
        from tqdm import tqdm

        self.total, self.tasks_total = total_points, total_tasks
        self.done = self.tasks_done = self.tasks_failed = 0
        self.measured = 0  # points measured by this process
        # the time left comes from the tasks' costs: (kind, declared seconds or None) of
        # each task still to run, and the seconds each finished task of a kind took
        self.plan = list(plan or [])
        self.took: dict[tuple, list[float]] = {}
        self.task_started: float | None = None
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

    def task_started_now(self) -> None:
        self.task_started = time.monotonic()

    def task_done(self, points_not_seen: int = 0, failed: bool = False) -> None:
        # sizes a variant skips (too small for the ranks) print no row
        self._advance(points_not_seen)
        if self.plan and self.task_started is not None:
            kind, _ = self.plan.pop(0)
            self.took.setdefault(kind, []).append(time.monotonic() - self.task_started)
            self.task_started = None
        self.tasks_done += 1
        self.tasks_failed += int(failed)
        self.draw(final=not self.tty)

    def seconds_left(self) -> float | None:
        """The tasks still to run, each at the mean time of the tasks of its kind this
        sweep finished, else its declared cost, else the mean of every finished task;
        less what the running task has spent. None when nothing says."""
        finished = [t for times in self.took.values() for t in times]
        overall = sum(finished) / len(finished) if finished else None
        total = 0.0
        for kind, declared in self.plan:
            mine = self.took.get(kind)
            cost = sum(mine) / len(mine) if mine else declared if declared else overall
            if cost is None:
                return None
            total += cost
        if self.task_started is not None:
            total -= min(time.monotonic() - self.task_started, total)
        return max(total, 0.0)

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        seconds = self.seconds_left()
        left = "?" if seconds is None else _clock(seconds)
        failed = f", {self.tasks_failed} failed" if self.tasks_failed else ""
        return (
            f"sweep: {self.done}/{self.total} points, {self.tasks_done}/{self.tasks_total} "
            f"tasks{failed}, {_clock(elapsed)} elapsed, ~{left} left  {self.label}"
        )

    def draw(self, final: bool = False) -> None:
        if self.tty:
            failed = f", {self.tasks_failed} failed" if self.tasks_failed else ""
            seconds = self.seconds_left()
            left = "?" if seconds is None else _clock(seconds)
            self.bar.set_postfix_str(
                f"{self.tasks_done}/{self.tasks_total} tasks{failed}, ~{left} left {self.label}"
            )
        elif final:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
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

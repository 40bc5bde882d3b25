"""Training runs from their per-step rows: which steps are timed, means and t intervals.

benchmarks.training writes one row per step and summary rows (means over the timed
steps, after warm-up; the final loss over the last steps). The figures draw means and
intervals from the step rows themselves; the summary rows only tell how many steps were
warm-up and how many the final loss averages (the rows carry no column for either), and
where a run has no summary the training loop's defaults stand in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ccbench.benchmarks.results import TRAINING
from ccbench.benchmarks.statistics import time_interval
from ccbench.plots.base import newest_per, rows

RUN_KEYS = ("framework", "variant", "algorithm", "codec", "compress", "error_feedback")
SETTING_KEYS = ("model", "ranks", "link_gbps")
FRAMEWORK_ORDER = {"fsdp": 0, "ddp": 1, "mgwfbp": 2, "own": 3}


def recorded_windows(steps: pd.DataFrame) -> tuple[int, int]:
    """(warm-up steps, final-loss window) the rows record; rows of files that predate
    these columns had the training loop's then defaults (the results model's)."""
    implied = TRAINING.defaults[1]
    values = []
    for column in ("warmup_steps", "final_window"):
        given = (
            pd.to_numeric(steps[column], errors="coerce").dropna()
            if column in steps.columns
            else pd.Series(dtype=float)
        )
        values.append(int(given.iloc[0]) if not given.empty else int(implied[column]))
    return values[0], values[1]


def training_frame(data) -> pd.DataFrame:
    """Training rows with every key column present and text keys filled in."""
    frame = rows(data, "training")
    for column in RUN_KEYS + SETTING_KEYS + ("strategy", "run_id"):
        if column not in frame.columns:
            frame = frame.assign(**{column: ""})
    # files from before --framework: the compact trainer
    framework = frame["framework"].astype(object).fillna("").astype(str).replace("", "own")
    return frame.assign(
        link_gbps=pd.to_numeric(frame["link_gbps"], errors="coerce").fillna(0.0),
        framework=framework,
        strategy=frame["strategy"].astype(object).fillna("").astype(str),
        compress=frame["compress"].astype(object).fillna("").astype(str),
        error_feedback=pd.to_numeric(frame["error_feedback"], errors="coerce").fillna(0),
        run_id=frame["run_id"].astype(object).fillna("").astype(str),
    )


@dataclass
class Launch:
    """One training launch: its step rows (in step order) and summary rows."""

    key: tuple  # RUN_KEYS values
    setting: tuple  # SETTING_KEYS values
    steps: pd.DataFrame
    summaries: pd.DataFrame
    warmup: int  # steps left out of the timing
    window: int  # steps the final loss averages
    inferred: bool  # warmup and window read off the summary rows (else the defaults)

    @property
    def strategies(self) -> list[str]:
        """Strategies in the order the launch rotated them (MG-WFBP), else []."""
        named = self.steps["strategy"][self.steps["strategy"] != ""]
        return list(dict.fromkeys(named))

    def timed(self, strategy: str | None = None) -> pd.DataFrame:
        """The timed step rows (of one strategy's steps, if given), as the loop's own
        summary takes them: a strategy with no step after warm-up keeps all of its."""
        steps = self.steps
        mine = steps if strategy is None else steps[steps["strategy"] == strategy]
        timed = mine[mine["step"] > self.warmup]
        return timed if not timed.empty else mine

    def final_losses(self) -> np.ndarray:
        return self.steps["loss"].to_numpy(dtype=float)[-self.window :]


def launches(frame: pd.DataFrame) -> list[Launch]:
    """Every training launch in the rows, grouped by run_id (or by its settings for rows
    without one), in a stable order."""
    steps = frame[(frame["row"] == "step") & frame["step"].notna()]
    summaries = frame[frame["row"] == "summary"]
    by = ["run_id", *RUN_KEYS, *SETTING_KEYS]
    out = []
    for values, sub in steps.groupby(by, sort=True, dropna=False):
        values = dict(zip(by, values, strict=True))
        sub = newest_per(sub, ["step"]).sort_values("step")
        mine = summaries
        for column in by:
            mine = mine[mine[column].astype(str) == str(values[column])]
        warmup, window, inferred = infer_windows(sub, mine)
        out.append(
            Launch(
                tuple(values[k] for k in RUN_KEYS),
                tuple(values[k] for k in SETTING_KEYS),
                sub,
                mine,
                warmup,
                window,
                inferred,
            )
        )
    out.sort(key=lambda la: (FRAMEWORK_ORDER.get(la.key[0], 9), str(la.key), str(la.setting)))
    return out


def _close(a: float, b: float) -> bool:
    return bool(np.isfinite(a) and np.isfinite(b) and abs(a - b) <= 1e-6 * max(abs(b), 1e-12))


def infer_windows(steps: pd.DataFrame, summaries: pd.DataFrame) -> tuple[int, int, bool]:
    """(warm-up, final window) that reproduce the summary rows' step time and loss from
    the step rows; the loop's defaults when no summary row pins them down."""
    default_warmup, default_window = recorded_windows(steps)
    times = steps["step_us"].to_numpy(dtype=float)
    loss = steps["loss"].to_numpy(dtype=float)
    numbers = steps["step"].to_numpy(dtype=float)
    strategy = steps["strategy"].to_numpy(dtype=object)
    if summaries.empty:
        return default_warmup, default_window, False
    warmup = None
    for k in range(len(times)):
        good = True
        for _, summary in summaries.iterrows():
            mine = (
                (strategy == summary["strategy"])
                if summary["strategy"]
                else np.ones(len(times), dtype=bool)
            )
            chosen = mine & (numbers > k)
            if not chosen.any():
                chosen = mine
            if not chosen.any() or not _close(times[chosen].mean(), float(summary["step_us"])):
                good = False
                break
        if good:
            warmup = k
            break
    target = float(summaries["loss"].iloc[0])
    window = next((w for w in range(1, len(loss) + 1) if _close(loss[-w:].mean(), target)), None)
    if warmup is None or window is None:
        return default_warmup, default_window, False
    return warmup, window, True


def interval(values) -> tuple[float, float, float, int]:
    """(mean, low, high, n): the 95% t interval of the mean of the values."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.nan, np.nan, np.nan, 0
    mean, low, high = time_interval(values)
    return mean, low, high, int(values.size)

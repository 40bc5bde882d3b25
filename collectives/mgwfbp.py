"""MG-WFBP planner: which gradients to merge into one allreduce (pure functions, no torch).

Conventions. A profile lists the model's gradient tensors in *backward order* (index 0
is the first gradient produced by backward, i.e. the last layer of the forward pass).
``backward_us[i]`` is the time between gradient i-1 and gradient i becoming ready
(gradient 0: from the start of backward), so gradient i is ready at
``ready_us[i] = sum(backward_us[:i+1])``. A plan cuts the tensors into contiguous groups,
given by their stop indices (the last stop is L). Each group is allreduced once, on one
communication stream, as soon as its last tensor is ready and the previous group is done:

    start[k] = max(end[k-1], ready[stop_k - 1]);   end[k] = start[k] + alpha + beta * bytes_k

Iteration time = forward + backward + non-overlapped communication, with
non-overlapped = end[last] - backward (Shi, Chu and Li, MG-WFBP, TPDS 2021).

Strategies (``parse_strategy`` reads their spec strings):

- ``wfbp``          one allreduce per tensor, launched as soon as it is ready.
- ``single``        one allreduce of every gradient after backward.
- ``fixed:BYTES``   Horovod-style fusion: tensors are packed in backward order into a
                    buffer of at most BYTES; a tensor that would overflow it starts the next
                    one (default 64MB; Horovod's cycle time is not modelled).
- ``ddp:BYTES``     PyTorch DDP buckets: a bucket is closed once it holds >= its cap; the
                    first bucket's cap is min(1 MiB, BYTES), as DDP's default (default 25MB).
- ``mgwfbp``        the greedy merge rule of MG-WFBP.
- ``optimal``       the exact optimum over contiguous groups under the same model (dynamic
                    programming), to measure how far the greedy rule is from the best plan.

Sizes take binary multiples: ``64MB`` = ``64MiB`` = 64 * 2**20 bytes (Horovod and DDP
count that way).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ccbench.collectives.costmodel import AlphaBeta
from ccbench.kernels.errors import UsageError
from ccbench.kernels.units import parse_size

DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_STRATEGIES = ("wfbp", "single", "fixed:64MB", "ddp:25MB", "mgwfbp", "optimal")

# Profile CSV, one row per gradient tensor in backward order (written by
# ccbench.scripts.profile_layers, read here so the planner and simulator need no torch).
PROFILE_COLUMNS = (
    "model",
    "order",
    "param",
    "shape",
    "numel",
    "dtype",
    "bytes",
    "backward_us",
    "ready_us",
    "forward_us",
    "batch",
    "width",
    "device",
    "iterations",
)


# ---------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """Per-tensor gradient sizes and backward times of one model, in backward order."""

    model: str
    params: tuple[str, ...]
    nbytes: np.ndarray  # int64, bytes of each gradient
    backward_us: np.ndarray  # float64, time from the previous gradient to this one
    forward_us: float = 0.0

    def __post_init__(self):
        n = len(self.params)
        if n == 0:
            raise UsageError(f"profile of {self.model!r} has no tensors")
        if self.nbytes.shape != (n,) or self.backward_us.shape != (n,):
            raise ValueError("profile arrays must have one entry per tensor")
        if np.any(self.nbytes < 0) or np.any(self.backward_us < 0):
            raise UsageError(f"profile of {self.model!r} has negative sizes or times")

    @property
    def ntensors(self) -> int:
        return len(self.params)

    @property
    def ready_us(self) -> np.ndarray:
        return np.cumsum(self.backward_us)

    @property
    def total_backward_us(self) -> float:
        return float(self.backward_us.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    @classmethod
    def from_arrays(cls, model, nbytes, backward_us, forward_us=0.0, params=None):
        nbytes = np.asarray(nbytes, dtype=np.int64)
        if params is None:
            params = tuple(f"t{i}" for i in range(nbytes.size))
        return cls(
            model,
            tuple(params),
            nbytes,
            np.asarray(backward_us, dtype=np.float64),
            float(forward_us),
        )


def read_profile(path) -> Profile:
    """Read a profile CSV (``PROFILE_COLUMNS``); rows are sorted by ``order``."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no profile at {path}; make one with ccbench profile")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    missing = {"order", "param", "bytes", "backward_us"} - set(rows[0] if rows else ())
    if missing:
        raise UsageError(f"{path} is not a layer profile (missing {', '.join(sorted(missing))})")
    rows.sort(key=lambda r: int(r["order"]))
    return Profile(
        model=rows[0].get("model") or path.stem,
        params=tuple(r["param"] for r in rows),
        nbytes=np.array([int(r["bytes"]) for r in rows], dtype=np.int64),
        backward_us=np.array([float(r["backward_us"]) for r in rows], dtype=np.float64),
        forward_us=float(rows[0].get("forward_us") or 0.0),
    )


# ---------------------------------------------------------------- strategy specs


def parse_bytes(text: str) -> int:
    """A merge threshold: a size as every size option reads it, at least 1 byte."""
    value = parse_size(text)
    if value < 1:
        raise UsageError(f"bad size {text!r}: must be at least 1 byte")
    return value


def format_bytes(n: int) -> str:
    for unit, shift in (("GB", 30), ("MB", 20), ("KB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


@dataclass(frozen=True)
class Strategy:
    kind: str  # wfbp | single | fixed | ddp | mgwfbp | optimal
    nbytes: int | None = None  # threshold of fixed / ddp

    @property
    def label(self) -> str:
        return self.kind if self.nbytes is None else f"{self.kind}:{format_bytes(self.nbytes)}"


_THRESHOLD_DEFAULTS = {"fixed": 64 << 20, "ddp": 25 << 20}
_PLAIN = ("wfbp", "single", "mgwfbp", "optimal")


def parse_strategy(spec: str) -> Strategy:
    """One strategy spec: wfbp | single | mgwfbp | optimal | fixed[:BYTES] | ddp[:BYTES]."""
    kind, sep, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind in _PLAIN:
        if sep:
            raise UsageError(f"strategy {kind!r} takes no argument (got {spec!r})")
        return Strategy(kind)
    if kind in _THRESHOLD_DEFAULTS:
        return Strategy(kind, parse_bytes(arg) if sep else _THRESHOLD_DEFAULTS[kind])
    raise UsageError(
        f"unknown strategy {spec!r}; choose from wfbp, single, fixed:BYTES, "
        "ddp:BYTES, mgwfbp, optimal (or all)"
    )


def parse_strategies(text: str) -> list[Strategy]:
    """Comma-separated specs; ``all`` is the default list. Duplicates are dropped."""
    specs = [s for s in text.split(",") if s.strip()]
    if not specs:
        raise UsageError("no strategy given")
    out: list[Strategy] = []
    for spec in specs:
        for s in DEFAULT_STRATEGIES if spec.strip().lower() == "all" else (spec,):
            strategy = parse_strategy(s)
            if strategy not in out:
                out.append(strategy)
    return out


# ---------------------------------------------------------------- timeline


@dataclass(frozen=True)
class Plan:
    """Groups of one strategy and their predicted timeline (times from backward start)."""

    strategy: str
    stops: tuple[int, ...]  # group k holds tensors stops[k-1] .. stops[k]-1 (backward order)
    group_bytes: np.ndarray
    ready_us: np.ndarray  # when each group's last tensor is ready
    start_us: np.ndarray  # when its allreduce starts
    end_us: np.ndarray  # when its allreduce ends
    forward_us: float
    backward_us: float

    @property
    def ngroups(self) -> int:
        return len(self.stops)

    @property
    def groups(self) -> list[tuple[int, int]]:
        """(start, stop) index ranges in backward order."""
        return list(zip((0,) + self.stops[:-1], self.stops, strict=True))

    @property
    def nonoverlapped_us(self) -> float:
        return max(0.0, float(self.end_us[-1]) - self.backward_us)

    @property
    def iteration_us(self) -> float:
        return self.forward_us + self.backward_us + self.nonoverlapped_us

    @property
    def stops_text(self) -> str:
        """Stops joined by spaces, e.g. ``"3 10 161"`` (for CSV and comparisons)."""
        return " ".join(map(str, self.stops))


def group_sizes(nbytes: np.ndarray, stops) -> np.ndarray:
    edges = np.concatenate(([0], np.cumsum(nbytes)))
    stops = np.asarray(stops, dtype=np.int64)
    return edges[stops] - edges[np.concatenate(([0], stops[:-1]))]


def comm_timeline(ready_us, durations_us):
    """Start and end of serial communications: ``start[k] = max(end[k-1], ready[k])``."""
    ready = np.asarray(ready_us, dtype=np.float64)
    durations = np.asarray(durations_us, dtype=np.float64)
    start, end = np.empty_like(durations), np.empty_like(durations)
    previous = 0.0
    for k in range(durations.size):
        start[k] = max(previous, ready[k])
        end[k] = previous = start[k] + durations[k]
    return start, end


def evaluate(profile: Profile, cost: AlphaBeta, stops, strategy: str = "custom") -> Plan:
    """Timeline of a grouping (stops strictly increasing, last stop = number of tensors)."""
    stops = tuple(int(s) for s in stops)
    if (
        not stops
        or stops[-1] != profile.ntensors
        or any(b <= a for a, b in zip((0,) + stops[:-1], stops, strict=True))
    ):
        raise ValueError(f"stops {stops} do not partition {profile.ntensors} tensors")
    sizes = group_sizes(profile.nbytes, stops)
    ready = profile.ready_us[np.asarray(stops) - 1]
    start, end = comm_timeline(ready, cost.time_us(sizes))
    return Plan(
        strategy, stops, sizes, ready, start, end, profile.forward_us, profile.total_backward_us
    )


# ---------------------------------------------------------------- strategies (stops)


def wfbp_stops(profile: Profile) -> list[int]:
    return list(range(1, profile.ntensors + 1))


def single_stops(profile: Profile) -> list[int]:
    return [profile.ntensors]


def fixed_stops(profile: Profile, threshold: int) -> list[int]:
    """Horovod-style fusion buffer of ``threshold`` bytes, filled in backward order."""
    stops, filled = [], 0
    for i, n in enumerate(profile.nbytes.tolist()):
        if filled and filled + n > threshold:
            stops.append(i)
            filled = 0
        filled += n
    return stops + [profile.ntensors]


def ddp_stops(
    profile: Profile, bucket_cap: int, first_bucket_cap: int = DDP_FIRST_BUCKET_BYTES
) -> list[int]:
    """DDP's ``compute_bucket_assignment_by_size``: close a bucket once it reaches its cap."""
    cap, stops, filled = min(first_bucket_cap, bucket_cap), [], 0
    for i, n in enumerate(profile.nbytes.tolist()):
        filled += n
        if filled >= cap:
            stops.append(i + 1)
            filled, cap = 0, bucket_cap
    if not stops or stops[-1] != profile.ntensors:
        stops.append(profile.ntensors)
    return stops


def mgwfbp_stops(profile: Profile, cost: AlphaBeta) -> list[int]:
    """MG-WFBP's greedy rule, walking backward order from the first gradient produced.

    Tensor i+1 joins the current group when it is ready before the group's allreduce
    would have started plus alpha (``tau_b[l-1] + tb[l-1] < tau_c[l] + alpha``): either the
    group could not have started yet, or waiting costs less than the start-up it saves.
    A merge moves the group's start to the new tensor's ready time (sizes add).
    """
    ready = profile.ready_us.tolist()
    nbytes = profile.nbytes.tolist()
    stops: list[int] = []
    prev_end = 0.0  # end of the last closed group's allreduce
    start, size = max(prev_end, ready[0]), nbytes[0]
    for i in range(1, profile.ntensors):
        if ready[i] < start + cost.alpha_us:
            start, size = max(prev_end, ready[i]), size + nbytes[i]
        else:
            stops.append(i)
            prev_end = start + float(cost.time_us(size))
            start, size = max(prev_end, ready[i]), nbytes[i]
    return stops + [profile.ntensors]


def optimal_stops(profile: Profile, cost: AlphaBeta) -> list[int]:
    """Exact minimum of the last allreduce's end over all contiguous groupings.

    best[j] = min over i <= j of  max(best[i-1], ready[j]) + cost(bytes[i..j]);
    correct because a group's end is non-decreasing in the previous group's end. O(L^2).
    """
    n = profile.ntensors
    ready = profile.ready_us
    edges = np.concatenate(([0], np.cumsum(profile.nbytes)))
    best = np.zeros(n + 1)  # best[j+1]: earliest end of tensors 0..j
    first = np.zeros(n, dtype=np.int64)  # first tensor of the last group in that optimum
    for j in range(n):
        ends = np.maximum(best[: j + 1], ready[j]) + cost.time_us(edges[j + 1] - edges[: j + 1])
        i = int(np.argmin(ends))  # ties: the largest group (fewest allreduces)
        best[j + 1], first[j] = ends[i], i
    stops, j = [], n
    while j > 0:
        stops.append(j)
        j = int(first[j - 1])
    return stops[::-1]


def plan(strategy: Strategy | str, profile: Profile, cost: AlphaBeta) -> Plan:
    """Groups and predicted timeline of one strategy under the cost model."""
    if isinstance(strategy, str):
        strategy = parse_strategy(strategy)
    if strategy.kind == "wfbp":
        stops = wfbp_stops(profile)
    elif strategy.kind == "single":
        stops = single_stops(profile)
    elif strategy.kind == "fixed":
        stops = fixed_stops(profile, strategy.nbytes)
    elif strategy.kind == "ddp":
        stops = ddp_stops(profile, strategy.nbytes)
    elif strategy.kind == "mgwfbp":
        stops = mgwfbp_stops(profile, cost)
    elif strategy.kind == "optimal":
        stops = optimal_stops(profile, cost)
    else:
        raise UsageError(f"unknown strategy {strategy.kind!r}")
    return evaluate(profile, cost, stops, strategy.label)


# ---------------------------------------------------------------- result rows


def plan_columns(p: Plan, cost: AlphaBeta) -> dict:
    """The result-row columns that describe one plan and its prediction."""
    return {
        "strategy": p.strategy,
        "predicted_us": round(p.iteration_us, 3),
        "forward_us": round(p.forward_us, 3),
        "backward_us": round(p.backward_us, 3),
        "nonoverlapped_us": round(p.nonoverlapped_us, 3),
        "groups": p.ngroups,
        "plan": p.stops_text,
        "tensors": p.stops[-1],
        "total_bytes": int(p.group_bytes.sum()),
        "comm_us": round(float(np.sum(p.end_us - p.start_us)), 3),
        "alpha_us": cost.alpha_us,
        "beta_us_per_byte": cost.beta_us_per_byte,
    }

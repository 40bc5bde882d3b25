"""The registry of variants: every name a variant has, and what each floor needs to know of
it, defined once.

A *variant* is a way of moving a collective's bytes that ccbench times: a benchmark
script under benchmarks/ (`ccbench NAME`), or `torch`, torch.distributed's own
collectives, which only training and trace replay carry gradients through. Plain data:
this module imports nothing of ccbench, so every floor may read it. Adding a variant adds
one `VariantInfo` here (docs/architecture.md, "Adding a variant").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VariantInfo:
    name: str
    label: str  # what figures' legends call it
    kind: str  # its short name in figures' bars and claims ("p2p", "coll")
    order: int  # where its series and bars stand in figures (lower first)
    description: str = ""  # one line for `ccbench list`
    needs_mpi: bool = True  # started under mpiexec / srun (False: one process)
    harness: bool = False  # a sized benchmark whose rows the harness driver builds
    command: bool = True  # `ccbench NAME` runs benchmarks/NAME.py
    # training and trace replay may carry gradients through it (their --variant)
    carries_gradients: bool = False
    # the compressed schedule it runs (collectives.compressed): "p2p", "coll", or None
    schedule: str | None = None
    # the algorithm its training / replay rows name; None: the run's own --algorithm
    gradient_algorithm: str | None = "ring"
    sized: bool = True  # sweeps message sizes (-m); False: rows of its own schema, no -m
    rows: str = ""  # the schema kind of the rows it writes (benchmarks/results.py)

    @property
    def compressed(self) -> bool:
        """Whether it needs a codec (and takes one of ccbench's)."""
        return self.schedule is not None


BASELINE = "baseline"
TORCH = "torch"

REGISTRY = (
    VariantInfo(
        "baseline",
        "baseline",
        "baseline",
        0,
        "the MPI library's collectives, and the same ring by hand",
        harness=True,
        carries_gradients=True,
        gradient_algorithm=None,
        rows="harness",
    ),
    # torch.distributed's own collectives: a --variant of training and replay, no script
    VariantInfo(
        "torch",
        "torch",
        "torch",
        1,
        command=False,
        carries_gradients=True,
        gradient_algorithm="torch",
        sized=False,
    ),
    VariantInfo(
        "p2p_compressed",
        "p2p compressed",
        "p2p",
        2,
        "ring collectives compressing and decompressing at every hop",
        harness=True,
        carries_gradients=True,
        schedule="p2p",
        rows="harness",
    ),
    VariantInfo(
        "coll_compressed",
        "collective compressed",
        "coll",
        3,
        "compress once, forward compressed bytes, pipelined (seed 000)",
        harness=True,
        carries_gradients=True,
        schedule="coll",
        rows="harness",
    ),
    VariantInfo(
        "sparse_streaming",
        "sparse streaming",
        "sparse",
        4,
        "OmniReduce: non-zero blocks streamed through aggregators (seed 001)",
        harness=True,
        carries_gradients=True,
        gradient_algorithm="omnireduce",
        rows="harness",
    ),
    VariantInfo(
        "merged_gradient",
        "merged_gradient",
        "mgwfbp",
        5,
        "MG-WFBP: layer gradients merged into optimal allreduces (seed 002)",
        sized=False,
        rows="mgwfbp",
    ),
    VariantInfo(
        "training",
        "training",
        "training",
        6,
        "sharded data-parallel training over the compressed collectives",
        sized=False,
        rows="training",
    ),
    VariantInfo(
        "trace_replay",
        "trace_replay",
        "replay",
        7,
        "a training step's collectives (a trace) replayed through any variant and codec",
        sized=False,
        rows="replay",
    ),
    VariantInfo(
        "codec_throughput",
        "codec_throughput",
        "codec",
        8,
        "encode / decode throughput of every codec against a copy",
        needs_mpi=False,
        rows="codec",
    ),
    VariantInfo(
        "overhead",
        "overhead",
        "overhead",
        9,
        "the harness's per-call cost against a bare loop and OSU's C loop",
    ),
    VariantInfo(
        "staging_bound",
        "staging_bound",
        "staging",
        10,
        "staged device allgather against its pinned copies and host MPI",
    ),
)

BY_NAME = {v.name: v for v in REGISTRY}
NAMES = tuple(BY_NAME)
# `ccbench NAME` runs these (benchmarks/NAME.py)
COMMANDS = tuple(v.name for v in REGISTRY if v.command)
# sized benchmarks whose rows the harness driver builds
HARNESS_VARIANTS = tuple(v.name for v in REGISTRY if v.harness)
# training's and trace replay's --variant: ccbench's, then torch.distributed's own
GRADIENT_VARIANTS = (*(v.name for v in REGISTRY if v.carries_gradients and v.command), TORCH)
# the compressed variants, and the compact sharded trainer's (the baseline and those)
COMPRESSED = tuple(v.name for v in REGISTRY if v.compressed)
SHARDED_VARIANTS = (BASELINE, *COMPRESSED)
# benchmarks without message sizes (no -m; rows of their own schema)
UNSIZED = tuple(v.name for v in REGISTRY if v.command and not v.sized)


def info(name: str) -> VariantInfo | None:
    """The registry's entry for `name`, or None for a name it does not hold."""
    return BY_NAME.get(name)


def label(name: str) -> str:
    """A legend's name for the variant (its own name when the registry does not hold it)."""
    found = BY_NAME.get(name)
    return found.label if found else str(name)


def kind(name: str) -> str:
    """The variant's short name ("p2p", "coll")."""
    return BY_NAME[name].kind


def schedule(name: str) -> str | None:
    """The compressed schedule the variant runs, or None for an uncompressed one."""
    found = BY_NAME.get(name)
    return found.schedule if found else None


def order(name: str, unknown: int = 99) -> int:
    """Where the variant stands in figures; `unknown` for names the registry lacks."""
    found = BY_NAME.get(name)
    return found.order if found else unknown


def needs_mpi(name: str) -> bool:
    return BY_NAME[name].needs_mpi


def rows_kind(name: str) -> str:
    """The kind of the rows the variant writes ("" for a name the registry lacks)."""
    found = BY_NAME.get(name)
    return found.rows if found else ""


def gradient_algorithm(name: str, chosen: str | None) -> str | None:
    """The algorithm a training or replay row of the variant names: the baseline's is the
    run's own --algorithm (`chosen`), the others' their own ("ring" for the compressed)."""
    found = BY_NAME.get(name)
    if found is None:
        return "ring"
    return chosen if found.gradient_algorithm is None else found.gradient_algorithm

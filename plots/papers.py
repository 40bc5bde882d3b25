"""The papers' numbers that figures and the headline table quote, and the plots' defaults.

Every number the plots print next to a measurement comes from here (cited in
docs/references.md); defaults that belong to a benchmark are read from the module that
defines them, never copied.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    key: str  # "seed 000"
    short: str  # how captions name it
    title: str


PAPERS = {
    "seed 000": Paper(
        "seed 000",
        "compression-assisted Allgather/Reduce-Scatter (IEEE, 2023)",
        "Accelerating Distributed Deep Learning Training with Compression "
        "Assisted Allgather and Reduce-Scatter Communication",
    ),
    "seed 001": Paper(
        "seed 001",
        "OmniReduce (Fei et al., SIGCOMM 2021)",
        "Efficient sparse collective communication and its application to "
        "accelerate distributed deep learning",
    ),
    "seed 002": Paper(
        "seed 002",
        "MG-WFBP (Shi, Chu, Li, TPDS 2021)",
        "MG-WFBP: Merging gradients wisely for efficient communication in "
        "distributed deep learning",
    ),
}


@dataclass(frozen=True)
class Claim:
    """One number a paper states, as the headline table shows it."""

    paper: str
    text: str  # what is claimed, in the headline table's words
    value: str  # the paper's number, as written in docs/references.md
    source: str  # "abstract" or where in the paper
    # the paper's number as B/A of times (1 - the saving), where it states one for the
    # pair measured here; None for a claim without a number
    ratio: float | None = None
    # why a measurement here cannot reproduce or refute the number ("" when it can)
    not_comparable: str = ""


CLAIMS = {
    "allgather_vs_baseline": Claim(
        "seed 000",
        "Allgather latency, collective-level compression vs the uncompressed baseline",
        "up to 83.6% lower",
        "abstract",
        1 - 0.836,
    ),
    "allgather_vs_p2p": Claim(
        "seed 000",
        "Allgather latency, collective-level vs point-to-point compression",
        "up to 30.3% lower",
        "abstract",
        1 - 0.303,
    ),
    "reduce_scatter_vs_baseline": Claim(
        "seed 000",
        "Reduce-Scatter latency, collective-level compression vs the uncompressed baseline",
        "up to 88.1% lower",
        "abstract",
        1 - 0.881,
    ),
    "reduce_scatter_vs_p2p": Claim(
        "seed 000",
        "Reduce-Scatter latency, collective-level vs point-to-point compression",
        "up to 40.6% lower",
        "abstract",
        1 - 0.406,
    ),
    "training_vs_baseline": Claim(
        "seed 000",
        "FSDP training time, collective-level compression vs the baseline",
        "31.7% faster",
        "abstract",
        1 - 0.317,
    ),
    "training_vs_p2p": Claim(
        "seed 000",
        "FSDP training time, collective-level vs point-to-point compression",
        "up to 12.5% faster",
        "abstract",
        1 - 0.125,
    ),
    "omnireduce_speedup": Claim(
        "seed 001",
        "OmniReduce allreduce against dense allreduce",
        "1.4-2.9x at 100 Gbps for network-bottlenecked DNNs; up to 8.2x faster training "
        "(end-to-end, not a micro-benchmark)",
        "abstract",
        not_comparable="the paper's speed-ups are end-to-end training at 100 Gbps, this is "
        "one allreduce on the link named; the trend is what compares",
    ),
    "mgwfbp_fastest": Claim(
        "seed 002",
        "MG-WFBP iteration time against the other merge strategies",
        "much better scaling performance than existing methods",
        "abstract",
    ),
}

# Seed 001's micro-benchmark setup (the paper's evaluation, not its abstract).
OMNIREDUCE_BLOCK_SIZE = 256
# Seed 002's trace-based simulation range (abstract).
MGWFBP_SIMULATED_GPUS = (4, 2048)


# The configuration seed 001's figures hold when rows were run with several: the paper's
# setup where it states one (256-element blocks, lossless, blocks chosen at random per
# rank, aggregators beside the workers), and otherwise the sparse-streaming benchmark's
# usual settings. A value absent from the rows gives way to their most common one.
OMNIREDUCE_SETUP = {
    "block_size": OMNIREDUCE_BLOCK_SIZE,
    "threshold": 0.0,
    "overlap": "random",
    "aggregators": 0,
    "fusion": 1024,
    "protocol": "request-driven",
    "slots": 2,
    "window": 4,
    "streams": 2,
}

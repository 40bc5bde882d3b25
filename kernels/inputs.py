"""Benchmark input values, made in one place: synthetic kinds and the real-data corpus.

A data kind is a short spec string (the `--data` option); `parse_data_kind` checks it
and gives its canonical spelling, which the CSV's `data` column records. `values` makes
the input of one rank: deterministic in its arguments, different on every rank (as the
ranks of a data-parallel job hold different gradients).

Synthetic kinds:

- ``exact``: integers in [-a, a], a = ``vocabulary.exact_amplitude(ranks)``, so every
  sum over the ranks is exact in every dtype and summation order (validation);
- ``normal``: standard normal values;
- ``gradient-like``: normal values times a log-normal scale per 4096 values;
- ``sparse:D``: exactly round(D x blocks) non-zero blocks of 256 per rank, chosen at
  random per rank, exactly summable values (``kernels/sparse_data.py``).

Corpus kinds read tensors that ``ccbench corpus`` captured while training the
project's own models (``scripts/corpus.py``): ``grad:MODEL[:PHASE]``,
``weights:MODEL[:PHASE]``, ``act:MODEL[:PHASE]``, PHASE one of early, middle, late;
without a phase every captured phase, latest first. Aliases: ``gradient``,
``weights`` and ``activations`` are those of the corpus's language model (``gradient``
is ``grad:lm-small``, the default real kind). The corpus is found in ``$CCBENCH_CORPUS``,
else ``results/corpus`` under the current directory. Corpus values are float32, the
captured values exactly; synthetic ones float64 (``sparse`` float32). The seed does not
change corpus values (the corpus has its own, in its manifest).

How a corpus kind fills ``count`` values on rank r of P (``fill_note`` says which rule
applied): docs/data.md, "How a corpus kind fills `count` values".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ccbench.kernels import switches
from ccbench.kernels.errors import UsageError
from ccbench.kernels.sparse_data import sparse_input
from ccbench.kernels.vocabulary import exact_amplitude

CORPUS_ENV = "CCBENCH_CORPUS"
DEFAULT_CORPUS = "results/corpus"
BUILD_COMMAND = "ccbench corpus"
MANIFEST = "manifest.json"
CORPUS_FORMAT = 1

SYNTHETIC = ("exact", "normal", "gradient-like")
TENSORS = ("grad", "weights", "act")
PHASES = ("early", "middle", "late")
ALIASES = {"gradient": "grad", "weights": "weights", "activations": "act"}
SPARSE_BLOCK = 256  # elements per block of `sparse:D` (OmniReduce's block)
GRADIENT_SCALE_BLOCK = 4096  # values sharing one scale in `gradient-like`

DATA_KINDS = (
    "exact (integers; validation), normal, gradient-like (normal x a scale per 4096 "
    "values), sparse:D (block-sparse, D in [0, 1]); from the corpus (ccbench corpus): "
    "gradient, weights, activations (of its language model), grad:MODEL[:PHASE], "
    "weights:MODEL[:PHASE], act:MODEL[:PHASE], PHASE early|middle|late"
)

# seed streams of the synthetic kinds (exact and gradient-like keep the harness's seeding)
_NORMAL = 1


@dataclass(frozen=True)
class CorpusItem:
    """One float32 tensor of the corpus (a flat .npy file)."""

    path: Path
    count: int
    phase: str
    rank: int | None  # simulated rank; None for weights (the same on every rank)


@dataclass(frozen=True)
class DataKind:
    spec: str  # canonical spelling, for the CSV's `data` column
    family: str  # exact, normal, gradient-like, sparse, corpus
    is_gradient: bool  # the cosine-similarity metric applies
    density: float | None = None
    items: tuple[CorpusItem, ...] = field(default=(), repr=False)
    sim_ranks: int = 0

    @property
    def from_corpus(self) -> bool:
        return self.family == "corpus"

    def fill_note(self, count: int, rank: int, ranks: int) -> str | None:
        """None when rank's `count` values are its own distinct data, else how they are filled."""
        if not self.from_corpus:
            return None
        total = sum(item.count for item in self.items)
        if self.items[0].rank is None:  # weights: shards of one sequence
            if ranks * count <= total:
                return None
            if ranks == 1:
                return f"{self.spec}: {count} values exceed the {total} captured; they repeat"
            return (
                f"{self.spec}: {ranks} x {count} values exceed the {total} captured; "
                "shards wrap round and overlap"
            )
        if rank >= self.sim_ranks:
            return (
                f"{self.spec}: rank {rank} reuses simulated rank {rank % self.sim_ranks}'s "
                f"tensors, rotated (the corpus has {self.sim_ranks} simulated ranks)"
            )
        own = sum(
            item.count for item in self.items if item.rank is not None and item.rank % ranks == rank
        )
        if count <= own:
            return None
        if count <= total:
            return (
                f"{self.spec}: rank {rank} holds {own} values of its own; the rest of "
                f"{count} come from other simulated ranks' tensors"
            )
        return (
            f"{self.spec}: {count} values exceed the corpus's {total}; "
            f"rank {rank}'s sequence repeats"
        )


# Parsing -----------------------------------------------------------------------------------


def corpus_root() -> Path:
    return Path(switches.current().corpus or DEFAULT_CORPUS)


def corpus_built() -> bool:
    """Whether a corpus has been built where corpus kinds look for it."""
    return (corpus_root() / MANIFEST).is_file()


def _unknown(spec: str) -> UsageError:
    return UsageError(f"unknown data kind {spec!r}; use {DATA_KINDS}")


def parse_data_kind(spec: str) -> DataKind:
    """The DataKind of a spec string; UsageError (one line) if unknown or not available."""
    text = spec.strip()
    if text in SYNTHETIC:
        return DataKind(text, text, is_gradient=text == "gradient-like")
    if text.startswith("sparse:"):
        value = text.split(":", 1)[1]
        try:
            density = float(value)
        except ValueError:
            raise UsageError(f"data kind {spec!r}: density {value!r} is not a number") from None
        if not 0.0 <= density <= 1.0:
            raise UsageError(f"data kind {spec!r}: density must be in [0, 1]")
        return DataKind(f"sparse:{density:g}", "sparse", is_gradient=True, density=density)
    parts = text.split(":")
    if parts[0] in ALIASES and len(parts) == 1:
        return _corpus_kind(spec, ALIASES[parts[0]], None, None)
    if parts[0] not in TENSORS or not 2 <= len(parts) <= 3 or not parts[1]:
        raise _unknown(spec)
    phase = parts[2] if len(parts) == 3 else None
    if phase is not None and phase not in PHASES:
        raise UsageError(f"data kind {spec!r}: phase must be one of {', '.join(PHASES)}")
    return _corpus_kind(spec, parts[0], parts[1], phase)


def _corpus_kind(spec: str, tensor: str, model: str | None, phase: str | None) -> DataKind:
    root = corpus_root()
    manifest = load_manifest(root, spec)
    if model is None:
        model = manifest.get("language_model")
        if not model:
            raise UsageError(f"data kind {spec!r}: the corpus at {root} names no language model")
    phases = [phase] if phase else list(reversed(PHASES))  # latest first
    chosen = [
        t
        for t in manifest["tensors"]
        if t["model"] == model
        and t["tensor"] == tensor
        and t["dtype"] == "float32"
        and t["phase"] in phases
    ]
    if not chosen:
        held = sorted({f"{t['tensor']}:{t['model']}:{t['phase']}" for t in manifest["tensors"]})
        raise UsageError(
            f"data kind {spec!r}: the corpus at {root} holds none; it has {', '.join(held)}"
        )
    chosen.sort(
        key=lambda t: (phases.index(t["phase"]), t["rank"] if t["rank"] is not None else -1)
    )
    items = tuple(
        CorpusItem(root / t["file"], int(t["count"]), t["phase"], t["rank"]) for t in chosen
    )
    canonical = f"{tensor}:{model}" + (f":{phase}" if phase else "")
    return DataKind(
        canonical,
        "corpus",
        is_gradient=tensor == "grad",
        items=items,
        sim_ranks=int(manifest["recipe"]["ranks"]),
    )


_MANIFESTS: dict[Path, tuple[float, dict]] = {}


def load_manifest(root: Path, spec: str = "gradient") -> dict:
    """The corpus manifest at `root` (cached by modification time)."""
    path = root / MANIFEST
    try:
        mtime = path.stat().st_mtime
    except OSError:
        raise UsageError(
            f"data kind {spec!r} needs the real-data corpus, not found at "
            f"{root} (${CORPUS_ENV}); build it with: {BUILD_COMMAND}"
        ) from None
    cached = _MANIFESTS.get(path)
    if cached and cached[0] == mtime:
        return cached[1]
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"corpus manifest {path} is unreadable ({exc}); rebuild it with: "
            f"{BUILD_COMMAND} --force"
        ) from None
    if manifest.get("format") != CORPUS_FORMAT:
        raise UsageError(
            f"corpus at {root} has format {manifest.get('format')}, this ccbench "
            f"reads {CORPUS_FORMAT}; rebuild it with: {BUILD_COMMAND} --force"
        )
    _MANIFESTS[path] = (mtime, manifest)
    return manifest


# Values ------------------------------------------------------------------------------------


def values(kind: DataKind | str, count: int, rank: int, ranks: int, seed: int = 0) -> np.ndarray:
    """The input of `rank` (of `ranks`): `count` values of the kind (see the module doc)."""
    if isinstance(kind, str):
        kind = parse_data_kind(kind)
    if kind.family == "exact":
        amplitude = exact_amplitude(ranks)
        rng = np.random.default_rng([seed, rank, count])
        return rng.integers(-amplitude, amplitude + 1, count).astype(np.float64)
    if kind.family == "gradient-like":
        rng = np.random.default_rng([seed, rank, count])
        blocks = max(1, count // GRADIENT_SCALE_BLOCK + 1)
        scale = np.exp(rng.normal(-6.0, 1.0, size=blocks))
        noise = rng.standard_normal(count)
        return noise * np.repeat(scale, GRADIENT_SCALE_BLOCK)[:count]
    if kind.family == "normal":
        return np.random.default_rng([seed, rank, count, _NORMAL]).standard_normal(count)
    if kind.family == "sparse":
        return sparse_input(count, SPARSE_BLOCK, kind.density, "random", rank, ranks, seed)
    return _corpus_values(kind, count, rank, ranks)


def _corpus_values(kind: DataKind, count: int, rank: int, ranks: int) -> np.ndarray:
    items = kind.items
    if items[0].rank is None:  # weights: the shard at rank x count of one sequence
        start = rank * count
        sequence = list(items)
    else:
        sims = kind.sim_ranks
        if rank < sims:
            own = [s for s in range(rank, sims, ranks)]
            rest = [s for s in (*range(rank + 1, sims), *range(rank)) if s not in own]
            start = 0
        else:
            own, rest = [rank % sims], [s for s in range(sims) if s != rank % sims]
        sequence = [item for s in (*own, *rest) for item in items if item.rank == s]
        if rank >= sims:
            length = sum(item.count for item in sequence)
            laps = -(-ranks // sims)
            start = (rank // sims) * (length // laps)
    return _take(sequence, start, count)


def _take(sequence: list[CorpusItem], start: int, count: int) -> np.ndarray:
    """`count` values of the items laid end to end from `start`, repeating if need be."""
    total = sum(item.count for item in sequence)
    out = np.empty(count, dtype=np.float32)
    position, filled = start % total if total else 0, 0
    while filled < count:
        offset = 0
        for item in sequence:
            if filled == count:
                break
            if position >= offset + item.count:
                offset += item.count
                continue
            lo = position - offset
            n = min(item.count - lo, count - filled)
            out[filled : filled + n] = _load(item)[lo : lo + n]
            filled += n
            position += n
            offset += item.count
        position = 0  # the next lap starts from the first item
    return out


def _load(item: CorpusItem) -> np.ndarray:
    try:
        data = np.load(item.path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"corpus file {item.path} is unreadable ({exc}); rebuild it with: "
            f"{BUILD_COMMAND} --force"
        ) from None
    if data.dtype != np.float32 or data.shape != (item.count,):
        raise UsageError(
            f"corpus file {item.path} holds {data.dtype} {data.shape}, the "
            f"manifest says float32 ({item.count},); rebuild it with: "
            f"{BUILD_COMMAND} --force"
        )
    return data

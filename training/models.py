"""Small real models and data for the training benchmark, with no downloads.

Two tasks, each a model plus a dataset and a deterministic batch sampler:

- ``lm-*``: a byte-level causal transformer language model trained on the Python
  standard library's own top-level source files, read at run time (every tenth file,
  in sorted order, is held out).
- ``digits-*``: a small CNN or MLP on scikit-learn's 8x8 handwritten digits (the
  dataset ships inside the scikit-learn wheel); 20% held out with a fixed split.

Batches: at step ``s`` the *global* batch is drawn from ``numpy.random.default_rng((seed,
s))`` and each rank takes its contiguous slice, so the samples a step sees do not depend
on the number of ranks, and sharded training can be compared with one process.
"""

from __future__ import annotations

import hashlib
import math
import pathlib
import sysconfig
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ccbench.kernels.errors import UsageError

# --------------------------------------------------------------------------- models


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, width // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class TransformerBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPTDecoder(nn.Module):
    """GPT-2's decoder: token and learned position embeddings, pre-LN blocks, final
    LayerNorm, output head tied to the token embedding. The training benchmark's
    language model is one over bytes (vocabulary 256); traces build GPT-2's own sizes."""

    def __init__(self, width: int, depth: int, heads: int, context: int, vocab: int = 256):
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(TransformerBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        # GPT-2's init: with the tied head, default N(0, 1) embeddings give huge logits.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.token.weight.T


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int = 256):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


# --------------------------------------------------------------------------- data


def stdlib_source_files() -> list[pathlib.Path]:
    """The standard library's top-level ``*.py`` files, sorted by name."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if len(files) < 10:
        raise UsageError(f"too few standard-library sources found under {root}")
    return files


def load_stdlib_corpus() -> tuple[np.ndarray, np.ndarray, str]:
    """(train bytes, held-out bytes, sha256 prefix of the whole corpus); every tenth file
    is held out, so held-out text comes from modules the model never saw."""
    train, held_out = [], []
    digest = hashlib.sha256()
    for index, path in enumerate(stdlib_source_files()):
        data = path.read_bytes()
        digest.update(data)
        (held_out if index % 10 == 9 else train).append(data)
    return _bytes_array(train), _bytes_array(held_out), digest.hexdigest()[:12]


def _bytes_array(parts: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits as float32 images in [0, 1]: (x_train, y_train, x_test, y_test)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UsageError(
            "the digits models need scikit-learn (pip install scikit-learn); "
            "the lm-* models need nothing extra"
        ) from None
    digits = load_digits()
    images = (digits.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))  # fixed split, any seed
    cut = round(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return images[train], labels[train], images[test], labels[test]


# --------------------------------------------------------------------------- tasks


@dataclass
class Metrics:
    """Sums over a set of samples (so ranks can add them up)."""

    loss_sum: float
    correct: int
    count: int


class Task:
    """A model, its data and its loss.  Subclasses fill the hooks."""

    name = ""
    unit = "samples"  # what throughput counts: samples or tokens
    dataset = ""
    default_batch = 32  # global batch (samples per step, over all ranks)
    default_lr = 1e-3

    def build_model(self) -> nn.Module:
        raise NotImplementedError

    def batch(self, seed: int, step: int, global_batch: int, lo: int, hi: int):
        """Samples lo..hi of the global batch of ``step`` as (inputs, targets)."""
        raise NotImplementedError

    def units_per_sample(self) -> int:
        return 1

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def held_out_size(self) -> int:
        raise NotImplementedError

    def held_out_batch(self, lo: int, hi: int):
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model: nn.Module, lo: int, hi: int, chunk: int = 64) -> Metrics:
        """Summed loss and correct predictions over held-out samples lo..hi."""
        total = Metrics(0.0, 0, 0)
        device = next(model.parameters()).device
        for start in range(lo, hi, chunk):
            inputs, targets = self.held_out_batch(start, min(hi, start + chunk))
            inputs, targets = inputs.to(device), targets.to(device)
            logits = model(inputs)
            logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
            total.loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            total.correct += int((logits.argmax(-1) == targets).sum())
            total.count += int(targets.numel())
        return total


class StdlibLM(Task):
    unit = "tokens"
    default_lr = 1e-3

    def __init__(self, name, width, depth, heads, context, batch, held_out_windows=256):
        self.name, self.width, self.depth, self.heads = name, width, depth, heads
        self.context, self.default_batch = context, batch
        self.train_bytes, held_out, digest = load_stdlib_corpus()
        self.dataset = f"stdlib-source:{len(self.train_bytes)}+{len(held_out)}B:sha256={digest}"
        # Held out: evenly spaced windows over modules never trained on.
        span = len(held_out) - context - 1
        starts = np.linspace(0, span, held_out_windows).astype(np.int64)
        self.held_out = self._windows(held_out, starts)

    def build_model(self) -> nn.Module:
        return GPTDecoder(self.width, self.depth, self.heads, self.context)

    def units_per_sample(self) -> int:
        return self.context

    def _windows(self, data: np.ndarray, starts: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(data[starts[:, None] + np.arange(self.context + 1)]).long()

    def batch(self, seed, step, global_batch, lo, hi):
        rng = np.random.default_rng((seed, step))
        starts = rng.integers(0, len(self.train_bytes) - self.context - 1, size=global_batch)
        windows = self._windows(self.train_bytes, starts[lo:hi])
        return windows[:, :-1], windows[:, 1:]

    def held_out_size(self) -> int:
        return len(self.held_out)

    def held_out_batch(self, lo, hi):
        windows = self.held_out[lo:hi]
        return windows[:, :-1], windows[:, 1:]


class Digits(Task):
    default_lr = 2e-3

    def __init__(self, name, model_class, batch=64):
        self.name, self.model_class, self.default_batch = name, model_class, batch
        self.x_train, self.y_train, x_test, y_test = load_digits_split()
        self.dataset = f"sklearn-digits:{len(self.y_train)}+{len(y_test)}"
        self.x_test, self.y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    def build_model(self) -> nn.Module:
        return self.model_class()

    def batch(self, seed, step, global_batch, lo, hi):
        rng = np.random.default_rng((seed, step))
        picks = rng.integers(0, len(self.y_train), size=global_batch)[lo:hi]
        return torch.from_numpy(self.x_train[picks]), torch.from_numpy(self.y_train[picks])

    def held_out_size(self) -> int:
        return len(self.y_test)

    def held_out_batch(self, lo, hi):
        return self.x_test[lo:hi], self.y_test[lo:hi]


# name -> (constructor, one-line description); tasks load their data lazily.
MODELS = {
    "lm-small": (
        lambda: StdlibLM("lm-small", width=256, depth=4, heads=4, context=64, batch=16),
        "byte-level transformer LM, 4 layers x 256 wide (3.2M params), stdlib source",
    ),
    "lm-tiny": (
        lambda: StdlibLM("lm-tiny", width=64, depth=2, heads=2, context=32, batch=16),
        "byte-level transformer LM, 2 layers x 64 wide (0.1M params), stdlib source",
    ),
    "digits-cnn": (
        lambda: Digits("digits-cnn", DigitsCNN),
        "2-conv CNN on scikit-learn digits (0.07M params)",
    ),
    "digits-mlp": (
        lambda: Digits("digits-mlp", DigitsMLP),
        "3-layer MLP on scikit-learn digits (0.09M params)",
    ),
}
DEFAULT_MODEL = "lm-small"


def make_task(name: str) -> Task:
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name][0]()


def build_model(task: Task, seed: int) -> nn.Module:
    """The task's model with weights drawn from ``seed`` (same on every rank)."""
    torch.manual_seed(seed)
    return task.build_model()


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def perplexity(mean_loss: float) -> float:
    return math.exp(min(mean_loss, 50.0))

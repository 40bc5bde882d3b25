"""The models whose gradients MG-WFBP merges, defined here with torch (no downloads).

Each keeps the real layer structure (and so the real number and order of gradient
tensors) of its namesake; ``width`` scales the channel / hidden widths so a CPU can
profile it in seconds (``width=1`` is the published size). Inputs are seeded synthetic
batches: only the shapes matter for gradient sizes and backward times.

- ``resnet50``: ResNet-50 v1.5 (bottlenecks [3, 4, 6, 3], BatchNorm), 161 tensors.
- ``vgg16``: VGG-16 (13 conv + 3 fully connected layers, no BatchNorm), 32 tensors.
- ``bert``: BERT-base encoder (12 post-LN layers, separate query/key/value, 12 heads,
  vocabulary 30522, pooler and a 2-class head), 201 tensors.
- ``lstm``: the 2-layer LSTM word language model of Zaremba et al. (PTB vocabulary of
  10000, 650 units, untied decoder), 10 tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ccbench.kernels.errors import UsageError


def _scaled(n: int, width: float, multiple: int = 1) -> int:
    return max(multiple, int(round(n * width / multiple)) * multiple)


# ---------------------------------------------------------------- ResNet-50


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # v1.5: stride here
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        base = _scaled(64, width)
        self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        stages, inplanes = [], base
        for i, blocks in enumerate((3, 4, 6, 3)):
            planes = base * 2**i
            layers = []
            for b in range(blocks):
                layers.append(Bottleneck(inplanes, planes, 2 if b == 0 and i > 0 else 1))
                inplanes = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------------- VGG-16

VGG16_LAYOUT = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
)


class VGG16(nn.Module):
    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        layers, channels = [], 3
        for item in VGG16_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                out = _scaled(item, width)
                layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU(inplace=True)]
                channels = out
        self.features = nn.Sequential(*layers)
        hidden = _scaled(4096, width)
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 7)  # as torchvision: any input size
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------- BERT-base encoder


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def forward(self, x):
        batch, seq, hidden = x.shape

        def split(t):
            return t.view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x))
        )
        return y.transpose(1, 2).reshape(batch, seq, hidden)


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        x = self.attention_norm(x + self.attention_output(self.attention(x)))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BertEncoder(nn.Module):
    """BERT-base: 12 layers, 12 heads, hidden 768 and FFN 3072 at width 1."""

    def __init__(
        self,
        width: float = 1.0,
        layers: int = 12,
        heads: int = 12,
        vocab: int = 30522,
        max_positions: int = 512,
        num_classes: int = 2,
    ):
        super().__init__()
        hidden = _scaled(768, width, heads)
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, 4 * hidden) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = (
            self.word_embeddings(tokens)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(torch.zeros_like(tokens))
        )
        x = self.embedding_norm(x)
        for layer in self.layers:
            x = layer(x)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


# ---------------------------------------------------------------- LSTM language model


class LSTMLanguageModel(nn.Module):
    """Zaremba et al.'s medium PTB model: 2 layers of 650 units at width 1."""

    def __init__(self, width: float = 1.0, vocab: int = 10000, layers: int = 2):
        super().__init__()
        hidden = _scaled(650, width)
        self.encoder = nn.Embedding(vocab, hidden)
        self.rnn = nn.LSTM(hidden, hidden, layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        y, _ = self.rnn(self.encoder(tokens))
        return self.decoder(y)


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model and a seeded batch for it, with CPU-friendly defaults."""

    build: Callable[[float], nn.Module]
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    width: float  # default width multiplier (1 = published size)
    batch: int  # default batch size
    description: str


def _image_batch(resolution: int, classes: int = 1000):
    def make(batch: int, gen: torch.Generator):
        x = torch.randn(batch, 3, resolution, resolution, generator=gen)
        return x, torch.randint(0, classes, (batch,), generator=gen)

    return make


def _token_batch(seq: int, vocab: int, classes: int | None):
    def make(batch: int, gen: torch.Generator):
        tokens = torch.randint(0, vocab, (batch, seq), generator=gen)
        if classes is None:  # language model: predict every next token
            return tokens, torch.randint(0, vocab, (batch, seq), generator=gen)
        return tokens, torch.randint(0, classes, (batch,), generator=gen)

    return make


MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec(
        ResNet50, _image_batch(64), 0.25, 16, "ResNet-50, 161 tensors, 64x64 images"
    ),
    "vgg16": ModelSpec(VGG16, _image_batch(32), 0.25, 16, "VGG-16, 32 tensors, 32x32 images"),
    "bert": ModelSpec(
        BertEncoder,
        _token_batch(64, 30522, 2),
        0.25,
        8,
        "BERT-base encoder, 201 tensors, 64 tokens",
    ),
    "lstm": ModelSpec(
        LSTMLanguageModel,
        _token_batch(35, 10000, None),
        0.5,
        20,
        "2-layer LSTM language model, 10 tensors, 35 steps",
    ),
}


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; choose from {', '.join(MODELS)}") from None


def loss_of(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's output (per token for the language model)."""
    out = model(inputs)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))

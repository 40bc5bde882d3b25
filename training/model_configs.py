"""Well-known transformer architectures from their published configurations, for traces.

Only the shapes matter: ``ccbench trace build`` constructs these on PyTorch's meta
device (no weights are allocated) and counts their FLOPs there. The configurations are
written here from the published ones (nothing is downloaded):

- ``gpt2-small`` / ``gpt2-medium``: GPT-2 (Radford et al., 2019), the configurations
  OpenAI released with the weights (Hugging Face ``gpt2`` / ``gpt2-medium``
  ``config.json``): 12 layers x 768 / 24 x 1024, 12 / 16 heads, vocabulary 50257,
  context 1024, pre-LayerNorm blocks with a 4x GELU MLP, learned positions, the output
  head tied to the token embedding (124M / 355M parameters).
- ``llama-1b``: Llama 3.2 1B (Meta, 2024; its ``config.json``): 16 layers x 2048, 32
  query heads sharing 8 key-value heads, SwiGLU MLP of 8192, vocabulary 128256, RMSNorm,
  rotary positions, head tied to the embedding (1.24B parameters).
- ``llama-7b``: Llama 2 7B (Touvron et al., 2023; its ``config.json``): 32 layers x
  4096, 32 heads, SwiGLU MLP of 11008, vocabulary 32000, context 4096, untied head
  (6.74B parameters).

Rotary embeddings have no parameters and few FLOPs; they are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ccbench.training.models import GPTDecoder


@dataclass(frozen=True)
class TransformerConfig:
    name: str
    family: str  # "gpt2" or "llama"
    layers: int
    width: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    context: int
    tied: bool  # output head tied to the token embedding
    sequence: int  # default training sequence of a built trace
    published: str  # what the numbers are read from (docs/traces.md cites it)


CONFIGS = {
    "gpt2-small": TransformerConfig(
        "gpt2-small",
        "gpt2",
        12,
        768,
        12,
        12,
        3072,
        50257,
        1024,
        True,
        1024,
        "GPT-2 small (OpenAI, 2019): gpt2 config.json",
    ),
    "gpt2-medium": TransformerConfig(
        "gpt2-medium",
        "gpt2",
        24,
        1024,
        16,
        16,
        4096,
        50257,
        1024,
        True,
        1024,
        "GPT-2 medium (OpenAI, 2019): gpt2-medium config.json",
    ),
    "llama-1b": TransformerConfig(
        "llama-1b",
        "llama",
        16,
        2048,
        32,
        8,
        8192,
        128256,
        131072,
        True,
        2048,
        "Llama 3.2 1B (Meta, 2024): config.json",
    ),
    "llama-7b": TransformerConfig(
        "llama-7b",
        "llama",
        32,
        4096,
        32,
        32,
        11008,
        32000,
        4096,
        False,
        4096,
        "Llama 2 7B (Meta, 2023): config.json",
    ),
}


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaAttention(nn.Module):
    """Grouped-query attention without biases (rotary positions left out)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head = c.heads, c.kv_heads, c.width // c.heads
        self.q_proj = nn.Linear(c.width, c.heads * self.head, bias=False)
        self.k_proj = nn.Linear(c.width, c.kv_heads * self.head, bias=False)
        self.v_proj = nn.Linear(c.width, c.kv_heads * self.head, bias=False)
        self.o_proj = nn.Linear(c.heads * self.head, c.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head).transpose(1, 2)
        if self.kv_heads != self.heads:  # each key-value head serves a group of queries
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, -1))


class LlamaBlock(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.width)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = RMSNorm(c.width)
        self.gate_proj = nn.Linear(c.width, c.ffn, bias=False)
        self.up_proj = nn.Linear(c.width, c.ffn, bias=False)
        self.down_proj = nn.Linear(c.ffn, c.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.width)
        self.layers = nn.ModuleList(LlamaBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.width)
        self.lm_head = None if c.tied else nn.Linear(c.width, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return x @ self.embed_tokens.weight.T if self.lm_head is None else self.lm_head(x)


def build(config: TransformerConfig) -> nn.Module:
    if config.family == "gpt2":
        return GPTDecoder(config.width, config.layers, config.heads, config.context, config.vocab)
    return Llama(config)


def sparse_embedding(model: nn.Module) -> tuple[str, int] | None:
    """(parameter name, vocabulary) of the input embedding whose gradient is sparse (a
    step touches only the rows of the tokens it saw), or None when the head is tied to
    it (the head's gradient fills every row)."""
    if isinstance(model, Llama) and model.lm_head is not None:
        return "embed_tokens.weight", model.embed_tokens.num_embeddings
    return None

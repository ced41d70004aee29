"""A small causal language model written the way Hugging Face models are, for the fast-init tests.

It reproduces each pattern that breaks naive meta-device initialisation: input and output
embeddings tied (one ``nn.Parameter``), a rotary buffer computed in ``__init__``
(``inv_freq``, not persistent), a GPT-2 ``Conv1D`` and a Llama ``RMSNorm`` without
``reset_parameters``, and a model-level ``_init_weights(module)`` applied by ``post_init``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import fullshard

VOCAB, DIM, LAYERS, SEQ = 96, 32, 3, 12


class RMSNorm(nn.Module):
    """Llama's norm: its weight is set in ``__init__`` only (no ``reset_parameters``)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Conv1D(nn.Module):
    """GPT-2's transposed linear layer: initialised in ``__init__``, no ``reset_parameters``."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)


class Rotary(nn.Module):
    """Rotary position embedding: a buffer computed in ``__init__``, owning no parameter."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.size(1), dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)
        cos, sin = freqs.cos()[None], freqs.sin()[None]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.rotary = Rotary(dim)
        self.qkv = Conv1D(3 * dim, dim)
        self.proj = Conv1D(dim, dim)
        self.norm2 = RMSNorm(dim)
        self.fc = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k = self.rotary(q), self.rotary(k)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn)
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class TinyLM(nn.Module):
    """The "transformers" model: ``post_init`` applies ``_init_weights`` and ties the embeddings."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.post_init()

    def post_init(self) -> None:
        self.apply(self._init_weights)
        self.lm_head.weight = self.embed.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | Conv1D):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            module.weight.data.fill_(1.0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


class LMModule(fullshard.Module):
    """Trains :class:`TinyLM`; ``scaled_init``: GPT-2's residual scaling as an ``init_weights`` override."""

    def __init__(self, scaled_init: bool = False) -> None:
        super().__init__()
        self.scaled_init = scaled_init
        self.model: TinyLM | None = None

    def configure_model(self) -> None:
        if self.model is None:
            self.model = TinyLM()

    def init_weights(self, module: nn.Module) -> None:
        if self.scaled_init and isinstance(module, Block):
            nn.init.normal_(module.proj.weight, std=0.02 / (2 * LAYERS) ** 0.5)
            nn.init.normal_(module.out.weight, std=0.02 / (2 * LAYERS) ** 0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.model is not None
        return self.model(ids)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        return self(ids)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def token_data(n: int = 32) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(7)
    return torch.utils.data.TensorDataset(torch.randint(0, VOCAB, (n, SEQ), generator=g))

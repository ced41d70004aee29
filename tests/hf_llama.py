"""A tiny Llama written as transformers writes it, with its tensor-parallel plan where transformers keeps one.

As in transformers 5 (checked against 5.24's ``LlamaConfig``, ``LlamaForCausalLM`` and
``distributed/mixin.py``): the config class carries ``base_model_tp_plan`` (keys relative to the
base model, ``*`` for the layer number), the head class ``_tp_plan = {"lm_head":
"colwise_gather_output"}``, both models ``base_model_prefix = "model"`` and a ``base_model``
property. Attention reshapes with ``view(*shape, -1, head_dim)`` as transformers' does since 4.48;
``legacy_attention=True`` gives the older form that reshapes with ``self.num_heads`` and
``self.num_key_value_heads``. Grouped-query attention (fewer key/value heads than query heads),
rotary embeddings with an ``inv_freq`` buffer, ``RMSNorm`` and SwiGLU MLPs as in Llama.
No dependency on transformers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hf_patterns import RMSNorm


class TinyLlamaConfig:
    model_type = "llama"
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(self, **kwargs: Any) -> None:
        self.vocab_size = 64
        self.hidden_size = 32
        self.intermediate_size = 48
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_key_value_heads = 2
        self.tie_word_embeddings = False
        self.legacy_attention = False
        for key, value in kwargs.items():
            if not hasattr(self, key):
                raise TypeError(f"TinyLlamaConfig has no {key!r}")
            setattr(self, key, value)
        self.head_dim = self.hidden_size // self.num_attention_heads


class RotaryEmbedding(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)

    def shape(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        return x.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, position: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = (
            self.shape(self.q_proj(x), "q"),
            self.shape(self.k_proj(x), "kv"),
            self.shape(self.v_proj(x), "kv"),
        )
        q, k = rotate(q, *position), rotate(k, *position)
        k = k.repeat_interleave(self.num_key_value_groups, dim=1)
        v = v.repeat_interleave(self.num_key_value_groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


class LegacyLlamaAttention(LlamaAttention):
    """transformers before 4.48: reshapes by the head counts it holds."""

    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__(config)
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads

    def shape(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        heads = self.num_heads if kind == "q" else self.num_key_value_heads
        return x.view(x.shape[0], x.shape[1], heads, self.head_dim).transpose(1, 2)


class LlamaMLP(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.config = config  # as transformers' MLPs hold it: not an attention module for all that
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size)
        attention = LegacyLlamaAttention if config.legacy_attention else LlamaAttention
        self.self_attn = attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, position: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), position)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlamaPreTrainedModel(nn.Module):
    base_model_prefix = "model"
    _tp_plan: dict[str, str] | None = None

    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.config = config

    @property
    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix, self)  # type: ignore[no-any-return]


class TinyLlamaModel(TinyLlamaPreTrainedModel):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        position = self.rotary_emb(input_ids.shape[1])
        for layer in self.layers:
            x = layer(x, position)
        return self.norm(x)  # type: ignore[no-any-return]


class TinyLlamaForCausalLM(TinyLlamaPreTrainedModel):
    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__(config)
        self.model = TinyLlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))  # type: ignore[no-any-return]


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``logits`` (from ``ids[:, :-1]``) against ``ids[:, 1:]``."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def token_batch(vocab: int, batch: int = 4, seq: int = 9, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)

"""The models and plans tests/scripts/tp_plan_job.py splits, built the same way for the one-process reference."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hf_llama import TinyLlamaConfig, TinyLlamaForCausalLM

CASES = ("auto", "user", "tied", "hf_auto")


def build(name: str) -> tuple[nn.Module, Any, str]:
    """``(model, tp_plan argument, name of one weight the plan splits)`` for case ``name``, seeded."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    torch.manual_seed(0)
    if name == "auto":
        return TinyLlamaForCausalLM(TinyLlamaConfig()), "auto", "model.layers.1.self_attn.k_proj.weight"
    if name == "user":
        model = TinyLlamaForCausalLM(TinyLlamaConfig(legacy_attention=True))
        plan = {
            "model.embed_tokens": "embedding_rowwise",
            "model.layers.*.self_attn.[qkv]_proj": "colwise",
            "model.layers.*.self_attn.o_proj": "rowwise",
            "model.layers.*.mlp.gate_proj": ColwiseParallel(),
            "model.layers.*.mlp.up_proj": "colwise",
            "model.layers.*.mlp.down_proj": "rowwise",
            "lm_head": ColwiseParallel(output_layouts=Replicate()),
        }
        return model, plan, "model.embed_tokens.weight"
    if name == "tied":  # the embedding and the head share one weight: "auto" splits both by vocabulary
        return TinyLlamaForCausalLM(TinyLlamaConfig(tie_word_embeddings=True)), "auto", "lm_head.weight"
    if name == "hf_auto":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            attn_implementation="eager",
        )
        return LlamaForCausalLM(config), "auto", "model.layers.1.self_attn.k_proj.weight"
    raise ValueError(f"unknown case {name!r}, one of {CASES}")

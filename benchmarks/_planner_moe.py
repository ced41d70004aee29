"""Mixture-of-experts models benchmarks/planner.py measures: Hugging Face Mixtral and Qwen2-MoE,
tiny, with the experts' own sparse routing (``torch.where`` per expert: data-dependent shapes,
see [Note: data-dependent steps] in fullshard/planner/data_dependent.py).

    python benchmarks/planner.py --only moe
"""

from __future__ import annotations

from typing import Any

import torch
from _planner_models import CausalLM, tokens

#: the model names benchmarks/planner.py knows from here, and their blocks; "gmm": Hugging Face's
#: default experts (``grouped_mm``: no data-dependent shapes; see
#: [Note: a fake kernel stricter than the CPU's] in fullshard/planner/torch_tools.py)
MODELS = {
    "mixtral": "MixtralDecoderLayer",
    "qwen2moe": "Qwen2MoeDecoderLayer",
    "mixtralgmm": "MixtralDecoderLayer",
}


def moe_config(kind: str) -> Any:
    """A tiny config of ``kind`` (a key of :data:`MODELS`): 4 layers, 8 experts, 2 per token,
    routed with the ``eager`` experts (one ``torch.where`` per expert), or ``grouped_mm``."""
    common = dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=1024,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        use_cache=False,
        experts_implementation="grouped_mm" if kind.endswith("gmm") else "eager",
    )
    if kind.startswith("mixtral"):
        from transformers import MixtralConfig

        return MixtralConfig(**common, intermediate_size=256, num_local_experts=8)
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **common,
        intermediate_size=256,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=256,
        num_experts=8,
    )


def build(kind: str, batch: int) -> tuple[Any, Any, tuple[str, ...]]:
    """The module, one process's batch (128 tokens a sequence) and the wrapped block classes, for ``kind``."""
    torch.manual_seed(0)
    return CausalLM(moe_config(kind)), tokens(batch, 128, 1024), (MODELS[kind],)

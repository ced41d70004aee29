"""The models benchmarks/planner.py measures, and factories for ``fullshard plan`` (each returns a
module and an example batch for one process).

    fullshard plan benchmarks/_planner_models.py:llama_7b --devices 8 --device-memory 80GiB --precision bf16-mixed
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import fullshard


class CausalLM(fullshard.Module):
    """A Hugging Face causal language model (built in ``configure_model``) trained with AdamW;
    ``attention``: its ``attn_implementation`` (``"eager"``, ``"sdpa"``)."""

    def __init__(self, config: Any, attention: str = "eager") -> None:
        super().__init__()
        self.config = config
        self.attention = attention
        self.model: nn.Module | None = None

    def configure_model(self) -> None:
        if self.model is None:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_config(self.config, attn_implementation=self.attention)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        assert self.model is not None
        loss: torch.Tensor = self.model(input_ids=batch, labels=batch).loss
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4, foreach=False)


class LoRACausalLM(CausalLM):
    """``CausalLM`` with LoRA adapters (peft, rank 8 on the attention's q and v projections): the
    base model frozen, the adapters trained."""

    def configure_model(self) -> None:
        if self.model is None:
            from peft import LoraConfig, get_peft_model

            super().configure_model()
            self.model = get_peft_model(self.model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trained = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(trained, lr=1e-4, foreach=False)


class Block(nn.Module):
    """A residual MLP block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class MLP(fullshard.Module):
    """Residual MLP blocks regressing random targets."""

    def __init__(self, width: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        for block in self.blocks:
            x = block(x)
        return F.mse_loss(self.head(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, foreach=False)


def llama_config(size: str) -> Any:
    """A Llama config: ``"7b"``, ``"70b"`` (Llama 2's shapes) or ``"tiny"`` (for measuring on CPU)."""
    from transformers import LlamaConfig

    shapes = {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=1024,
        ),
        "7b": dict(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32000,
        ),
        "70b": dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            vocab_size=32000,
        ),
    }
    return LlamaConfig(**shapes[size], max_position_embeddings=4096, use_cache=False)


def gpt2_config(size: str = "tiny") -> Any:
    """A GPT-2 config (``"tiny"`` for measuring on CPU, ``"small"``: the 124M one)."""
    from transformers import GPT2Config

    shapes = {"tiny": dict(n_embd=128, n_layer=4, n_head=4, vocab_size=1024), "small": {}}
    return GPT2Config(
        **shapes[size], n_positions=1024, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )


def tokens(batch: int, seq: int, vocab: int) -> torch.Tensor:
    """A batch of token ids."""
    return torch.randint(0, vocab, (batch, seq))


def llama_7b(batch: int = 1, seq: int = 4096) -> tuple[nn.Module, Any]:
    """Llama 2 7B, one sequence of 4096 tokens per process."""
    return CausalLM(llama_config("7b")), tokens(batch, seq, 32000)


def llama_70b(batch: int = 1, seq: int = 4096) -> tuple[nn.Module, Any]:
    """Llama 2 70B, one sequence of 4096 tokens per process."""
    return CausalLM(llama_config("70b")), tokens(batch, seq, 32000)

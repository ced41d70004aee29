"""Single-process reference runs for the FSDP parity tests (same model, data and seed, no sharding)."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils.data import DataLoader

import fullshard
from conftest import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
from train_fsdp import BlockModel, make_data


def reference_run(
    steps: int = 6, batch_size: int = 16, clip: float | None = None, precision: str = "32-true"
) -> tuple[dict[str, torch.Tensor], list[float], list[float]]:
    """Train ``BlockModel`` in this process; returns (params, losses, gradient norms before clipping)."""
    fullshard.seed_everything(5)
    model = BlockModel()
    model.configure_model()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        gradient_clip_val=clip,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    norms: list[float] = []
    original = trainer.strategy.clip_gradients_norm

    def recording(optimizer: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        norm = original(optimizer, max_norm, norm_type)
        norms.append(float(norm))
        return norm

    trainer.strategy.clip_gradients_norm = recording  # type: ignore[method-assign]
    trainer.fit(model, DataLoader(make_data(), batch_size=batch_size))
    params = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    return params, model.losses, norms


def initial_params() -> dict[str, torch.Tensor]:
    """``BlockModel``'s parameters right after an eager build with the scripts' seed."""
    fullshard.seed_everything(5)
    model = BlockModel()
    model.configure_model()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}

"""The fine-tuning idiom of saving only an adapter: a frozen base layer and a small trained
adapter, a module whose ``on_save_checkpoint`` keeps only the adapter's weights, and
``strict_loading = False`` to load such a checkpoint back into a whole model.

python tests/scripts/adapter_ckpt_job.py --out DIR --strategy fsdp --devices 2 --format sharded

Each rank trains 3 steps and saves ``DIR/adapter.ckpt``; then a fresh model (its base initialised
from another seed) resumes from it with ``fit(ckpt_path=...)`` (max_steps=3: nothing more to train). Rank 0 writes
``DIR/result.json``: what the save hook saw, the keys the checkpoint holds, and whether the
resumed model's adapter weights and their optimizer state are the saved ones while its base kept
its own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy

DIM = 8


class Adapted(nn.Module):
    """A frozen base layer plus a trained low-rank adapter (the shape of a LoRA layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(DIM, DIM)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(DIM, 2, bias=False)
        self.lora_b = nn.Linear(2, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x))


class AdapterModule(fullshard.Module):
    strict_loading = False  # the checkpoint holds only the adapter

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layer = Adapted()
        self.head = nn.Linear(DIM, 1)
        self.head.requires_grad_(False)
        self.seen: dict[str, Any] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.head(self.layer(x)).squeeze(-1), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=0.05)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["state_dict"]
        self.seen = {
            "state_dict_keys": sorted(state),
            "tensor_types": sorted({type(v).__name__ for v in state.values()}),
            "optimizer_states": len(checkpoint["optimizer_states"]),
            "optimizer_state_keys": sorted(checkpoint["optimizer_states"][0]),
        }
        for key in [k for k in state if "lora_" not in k]:
            del state[key]


def strategy_of(name: str, fmt: str) -> Any:
    if name == "ddp":
        return DDPStrategy(state_dict_type=fmt) if fmt == "sharded" else "ddp"
    cls = FSDPStrategy if name == "fsdp" else FSDP2Strategy
    return cls(auto_wrap_policy={Adapted}, state_dict_type=fmt)


def full_state(trainer: Any) -> dict[str, torch.Tensor]:
    state = trainer.strategy.get_state((), full=True)[0]
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def full_optimizer_state(trainer: Any) -> dict[str, dict[str, torch.Tensor]]:
    """The optimizer's per-parameter state, whole tensors (gathered under FSDP)."""
    state = trainer.strategy.get_state(trainer.optimizers, full=True)[1][0]["state"]
    return {k: {s: torch.as_tensor(v).detach().cpu().clone() for s, v in d.items()} for k, d in state.items()}


def saved_keys(path: Path) -> list[str]:
    """The model keys the checkpoint holds, read without fullshard."""
    if path.is_file():
        return sorted(torch.load(path, map_location="cpu", weights_only=True)["state_dict"])
    from torch.distributed.checkpoint import FileSystemReader

    (data,) = [d for d in path.iterdir() if d.is_dir() and d.name.startswith("data-")]
    metadata = FileSystemReader(str(data)).read_metadata()
    return sorted(k[len("model.") :] for k in metadata.state_dict_metadata if k.startswith("model."))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="fsdp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--format", default="full")
    args = parser.parse_args()
    out = Path(args.out)
    path = out / "adapter.ckpt"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, DIM, generator=g)
    data = TensorDataset(x, x.sum(-1))

    def trainer(max_steps: int) -> Any:
        return fullshard.Trainer(
            accelerator="cpu",
            devices=args.devices,
            strategy=strategy_of(args.strategy, args.format),
            max_steps=max_steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=out,
        )

    first = trainer(3)
    model = AdapterModule(seed=1)
    first.fit(model, DataLoader(data, batch_size=8))
    trained = full_state(first)
    trained_optimizer = full_optimizer_state(first)
    first.save_checkpoint(path)

    second = trainer(3)
    fresh = AdapterModule(seed=2)
    fresh_init = {k: v.detach().clone() for k, v in fresh.state_dict().items()}
    second.fit(fresh, DataLoader(data, batch_size=8), ckpt_path=path)
    resumed = full_state(second)
    resumed_optimizer = full_optimizer_state(second)
    if second.is_global_zero:
        base_keys = [k for k in trained if "lora_" not in k]
        result = {
            "seen": model.seen,
            "saved_keys": saved_keys(path),
            "global_step": second.global_step,
            # the adapter is the saved one; the base (frozen) kept the fresh model's initialisation
            "adapter_loaded": all(torch.equal(resumed[k], trained[k]) for k in trained if "lora_" in k),
            "base_kept": all(torch.equal(resumed[k], fresh_init[k]) for k in base_keys),
            "base_differs_from_saved": any(not torch.equal(trained[k], fresh_init[k]) for k in base_keys),
            # the adapter's optimizer state (AdamW's step and moments) is the saved one
            "optimizer_keys": sorted(resumed_optimizer),
            "optimizer_loaded": sorted(resumed_optimizer) == sorted(trained_optimizer)
            and all(
                torch.equal(resumed_optimizer[k][s], v)
                for k, d in trained_optimizer.items()
                for s, v in d.items()
            ),
        }
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

"""The "Manual wrapping" flow of Lightning's FSDP guide, its class verbatim but for imports.

    python tests/scripts/guide_manual_wrap.py --out DIR [--devices 2] [--strategy fsdp] [--state-dict-type sharded]

Trains 4 steps and saves a checkpoint (full or sharded), resumes from it in a new Trainer to step 6, and writes
both state dicts (``model.pt``, ``resumed.pt``) and the wrap plan's units (``result.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.fsdp.wrap import wrap
from torch.utils.data import DataLoader, TensorDataset

import fullshard as L
from fullshard.strategies import FSDPStrategy


# ---- verbatim from the guide (shared/reference/002_9e1d750d94e80e9e.txt, "Manual wrapping")
class MyModel(L.LightningModule):
    def configure_model(self):
        self.linear_layer = nn.Linear(32, 32)
        self.block = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))

        # Modules get sharded across processes as soon as they are wrapped with `wrap`.
        linear_layer = wrap(self.linear_layer)

        for i, layer in enumerate(self.block):
            self.block[i] = wrap(layer)

        self.model = nn.Sequential(linear_layer, nn.ReLU(), self.block)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters())


# ---- end of the guide's code


class Runnable(MyModel):
    """What the guide leaves out: a training step and data."""

    def __init__(self, global_batch: int, devices: int) -> None:
        super().__init__()
        self.batch_size = global_batch // devices

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.model(x).pow(2).mean()

    def train_dataloader(self):
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
        return DataLoader(TensorDataset(x), batch_size=self.batch_size)


def fit(args: argparse.Namespace, max_steps: int, ckpt_path: Path | None = None) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=FSDPStrategy(state_dict_type=args.state_dict_type)
        if args.strategy == "fsdp"
        else args.strategy,
        precision=args.precision,
        max_steps=max_steps,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        # compared with a one-process run, which reads the data in order: keep the loader's order
        use_distributed_sampler="keep_shuffle",
    )
    trainer.fit(Runnable(global_batch=16, devices=args.devices), ckpt_path=ckpt_path)
    return trainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--strategy", default="fsdp")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--state-dict-type", default="full", choices=["full", "sharded"])
    args = p.parse_args()
    L.seed_everything(7)
    trainer = fit(args, max_steps=4)
    path = args.out / "model.ckpt"
    trainer.save_checkpoint(path)
    plan = getattr(trainer.strategy, "wrap_plan", None)
    resumed = fit(args, max_steps=6, ckpt_path=path)  # a new Trainer and model, as a resuming user has
    resumed.save_checkpoint(args.out / "resumed.ckpt")
    for name, run in (("model", trainer), ("resumed", resumed)):
        state = run.strategy.module_state_dict()  # whole tensors, as a full checkpoint holds them
        if trainer.is_global_zero:
            torch.save(state, args.out / f"{name}.pt")
    if trainer.is_global_zero:
        units = [u.name for u in plan.units] if plan is not None else []
        result = {"steps": [trainer.global_step, resumed.global_step], "units": units}
        (args.out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

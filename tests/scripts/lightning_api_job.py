"""Lightning's module, Trainer and strategy surface in 2 processes: steps without ``batch_idx``,
a model built in ``trainer.init_module()``, the Trainer's dataloader views, and the strategy's
``lightning_module_state_dict``, ``optimizer_state``, ``reduce``, ``save_checkpoint(checkpoint,
filepath)`` / ``load_checkpoint(checkpoint_path)``.

python tests/scripts/lightning_api_job.py --out DIR --strategy fsdp --devices 2

Each rank writes ``DIR/rank<r>.json`` with what it saw.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import fullshard
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy


class NoBatchIdx(fullshard.LightningModule):
    """Every step without ``batch_idx``, as Lightning's docs often write them."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.seen: dict[str, Any] = {}

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y), sync_dist=True)

    def predict_step(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0])

    def on_train_start(self) -> None:
        trainer = self.trainer
        loader = trainer.train_dataloader
        self.seen["train_dataloader"] = type(loader).__name__
        self.seen["train_sampler"] = type(loader.sampler).__name__ if loader is not None else None
        self.seen["distributed"] = isinstance(getattr(loader, "sampler", None), DistributedSampler)
        self.seen["val_dataloaders"] = type(trainer.val_dataloaders).__name__

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def make_strategy(name: str) -> Any:
    if name == "ddp":
        return DDPStrategy()
    if name == "ddp_fp16_hook":  # Lightning's DDPStrategy(ddp_comm_hook=): gradients sent in float16
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook)
    if name == "fsdp":
        return FSDPStrategy(auto_wrap_policy={nn.Linear})
    return FSDP2Strategy(auto_wrap_policy={nn.Linear})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument(
        "--empty-init", action="store_true", help="build the model in init_module(empty_init=True)"
    )
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    data = TensorDataset(x, x.sum(-1, keepdim=True).sin())
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=make_strategy(args.strategy),
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    with trainer.init_module(empty_init=True if args.empty_init else None):
        torch.manual_seed(1)
        model = NoBatchIdx()
    seen_device = next(model.parameters()).device.type  # "meta" with empty_init until set up
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
    strategy = trainer.strategy
    seen = dict(model.seen)
    seen["built_on"] = seen_device
    seen["global_step"] = trainer.global_step
    seen["val_loss"] = float(trainer.callback_metrics["val_loss"])

    state = strategy.lightning_module_state_dict()
    seen["state_keys"] = sorted(state)
    seen["state_sum"] = float(sum(v.sum() for v in state.values()))
    optimizer_state = strategy.optimizer_state(trainer.optimizers[0])
    seen["optimizer_state_keys"] = sorted(optimizer_state)
    seen["optimizer_state_params"] = sorted(optimizer_state["state"])
    seen["reduce_sum"] = float(strategy.reduce(torch.tensor(1.0), reduce_op="sum"))
    seen["precision_plugin"] = strategy.precision_plugin.precision
    seen["trainer_precision_plugin_is_strategys"] = trainer.precision_plugin is strategy.precision_plugin

    # Lightning's strategy.save_checkpoint(checkpoint, filepath): a dict built by hand, the model's
    # and optimizer's states added; a full checkpoint is one torch file, as Lightning's
    by_hand = args.out / "hand.ckpt"
    strategy.save_checkpoint({"note": "by hand"}, filepath=by_hand, optimizers=trainer.optimizers)
    strategy.barrier()
    written = torch.load(by_hand, weights_only=True)
    seen["hand_written"] = {"note": written["note"], "state_keys": sorted(written["state_dict"])}
    # ... and load_checkpoint(checkpoint_path): the model's state into place, the rest returned
    whole = args.out / "whole.ckpt"
    trainer.save_checkpoint(whole)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    rest = strategy.load_checkpoint(checkpoint_path=whole)
    seen["loaded_rest"] = {"global_step": rest["global_step"], "has_state_dict": "state_dict" in rest}
    seen["reloaded_sum"] = float(sum(v.sum() for v in strategy.lightning_module_state_dict().values()))

    predictions = trainer.predict(model, DataLoader(data, batch_size=8))
    seen["predictions"] = [list(p.shape) for p in predictions or []]
    seen["predict_dataloaders"] = type(trainer.predict_dataloaders).__name__
    (args.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()

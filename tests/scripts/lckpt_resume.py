"""Resume tests/lckpt_models.py's MLP from a (Lightning) checkpoint with any strategy; used by
tests/test_lightning_checkpoints.py.

python tests/scripts/lckpt_resume.py --ckpt lightning.ckpt --strategy fsdp --devices 2 --out DIR
python tests/scripts/lckpt_resume.py --ckpt lightning.ckpt --strategy ddp,fsdp --devices 2 --out DIR

Trains to the end of epoch 2 (or ``--max-steps``) and writes ``DIR/final.pt`` (the full weights, optimizer and
scheduler states, counters and the warnings rank 0 saw while resuming). Several strategies: each
in turn in the same processes (one start-up for all), writing ``DIR/<strategy>/final.pt``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fullshard
from fullshard.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy

sys.path.insert(0, str(Path(__file__).parents[1]))
from lckpt_models import MLP, loader


def make_strategy(name: str) -> Any:
    if name == "fsdp":
        # each Linear its own FSDP unit: parameter names then carry FSDP's wrapper prefix
        return FSDPStrategy(auto_wrap_policy={nn.Linear})
    if name == "ddp":
        return DDPStrategy()
    return SingleDeviceStrategy()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1, help="stop here (the checkpoint's step: load only)")
    args = p.parse_args()
    strategies = args.strategy.split(",")
    for strategy in strategies:
        resume(args, strategy, Path(args.out) / strategy if len(strategies) > 1 else Path(args.out))


def resume(args: argparse.Namespace, strategy: str, out: Path) -> None:
    fullshard.seed_everything(7)
    model = MLP()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=make_strategy(strategy),
        max_epochs=2,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
        use_distributed_sampler="keep_shuffle",  # the expected run is a plain loop over the data in order
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, loader(), ckpt_path=args.ckpt)
    model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=True)
    if trainer.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "state_dict": model_state,
                "optimizer": optimizer_states[0],
                "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
                "global_step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "warnings": [str(w.message) for w in caught],
            },
            out / "final.pt",
        )


if __name__ == "__main__":
    main()

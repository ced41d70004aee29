"""Save a checkpoint before the first optimizer step, then resume from it; used by
tests/test_checkpoints.py ([Note: unstepped optimizers] in fullshard/strategies/optimizer_state.py).

python tests/scripts/unstepped_save_job.py --strategy fsdp --out DIR

Three runs of AdamW on 2 processes, sharded checkpoints: one uninterrupted, one that saves in
``on_train_start``, one resumed from that checkpoint. Rank 0 writes their losses to DIR/losses.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard


class Regression(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.1)


class SaveAtStart(fullshard.Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        trainer.save_checkpoint(self.path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True, choices=["fsdp", "fsdp2"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    checkpoint = args.out / "start"

    def run(callbacks: list[Any], ckpt_path: Path | None = None) -> tuple[list[float], Any]:
        fullshard.seed_everything(0)
        module = Regression()
        data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
        strategy = fullshard.strategies.STRATEGY_REGISTRY.get(args.strategy, state_dict_type="sharded")
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=strategy,
            max_steps=3,
            callbacks=callbacks,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=args.out,
        )
        trainer.fit(module, data, ckpt_path=ckpt_path)
        return module.losses, trainer

    uninterrupted, trainer = run([])
    saved, _ = run([SaveAtStart(checkpoint)])
    resumed, _ = run([], checkpoint)
    if trainer.global_rank == 0:
        runs = {"uninterrupted": uninterrupted, "saved": saved, "resumed": resumed}
        (args.out / "losses.json").write_text(json.dumps(runs))


if __name__ == "__main__":
    main()

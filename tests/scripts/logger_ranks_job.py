"""Train on 2 processes while the module calls its loggers from every rank, as users' code does;
each rank writes what it saw to DIR/rank<N>.json.

python tests/scripts/logger_ranks_job.py --out DIR --strategy ddp
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.loggers import CSVLogger, TensorBoardLogger


class Net(fullshard.LightningModule):
    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.Linear(hidden, 1))
        self.seen: dict[str, Any] = {}

    def on_train_start(self) -> None:
        for logger in self.loggers:
            logger.log_hyperparams({"from_rank": self.global_rank})
            logger.log_metrics({"rank_metric": float(self.global_rank)}, step=0)
            if isinstance(logger, TensorBoardLogger):  # rank 1's experiment is a do-nothing stand-in
                logger.experiment.add_text("note", f"rank {self.global_rank}")
            logger.save()
        self.seen = {
            "experiments": [type(lg.experiment).__name__ for lg in self.loggers],
            "log_dirs": [lg.log_dir for lg in self.loggers],
        }

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--strategy", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
    model = Net()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_steps=2,
        log_every_n_steps=1,
        logger=[CSVLogger(args.out / "logs"), TensorBoardLogger(args.out / "logs", name="tb")],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=4))
    (args.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(model.seen))


if __name__ == "__main__":
    main()

"""Predict with a BasePredictionWriter on N processes without gathering: each rank writes its
batches (with their dataset indices) and its epoch's predictions to DIR.

python tests/scripts/prediction_writer_job.py --out DIR --devices 2 --strategy ddp --interval batch_and_epoch
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.callbacks import BasePredictionWriter
from fullshard.strategies import FSDP2Strategy


def make_data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(n, 4, generator=g))


class Doubler(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 2)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self.layer(batch[0])


class Writer(BasePredictionWriter):
    def __init__(self, out: Path, interval: Any) -> None:
        super().__init__(interval)
        self.out = out

    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        name = f"batch_{dataloader_idx}_{trainer.global_rank}_{batch_idx}.pt"
        torch.save({"indices": list(batch_indices), "prediction": prediction}, self.out / name)

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        torch.save(
            {"indices": batch_indices, "predictions": predictions},
            self.out / f"epoch_{trainer.global_rank}.pt",
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--interval", default="batch_and_epoch")
    p.add_argument("--loaders", type=int, default=1)
    args = p.parse_args()
    strategy: Any = FSDP2Strategy() if args.strategy == "fsdp2" else args.strategy
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy if args.devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Writer(args.out, args.interval)],
    )
    loaders = [DataLoader(make_data(13 + 4 * i), batch_size=3) for i in range(args.loaders)]
    returned = trainer.predict(
        Doubler(), loaders if args.loaders > 1 else loaders[0], return_predictions=False
    )
    (args.out / f"returned_{trainer.global_rank}.json").write_text(json.dumps(returned))


if __name__ == "__main__":
    main()

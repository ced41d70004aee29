"""``BasePredictionWriter.write_on_epoch_end``'s arguments under Lightning 2.6.6 and fullshard
(tests/test_prediction_writer_twins.py compares them).

Run one framework by hand::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/prediction_writer.py --out /tmp/l.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from twin import imp, main

L = imp()
BasePredictionWriter = imp("callbacks").BasePredictionWriter


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.layer(batch[0]).squeeze(-1)


class Writer(BasePredictionWriter):
    def __init__(self, interval: str) -> None:
        super().__init__(write_interval=interval)
        self.seen: list[Any] = []

    def write_on_batch_end(
        self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, *rest: Any
    ) -> None:
        pass

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        def shape(x: Any) -> Any:
            return [shape(v) for v in x] if isinstance(x, list) else type(x).__name__

        self.seen.append({"predictions": shape(predictions), "batch_indices": batch_indices})


def loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 2, generator=g)), batch_size=3)


def predict(tmp: Path, loaders: Any, interval: str, keep: bool = True) -> Any:
    writer = Writer(interval)
    t = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        callbacks=[writer],
        default_root_dir=tmp,
    )
    t.predict(Net(), loaders, return_predictions=keep)
    return writer.seen


def case_one_dataloader(tmp: Path) -> Any:
    return predict(tmp, loader(7, 0), "epoch")


def case_two_dataloaders(tmp: Path) -> Any:
    return predict(tmp, [loader(7, 0), loader(4, 1)], "batch_and_epoch")


def case_one_dataloader_in_a_list_without_returned_predictions(tmp: Path) -> Any:
    return predict(tmp, [loader(5, 0)], "epoch", keep=False)


if __name__ == "__main__":
    main()

"""A 2-process DDP fit with dropout, a shuffled loader and validation, under Lightning or
fullshard: each rank writes its losses per step, its validation losses, a draw made in
``setup`` and the final weight sums (``<out>/rank<r>.json``). tests/test_seeding.py compares
fullshard's run with Lightning's, recorded in tests/fixtures/seeding_ddp_lightning.json by::

    SEEDING_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/scripts/seeding_ddp_job.py --out /tmp/sd \\
        && python -c "import json; print(json.dumps([json.load(open(f'/tmp/sd/rank{r}.json')) for r in (0, 1)]))" \\
        > tests/fixtures/seeding_ddp_lightning.json

and run under fullshard with ``python tests/scripts/seeding_ddp_job.py --out /tmp/sd``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("SEEDING_FRAMEWORK") == "lightning":
    import lightning.pytorch as L
else:
    import fullshard as L


def regression(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.record: dict[str, Any] = {"losses": [], "val_losses": []}

    def setup(self, stage: str) -> None:
        self.record["setup_draw"] = float(torch.rand(()))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.record["losses"].append(round(loss.item(), 6))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.record["val_losses"].append(round(float(self.trainer.callback_metrics["val_loss"]), 6))

    def on_train_end(self) -> None:
        self.record["weights"] = [round(float(p.sum()), 5) for p in self.net.parameters()]
        self.record["after"] = float(torch.rand(()))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    L.seed_everything(11)
    torch.randn(3)  # the script draws after seeding: the strategy seeds again at setup
    model = Net()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train = DataLoader(regression(40, 1), batch_size=5, shuffle=True)
    trainer.fit(model, train, DataLoader(regression(12, 2), batch_size=3))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(model.record))


if __name__ == "__main__":
    main()

"""The one-process runs whose results tests/test_lightning_callbacks.py holds fullshard to
(``_LIGHTNING``): the same model, data and seed under Lightning or fullshard, one line per case
with the global step and each parameter's sum (rounded to 5 digits).

    FW=lightning /tmp/lvenv/bin/python tests/scripts/callbacks_lightning_reference.py
    FW=fullshard python tests/scripts/callbacks_lightning_reference.py
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("FW", "fullshard") == "lightning":
    import lightning.pytorch as L
    import lightning.pytorch.callbacks as C
else:
    import fullshard as L  # type: ignore[no-redef]
    import fullshard.callbacks as C  # type: ignore[no-redef]


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1)


class Net(L.LightningModule):
    def __init__(self, bn: bool = False, sched: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(4, 8), *([nn.BatchNorm1d(8)] if bn else []), nn.ReLU()]
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Linear(8, 1)
        self.sched = sched

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)).squeeze(-1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.mse_loss(self(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.02, momentum=0.9)
        if self.sched:
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)}
        return opt

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(data(), batch_size=4)


def callbacks(case: str) -> list[Any]:
    swa = C.StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2)
    return {
        "gas": [C.GradientAccumulationScheduler({1: 2, 2: 4})],
        "swa": [swa],
        "swa_bn": [swa],
        "ema": [C.EMAWeightAveraging(decay=0.9)],
        "wa": [C.WeightAveraging()],
        "finetune": [C.BackboneFinetuning(unfreeze_backbone_at_epoch=2, lambda_func=lambda e: 1.5)],
        "prune": [C.ModelPruning("l1_unstructured", amount=0.3)],
        "prune_local": [
            C.ModelPruning(
                "ln_structured",
                amount=0.25,
                use_global_unstructured=False,
                parameter_names=["weight"],
                pruning_dim=0,
                pruning_norm=2,
                use_lottery_ticket_hypothesis=False,
                make_pruning_permanent=False,
            )
        ],
    }[case]


def run(case: str) -> None:
    L.seed_everything(0)
    model = Net(bn=case == "swa_bn", sched=case.startswith("swa"))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks(case),
        num_sanity_val_steps=0,
    )
    trainer.fit(model, val_dataloaders=DataLoader(data(), batch_size=16))
    print(
        f'"{case}": ({trainer.global_step}, {[round(float(p.detach().sum()), 5) for p in model.parameters()]}),'
    )


if __name__ == "__main__":
    for name in ("gas", "swa", "swa_bn", "ema", "wa", "finetune", "prune", "prune_local"):
        run(name)

"""Porting script: Lightning's common training callbacks together.

Covers: a ``BaseFinetuning`` subclass (the backbone frozen in ``setup``, before
``configure_optimizers``; the head's learning rate lowered from epoch 2 in ``finetune_function``),
``GradientAccumulationScheduler``
(1 micro-batch per step, then 2 from epoch 2), ``EMAWeightAveraging`` (validation with the
average, the average in the model at the end, and a checkpoint's ``state_dict``/``current_model_state``),
``LambdaCallback``, ``ModelSummary``, ``SpikeDetection`` (no spike), ``OnExceptionCheckpoint``
(nothing left after a run without error), ``trainer.progress_bar_callback``; checked against the
same training in one plain-PyTorch process.

(Unfreezing the backbone during training is left to tests/test_lightning_callbacks.py: under DDP,
Lightning 2.6.6 does not average the gradients of parameters unfrozen after the model was wrapped,
so its result differs from one-process training; fullshard's does not.)

    PORT_FRAMEWORK=fullshard python tests/porting/finetune_ema_schedule.py --strategy fsdp --out /tmp/p9
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import global_batches, mean_loss, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import (
        BaseFinetuning,
        Callback,
        EMAWeightAveraging,
        GradientAccumulationScheduler,
        LambdaCallback,
        ModelSummary,
        OnExceptionCheckpoint,
        SpikeDetection,
    )
else:
    import fullshard as L
    from fullshard.callbacks import (
        BaseFinetuning,
        Callback,
        EMAWeightAveraging,
        GradientAccumulationScheduler,
        LambdaCallback,
        ModelSummary,
        OnExceptionCheckpoint,
        SpikeDetection,
    )

SEED, EPOCHS, BATCH, LR, DECAY, SLOWER_FROM = 3, 4, 4, 0.05, 0.8, 2
SCHEDULE = {0: 1, 2: 2}


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 1.5]) + 0.3)


class FrozenBackbone(BaseFinetuning):
    """Trains the head only, at half the learning rate from epoch SLOWER_FROM."""

    def freeze_before_training(self, pl_module):
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == SLOWER_FROM:
            optimizer.param_groups[0]["lr"] = LR / 2


class Net(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.backbone(x)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=LR)


class Recorder(RecordCallbackHooks, Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        value(f"accumulate_at_epoch_{trainer.current_epoch}", trainer.accumulate_grad_batches)
        value(
            f"groups_at_epoch_{trainer.current_epoch}", [g["lr"] for g in trainer.optimizers[0].param_groups]
        )

    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)


def reference(train: TensorDataset, world_size: int) -> tuple[dict, list[float]]:
    """One process: the same global batches; the head alone trains (at LR / 2 from epoch
    SLOWER_FROM); an EMA after each optimizer step."""
    torch.manual_seed(SEED)
    model = Net()
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.SGD(list(model.head.parameters()), lr=LR)
    x, y = train.tensors
    ema: dict[str, torch.Tensor] | None = None
    lrs = []
    for epoch in range(EPOCHS):
        accumulate = max(v for k, v in SCHEDULE.items() if k <= epoch)
        if epoch == SLOWER_FROM:
            optimizer.param_groups[0]["lr"] = LR / 2
        lrs.append(optimizer.param_groups[0]["lr"])
        batches = list(global_batches(len(train), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch))
        for i, idx in enumerate(batches):
            (F.mse_loss(model(x[idx]), y[idx]) / accumulate).backward()
            if (i + 1) % accumulate == 0 or i + 1 == len(batches):
                optimizer.step()
                optimizer.zero_grad()
                current = {k: v.detach().clone() for k, v in model.state_dict().items()}
                ema = current if ema is None else {k: DECAY * ema[k] + (1 - DECAY) * current[k] for k in ema}
    assert ema is not None
    return ema, lrs


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    train, val = make_data(48, 1), make_data(16, 2)
    model = Net()
    epoch_ends = []
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=EPOCHS,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=False,
        callbacks=[
            Recorder(),
            FrozenBackbone(),
            GradientAccumulationScheduler(dict(SCHEDULE)),
            EMAWeightAveraging(decay=DECAY),
            LambdaCallback(
                on_train_epoch_end=lambda trainer, pl_module: epoch_ends.append(trainer.global_step)
            ),
            ModelSummary(max_depth=2),
            SpikeDetection(rtol=1e6, exclude_batches_path=str(root)),
            OnExceptionCheckpoint(root / "failure"),
        ],
        enable_progress_bar=False,
        default_root_dir=root,
    )
    value("progress_bar_callback", type(trainer.progress_bar_callback).__name__)
    mark("fit")
    trainer.fit(model, DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH))
    mark("after fit")
    snapshot("after fit", trainer)
    value("global_step", trainer.global_step)
    value("epoch_ends", epoch_ends)
    check("the accumulation schedule took 6 + 6 + 3 + 3 steps", epoch_ends == [6, 12, 15, 18], epoch_ends)
    trainer.save_checkpoint(root / "final.ckpt")
    check("no failure checkpoint is left", not (root / "failure" / "on_exception.ckpt").exists(), "")

    if trainer.global_rank == 0:
        ema, lrs = reference(train, trainer.world_size)
        saved = torch.load(root / "final.ckpt", map_location="cpu", weights_only=False)
        check("final weights are one-process training's average", *state_close(saved["state_dict"], ema))
        check("the checkpoint keeps the trained weights too", "current_model_state" in saved, sorted(saved))
        value("head_lrs", lrs)
        reference_model = Net()
        reference_model.load_state_dict(ema)
        expected = mean_loss(reference_model, F.mse_loss, val.tensors)
        got = float(trainer.callback_metrics["val_loss"])
        check("val_loss is the average's loss on the validation data", close(got, expected), (got, expected))


if __name__ == "__main__":
    run(main)

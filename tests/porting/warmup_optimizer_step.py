"""Porting script: LR warm-up in ``optimizer_step``, a timm-style scheduler, custom clipping.

Covers: an ``optimizer_step`` override that sets the learning rate of the first steps and then
calls ``optimizer.step(closure=optimizer_closure)`` (the closure runs ``training_step``,
``optimizer_zero_grad`` and ``backward``), with ``accumulate_grad_batches=2`` (the micro-batch
without a step runs no ``optimizer_step``); a scheduler without torch's API (like timm's:
``step(epoch)``), stepped by an ``lr_scheduler_step`` override; a ``configure_gradient_clipping``
override that clips by value from the second step on (``self.clip_gradients``). Checked against
the same training in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/warmup_optimizer_step.py --strategy fsdp --out /tmp/p8
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import global_batches, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback
else:
    import fullshard as L
    from fullshard.callbacks import Callback

SEED, EPOCHS, BATCH, N, ACCUMULATE, LR, WARMUP, DECAY, CLIP = 5, 2, 4, 64, 2, 0.1, 3, 0.5, 0.3


class EpochDecay:
    """A scheduler in timm's style: not a torch LRScheduler; ``step(epoch)`` sets the rate."""

    def __init__(self, optimizer: torch.optim.Optimizer, decay: float) -> None:
        self.optimizer = optimizer
        self.decay = decay
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.last_epoch = 0

    def step(self, epoch: int) -> None:
        self.last_epoch = epoch
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * self.decay**epoch

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "base_lrs": self.base_lrs}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch, self.base_lrs = state["last_epoch"], state["base_lrs"]


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(9)
    x = torch.randn(N, 3, generator=g)
    return TensorDataset(x, 2.0 * x[:, 0] - x[:, 2] + 0.5)


def warmup_lr(step: int) -> float | None:
    """The learning rate of optimizer step ``step`` (0-based) during the warm-up, else None."""
    return LR * (step + 1) / WARMUP if step < WARMUP else None


class Net(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        lr = warmup_lr(self.trainer.global_step)
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        optimizer.step(closure=optimizer_closure)

    def lr_scheduler_step(self, scheduler, metric):
        scheduler.step(epoch=self.current_epoch + 1)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if self.trainer.global_step >= 1:
            self.clip_gradients(optimizer, gradient_clip_val=CLIP, gradient_clip_algorithm="value")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR, momentum=0.5)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": EpochDecay(optimizer, DECAY), "interval": "epoch"},
        }


class Recorder(RecordCallbackHooks, Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def on_train_epoch_end(self, trainer, pl_module):
        snapshot("on_train_epoch_end", trainer)


def reference(data: TensorDataset, world_size: int) -> tuple[dict, list[float]]:
    torch.manual_seed(SEED)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    x, y = data.tensors
    lrs, step = [], 0
    for epoch in range(EPOCHS):
        batches = list(global_batches(len(data), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch))
        for i, idx in enumerate(batches):
            (F.mse_loss(model.net(x[idx]).squeeze(-1), y[idx]) / ACCUMULATE).backward()
            if (i + 1) % ACCUMULATE == 0 or i + 1 == len(batches):
                lr = warmup_lr(step)
                if lr is not None:
                    optimizer.param_groups[0]["lr"] = lr
                lrs.append(optimizer.param_groups[0]["lr"])
                if step >= 1:
                    torch.nn.utils.clip_grad_value_(model.parameters(), CLIP)
                optimizer.step()
                optimizer.zero_grad()
                step += 1
        optimizer.param_groups[0]["lr"] = LR * DECAY ** (epoch + 1)
    return model.state_dict(), lrs


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    data = make_data()
    model = Net()
    recorder = Recorder()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        precision="32-true",
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATE,
        log_every_n_steps=1,
        logger=False,
        callbacks=[recorder],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    mark("fit")
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True))
    mark("after fit")
    snapshot("after fit", trainer)
    value("global_step", trainer.global_step)
    value("lrs", recorder.lrs)
    final_lr = trainer.optimizers[0].param_groups[0]["lr"]
    check("the timm-style scheduler set the last epoch's rate", close(final_lr, LR * DECAY**EPOCHS), final_lr)
    trainer.save_checkpoint(root / "final.ckpt")

    if trainer.global_rank == 0:
        weights, lrs = reference(data, trainer.world_size)
        check("warm-up and decay rates equal plain PyTorch's", close(recorder.lrs, lrs), (recorder.lrs, lrs))
        saved = torch.load(root / "final.ckpt", map_location="cpu", weights_only=False)
        check("final weights equal one-process training", *state_close(saved["state_dict"], weights))
        check(
            "the scheduler's state is in the checkpoint",
            saved["lr_schedulers"][0]["last_epoch"] == EPOCHS,
            saved["lr_schedulers"],
        )


if __name__ == "__main__":
    run(main)

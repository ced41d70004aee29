"""Porting script: gradient clipping with gradient accumulation, validation twice per epoch.

Covers: ``accumulate_grad_batches`` (with a last, partial window), ``gradient_clip_val`` /
``gradient_clip_algorithm``, ``val_check_interval`` (a fraction), ``limit_train_batches`` (a
count), ``limit_val_batches`` (a fraction), ``num_sanity_val_steps=0``, ``log_every_n_steps``,
a ``training_step`` returning a dict, ``self.global_step`` (optimizer steps, not batches),
``trainer.estimated_stepping_batches``, ``trainer.num_training_batches``, ``precision="32-true"``,
``use_distributed_sampler``; checked against the
same training in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/clip_accumulate.py --strategy fsdp --out /tmp/p2
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
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import CSVLogger
else:
    import fullshard as L
    from fullshard.callbacks import Callback
    from fullshard.loggers import CSVLogger

SEED, EPOCHS, BATCH, ACCUMULATE, LIMIT_TRAIN, CLIP, LR = 7, 2, 4, 4, 6, 0.5, 0.2


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = 3.0 * x[:, 0] - 2.0 * x[:, 1] * x[:, 2] + 1.5  # large targets: gradients well above CLIP
    return TensorDataset(x, y)


class Net(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        self.log("step_seen", float(self.global_step))
        return {"loss": loss, "batch_size": torch.tensor(len(x))}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


class Recorder(RecordCallbackHooks, Callback):
    def on_train_start(self, trainer, pl_module):
        value("estimated_stepping_batches", trainer.estimated_stepping_batches)
        value("num_training_batches", trainer.num_training_batches)

    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)


def reference(train: TensorDataset, world_size: int) -> tuple[dict, list[float]]:
    """One process: the same global batches, loss / ACCUMULATE per micro-batch, clip, step."""
    torch.manual_seed(SEED)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = train.tensors
    norms = []
    for epoch in range(EPOCHS):
        batches = list(
            global_batches(
                len(train), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch, limit=LIMIT_TRAIN
            )
        )
        for i, idx in enumerate(batches):
            (F.mse_loss(model(x[idx]), y[idx]) / ACCUMULATE).backward()
            if (i + 1) % ACCUMULATE == 0 or i + 1 == len(batches):
                norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
                optimizer.step()
                optimizer.zero_grad()
    return model.state_dict(), norms


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    train, val = make_data(80, 1), make_data(32, 2)
    model = Net()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        precision="32-true",
        use_distributed_sampler=True,
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATE,
        gradient_clip_val=CLIP,
        gradient_clip_algorithm="norm",
        val_check_interval=0.5,
        limit_train_batches=LIMIT_TRAIN,
        limit_val_batches=0.5,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=CSVLogger(root, name="logs"),
        callbacks=[Recorder()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=root,
    )
    mark("fit")
    trainer.fit(model, DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH))
    mark("after fit")
    snapshot("after fit", trainer)
    value("global_step", trainer.global_step)
    check("global_step counts optimizer steps", trainer.global_step == EPOCHS * 2, trainer.global_step)
    trainer.save_checkpoint(root / "final.ckpt")

    if trainer.global_rank == 0:
        weights, norms = reference(train, trainer.world_size)
        check("every step was clipped (gradient norm above the limit)", min(norms) > CLIP, norms)
        saved = torch.load(root / "final.ckpt", map_location="cpu", weights_only=False)["state_dict"]
        check("final weights equal one-process training", *state_close(saved, weights))
        # limit_val_batches=0.5 of 4 batches per rank: 2 batches, the first 16 samples together
        model_ref = Net()
        model_ref.load_state_dict(weights)
        expected = mean_loss(model_ref, F.mse_loss, val.tensors, slice(0, 16))
        got = float(trainer.callback_metrics["val_loss"])
        check(
            "val_loss is the final weights' loss on the first 16 validation samples",
            close(got, expected),
            (got, expected),
        )


if __name__ == "__main__":
    run(main)

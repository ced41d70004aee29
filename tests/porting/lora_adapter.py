"""Porting script: a LoRA fine-tune that checkpoints its adapters only and resumes into a whole model.

A frozen "pretrained" network (its weights drawn from a fixed seed, as a download would give the
same ones every time) gets low-rank adapters on its two layers; only the adapters train. The
module's ``on_save_checkpoint`` keeps the adapters' weights alone in ``checkpoint["state_dict"]``
(the idiom of LoRA fine-tunes: a checkpoint of kilobytes, not of the whole model), and
``strict_loading = False`` lets such a checkpoint load into a whole model: ``fit(ckpt_path="last")``
resumes a fresh model (its base rebuilt from the same seed) and ``load_from_checkpoint`` restores
one. Covers: frozen parameters, an optimizer over the trainable parameters only, the save hook
cutting the checkpoint down, ``ModelCheckpoint(save_last=True, save_top_k=-1)``, resume and
``load_from_checkpoint`` with ``strict_loading = False``, ``validation_step`` and ``sync_dist``
logging; checked against 4 uninterrupted epochs in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/lora_adapter.py --strategy fsdp --out /tmp/lora
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, value
from reference import global_batches, mean_loss, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
else:
    import fullshard as L
    from fullshard.callbacks import Callback, ModelCheckpoint

SEED, BATCH, FIRST_EPOCHS, EPOCHS, RANK, DIM = 5, 8, 2, 4, 2, 6


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g)
    return TensorDataset(x, torch.tanh(x @ torch.linspace(-1, 1, DIM)) + 0.1 * torch.randn(n, generator=g))


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trained low-rank update ``B @ A`` (B starts at zero)."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_a.t() @ self.lora_b.t()


def pretrained() -> nn.Sequential:
    """The "downloaded" network: the same weights every time."""
    g = torch.Generator().manual_seed(123)
    net = nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Linear(16, 1))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


class LoRAModel(RecordModuleHooks, L.LightningModule):
    strict_loading = False  # its checkpoints hold the adapters only

    def __init__(self, lr: float = 0.05, rank: int = RANK) -> None:
        super().__init__()
        self.save_hyperparameters()
        net = pretrained()
        torch.manual_seed(SEED)  # the adapters' initial values
        self.net = nn.Sequential(LoRALinear(net[0], rank), nn.Tanh(), LoRALinear(net[2], rank))

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.hparams.lr)

    def on_save_checkpoint(self, checkpoint):
        # keep only the adapters: the base is the pretrained network, which anyone can rebuild
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if "lora_" in k}


class Saves(RecordCallbackHooks, Callback):
    """Counts the checkpoints written (the hook order is recorded by the mixin)."""

    def __init__(self) -> None:
        self.saves = 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.saves += 1


def reference(train: TensorDataset, world_size: int) -> dict:
    """4 uninterrupted epochs in one process: the same model, AdamW over the adapters."""
    model = LoRAModel()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    x, y = train.tensors
    for epoch in range(EPOCHS):
        for idx in global_batches(len(train), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch):
            optimizer.zero_grad()
            F.mse_loss(model(x[idx]), y[idx]).backward()
            optimizer.step()
    return model.state_dict()


def make_trainer(args, root: Path, epochs: int, saves: Saves):
    checkpoint = ModelCheckpoint(dirpath=root / "ckpts", save_last=True, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=epochs,
        callbacks=[saves, checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    return trainer, checkpoint


def main(args):
    L.seed_everything(SEED)
    root: Path = args.out / "work"
    train, val = make_data(48, 1), make_data(24, 2)
    loaders = (DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH))

    trainer, checkpoint = make_trainer(args, root, FIRST_EPOCHS, Saves())
    mark("fit 2 epochs")
    trainer.fit(LoRAModel(), *loaders)
    mark("after first fit")
    saved = torch.load(checkpoint.last_model_path, map_location="cpu", weights_only=True)["state_dict"]
    value("saved_keys", sorted(saved))
    check(
        "the save hook left only the adapters in the checkpoint",
        sorted(saved) == ["net.0.lora_a", "net.0.lora_b", "net.2.lora_a", "net.2.lora_b"],
        sorted(saved),
    )

    saves = Saves()
    trainer, checkpoint = make_trainer(args, root, EPOCHS, saves)
    model = LoRAModel()
    mark("resume from last")
    trainer.fit(model, *loaders, ckpt_path="last")
    mark("after resumed fit")
    value("current_epoch", trainer.current_epoch)
    value("global_step", trainer.global_step)
    value("saves", saves.saves)
    value("val_loss", float(trainer.callback_metrics["val_loss"]))

    restored = LoRAModel.load_from_checkpoint(checkpoint.last_model_path)
    weights = reference(train, trainer.world_size)
    check(
        "resumed from adapter-only checkpoints: the weights of 4 uninterrupted epochs in one process",
        *state_close(restored.state_dict(), weights),
    )
    base = LoRAModel().state_dict()
    check(
        "load_from_checkpoint: the base is the pretrained one, the adapters the trained ones",
        all(torch.equal(restored.state_dict()[k], v) for k, v in base.items() if "lora_" not in k)
        and not torch.equal(restored.net[0].lora_b, base["net.0.lora_b"]),
        sorted(base),
    )
    expected = mean_loss(restored, F.mse_loss, val.tensors)
    check(
        "the last validation loss is the final weights' loss on the whole validation set",
        close(trainer.callback_metrics["val_loss"], expected),
        (float(trainer.callback_metrics["val_loss"]), expected),
    )


if __name__ == "__main__":
    run(main)

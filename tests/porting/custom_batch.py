"""Porting script: a custom batch type moved by the batch-transfer hooks, callbacks from the
module, loaders rebuilt every epoch, and a time limit that does not stop training.

Covers: ``transfer_batch_to_device`` (a batch class with a ``.to()`` method, moved through
``super()``), ``on_before_batch_transfer`` / ``on_after_batch_transfer`` transforming the batch,
``configure_callbacks`` (a callback of the same type as a Trainer callback replaces it; the
checkpoint callback stays last), ``reload_dataloaders_every_n_epochs=1`` (the module's
``train_dataloader`` / ``val_dataloader`` called again each epoch), ``max_time`` (a
``"DD:HH:MM:SS"`` limit long enough not to stop); checked against the same training in one
plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/custom_batch.py --strategy fsdp --out /tmp/p7
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, mark, run, snapshot, value
from reference import global_batches, state_close
from torch import nn
from torch.utils.data import DataLoader, Dataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
else:
    import fullshard as L
    from fullshard.callbacks import Callback, ModelCheckpoint, Timer

SEED, EPOCHS, BATCH, LR, N = 13, 3, 4, 0.05, 32
MOVES = []  # one entry per Batch.to() call: the hooks moved this batch


class Batch:
    """A user's batch type: two tensors, moved by ``.to()`` (neither a tensor nor a collection)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def to(self, device):
        MOVES.append(str(torch.device(device).type))
        return Batch(self.x.to(device), self.y.to(device))


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3


class Pairs(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def collate(items) -> Batch:
    return Batch(torch.stack([x for x, _ in items]), torch.stack([y for _, y in items]))


class Counter(RecordCallbackHooks, Callback):
    """A callback given both to the Trainer and by the module: the module's replaces the Trainer's."""

    def __init__(self, owner: str) -> None:
        self.owner = owner


class Net(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.data = {"train": make_data(N, 1), "val": make_data(16, 2)}
        self.loader_calls = {"train": 0, "val": 0}

    def forward(self, x):
        return self.layer(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self(batch.x), batch.y)
        self.log("train_loss", loss, batch_size=len(batch.x))
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self(batch.x), batch.y), sync_dist=True, batch_size=len(batch.x))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)

    def configure_callbacks(self):
        return [Counter("module")]

    def on_before_batch_transfer(self, batch, dataloader_idx):
        return Batch(batch.x * 2.0, batch.y)  # still on the loader's side

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return super().transfer_batch_to_device(batch, device, dataloader_idx)  # calls Batch.to

    def on_after_batch_transfer(self, batch, dataloader_idx):
        return Batch(batch.x, batch.y + 1.0)  # on the device

    def train_dataloader(self):
        self.loader_calls["train"] += 1
        return DataLoader(Pairs(*self.data["train"]), batch_size=BATCH, shuffle=True, collate_fn=collate)

    def val_dataloader(self):
        self.loader_calls["val"] += 1
        return DataLoader(Pairs(*self.data["val"]), batch_size=BATCH, collate_fn=collate)


class Recorder(RecordCallbackHooks, Callback):
    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)


def main(args):
    L.seed_everything(SEED)
    model = Net()
    initial = {k: v.clone() for k, v in model.layer.state_dict().items()}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=EPOCHS,
        max_time="00:01:00:00",
        reload_dataloaders_every_n_epochs=1,
        callbacks=[Recorder(), Counter("trainer"), ModelCheckpoint(dirpath=args.out / "ckpts", save_top_k=0)],
        logger=False,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out / "work",
    )
    mark("fit")
    trainer.fit(model)
    mark("after fit")
    value("global_step", trainer.global_step)
    value("should_stop", trainer.should_stop)
    value("loader_calls", model.loader_calls)
    value("batches_moved", len(MOVES))
    ours = [cb for cb in trainer.callbacks if isinstance(cb, Recorder | Counter | ModelCheckpoint)]
    value("callbacks", [getattr(cb, "owner", type(cb).__name__) for cb in ours])
    timers = [cb for cb in trainer.callbacks if isinstance(cb, Timer)]
    check(
        "a Timer came with max_time, and measured the training",
        len(timers) == 1 and 0 < timers[0].time_elapsed("train") < 3600,
    )
    check("every batch moved to cpu through Batch.to", set(MOVES) == {"cpu"}, sorted(set(MOVES)))

    # the same training in one process, with the hooks' transforms
    reference = nn.Linear(3, 1)
    reference.load_state_dict(initial)
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    x, y = model.data["train"]
    for epoch in range(EPOCHS):
        for indices in global_batches(N, BATCH, 2, shuffle=True, seed=SEED, epoch=epoch):
            optimizer.zero_grad()
            F.mse_loss(reference(x[indices] * 2.0).squeeze(-1), y[indices] + 1.0).backward()
            optimizer.step()
    path = os.path.join(trainer.default_root_dir, "final.ckpt")
    trainer.save_checkpoint(path)
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    ok, detail = state_close({k.removeprefix("layer."): v for k, v in state.items()}, reference.state_dict())
    check("the weights equal one-process training on the transformed global batches", ok, detail)


if __name__ == "__main__":
    run(main)

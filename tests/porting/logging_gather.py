"""Porting script: a classifier built in ``configure_model`` that logs in every way users do and
gathers its outputs across processes; stopped by ``max_steps`` in the middle of an epoch.

Covers: ``configure_model``, ``self.log`` with ``on_step``/``on_epoch``/``prog_bar``/
``sync_dist``/``reduce_fx`` ("max", "sum")/``batch_size``, ``trainer.progress_bar_metrics``,
``trainer.callback_metrics``, ``self.all_gather`` of a tensor and of a dict, logging the gathered
values in ``on_train_epoch_end`` and ``on_validation_epoch_end``, ``val_check_interval`` as a
number of batches, ``max_steps`` ending training mid-epoch, ``min_steps``, ``self.global_step``,
``self.current_epoch``; checked against plain PyTorch.

    PORT_FRAMEWORK=fullshard python tests/porting/logging_gather.py --strategy fsdp --out /tmp/p6
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RECORD, RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback
else:
    import fullshard as L
    from fullshard.callbacks import Callback

SEED, BATCH, MAX_STEPS = 13, 8, 7


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x[:, 0] * x[:, 1] > 0).long())


class Classifier(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder: nn.Module | None = None
        self.head: nn.Module | None = None
        self.train_losses: list[torch.Tensor] = []
        self.val_outputs: list[dict[str, torch.Tensor]] = []

    def configure_model(self):
        if self.encoder is not None:
            return
        self.encoder = nn.Sequential(nn.Linear(4, 32), nn.ReLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("loss", loss, on_step=True, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log(
            "max_logit", logits.abs().max(), on_step=False, on_epoch=True, reduce_fx="max", sync_dist=True
        )
        self.log("samples", float(len(x)), on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True)
        self.log("step_in_step", float(self.global_step), on_step=True, on_epoch=False)
        self.train_losses.append(loss.detach())
        return loss

    def on_train_epoch_end(self):
        gathered = self.all_gather(torch.stack(self.train_losses))  # (world size, batches)
        self.train_losses.clear()
        value(f"train_gathered_shape_epoch{self.current_epoch}", list(gathered.shape))
        self.log("gathered_loss", gathered.mean())

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log(
            "val_acc",
            (logits.argmax(-1) == y).float().mean(),
            sync_dist=True,
            batch_size=len(x),
            prog_bar=True,
        )
        self.val_outputs.append({"pred": logits.argmax(-1), "y": y})
        return logits

    def on_validation_epoch_end(self):
        outputs = {k: torch.cat([o[k] for o in self.val_outputs]) for k in ("pred", "y")}
        self.val_outputs.clear()
        gathered = self.all_gather(outputs)  # a dict of (world size, samples) tensors
        self.log("val_acc_gathered", (gathered["pred"] == gathered["y"]).float().mean())
        value(f"val_gathered_at_step{self.global_step}", {k: list(v.shape) for k, v in gathered.items()})

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class Recorder(RecordCallbackHooks, Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        snapshot("on_train_epoch_end", trainer)

    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    train, val = make_data(64, 1), make_data(32, 2)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=3,
        max_steps=MAX_STEPS,
        min_steps=1,
        val_check_interval=2,
        num_sanity_val_steps=0,
        callbacks=[Recorder()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=root,
    )
    model = Classifier()
    mark("fit")
    trainer.fit(model, DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH))
    mark("after fit")
    snapshot("after fit", trainer)
    value("global_step", trainer.global_step)
    value("current_epoch", trainer.current_epoch)
    metrics = trainer.callback_metrics
    value("progress_bar_names", sorted(trainer.progress_bar_metrics))
    # the epoch cut short by max_steps still ends (on_train_epoch_end runs) and is counted
    check(
        "max_steps stops in the middle of the second epoch",
        (trainer.global_step, trainer.current_epoch) == (MAX_STEPS, 2),
        (trainer.global_step, trainer.current_epoch),
    )
    epoch_end = [m for m in RECORD.metrics if m["point"].startswith("on_train_epoch_end")]
    first = epoch_end[0]["callback_metrics"] if epoch_end else {}
    check(
        "reduce_fx='sum' with sync_dist adds every sample of the first epoch",
        first.get("samples") == 64.0,
        first.get("samples"),
    )
    later = next(
        (m["callback_metrics"] for m in RECORD.metrics if "gathered_loss" in m["callback_metrics"]), {}
    )
    check(
        "all_gather of the first epoch's losses averages to its loss_epoch",
        close(later.get("gathered_loss", 0.0), first.get("loss_epoch", 1.0)),
        (later.get("gathered_loss"), first.get("loss_epoch")),
    )
    check(
        "val_acc (sync_dist) equals the accuracy of the gathered predictions",
        close(metrics["val_acc"], metrics["val_acc_gathered"]),
        (float(metrics["val_acc"]), float(metrics["val_acc_gathered"])),
    )

    mark("validate")
    results = trainer.validate(model, DataLoader(val, batch_size=BATCH))
    mark("after validate")
    value("validate_results", results)
    trainer.save_checkpoint(root / "final.ckpt")
    state = torch.load(root / "final.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    reference = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    reference.load_state_dict(
        {
            "0.weight": state["encoder.0.weight"],
            "0.bias": state["encoder.0.bias"],
            "2.weight": state["head.weight"],
            "2.bias": state["head.bias"],
        }
    )
    x, y = val.tensors
    with torch.no_grad():
        acc = float((reference(x).argmax(-1) == y).float().mean())
    check(
        "validate() after fit gives the final weights' accuracy on the whole validation set",
        close(results[0]["val_acc"], acc),
        (results[0]["val_acc"], acc),
    )


if __name__ == "__main__":
    run(main)

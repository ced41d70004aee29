"""Porting script: torchmetrics, two validation dataloaders, a test loader and a prediction writer.

Covers: ``self.log`` with a ``torchmetrics.Metric`` (``on_step`` and ``on_epoch`` in training,
per validation dataloader), ``self.log_dict`` with a ``MetricCollection`` in ``test_step``,
``metric_attribute``, two validation dataloaders (``dataloader_idx``, ``/dataloader_idx_N``
names, ``add_dataloader_idx=False``, ``num_sanity_val_steps`` and ``limit_val_batches`` per
dataloader, ``trainer.num_val_batches``), ``validate`` returning one dict per dataloader, two
prediction dataloaders with a ``BasePredictionWriter`` (``write_interval="batch_and_epoch"``,
``batch_indices``) and ``predict(return_predictions=False)``, the model eval/train hooks;
checked against the same training and evaluation in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/metrics_writer_multi_val.py --strategy fsdp --out /tmp/p7
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import torchmetrics
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import global_batches, rank_indices
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import BasePredictionWriter, Callback
else:
    import fullshard as L
    from fullshard.callbacks import BasePredictionWriter, Callback

SEED, EPOCHS, BATCH, CLASSES, LR = 5, 2, 8, 3, 0.05


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].argmax(-1) + (x[:, 3] > 1.0).long()) % CLASSES
    return TensorDataset(x, y)


def accuracy() -> torchmetrics.Metric:
    return torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)


class Classifier(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, CLASSES))
        self.train_acc = accuracy()
        self.val_acc = nn.ModuleList([accuracy(), accuracy()])
        self.test_metrics = torchmetrics.MetricCollection({"acc": accuracy()}, prefix="test_")

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True, metric_attribute="train_acc")
        return F.cross_entropy(logits, y)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        logits = self(x)
        self.val_acc[dataloader_idx](logits, y)
        self.log("val_acc", self.val_acc[dataloader_idx])
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(
            f"val_batches_{dataloader_idx}", float(batch_idx + 1), reduce_fx="max", add_dataloader_idx=False
        )

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.test_metrics(self(x), y)
        self.log_dict(self.test_metrics)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, _ = batch
        return self(x).softmax(-1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


class Recorder(RecordCallbackHooks, Callback):
    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)
        value(
            f"num_val_batches_{'sanity' if trainer.sanity_checking else trainer.current_epoch}",
            trainer.num_val_batches,
        )
        if trainer.sanity_checking:
            value("num_sanity_val_batches", trainer.num_sanity_val_batches)

    def on_train_epoch_end(self, trainer, pl_module):
        snapshot("on_train_epoch_end", trainer)


class Writer(BasePredictionWriter):
    """Writes each batch's predictions with their dataset indices; keeps the epoch's for a check."""

    def __init__(self, out) -> None:
        super().__init__(write_interval="batch_and_epoch")
        self.out = out
        self.epoch = None

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        path = self.out / f"pred_{dataloader_idx}_{trainer.global_rank}_{batch_idx}.pt"
        torch.save({"indices": list(batch_indices), "prediction": prediction}, path)

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.epoch = (len(predictions), [len(p) for p in predictions], batch_indices)


def reference(train: TensorDataset, world_size: int) -> tuple[nn.Module, list[float]]:
    """One process: the same global batches; the epoch's accuracy of the predictions made before
    each step (what ``train_acc`` accumulates)."""
    torch.manual_seed(SEED)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = train.tensors
    accuracies = []
    for epoch in range(EPOCHS):
        correct = total = 0
        for idx in global_batches(len(train), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch):
            logits = model(x[idx])
            correct += int((logits.argmax(-1) == y[idx]).sum())
            total += len(idx)
            F.cross_entropy(logits, y[idx]).backward()
            optimizer.step()
            optimizer.zero_grad()
        accuracies.append(correct / total)
    return model, accuracies


def acc_of(model: nn.Module, data: TensorDataset, indices=None) -> float:
    x, y = data.tensors
    if indices is not None:
        x, y = x[indices], y[indices]
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    (root / "preds").mkdir(parents=True, exist_ok=True)
    train, val_a, val_b, test = make_data(64, 1), make_data(32, 2), make_data(48, 3), make_data(40, 4)
    writer = Writer(root / "preds")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=EPOCHS,
        num_sanity_val_steps=1,
        limit_val_batches=2,
        log_every_n_steps=1,
        callbacks=[Recorder(), writer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=root,
    )
    model = Classifier()
    mark("fit")
    trainer.fit(
        model,
        DataLoader(train, batch_size=BATCH, shuffle=True),
        [DataLoader(val_a, batch_size=BATCH), DataLoader(val_b, batch_size=BATCH)],
    )
    mark("after fit")
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    ref, train_accs = reference(train, trainer.world_size)
    check(
        "train_acc_epoch is the accuracy of the last epoch's training predictions",
        close(fit_metrics["train_acc_epoch"], train_accs[-1]),
        (fit_metrics["train_acc_epoch"], train_accs),
    )
    # limit_val_batches=2 per dataloader: the first 2 batches of each rank, the first 32 samples together
    for i, data in enumerate((val_a, val_b)):
        expected = acc_of(ref, data, slice(0, 32))
        got = fit_metrics[f"val_acc/dataloader_idx_{i}"]
        check(
            f"val_acc of dataloader {i} is the final weights' on its first 32 samples",
            close(got, expected),
            (got, expected),
        )
        check(
            f"val_batches_{i} is logged without a suffix",
            fit_metrics.get(f"val_batches_{i}") == 2.0,
            fit_metrics,
        )

    mark("validate")
    results = trainer.validate(
        model, [DataLoader(val_a, batch_size=BATCH), DataLoader(val_b, batch_size=BATCH)], verbose=False
    )
    value("validate_results", results)
    check(
        "validate returns one dict per dataloader",
        [sorted(r) for r in results]
        == [
            ["val_acc/dataloader_idx_0", "val_batches_0", "val_loss/dataloader_idx_0"],
            ["val_acc/dataloader_idx_1", "val_batches_1", "val_loss/dataloader_idx_1"],
        ],
        results,
    )

    mark("test")
    tested = trainer.test(model, DataLoader(test, batch_size=BATCH), verbose=False)
    value("test_results", tested)
    check(
        "test_acc is the final weights' on the whole test set",
        close(tested[0]["test_acc"], acc_of(ref, test)),
        tested,
    )

    mark("predict")
    returned = trainer.predict(
        model,
        [DataLoader(test, batch_size=BATCH), DataLoader(val_a, batch_size=BATCH)],
        return_predictions=False,
    )
    mark("after predict")
    check("predict(return_predictions=False) returns None", returned is None, type(returned))
    value("num_predict_batches", trainer.num_predict_batches)
    value("writer_interval", [writer.interval.on_batch, writer.interval.on_epoch])
    count, lengths, indices = writer.epoch
    value("writer_epoch", [count, lengths])
    rank = trainer.global_rank
    for i, data in enumerate((test, val_a)):
        mine = rank_indices(len(data), trainer.world_size, rank, shuffle=False, seed=SEED, epoch=0)
        written = [torch.load(root / "preds" / f"pred_{i}_{rank}_{b}.pt") for b in range(lengths[i])]
        got_indices = [j for w in written for j in w["indices"]]
        check(f"batch_indices of dataloader {i} are this rank's samples", got_indices == mine, got_indices)
        check(
            f"the epoch's batch_indices of dataloader {i} are the batches'",
            [j for b in indices[i] for j in b] == mine,
        )
        with torch.no_grad():
            expected = ref(data.tensors[0][mine]).softmax(-1)
        got = torch.cat([w["prediction"] for w in written])
        check(
            f"written predictions of dataloader {i} are the final weights'", close(got, expected), got.shape
        )


if __name__ == "__main__":
    run(main)

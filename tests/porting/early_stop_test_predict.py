"""Porting script: a classifier stopped early, then tested and used for prediction from its best
checkpoint.

Covers: ``EarlyStopping`` (mode, patience), ``check_val_every_n_epoch``, ``min_epochs``,
``ModelCheckpoint`` (monitor, mode, save_top_k, filename template), ``trainer.checkpoint_callback``
with ``best_model_path`` and ``best_model_score``,
``trainer.test(ckpt_path="best")`` and ``trainer.predict(ckpt_path="best")`` with their return
values, a custom callback that keeps state and logs from a callback hook, ``self.all_gather``,
``self.global_rank``, ``trainer.should_stop``, ``num_sanity_val_steps`` (default),
``Module.load_from_checkpoint``; checked against plain-PyTorch evaluation of the best weights.

    PORT_FRAMEWORK=fullshard python tests/porting/early_stop_test_predict.py --strategy fsdp --out /tmp/p3
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import rank_indices
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
else:
    import fullshard as L
    from fullshard.callbacks import Callback, EarlyStopping, ModelCheckpoint

SEED, BATCH, CLASSES = 3, 8, 3
# The score the module reports at each validated epoch (1, 3, 5, ...): best at epoch 3, worse at 5,
# so EarlyStopping(patience=1) stops after epoch 5 and the best checkpoint is epoch 3's.
SCORES = {1: 1.0, 3: 0.5, 5: 0.6, 7: 0.4, 9: 0.3}


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].argmax(-1) + (x[:, 3] > 1.0).long()) % CLASSES
    return TensorDataset(x, y)


class Classifier(RecordModuleHooks, L.LightningModule):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))
        self.val_correct: list[torch.Tensor] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.val_correct.append((logits.argmax(-1) == y).float())

    def on_validation_epoch_end(self):
        correct = self.all_gather(torch.cat(self.val_correct))  # (world size, samples per rank)
        self.val_correct.clear()
        value(f"val_gathered_shape_epoch{self.current_epoch}", list(correct.shape))
        self.log("val_acc", correct.mean())
        self.log("val_score", SCORES.get(self.current_epoch, 9.0))

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("test_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("test_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, _ = batch
        return {"rank": self.global_rank, "probs": self(x).softmax(-1)}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class Recorder(RecordCallbackHooks, Callback):
    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)

    def on_test_end(self, trainer, pl_module):
        snapshot("on_test_end", trainer)


class BestScore(Callback):
    """A user's callback: remembers the best val_score (saved in checkpoints) and logs the epoch."""

    def __init__(self) -> None:
        self.best = float("inf")
        self.validations = 0

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        self.validations += 1
        self.best = min(self.best, float(trainer.callback_metrics["val_score"]))

    def on_train_epoch_end(self, trainer, pl_module):
        pl_module.log("cb_epoch", float(trainer.current_epoch))

    def state_dict(self):
        return {"best": self.best, "validations": self.validations}

    def load_state_dict(self, state_dict):
        self.best, self.validations = state_dict["best"], state_dict["validations"]


def evaluate(model: nn.Module, data: TensorDataset) -> tuple[float, float]:
    x, y = data.tensors
    with torch.no_grad():
        logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(-1) == y).float().mean())


def main(args):
    L.seed_everything(SEED)
    root: Path = args.out / "work"
    train, val, test = make_data(64, 1), make_data(32, 2), make_data(32, 3)
    best_score = BestScore()
    checkpoint = ModelCheckpoint(
        dirpath=root / "ckpts",
        filename="{epoch}-{val_score:.2f}",
        monitor="val_score",
        mode="min",
        save_top_k=2,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=10,
        min_epochs=2,
        check_val_every_n_epoch=2,
        callbacks=[
            Recorder(),
            best_score,
            checkpoint,
            EarlyStopping(monitor="val_score", mode="min", patience=1),
        ],
        logger=False,
        enable_progress_bar=False,
        default_root_dir=root,
    )
    model = Classifier()
    mark("fit")
    trainer.fit(model, DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH))
    mark("after fit")
    value("stopped_at_epoch", trainer.current_epoch)
    value("should_stop", trainer.should_stop)
    value("best_model", Path(trainer.checkpoint_callback.best_model_path).name)
    value("best_model_score", trainer.checkpoint_callback.best_model_score)
    value("kept_checkpoints", sorted(p.name for p in (root / "ckpts").iterdir()))
    check(
        "the custom callback saw 3 validations, best 0.5",
        (best_score.validations, best_score.best) == (3, 0.5),
        (best_score.validations, best_score.best),
    )

    mark("test")
    results = trainer.test(model, DataLoader(test, batch_size=BATCH), ckpt_path="best")
    value("test_results", results)
    mark("predict")
    predictions = trainer.predict(model, DataLoader(test, batch_size=BATCH), ckpt_path="best")
    mark("after predict")
    value("prediction_batches", len(predictions))

    best = Classifier.load_from_checkpoint(checkpoint.best_model_path)
    check("load_from_checkpoint keeps the hyperparameters", best.hparams.hidden == 32, dict(best.hparams))
    best.eval()
    test_loss, test_acc = evaluate(best, test)
    check(
        "test metrics are the best weights' on the whole test set",
        close(results[0]["test_loss"], test_loss) and close(results[0]["test_acc"], test_acc),
        (results[0], test_loss, test_acc),
    )
    mine = rank_indices(len(test), trainer.world_size, trainer.global_rank, shuffle=False, seed=SEED, epoch=0)
    with torch.no_grad():
        expected = best(test.tensors[0][mine]).softmax(-1)
    got = torch.cat([p["probs"] for p in predictions])
    check("predictions are this rank's share, from the best weights", close(got, expected), got.shape)
    check("predict_step ran on this rank", all(p["rank"] == trainer.global_rank for p in predictions))


if __name__ == "__main__":
    run(main)

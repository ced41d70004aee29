"""Fine-tuning callbacks, resuming, the tuner and the prediction writer under Lightning 2.6.6 and
fullshard (tests/test_tuning_resume_twins.py compares them): resuming after BackboneFinetuning
unfroze the backbone or StochasticWeightAveraging started, the checks made when resuming, a
BaseFinetuning subclass with batch norm layers, ``Tuner.lr_find``/``scale_batch_size``, and the
arguments of ``BasePredictionWriter.write_on_epoch_end``.

Run one framework by hand::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/tuning_resume.py --out /tmp/l.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from twin import caught_warnings, imp, main, raised, warned

L = imp()


# ---- resuming after a callback changed the optimizer; the checks made when resuming
callbacks = imp("callbacks")


class ResumeNet(L.LightningModule):
    """A backbone with batch norm and a head; SGD with momentum over the trainable parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.head(self.backbone(x)), y)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(32, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=8)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)


class ResumePlain(ResumeNet):
    """No batch norm (SWA would add an epoch for it under Lightning)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))


def resume_trainer(tmp: Path, cbs: list[Any], **kwargs: Any) -> Any:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
        callbacks=cbs,
        **kwargs,
    )


def weight_sums(model: nn.Module) -> dict[str, float]:
    return {k: float(v.double().sum()) for k, v in model.state_dict().items()}


def fit_straight_and_resumed(
    tmp: Path, make: Any, callback: Any, first: dict[str, Any], second: dict[str, Any]
) -> dict[str, Any]:
    L.seed_everything(0)
    straight = make()
    t = resume_trainer(tmp / "straight", [callback()], **second)
    t.fit(straight)
    L.seed_everything(0)
    half = make()
    t = resume_trainer(tmp / "half", [callback()], **first)
    t.fit(half)
    t.save_checkpoint(tmp / "mid.ckpt")
    resumed = make()
    t = resume_trainer(tmp / "resumed", [callback()], **second)
    out = raised(lambda: t.fit(resumed, ckpt_path=tmp / "mid.ckpt"))
    groups = [{"n": len(g["params"]), "lr": g["lr"]} for g in t.optimizers[0].param_groups]
    a, b = weight_sums(straight), weight_sums(resumed)
    return {
        "fit": out,
        "resumed": b,
        "groups": groups,
        "global_step": t.global_step,
        "same_as_straight": all(abs(a[k] - b[k]) < 1e-5 for k in a),
    }


def case_resume_after_backbone_unfrozen(tmp: Path) -> Any:
    def callback() -> Any:
        return callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda e: 1.5)

    return fit_straight_and_resumed(tmp, ResumeNet, callback, {"max_epochs": 2}, {"max_epochs": 4})


def case_resume_after_swa_started(tmp: Path) -> Any:
    def callback() -> Any:
        return callbacks.StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=2)

    # stopped by max_steps (not max_epochs: SWA would end and put the average into the model)
    return fit_straight_and_resumed(
        tmp, ResumePlain, callback, {"max_epochs": 5, "max_steps": 12}, {"max_epochs": 5}
    )


class ResumeSched(ResumePlain):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]


def case_resume_after_swa_replaced_a_scheduler(tmp: Path) -> Any:
    def callback() -> Any:
        return callbacks.StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=2)

    return fit_straight_and_resumed(
        tmp, ResumeSched, callback, {"max_epochs": 5, "max_steps": 12}, {"max_epochs": 5}
    )


def case_resume_with_max_epochs_below_the_checkpoints(tmp: Path) -> Any:
    L.seed_everything(0)
    t = resume_trainer(tmp, [], max_epochs=3)
    t.fit(ResumeNet())
    t.save_checkpoint(tmp / "end.ckpt")
    out = {}
    for max_epochs in (1, 2, 3, 4):
        t = resume_trainer(tmp / str(max_epochs), [], max_epochs=max_epochs)
        try:
            t.fit(ResumeNet(), ckpt_path=tmp / "end.ckpt")
            seen = None
        except Exception as err:  # Lightning's MisconfigurationException is fullshard's MisconfigurationError
            name = type(err).__name__
            seen = {
                "misconfiguration": name.startswith("Misconfiguration"),
                "gist": ["current_epoch=3" in str(err), f"max_epochs={max_epochs}" in str(err)],
            }
        # (the step a failed resume leaves differs: Lightning has restored its counters by then)
        out[max_epochs] = {"raised": seen} if seen else {"raised": None, "global_step": t.global_step}
    return out


class Counter(L.Callback):
    """A callback with a state of its own."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches = state_dict["batches"]


def case_resume_without_a_callback_the_checkpoint_holds(tmp: Path) -> Any:
    L.seed_everything(0)
    t = resume_trainer(tmp, [Counter()], max_epochs=2)
    t.fit(ResumeNet())
    t.save_checkpoint(tmp / "mid.ckpt")
    needle = "callbacks used to create the checkpoint need to be"
    out = {}
    for name, counter in (("without", None), ("with", Counter())):
        t = resume_trainer(tmp / name, [counter] if counter else [], max_epochs=3)
        with caught_warnings() as seen:
            t.fit(ResumeNet(), ckpt_path=tmp / "mid.ckpt")
        out[name] = warned(seen, needle) + ([counter.batches] if counter else [])
    return out


# ---- Lightning's transfer-learning example in small (examples/pytorch/domain_templates/
# computer_vision_fine_tuning.py): a BaseFinetuning subclass unfreezing a CNN with batch norm at milestones
BaseFinetuning = imp("callbacks").BaseFinetuning


class MilestonesFinetuning(BaseFinetuning):
    """As in the example: the backbone frozen (its batch norms too, ``train_bn=False``), its last
    layers unfrozen at the first milestone, the rest at the second."""

    def __init__(self, milestones: tuple[int, int] = (1, 2), train_bn: bool = False) -> None:
        super().__init__()
        self.milestones = milestones
        self.train_bn = train_bn

    def freeze_before_training(self, pl_module: Any) -> None:
        self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        if epoch == self.milestones[0]:
            self.unfreeze_and_add_param_group(
                modules=pl_module.feature_extractor[-5:], optimizer=optimizer, train_bn=self.train_bn
            )
        elif epoch == self.milestones[1]:
            self.unfreeze_and_add_param_group(
                modules=pl_module.feature_extractor[:-5], optimizer=optimizer, train_bn=self.train_bn
            )


class TransferLearningModel(L.LightningModule):
    def __init__(self, lr: float = 1e-2, milestones: tuple[int, int] = (1, 2)) -> None:
        super().__init__()
        self.lr = lr
        self.milestones = milestones
        self.feature_extractor = nn.Sequential(
            nn.Conv2d(3, 8, 3, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.feature_extractor(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.binary_cross_entropy_with_logits(self(x), y))

    def configure_optimizers(self) -> Any:
        parameters = list(self.parameters())
        trainable_parameters = list(filter(lambda p: p.requires_grad, parameters))
        optimizer = torch.optim.Adam(trainable_parameters, lr=self.lr)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(
            optimizer, milestones=list(self.milestones), gamma=0.5
        )
        return [optimizer], [scheduler]


def image_loader(n: int, seed: int, shuffle: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 10, 10, generator=g)
    y = (x[:, 0].mean((1, 2)) > 0).float().unsqueeze(1)
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=shuffle)


def finetune_run(tmp: Path, train_bn: bool, shuffle: bool = False) -> Any:
    L.seed_everything(0)
    model = TransferLearningModel()
    callback = MilestonesFinetuning(train_bn=train_bn)
    t = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=4,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback],
        default_root_dir=tmp,
    )
    t.fit(model, image_loader(32, 1, shuffle), image_loader(16, 2))
    groups = [{"n": len(g["params"]), "lr": g["lr"]} for g in t.optimizers[0].param_groups]
    sums = {k: float(v.double().sum()) for k, v in model.state_dict().items()}
    modes = {
        k: [m.training, m.track_running_stats]
        for k, m in model.named_modules()
        if isinstance(m, nn.BatchNorm2d)
    }
    return {
        "groups": groups,
        "sums": sums,
        "bn": modes,
        "requires_grad": [p.requires_grad for p in model.parameters()],
    }


def case_milestones_batch_norm_frozen(tmp: Path) -> Any:
    return finetune_run(tmp, train_bn=False)


def case_milestones_batch_norm_trained(tmp: Path) -> Any:
    return finetune_run(tmp, train_bn=True)


def case_milestones_shuffled_as_the_example(tmp: Path) -> Any:
    # Lightning's transfer-learning example shuffles its training loader
    return finetune_run(tmp, train_bn=False, shuffle=True)


# ---- the tuner
Tuner = imp("tuner").Tuner


def tuner_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, :4].sum(1, keepdim=True)).tanh())


class TunedNet(L.LightningModule):
    def __init__(
        self, lr: float = 0.01, batch_size: int = 4, skip_every: int = 0, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        self.batch_size = batch_size
        self.layer = nn.Sequential(nn.Linear(8, 16), nn.Dropout(dropout), nn.ReLU(), nn.Linear(16, 1))
        self.val_losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.hparams.skip_every and batch_idx % self.hparams.skip_every == 1:
            return None  # a skipped step
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.layer(x), y))

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_losses.append(float(self.trainer.callback_metrics["val_loss"]))

    def train_dataloader(self) -> DataLoader:
        # unshuffled; the shuffled sequence is case_scale_batch_size_then_lr_find_shuffled in seeding.py
        return DataLoader(tuner_data(256, 1), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(tuner_data(64, 2), batch_size=16)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def tuner_trainer(tmp: Path, **kwargs: Any) -> Any:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp,
        **kwargs,
    )


def case_scale_batch_size_leaves_val_dataloaders(tmp: Path) -> Any:
    L.seed_everything(0)
    t = tuner_trainer(tmp, max_epochs=1)
    model = TunedNet()
    found = Tuner(t).scale_batch_size(model, max_trials=3, steps_per_trial=2)
    val = t.val_dataloaders
    return {"found": found, "val_set": val is not None, "val_type": type(val).__name__}


def case_lr_find_with_skipped_steps(tmp: Path) -> Any:
    L.seed_everything(0)
    t = tuner_trainer(tmp, max_epochs=1)
    model = TunedNet(skip_every=3)
    finder = Tuner(t).lr_find(model, num_training=20, early_stop_threshold=None)
    losses = finder.results["loss"]
    return {
        "points": len(losses),
        "nan": [i for i, v in enumerate(losses) if v != v],
        "lrs": finder.results["lr"][:3],
        "global_step": t.global_step,
    }


def case_lr_find_updates_hparams(tmp: Path) -> Any:
    L.seed_everything(0)
    t = tuner_trainer(tmp, max_epochs=1)
    model = TunedNet()
    finder = Tuner(t).lr_find(model, num_training=30)
    return {
        "suggestion": finder.suggestion(),
        "lr": model.lr,
        "hparams_lr": model.hparams.lr,
        "optimizer_lr": t.optimizers[0].param_groups[0]["lr"] if t.optimizers else None,
        "val_set": t.val_dataloaders is not None,
    }


def case_lr_find_after_scale_batch_size(tmp: Path) -> Any:
    # without dropout or shuffling; with both: case_scale_batch_size_then_lr_find_shuffled in seeding.py
    L.seed_everything(7)
    t = tuner_trainer(tmp, max_epochs=3)
    model = TunedNet(dropout=0.0)
    tuner = Tuner(t)
    found = tuner.scale_batch_size(model, max_trials=3, steps_per_trial=2)
    finder = tuner.lr_find(model, num_training=30)
    t.fit(model)
    return {"batch_size": found, "suggestion": finder.suggestion(), "val_losses": model.val_losses}


# ---- BasePredictionWriter.write_on_epoch_end's arguments
BasePredictionWriter = imp("callbacks").BasePredictionWriter


class PredictNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.layer(batch[0]).squeeze(-1)


class Writer(BasePredictionWriter):
    def __init__(self, interval: str) -> None:
        super().__init__(write_interval=interval)
        self.seen: list[Any] = []

    def write_on_batch_end(
        self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, *rest: Any
    ) -> None:
        pass

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        def shape(x: Any) -> Any:
            return [shape(v) for v in x] if isinstance(x, list) else type(x).__name__

        self.seen.append({"predictions": shape(predictions), "batch_indices": batch_indices})


def predict_loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 2, generator=g)), batch_size=3)


def predict_with_writer(tmp: Path, loaders: Any, interval: str, keep: bool = True) -> Any:
    writer = Writer(interval)
    t = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        callbacks=[writer],
        default_root_dir=tmp,
    )
    t.predict(PredictNet(), loaders, return_predictions=keep)
    return writer.seen


def case_one_dataloader(tmp: Path) -> Any:
    return predict_with_writer(tmp, predict_loader(7, 0), "epoch")


def case_two_dataloaders(tmp: Path) -> Any:
    return predict_with_writer(tmp, [predict_loader(7, 0), predict_loader(4, 1)], "batch_and_epoch")


def case_one_dataloader_in_a_list_without_returned_predictions(tmp: Path) -> Any:
    return predict_with_writer(tmp, [predict_loader(5, 0)], "epoch", keep=False)


if __name__ == "__main__":
    main()

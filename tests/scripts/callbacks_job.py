"""Lightning's callbacks and the tuner on 2 processes (or 1, the reference), writing what each
run ended with to a JSON file (rank 0):

    python tests/scripts/callbacks_job.py ddp|fsdp|fsdp2|single OUT_DIR

1. EMAWeightAveraging + GradientAccumulationScheduler + BackboneFinetuning, with
   ThroughputMonitor, DeviceStatsMonitor, SpikeDetection, LambdaCallback and ModelSummary beside
   them (CSVLogger): the final (averaged) weights.
   Then EMAWeightAveraging alone, resumed after 2 of 4 epochs.
2. Tuner.lr_find, then StochasticWeightAveraging with a RichProgressBar: the suggestion, whether the weights were left
   as they were, and the final weights; Tuner.scale_batch_size (3 trials: 2, 4, 8).
3. ModelPruning, global and per parameter: the pruned weights.
4. SpikeDetection and OnExceptionCheckpoint: the loss spikes at step 3 on every rank; the
   batches written to skip, and the checkpoint's global step (4: the spike is seen after the step).

Two processes see batches of 4 each, the reference one of 8 (the same global batches, in order).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.callbacks import (
    BackboneFinetuning,
    DeviceStatsMonitor,
    EMAWeightAveraging,
    GradientAccumulationScheduler,
    LambdaCallback,
    ModelCheckpoint,
    ModelPruning,
    ModelSummary,
    OnExceptionCheckpoint,
    RichProgressBar,
    SpikeDetection,
    StochasticWeightAveraging,
    ThroughputMonitor,
    TrainingSpikeException,
)
from fullshard.loggers import CSVLogger
from fullshard.strategies import FSDP2Strategy, FSDPStrategy
from fullshard.tuner import Tuner


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1)


class Net(fullshard.LightningModule):
    def __init__(self, lr: float = 0.02, spike_at: int | None = None) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 1)
        self.lr = lr
        self.spike_at = spike_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)).squeeze(-1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        if self.global_step == self.spike_at:
            loss = loss * 1000  # on every rank, at the same step
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=self.lr, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7)}


class SizedNet(Net):
    """Builds its loader from ``self.batch_size``, which the batch size finder sets."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 2

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(data(), batch_size=self.batch_size)


def make_strategy(name: str) -> Any:
    if name == "fsdp":
        return FSDPStrategy(auto_wrap_policy={nn.Linear})
    if name == "fsdp2":
        return FSDP2Strategy(auto_wrap_policy={nn.Linear})
    return "ddp" if name == "ddp" else "auto"


def trainer_for(name: str, out: Path, callbacks: list[Any], **kwargs: Any) -> fullshard.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1 if name == "single" else 2,
        strategy=make_strategy(name),
        max_epochs=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=out,
        # 2 processes are compared with one reading the data in order: keep the loader's order
        use_distributed_sampler="keep_shuffle",
    )
    options.update(kwargs)
    return fullshard.Trainer(callbacks=callbacks, **options)


def weights(trainer: fullshard.Trainer) -> list[float]:
    state = trainer.strategy.module_state_dict()  # collective
    return [round(float(v.sum()), 5) for _, v in sorted(state.items())]


def main(name: str, out: Path) -> None:
    batch = 8 if name == "single" else 4
    loader = DataLoader(data(), batch_size=batch)
    result: dict[str, Any] = {}

    # 1. averaging, accumulation schedule and finetuning together, with the monitors beside them
    fullshard.seed_everything(0)
    seen: list[int] = []
    trainer = trainer_for(
        name,
        out,
        [
            EMAWeightAveraging(decay=0.9),
            GradientAccumulationScheduler({1: 2}),
            BackboneFinetuning(unfreeze_backbone_at_epoch=2, lambda_func=lambda epoch: 1.5),
            ThroughputMonitor(batch_size_fn=lambda b: len(b[0]), window_size=2),
            DeviceStatsMonitor(),
            SpikeDetection(rtol=1e6),
            LambdaCallback(on_train_epoch_end=lambda trainer, module: seen.append(trainer.current_epoch)),
            ModelSummary(max_depth=2),
        ],
        logger=CSVLogger(out, name="logs"),
        log_every_n_steps=1,
    )
    trainer.fit(Net(), loader)
    result["averaged"] = weights(trainer)
    result["steps"] = trainer.global_step
    result["epochs_seen"] = seen
    result["groups"] = [g["lr"] for g in trainer.optimizers[0].param_groups]
    logged: set[str] = set()
    if trainer.is_global_zero:
        with open(Path(trainer.logger.log_dir) / "metrics.csv") as f:  # type: ignore[union-attr]
            logged = set(f.readline().strip().split(","))
    result["throughput_logged"] = "train/device/samples_per_sec" in logged
    result["device_stats_logged"] = "DeviceStatsMonitor.on_train_batch_end/cpu_percent" in logged

    # 1b. EMA resumed from a checkpoint of epoch 2 (the single run also trains 4 epochs straight)
    for tag, epochs, ckpt in (
        ("straight", 4, None),
        ("half", 2, None),
        ("resumed", 4, out / name / "half" / "last.ckpt"),
    ):
        if tag == "straight" and name != "single":
            continue
        fullshard.seed_everything(0)
        checkpoints = ModelCheckpoint(dirpath=out / name / tag, save_last=True)
        trainer = trainer_for(
            name,
            out,
            [EMAWeightAveraging(decay=0.9), checkpoints],
            enable_checkpointing=True,
            max_epochs=epochs,
        )
        trainer.fit(Net(), loader, ckpt_path=ckpt)
        result[f"ema_{tag}"] = weights(trainer)

    # 2. the tuner's learning rate finder leaves the model as it was; then SWA
    fullshard.seed_everything(0)
    model = Net(lr=1e-3)
    before = [round(float(v.sum()), 5) for _, v in sorted(model.state_dict().items())]
    bar = RichProgressBar(leave=True, console_kwargs={"file": open(out / f"rich-{name}.txt", "w")})  # noqa: SIM115
    trainer = trainer_for(
        name, out, [StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2), bar], enable_progress_bar=True
    )
    finder = Tuner(trainer).lr_find(model, loader, num_training=20, early_stop_threshold=None)
    assert finder is not None
    result["lr_points"] = len(finder.results["lr"])
    result["lr_suggested"] = model.lr
    result["left_as_it_was"] = weights(trainer) == before
    trainer.fit(model, loader)
    result["swa"] = weights(trainer)
    result["rich_bar"] = trainer.progress_bar_callback is bar

    # 2b. the batch size finder (the loader rebuilt from model.batch_size at each trial)
    fullshard.seed_everything(0)
    sized = SizedNet()
    before = [round(float(v.sum()), 5) for _, v in sorted(sized.state_dict().items())]
    trainer = trainer_for(name, out, [])
    result["batch_size"] = Tuner(trainer).scale_batch_size(sized, max_trials=3)
    result["batch_size_on_model"] = sized.batch_size
    result["batch_size_left_as_it_was"] = weights(trainer) == before and trainer.global_step == 0

    # 3. pruning (torch.nn.utils.prune on one process and DDP; masks of the shards under FSDP)
    fullshard.seed_everything(0)
    trainer = trainer_for(name, out, [ModelPruning("l1_unstructured", amount=0.3)])
    trainer.fit(Net(), loader)
    result["pruned"] = weights(trainer)
    result["zeros"] = sum(int((v == 0).sum()) for v in trainer.strategy.module_state_dict().values())
    fullshard.seed_everything(0)
    local = ModelPruning(
        "l1_unstructured", amount=2, use_global_unstructured=False, parameter_names=["weight"]
    )
    trainer = trainer_for(name, out, [local])
    trainer.fit(Net(), loader)
    result["pruned_per_parameter"] = weights(trainer)

    # 4. a loss spike at step 3 stops training on every rank, and a checkpoint is written (last:
    # the exception ends the job's processes)
    fullshard.seed_everything(0)
    spikes = SpikeDetection(exclude_batches_path=out / name)
    trainer = trainer_for(
        name, out, [spikes, OnExceptionCheckpoint(out / name / "failed")], enable_checkpointing=True
    )
    with contextlib.suppress(TrainingSpikeException):
        trainer.fit(Net(spike_at=3), loader)
    saved = torch.load(out / name / "failed" / "on_exception.ckpt", map_location="cpu", weights_only=True)
    result["exception_checkpoint_step"] = saved["global_step"]
    result["skipped_batches"] = json.loads((out / name / "skip_batches.json").read_text())

    if trainer.is_global_zero:
        (out / f"{name}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

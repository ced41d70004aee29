"""The optimization-loop hooks of automatic optimization, as Lightning 2.x calls them:
``optimizer_step`` (with the closure), ``optimizer_zero_grad``, ``backward``,
``lr_scheduler_step`` and ``configure_gradient_clipping``; and the lean path kept when none is
overridden (see [Note: three ways through a training batch] in fullshard.trainer.optimization).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import quiet_trainer
from fullshard.errors import MisconfigurationError
from fullshard.trainer.optimization import LightningOptimizer

LR, WARMUP = 0.1, 3


def make_data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, 3.0 * x[:, 0] - x[:, 1] + 1.0)


def loader() -> DataLoader:
    return DataLoader(make_data(), batch_size=4)


class Net(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.layer(x).squeeze(-1), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)


class Recorded(Net):
    """Overrides every optimization hook, records the calls and does what the default does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls.append(("training_step", batch_idx))
        return super().training_step(batch, batch_idx)

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        self.calls.append(
            ("optimizer_step", epoch, batch_idx, type(optimizer).__name__, callable(optimizer_closure))
        )
        assert isinstance(optimizer, LightningOptimizer)
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        self.calls.append(("optimizer_zero_grad", epoch, batch_idx, type(optimizer).__name__))
        super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("backward", round(float(loss.detach()), 6)))
        super().backward(loss, *args, **kwargs)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.calls.append(("on_before_optimizer_step",))

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        self.calls.append(("configure_gradient_clipping", gradient_clip_val, gradient_clip_algorithm))
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        self.calls.append(("lr_scheduler_step", type(scheduler).__name__, metric))
        super().lr_scheduler_step(scheduler, metric)

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_each_hook_is_called_with_its_arguments_in_lightnings_order(tmp_path: Path) -> None:
    model = Recorded()
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, limit_train_batches=4, accumulate_grad_batches=2, gradient_clip_val=0.5
    )
    trainer.fit(model, loader())
    names = [call[0] for call in model.calls]
    window = [
        "training_step",
        "optimizer_zero_grad",
        "backward",  # the first micro-batch: no optimizer_step
        "optimizer_step",
        "training_step",
        "backward",  # the closure runs inside optimizer_step
        "on_before_optimizer_step",
        "configure_gradient_clipping",
        "lr_scheduler_step",
    ]
    assert names == window * 2
    assert model.calls[1] == ("optimizer_zero_grad", 0, 0, "SGD")
    assert model.calls[3] == ("optimizer_step", 0, 1, "LightningSGD", True)
    assert model.calls[7] == ("configure_gradient_clipping", 0.5, "norm")
    assert model.calls[8] == ("lr_scheduler_step", "StepLR", None)
    assert trainer.global_step == 2
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(LR * 0.25)


def test_backward_gets_the_loss_divided_by_the_accumulation(tmp_path: Path) -> None:
    model = Recorded()
    quiet_trainer(tmp_path, max_steps=1, accumulate_grad_batches=2).fit(model, loader())
    x, y = next(iter(loader()))
    torch.manual_seed(0)
    first = float(F.mse_loss(nn.Linear(3, 1)(x).squeeze(-1), y)) / 2
    assert next(c for c in model.calls if c[0] == "backward") == ("backward", round(first, 6))


def test_the_lean_path_is_kept_when_no_step_hook_is_overridden(tmp_path: Path) -> None:
    plain = quiet_trainer(tmp_path, max_steps=1)
    plain.fit(Net(), loader())
    assert not plain.fit_loop.optimization.uses_hooks

    class ZeroGradOnly(Net):
        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            self.zeroed = batch_idx
            optimizer.zero_grad()

    model = ZeroGradOnly()
    hooked = quiet_trainer(tmp_path, max_steps=1)
    hooked.fit(model, loader())
    assert hooked.fit_loop.optimization.uses_hooks and model.zeroed == 0


def train_plain(warmup: bool, clip: float | None) -> dict[str, torch.Tensor]:
    """Plain PyTorch: the same model, batches and steps."""
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step, (x, y) in enumerate(loader()):
        if warmup and step < WARMUP:
            optimizer.param_groups[0]["lr"] = LR * (step + 1) / WARMUP
        F.mse_loss(model.layer(x).squeeze(-1), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def test_a_warmup_in_optimizer_step_matches_plain_pytorch(tmp_path: Path) -> None:
    lrs: list[float] = []

    class WarmUp(Net):
        def optimizer_step(
            self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
        ) -> None:
            if self.trainer.global_step < WARMUP:
                for group in optimizer.param_groups:
                    group["lr"] = LR * (self.trainer.global_step + 1) / WARMUP
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step(closure=optimizer_closure)

    model = WarmUp()
    quiet_trainer(tmp_path, max_epochs=1).fit(model, loader())
    assert lrs == pytest.approx([LR / 3, 2 * LR / 3, LR] + [LR] * 5)
    for key, value in train_plain(warmup=True, clip=None).items():
        torch.testing.assert_close(model.state_dict()[key], value)
    assert not any(
        torch.equal(model.state_dict()[k], v) for k, v in train_plain(warmup=False, clip=None).items()
    )


def test_configure_gradient_clipping_by_default_clips_as_the_trainer_does(tmp_path: Path) -> None:
    class Default(Net):
        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    model = Default()
    quiet_trainer(tmp_path, max_epochs=1, gradient_clip_val=0.5).fit(model, loader())
    for key, value in train_plain(warmup=False, clip=0.5).items():
        torch.testing.assert_close(model.state_dict()[key], value)


def test_a_custom_clipping_hook_replaces_the_trainers(tmp_path: Path) -> None:
    class NoClip(Net):
        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            pass  # the Trainer's gradient_clip_val is left unused

    model = NoClip()
    quiet_trainer(tmp_path, max_epochs=1, gradient_clip_val=0.001).fit(model, loader())
    for key, value in train_plain(warmup=False, clip=None).items():
        torch.testing.assert_close(model.state_dict()[key], value)


class EpochDecay:
    """A scheduler in timm's style (not a torch LRScheduler)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.epochs: list[int] = []

    def step(self, epoch: int) -> None:
        self.epochs.append(epoch)
        self.optimizer.param_groups[0]["lr"] = LR * 0.5**epoch

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs = state["epochs"]


class Timm(Net):
    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        return {"optimizer": optimizer, "lr_scheduler": EpochDecay(optimizer)}


def test_a_non_torch_scheduler_is_stepped_by_lr_scheduler_step(tmp_path: Path) -> None:
    class Stepped(Timm):
        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            scheduler.step(epoch=self.current_epoch + 1)

    model = Stepped()
    trainer = quiet_trainer(tmp_path, max_epochs=3)
    trainer.fit(model, loader())
    assert trainer.lr_scheduler_configs[0].scheduler.epochs == [1, 2, 3]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(LR * 0.125)


def test_a_non_torch_scheduler_without_lr_scheduler_step_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"The LR scheduler EpochDecay does not follow torch's LRScheduler API.*Override Timm.lr_scheduler_step",
    ):
        quiet_trainer(tmp_path, max_epochs=1).fit(Timm(), loader())


def test_lr_scheduler_step_gets_the_monitored_metric_of_a_plateau_scheduler(tmp_path: Path) -> None:
    metrics: list[Any] = []

    class Plateau(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss, on_epoch=True)
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = super().configure_optimizers()
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "train_loss_epoch"},
            }

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            metrics.append(metric)
            super().lr_scheduler_step(scheduler, metric)

    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(Plateau(), loader())
    assert len(metrics) == 2 and all(isinstance(m, torch.Tensor) for m in metrics)
    assert float(metrics[-1]) == pytest.approx(float(trainer.callback_metrics["train_loss_epoch"]))

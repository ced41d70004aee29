"""The learning rate finder: train with a learning rate growing step by step, record the loss,
and suggest the learning rate where the loss falls fastest (Smith, 2017), as Lightning's."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from tqdm import tqdm
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.optimizer_config import LRSchedulerConfig
from fullshard.rank_zero import rank_zero_warn
from fullshard.seed import rng_states, set_rng_states
from fullshard.trainer.callbacks.base import Callback
from fullshard.tuner.search import Snapshot, rebuild_train_loader, run_trial

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger(__name__)
_LR_NAMES = ("lr", "learning_rate")


def _has_attr(module: Module, name: str) -> bool:
    return hasattr(module, name) or name in getattr(module, "hparams", {})


def _set_attr(module: Module, name: str, value: Any) -> None:
    """Set ``name`` on ``module`` and in its ``hparams``, wherever it is (as Lightning's setattr)."""
    if hasattr(module, name):
        setattr(module, name, value)
    hparams = getattr(module, "hparams", None)
    if hparams is not None and name in hparams:
        hparams[name] = value


def lr_attr_name(module: Module, attr_name: str = "") -> str:
    """The attribute of ``module`` (or of ``module.hparams``) that holds the learning rate.

    Raises:
        AttributeError: when ``attr_name`` (or, without it, ``lr`` and ``learning_rate``) is
            neither.
    """
    if attr_name:
        if not _has_attr(module, attr_name):
            raise AttributeError(
                f"lr_find(attr_name={attr_name!r}): {type(module).__name__} has no attribute or hparams entry "
                f"{attr_name!r}. Name the attribute configure_optimizers reads the learning rate from."
            )
        return attr_name
    for name in _LR_NAMES:
        if _has_attr(module, name):
            return name
    raise AttributeError(
        f"The learning rate finder sets the learning rate on the model: {type(module).__name__} (or its hparams) needs "
        f"one of {_LR_NAMES}, read by configure_optimizers. For another name pass attr_name=..., or "
        "update_attr=False to only get the results."
    )


class _SweepLR(LRScheduler):
    """From ``base_lr`` to ``end_lr`` over ``num_iter`` steps, linearly or exponentially."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, end_lr: float, num_iter: int, exponential: bool
    ) -> None:
        self.end_lr = end_lr
        self.num_iter = num_iter
        self.exponential = exponential
        self._lr: list[Any] = []
        super().__init__(optimizer, -1)

    @override
    def get_lr(self) -> list[Any]:
        r = (self.last_epoch + 1) / self.num_iter
        if self.last_epoch > 0:
            if self.exponential:
                values = [base * (self.end_lr / base) ** r for base in self.base_lrs]
            else:
                values = [base + r * (self.end_lr - base) for base in self.base_lrs]
        else:
            values = list(self.base_lrs)
        self._lr = values
        return values

    @property
    def lr(self) -> list[Any]:
        """The learning rates of the current step."""
        return self._lr


class LRFinder:
    """The finder's results: ``results["lr"]`` and ``results["loss"]`` (smoothed), one entry per
    optimizer step; :meth:`suggestion` and :meth:`plot` read them."""

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode = mode
        self.lr_min = lr_min
        self.lr_max = lr_max
        self.num_training = num_training
        self.results: dict[str, Any] = {}
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate at the steepest descent of the loss, leaving out the first
        ``skip_begin`` and last ``skip_end`` points (and non-finite losses); None (with an error
        logged) when fewer than two points remain."""
        losses = torch.tensor(self.results["loss"][skip_begin:-skip_end])
        lrs = torch.tensor(self.results["lr"][skip_begin:-skip_end])
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            log.error(
                "The learning rate finder has fewer than 2 points to suggest from: raise num_training or use more data."
            )
            self._optimal_idx = None
            return None
        gradients = torch.gradient(losses, spacing=[lrs])[0]
        steepest = int(torch.argmin(gradients).item())
        kept = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(kept[steepest].item())
        return float(self.results["lr"][self._optimal_idx])

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """The loss against the learning rate (matplotlib, which must be installed)."""
        try:
            import matplotlib.pyplot as plt  # type: ignore[import-not-found]
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                "LRFinder.plot draws with matplotlib: pip install matplotlib."
            ) from error
        if ax is None:
            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion() is not None and self._optimal_idx is not None:
            i = self._optimal_idx
            ax.plot(self.results["lr"][i], self.results["loss"][i], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


class _LossRecorder(Callback):
    """Records the learning rate and the smoothed loss of each optimizer step; asks to stop when
    the loss diverges (above ``early_stop_threshold`` times the best)."""

    def __init__(
        self, num_training: int, early_stop_threshold: float | None, show_bar: bool, beta: float = 0.98
    ):
        self.num_training = num_training
        self.early_stop_threshold = early_stop_threshold
        self.beta = beta
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.avg_loss = 0.0
        self.best_loss = 0.0
        self.show_bar = show_bar
        self.bar: Any = None
        self.start_step = 0

    @staticmethod
    def _steps(trainer: Trainer, batch_idx: int) -> bool:
        return (batch_idx + 1) % trainer.accumulate_grad_batches == 0

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int) -> None:
        if not self._steps(trainer, batch_idx):
            return
        if self.show_bar and self.bar is None and trainer.is_global_zero:
            self.bar = tqdm(desc="Finding best initial lr", total=self.num_training)
        self.lrs.append(trainer.lr_scheduler_configs[0].scheduler.lr[0])

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._steps(trainer, batch_idx):
            return
        if not outputs:
            # training_step returned None: the step still counts (the loop steps the sweep), and
            # is one of the num_training points, with no loss
            self.losses.append(float("nan"))
            return
        if self.bar is not None:
            self.bar.update()
        loss = float(outputs["loss"] if not isinstance(outputs, torch.Tensor) else outputs)
        step = self.start_step + len(self.losses) + 1  # Lightning's global_step: skipped steps count
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * loss
        smoothed = self.avg_loss / (1 - self.beta ** (step + 1))
        if (
            self.early_stop_threshold is not None
            and step > 1
            and smoothed > self.early_stop_threshold * self.best_loss
        ):
            trainer.should_stop = True
        trainer.should_stop = trainer.strategy.broadcast(trainer.should_stop)
        if smoothed < self.best_loss or step == 1:
            self.best_loss = smoothed
        self.losses.append(smoothed)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def lr_find(
    trainer: Trainer,
    model: Module,
    min_lr: float = 1e-8,
    max_lr: float = 1,
    num_training: int = 100,
    mode: str = "exponential",
    early_stop_threshold: float | None = 4.0,
    update_attr: bool = False,
    attr_name: str = "",
) -> LRFinder | None:
    """Run the search inside the running ``fit`` (from ``on_fit_start``) and put the model and
    Trainer back as they were ([Note: the tuner leaves things as they were] in search.py). With
    ``update_attr`` the suggestion is written to the model's learning rate attribute and the
    optimizers' parameter groups. Returns None in a ``fast_dev_run``."""
    if trainer.fast_dev_run:
        rank_zero_warn("The learning rate finder is skipped in a fast_dev_run.")
        return None
    if len(trainer.optimizers) != 1:
        raise MisconfigurationError(
            f"The learning rate finder works with one optimizer; configure_optimizers returned {len(trainer.optimizers)}."
        )
    if update_attr:
        attr_name = lr_attr_name(model, attr_name)
    snapshot = Snapshot(trainer, model)
    start_step = trainer.global_step
    bar = trainer.progress_bar_callback
    show_bar = bar is not None and bar.is_enabled
    if bar is not None:
        bar.disable()
    finder = LRFinder(mode, min_lr, max_lr, num_training)
    recorder = _LossRecorder(num_training, early_stop_threshold, show_bar)
    recorder.start_step = start_step
    finished = False
    try:
        optimizer = trainer.optimizers[0]
        for group in optimizer.param_groups:
            group["lr"] = min_lr
            group["initial_lr"] = min_lr
        scheduler = _SweepLR(optimizer, max_lr, num_training, exponential=mode == "exponential")
        trainer.lr_scheduler_configs = [LRSchedulerConfig(scheduler, interval="step")]
        trainer.max_steps = num_training + start_step
        trainer.limit_val_batches = num_training
        run_trial(trainer, model, [recorder])
        if trainer.global_step != num_training + start_step:
            log.info(
                f"The learning rate finder stopped early after {trainer.global_step} steps: the loss diverged."
            )
        finder.results = trainer.strategy.broadcast({"lr": recorder.lrs, "loss": recorder.losses})
        finished = True
    finally:
        recorder.close()
        snapshot.restore(trainer, model)
        rebuild_train_loader(trainer, model)
        # Lightning makes the rebuilt loader's iterator now, from the state the search left
        trainer.fit_loop.draw_next_epoch_from(torch.get_rng_state())
        if bar is not None and show_bar:
            bar.enable()
    if update_attr and finished:
        lr = finder.suggestion()
        if lr is not None:
            _set_attr(model, attr_name, lr)
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = lr
            log.info(f"Learning rate set to {lr}")
    return finder


class isolate_rng:
    """Put this process's random-number generators back as they were on leaving the block."""

    def __enter__(self) -> None:
        self._states = rng_states()

    def __exit__(self, *exc: object) -> None:
        set_rng_states(self._states)

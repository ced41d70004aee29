"""The hooks of :class:`fullshard.Module`, by concern, as Lightning groups them: the model's
life-cycle hooks (:class:`ModelHooks`) and where its data comes from and how a batch reaches the
device (:class:`DataHooks`). Each is a no-op (or the Trainer's default behaviour) until a module
overrides it; the Trainer calls a hook only when a module or callback overrides it
(:class:`fullshard.trainer.hooks.Hooks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.batch_transfer import move_data_to_device

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

    _ModuleBase = nn.Module
else:
    _ModuleBase = object


def not_defined(module: object, method: str, why: str) -> NotImplementedError:
    """The error of a required method a module does not define."""
    return NotImplementedError(f"{type(module).__name__} does not define {method}; {why}")


class ModelHooks(_ModuleBase):
    """The model's life-cycle hooks: stages, epochs, batches, backward and checkpoints."""

    if TYPE_CHECKING:
        trainer: Trainer

    def prepare_data(self) -> None:
        """Download or preprocess data once per machine (local rank 0, before the others go on)."""

    def setup(self, stage: str) -> None:
        """Called on every process at the start of ``fit``/``validate``/``test``/``predict``
        (``stage`` is that name), before ``configure_model``."""

    def teardown(self, stage: str) -> None:
        """Called on every process at the end of ``fit``/``validate``/``test``/``predict``."""

    def on_fit_start(self) -> None:
        """Called when fit starts, after setup and restoring a checkpoint."""

    def on_fit_end(self) -> None:
        """Called when fit ends."""

    def on_train_start(self) -> None:
        """Called before the first training epoch (after the sanity validation)."""

    def on_train_end(self) -> None:
        """Called after the last training epoch."""

    def on_train_epoch_start(self) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self) -> None:
        """Called at the end of each training epoch; what it logs reaches loggers and monitors at once."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """Called before ``training_step``. Return -1 to skip the rest of this epoch."""
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after each training batch (after the optimizer step, when one happened).
        ``outputs`` is what ``training_step`` returned, as a dict with a ``"loss"`` entry."""

    def on_validation_start(self) -> None:
        """Called before a validation run (also the sanity run)."""

    def on_validation_end(self) -> None:
        """Called after a validation run."""

    def on_validation_epoch_start(self) -> None:
        """Called before the first validation batch."""

    def on_validation_epoch_end(self) -> None:
        """Called after the last validation batch; what it logs reaches loggers and monitors at once."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``validation_step``."""

    def on_validation_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after ``validation_step`` with what it returned."""

    def on_test_start(self) -> None:
        """Called before a test run."""

    def on_test_end(self) -> None:
        """Called after a test run."""

    def on_test_epoch_start(self) -> None:
        """Called before the first test batch."""

    def on_test_epoch_end(self) -> None:
        """Called after the last test batch."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``test_step``."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``test_step`` with what it returned."""

    def on_predict_start(self) -> None:
        """Called before a prediction run."""

    def on_predict_end(self) -> None:
        """Called after a prediction run."""

    def on_predict_epoch_start(self) -> None:
        """Called before the first prediction batch."""

    def on_predict_epoch_end(self) -> None:
        """Called after the last prediction batch."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``predict_step``."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``predict_step`` with the prediction."""

    def on_validation_model_eval(self) -> None:
        """Called when validation starts, to put the model in eval mode (default:
        ``self.trainer.model.eval()``). Override it to keep, e.g., dropout on in validation."""
        self.trainer.model.eval()  # type: ignore[union-attr]

    def on_validation_model_train(self) -> None:
        """Called when validation ends. When not overridden, the Trainer puts back the mode every
        submodule had before validation; an override decides instead (this default calls
        ``self.trainer.model.train()``, for an override that calls ``super()``)."""
        self.trainer.model.train()  # type: ignore[union-attr]

    def on_validation_model_zero_grad(self) -> None:
        """Called before a validation run during training, after an optimizer step (not in the
        middle of an accumulation window), to free the gradients' memory (default:
        ``self.zero_grad(set_to_none=True)``)."""
        self.zero_grad(set_to_none=True)

    def on_test_model_eval(self) -> None:
        """Called when testing starts, to put the model in eval mode (default:
        ``self.trainer.model.eval()``)."""
        self.trainer.model.eval()  # type: ignore[union-attr]

    def on_test_model_train(self) -> None:
        """Called when testing ends; as :meth:`on_validation_model_train` for the test run."""
        self.trainer.model.train()  # type: ignore[union-attr]

    def on_predict_model_eval(self) -> None:
        """Called when prediction starts, to put the model in eval mode (default:
        ``self.trainer.model.eval()``); each submodule's mode is put back afterwards."""
        self.trainer.model.eval()  # type: ignore[union-attr]

    def on_before_zero_grad(self, optimizer: Optimizer) -> None:
        """Called before gradients are zeroed (after ``training_step``, before ``backward``, on the
        first micro-batch of each accumulation window)."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Called before ``loss.backward()``."""

    def on_after_backward(self) -> None:
        """Called after ``loss.backward()``: gradients are there (sharded, under FSDP), unclipped."""

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        """Called before the optimizer step, before gradients are clipped (unscaled under "16-mixed")."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add or change entries of a checkpoint as it is written."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read custom entries of a checkpoint as it is restored (before the weights load)."""


class DataHooks:
    """Where a module's data comes from, and how each batch reaches the device."""

    # A module may provide its own data, as in Lightning; the Trainer uses these when no
    # dataloaders or DataModule are passed.
    def train_dataloader(self) -> Any:
        """The training dataloader, when none is passed to ``fit``."""
        raise not_defined(self, "train_dataloader()", "pass train_dataloaders= or a datamodule= to fit().")

    def val_dataloader(self) -> Any:
        """The validation dataloader, when none is passed."""
        raise not_defined(self, "val_dataloader()", "pass val_dataloaders= or a datamodule=.")

    def test_dataloader(self) -> Any:
        """The test dataloader, when none is passed to ``test``."""
        raise not_defined(self, "test_dataloader()", "pass dataloaders= or a datamodule= to test().")

    def predict_dataloader(self) -> Any:
        """The prediction dataloader, when none is passed to ``predict``."""
        raise not_defined(self, "predict_dataloader()", "pass dataloaders= or a datamodule= to predict().")

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Alter the batch (still where the dataloader made it) before it moves to the device, and
        return it. Called for the batches of every stage; a DataModule's override takes precedence."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device`` and return it. The default moves tensors and objects with a
        ``.to(device)`` method, inside lists, tuples, dicts and dataclasses; override it for a batch
        type it cannot walk (and call ``super()`` for the parts it can)."""
        return move_data_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Alter the batch once it is on the device (e.g. augmentations on the GPU), and return it."""
        return batch

    def configure_callbacks(self) -> Any:
        """Callbacks this module needs, merged with the Trainer's when ``fit``/``validate``/``test``/
        ``predict`` starts (as Lightning): one callback or a list. A Trainer callback of the same
        type (or a parent type) is replaced; checkpoint callbacks still run last."""
        return []

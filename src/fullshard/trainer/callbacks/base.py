"""The ``Callback`` base class: hooks the Trainer calls at fixed points of ``fit``, ``validate``,
``test`` and ``predict`` (Lightning's names, arguments and order).

Every hook receives the Trainer and the user's ``fullshard.Module``. A callback that keeps state
across a resume returns it from :meth:`Callback.state_dict`; the Trainer stores it in each
checkpoint under :attr:`Callback.state_key` and hands it back through
:meth:`Callback.load_state_dict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from torch.optim import Optimizer

    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer


class Callback:
    """Base class for Trainer callbacks. Override only the hooks you need."""

    #: Where the Trainer puts the callback among the others: None (the default) in the order
    #: given; a number before every other callback, smaller first. The tuner's ``BatchSizeFinder``
    #: (0) and ``LearningRateFinder`` (1) set it, so that their searches run before the other
    #: callbacks' ``on_fit_start``, as Lightning orders them.
    runs_first: ClassVar[int | None] = None

    @property
    def state_key(self) -> str:
        """Key under which this callback's state is stored in a checkpoint.

        Two instances of one class with different settings should return different keys.
        """
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """State to save in a checkpoint. Empty by default."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""

    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        """Called on every rank when ``fit``/``validate``/``test``/``predict`` begins (``stage``)."""

    def teardown(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        """Called on every rank when ``fit``/``validate``/``test``/``predict`` ends."""

    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called once the model and optimizers are set up (and a checkpoint restored)."""

    def on_fit_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after the last epoch."""

    def on_sanity_check_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before the sanity validation run (``num_sanity_val_steps`` batches)."""

    def on_sanity_check_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after the sanity validation run; its metrics are discarded."""

    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before the first training epoch."""

    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after the last training epoch."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called at the end of each training epoch, after epoch-level metrics are reduced."""

    def on_train_batch_start(self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int) -> None:
        """Called before ``training_step`` on each micro-batch."""

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Called after each micro-batch (after the optimizer step when one happened).
        ``outputs`` is ``training_step``'s result as a dict with a ``"loss"`` entry."""

    def on_validation_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before a validation run."""

    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after a validation run, when its metrics are in ``trainer.callback_metrics``."""

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before the first validation batch."""

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after the last validation batch, after epoch-level metrics are reduced."""

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before ``validation_step``."""

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Called after ``validation_step``."""

    def on_test_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before a test run."""

    def on_test_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after a test run."""

    def on_test_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before the first test batch."""

    def on_test_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after the last test batch, after epoch-level metrics are reduced."""

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before ``test_step``."""

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Called after ``test_step``."""

    def on_predict_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before a prediction run."""

    def on_predict_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after a prediction run."""

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        """Called before the first prediction batch."""

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after the last prediction batch."""

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before ``predict_step``."""

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Called after ``predict_step`` with the prediction."""

    def on_before_zero_grad(self, trainer: Trainer, pl_module: Module, optimizer: Optimizer) -> None:
        """Called before gradients are zeroed (first micro-batch of each accumulation window)."""

    def on_before_backward(self, trainer: Trainer, pl_module: Module, loss: torch.Tensor) -> None:
        """Called before ``loss.backward()``."""

    def on_after_backward(self, trainer: Trainer, pl_module: Module) -> None:
        """Called after ``loss.backward()``, before gradient clipping and the optimizer step."""

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Module, optimizer: Optimizer) -> None:
        """Called before the optimizer step, before gradients are clipped (unscaled under "16-mixed")."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Called when a checkpoint is assembled; may add entries to ``checkpoint``."""

    def on_load_checkpoint(self, trainer: Trainer, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Called when a checkpoint is restored, before training resumes."""

    def on_exception(self, trainer: Trainer, pl_module: Module, exception: BaseException) -> None:
        """Called when ``fit``, ``validate``, ``test`` or ``predict`` raises."""


class Checkpoint(Callback):
    """The base class of callbacks that save checkpoints (:class:`ModelCheckpoint`), as Lightning's:
    ``isinstance(callback, Checkpoint)`` finds them."""

    def newest_checkpoint(self) -> str | None:
        """The newest complete checkpoint this callback wrote that ``fit(ckpt_path="last")`` may
        resume from (None: none)."""
        return None

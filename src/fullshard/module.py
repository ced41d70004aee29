"""``fullshard.Module``: an ``nn.Module`` with the hooks the Trainer drives.

The hooks, their arguments and the order in which the Trainer calls them are Lightning 2.x's
(see docs/lightning.md for the recorded order), so a ``LightningModule`` ports by changing its
import; ``fullshard.LightningModule`` is another name for this class.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.batch_transfer import move_data_to_device
from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from typing_extensions import Self

    from fullshard.trainer.loggers import Logger
    from fullshard.trainer.trainer import Trainer

OptimizerConfig = Any
"""What ``configure_optimizers`` returns: an optimizer, or a dict with ``"optimizer"`` and
optionally ``"lr_scheduler"`` (a scheduler, or a dict ``{"scheduler", "interval", "frequency"}``)."""


class AttributeDict(dict[str, Any]):
    """A dict whose keys are also attributes: ``hparams.lr`` is ``hparams["lr"]``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(
                f"hparams has no {key!r}; it holds {sorted(self) or 'nothing'}. Record it with "
                "self.save_hyperparameters() in __init__."
            ) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]


def init_arguments(frame: FrameType, names: tuple[str, ...]) -> dict[str, Any]:
    """The arguments of the function running in ``frame`` (an ``__init__``), all of them or those
    in ``names``; what ``save_hyperparameters()`` records."""
    arguments = inspect.getargvalues(frame)
    local = {k: arguments.locals[k] for k in arguments.args if k != "self"}
    if arguments.keywords:
        local.update(arguments.locals.get(arguments.keywords, {}))
    unknown = [n for n in names if n not in local]
    if unknown:
        raise ValueError(
            f"save_hyperparameters got {unknown}, which are not arguments of the calling "
            f"function (it has {sorted(local)}). Pass argument names, or keyword values."
        )
    return {k: v for k, v in local.items() if not names or k in names}


def _not_defined(module: Module, method: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"{type(module).__name__} does not define {method}; {why}")


class Module(nn.Module):
    """Base class for models trained by :class:`fullshard.Trainer`.

    Override :meth:`training_step` and :meth:`configure_optimizers`; optionally the evaluation
    steps, :meth:`configure_model` (to build big layers directly on the right device, or
    sharded), and any of the hooks below. Every hook is also a :class:`~fullshard.Callback` hook;
    callbacks run before the module's hook, except that checkpointing and early-stopping
    callbacks run after ``on_train_epoch_end`` of the module (so they see what it logged).
    """

    #: False: Lightning's manual optimization. The Trainer then calls ``training_step`` and
    #: nothing else for the optimization: the step gets its optimizers with :meth:`optimizers`,
    #: calls :meth:`manual_backward` and ``opt.step()`` itself (docs/manual-optimization.md).
    automatic_optimization: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self._hparams = AttributeDict()
        self._param_requires_grad_state: dict[nn.Parameter, bool] = {}

    # ------------------------------------------------------------------------------- steps
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute the loss of one batch.

        Return the loss tensor, a dict with a ``"loss"`` entry, or None to skip the batch
        (under several processes every rank must skip the same batch; see docs/lightning.md).
        """
        raise _not_defined(
            self, "training_step(batch, batch_idx)", "the Trainer needs it to compute a loss. Override it "
            "and return the loss tensor."
        )

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one validation batch; log metrics with :meth:`log`."""
        raise _not_defined(
            self, "validation_step(batch, batch_idx)", "but validation data was given. Override "
            "validation_step, or pass no validation dataloaders."
        )

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one test batch (``Trainer.test``); log metrics with :meth:`log`."""
        raise _not_defined(
            self, "test_step(batch, batch_idx)", "Trainer.test() calls it for every test batch. Override it."
        )

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """Return the prediction for one batch (``Trainer.predict``). By default ``self(batch)``."""
        return self(batch)

    def configure_optimizers(self) -> OptimizerConfig:
        """Return an optimizer, or ``{"optimizer": opt, "lr_scheduler": sched_or_config}``.

        A scheduler config is a dict ``{"scheduler": sched, "interval": "step" | "epoch",
        "frequency": n, "monitor": metric, "name": name}``. Called after the strategy wrapped the
        model, so ``self.parameters()`` are the parameters that will be trained.
        """
        raise _not_defined(
            self, "configure_optimizers()", "the Trainer needs an optimizer. Override it, e.g. "
            "`return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
        )

    def configure_model(self) -> None:
        """Build (large) layers here instead of ``__init__``.

        The Trainer calls it inside the strategy's initialisation and sharding contexts, so layers
        are created directly on the target device (or the meta device, for sharded strategies).
        It may be called more than once (``fit`` after ``validate``): make it idempotent, e.g.
        ``if self.model is not None: return``.
        """

    def init_weights(self, module: nn.Module) -> None:
        """Initialise ``module``'s own parameters: override to give the model its init.

        Called under ``torch.no_grad()`` for every submodule that ``configure_model()`` created,
        children before parents, after the layers' ``reset_parameters()`` and a Hugging Face
        model's ``_init_weights``. With ``FSDPStrategy(empty_init=True)`` it runs as each FSDP
        unit is materialised from the meta device (on the whole, unsharded unit); without, right
        after ``configure_model()``: the model is the same either way. Example::

            def init_weights(self, module):
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=0.02)
        """

    # -------------------------------------------------------------------------- data hooks
    # A module may provide its own data, as in Lightning; the Trainer uses these when no
    # dataloaders or DataModule are passed.
    def train_dataloader(self) -> Any:
        """The training dataloader, when none is passed to ``fit``."""
        raise _not_defined(self, "train_dataloader()", "pass train_dataloaders= or a datamodule= to fit().")

    def val_dataloader(self) -> Any:
        """The validation dataloader, when none is passed."""
        raise _not_defined(self, "val_dataloader()", "pass val_dataloaders= or a datamodule=.")

    def test_dataloader(self) -> Any:
        """The test dataloader, when none is passed to ``test``."""
        raise _not_defined(self, "test_dataloader()", "pass dataloaders= or a datamodule= to test().")

    def predict_dataloader(self) -> Any:
        """The prediction dataloader, when none is passed to ``predict``."""
        raise _not_defined(self, "predict_dataloader()", "pass dataloaders= or a datamodule= to predict().")

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

    # ------------------------------------------------------------------------------- hooks
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

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
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

    # ------------------------------------------------------------------ optimization hooks
    # The Trainer calls these only when the module overrides them (decided once per fit: see
    # [Note: three ways through a training batch] in fullshard.trainer.optimization).
    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Any,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step ``optimizer`` (a :class:`~fullshard.trainer.optimization.LightningOptimizer`) at the
        end of each accumulation window (automatic optimization).

        ``optimizer_closure`` runs ``training_step``, ``zero_grad`` (when due) and backward: it
        must be run, typically by ``optimizer.step(closure=optimizer_closure)``. Override to act
        around the step, e.g. a learning-rate warm-up that sets ``param_groups[i]["lr"]`` first.
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Zero the gradients of ``optimizer`` (first micro-batch of each accumulation window,
        after ``on_before_zero_grad``). Default: ``optimizer.zero_grad()`` (set to None)."""
        optimizer.zero_grad()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (already divided by ``accumulate_grad_batches``, and scaled
        under "16-mixed"). Default: ``loss.backward(*args, **kwargs)``."""
        loss.backward(*args, **kwargs)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step ``scheduler`` when its interval and frequency say so; ``metric`` is the monitored
        value for a ``ReduceLROnPlateau`` (or ``"reduce_on_plateau": True``) scheduler, else None.
        Override it for schedulers without torch's API (``timm``'s take the epoch or step)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the gradients before each optimizer step (automatic optimization), with the
        Trainer's ``gradient_clip_val`` / ``gradient_clip_algorithm``. Default:
        :meth:`clip_gradients` with them."""
        self.clip_gradients(
            optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add or change entries of a checkpoint as it is written."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read custom entries of a checkpoint as it is restored (before the weights load)."""

    # ----------------------------------------------------------------------------- helpers
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module."""
        if self._trainer is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer. `self.trainer` is available inside "
                "the hooks called by Trainer.fit() / validate() / test() / predict()."
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        self._trainer = trainer

    @property
    def hparams(self) -> AttributeDict:
        """The hyperparameters recorded by :meth:`save_hyperparameters` (``self.hparams.lr``)."""
        return self._hparams

    @property
    def device(self) -> torch.device:
        """The device this module computes on."""
        if self._trainer is not None and self._trainer.strategy.module is not None:
            return self._trainer.strategy.root_device
        for param in self.parameters():
            return param.device
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes of the job (0 without a Trainer)."""
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """Rank of this process on its machine (0 without a Trainer)."""
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The Trainer's current epoch (0 without a Trainer)."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (0 without a Trainer)."""
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def logger(self) -> Logger | None:
        """The Trainer's first logger, if any."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Logger]:
        """The Trainer's loggers."""
        return self._trainer.loggers if self._trainer is not None else []

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer(s) the Trainer built from :meth:`configure_optimizers` (one, or a list).

        By default each is wrapped in a :class:`~fullshard.trainer.optimization.LightningOptimizer`,
        whose ``step()`` goes through the Trainer (precision, ``on_before_optimizer_step``, the
        ``global_step`` count of manual optimization); ``use_pl_optimizer=False``: the raw ones.
        """
        optimizers: list[Any] = self.trainer.optimizers
        if use_pl_optimizer:
            optimizers = self.trainer.fit_loop.optimization.wrapped(optimizers)
        return optimizers[0] if len(optimizers) == 1 else optimizers

    def lr_schedulers(self) -> Any:
        """The LR scheduler(s) from :meth:`configure_optimizers` (None, one, or a list)."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record a scalar metric (Lightning's arguments and defaults).

        Args:
            name: metric name.
            value: a number, a one-element tensor, or a ``torchmetrics.Metric`` (its step value
                is its ``forward`` result on the batch, its epoch value its ``compute()``, after
                which it is reset; it syncs itself across processes: docs/lightning.md, "torchmetrics").
            prog_bar: show it in the progress bar.
            logger: send it to the loggers (default True).
            on_step: record the value of each step. Default: True in ``training_step`` and the
                training batch hooks, False elsewhere.
            on_epoch: record the ``reduce_fx`` over the epoch. Default: the opposite of ``on_step``.
                With both on, the metric appears as ``name_step`` and ``name_epoch``.
            reduce_fx: ``"mean"``, ``"sum"``, ``"max"`` or ``"min"`` (epoch and cross-process reduction).
            sync_dist: reduce it across processes (costs a collective each call); an epoch mean
                then weights every batch of every process by its size.
            batch_size: weight of this value in the epoch mean. Default: inferred from the current
                batch (the size of the first dimension of its first tensor), as Lightning does.
            add_dataloader_idx: with several evaluation dataloaders, a value logged in a step is
                named ``name/dataloader_idx_<i>``; False keeps ``name`` (then give each dataloader
                its own name).
            enable_graph, sync_dist_group, metric_attribute, rank_zero_only: accepted for
                Lightning compatibility; values are always detached and reduced over the whole
                job, and a Metric needs no attribute name (it is never saved by the Trainer).
        """
        self.trainer.metrics_collector.log(
            name,
            value,
            prog_bar=prog_bar,
            sync_dist=sync_dist,
            on_step=on_step,
            on_epoch=on_epoch,
            reduce_fx=reduce_fx,
            batch_size=batch_size,
            logger=True if logger is None else logger,
            add_dataloader_idx=add_dataloader_idx,
        )

    def log_dict(self, dictionary: Mapping[str, Any] | Any, **kwargs: Any) -> None:
        """Call :meth:`log` for each entry of ``dictionary`` with the same options; a
        ``torchmetrics.MetricCollection`` logs each of its metrics under its (prefixed) name."""
        from fullshard.trainer.metrics import is_metric_collection

        if is_metric_collection(dictionary):
            options = {"keep_base": False}
            if getattr(dictionary, "_enable_compute_groups", False):
                options["copy_state"] = False  # the members share their states: compute them as they are
            items = dictionary.items(**options)
        else:
            items = dictionary.items()
        for name, value in items:
            self.log(name, value, **kwargs)

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` inside ``training_step`` under manual optimization, through the
        strategy: scaled under "16-mixed", gradients reduced (DDP) or reduce-scattered (FSDP),
        except inside ``self.trainer.strategy.no_backward_sync(enabled=True)`` or
        ``opt.toggle_model(sync_grad=False)``. Calls ``on_before_backward`` / ``on_after_backward``.

        Raises:
            MisconfigurationError: the module uses automatic optimization.
        """
        self._require_manual("manual_backward")
        self.trainer.fit_loop.optimization.backward(loss, *args, **kwargs)

    def _require_manual(self, what: str) -> None:
        if self.automatic_optimization:
            raise MisconfigurationError(
                f"{type(self).__name__}.{what}() is for manual optimization, but automatic_optimization is "
                "True. Set self.automatic_optimization = False in __init__, or return the loss from "
                "training_step and let the Trainer run backward."
            )

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Let only ``optimizer``'s parameters require gradients: those of the other optimizers
        get ``requires_grad=False`` until :meth:`untoggle_optimizer` (which restores them)."""
        state: dict[nn.Parameter, bool] = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = state[param]
        self._param_requires_grad_state = state

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Restore the ``requires_grad`` that :meth:`toggle_optimizer` changed."""
        raw = getattr(optimizer, "optimizer", optimizer)
        state = self._param_requires_grad_state
        for opt in self.trainer.optimizers:
            if opt is raw:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in state:
                        param.requires_grad = state[param]
        self._param_requires_grad_state = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` inside the context, :meth:`untoggle_optimizer` on leaving it."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(
        self,
        optimizer: Any,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip ``optimizer``'s gradients through the strategy (unscaled first under "16-mixed";
        the norm over all shards under FSDP). Defaults: the Trainer's ``gradient_clip_val`` (none:
        no clipping) and ``gradient_clip_algorithm``; ``"norm"`` or ``"value"``.

        Raises:
            MisconfigurationError: the Trainer clips with another value or algorithm, or the
                algorithm is unknown.
            TypeError: ``gradient_clip_val`` is not a number.
        """
        optimization = self.trainer.fit_loop.optimization
        value, algorithm = optimization.clipping(gradient_clip_val, gradient_clip_algorithm)
        optimization.clip_gradients(getattr(optimizer, "optimizer", optimizer), value, algorithm)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Gather tensors (or collections of them) from every process: each tensor gets a new first
        dimension of size world size. A no-op stacking with one process."""
        from lightning_utilities.core.apply_func import apply_to_collection

        strategy = self.trainer.strategy

        def gather(tensor: torch.Tensor) -> torch.Tensor:
            return strategy.all_gather(tensor, sync_grads=sync_grads)

        return apply_to_collection(data, torch.Tensor, gather)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self._trainer is None or self._trainer.is_global_zero:
            print(*args, **kwargs)

    def save_hyperparameters(self, *names: str, ignore: str | list[str] | None = None, **values: Any) -> None:
        """Store constructor arguments in :attr:`hparams` (and so in every checkpoint).

        Called without arguments inside ``__init__`` it records every argument of ``__init__``;
        ``names`` selects some of them, ``ignore`` leaves some out; keyword ``values`` are
        stored as given.
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        if caller is not None and not values:
            self._hparams.update(
                {k: v for k, v in init_arguments(caller, names).items() if k not in ignored}
            )
        self._hparams.update(values)

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | Path,
        map_location: Any = None,
        strict: bool = True,
        trust_checkpoint: bool = False,
        **kwargs: Any,
    ) -> Self:
        """Build the module from a checkpoint (full or sharded, fullshard's or Lightning's).

        The module is created as ``cls(**hparams, **kwargs)`` from the hyperparameters saved with
        it (``kwargs`` override them), ``configure_model()`` and ``on_load_checkpoint()`` run,
        and the weights are loaded (``strict``: the keys must match exactly) onto
        ``map_location`` (default: the device they were saved from, CPU when that one is
        missing). As in Lightning, the module is returned in training mode: call ``.eval()``
        for inference.

        The checkpoint is read with ``weights_only=True``: one that holds more than plain data
        (hyperparameters of other types, a file made to attack) raises ``UntrustedCheckpointError``
        and runs nothing. ``trust_checkpoint=True`` unpickles it unrestricted, which runs any code
        it names: only for a checkpoint from someone you trust.
        """
        from fullshard.checkpoint.module_loading import load_module_from_checkpoint

        return load_module_from_checkpoint(
            cls,
            checkpoint_path,
            map_location=map_location,
            strict=strict,
            trust_checkpoint=trust_checkpoint,
            **kwargs,
        )


LightningModule = Module
"""Lightning's name for :class:`Module`, so ported scripts keep their class statements."""

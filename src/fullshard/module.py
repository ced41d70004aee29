"""``fullshard.Module``: an ``nn.Module`` with the hooks the Trainer drives.

The hooks, their arguments and the order in which the Trainer calls them are Lightning 2.x's
(see docs/lightning.md for the recorded order), so a ``LightningModule`` ports by changing its
import; ``fullshard.LightningModule`` is another name for this class.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fullshard import hyperparameters
from fullshard.module_hooks import DataHooks, ModelHooks, not_defined
from fullshard.module_optimization import OptimizationHooks
from fullshard.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from typing_extensions import Self

    from fullshard.trainer.loggers.base import Logger
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


class Module(ModelHooks, DataHooks, OptimizationHooks, nn.Module):
    """Base class for models trained by :class:`fullshard.Trainer`.

    Override :meth:`training_step` and :meth:`configure_optimizers`; optionally the evaluation
    steps, :meth:`configure_model` (to build big layers directly on the right device, or
    sharded), and any of the hooks (:class:`~fullshard.module_hooks.ModelHooks`,
    :class:`~fullshard.module_hooks.DataHooks`, :class:`~fullshard.module_optimization.OptimizationHooks`).
    Every hook is also a :class:`~fullshard.Callback` hook;
    callbacks run before the module's hook, except that checkpointing and early-stopping
    callbacks run after ``on_train_epoch_end`` of the module (so they see what it logged).
    """

    #: False: Lightning's manual optimization. The Trainer then calls ``training_step`` and
    #: nothing else for the optimization: the step gets its optimizers with :meth:`optimizers`,
    #: calls :meth:`manual_backward` and ``opt.step()`` itself (docs/manual-optimization.md).
    automatic_optimization: bool = True

    #: False: a checkpoint may hold part of the module's state, or keys it does not have, as with
    #: ``load_state_dict(strict=False)``: what both have loads, the rest of the module stays
    #: (Lightning's ``strict_loading``). For ``fit/validate/test/predict(ckpt_path=...)`` and
    #: ``load_from_checkpoint`` without ``strict=``. Shapes are checked either way. The usual
    #: pair: an ``on_save_checkpoint`` that keeps only the trained part (a LoRA adapter) and
    #: ``strict_loading = False`` to load it back into a whole model.
    strict_loading: bool = True
    _jit_is_scripting = False  # set while to_torchscript compiles (no annotation: TorchScript reads those)
    __jit_unused_properties__ = list[str]()  # filled below: [Note: what TorchScript compiles of a Module]

    #: The checkpoint entries of the hyperparameters, as Lightning names them (fullshard writes the
    #: first; the other two come from Lightning's checkpoints: fullshard's hparams are a dict).
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self._hparams = AttributeDict()
        self._param_requires_grad_state: dict[nn.Parameter, bool] = {}

    # ------------------------------------------------------------------------------- steps
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute the loss of one batch.

        Return the loss tensor, a dict with a ``"loss"`` entry, or None: the batch adds no
        gradient, and its window's optimizer step still runs and counts, as in Lightning (under
        several processes every rank must return None at the same batch; see docs/lightning.md).
        """
        raise not_defined(
            self,
            "training_step(batch, batch_idx)",
            "the Trainer needs it to compute a loss. Override it and return the loss tensor.",
        )

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one validation batch; log metrics with :meth:`log`."""
        raise not_defined(
            self,
            "validation_step(batch, batch_idx)",
            "but validation data was given. Override validation_step, or pass no validation dataloaders.",
        )

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one test batch (``Trainer.test``); log metrics with :meth:`log`."""
        raise not_defined(
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
        raise not_defined(
            self,
            "configure_optimizers()",
            "the Trainer needs an optimizer. Override it, e.g. "
            "`return torch.optim.AdamW(self.parameters(), lr=1e-3)`.",
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

    # ----------------------------------------------------------------------------- helpers
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module."""
        if self._trainer is None and not self._jit_is_scripting:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer. `self.trainer` is available inside "
                "the hooks called by Trainer.fit() / validate() / test() / predict()."
            )
        return self._trainer  # type: ignore[return-value]  # None only while to_torchscript compiles

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        self._trainer = trainer

    @property
    def hparams(self) -> AttributeDict:
        """The hyperparameters recorded by :meth:`save_hyperparameters` (``self.hparams.lr``)."""
        return self._hparams

    def remove_ignored_hparams(self, ignore_list: list[str]) -> None:
        """Drop the hyperparameters named in ``ignore_list`` from :attr:`hparams` (a subclass
        dropping what its base class's ``save_hyperparameters`` recorded), as Lightning's."""
        for key in ignore_list:
            self._hparams.pop(key, None)

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of :attr:`hparams` as :meth:`save_hyperparameters` recorded them (later changes
        to ``self.hparams`` do not show here)."""
        return AttributeDict(copy.deepcopy(dict(getattr(self, "_hparams_initial", {}))))

    @property
    def example_input_array(self) -> Any:
        """An example batch input for ``forward`` (Lightning's; None unless set)."""
        return getattr(self, "_example_input_array", None)

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self._example_input_array = example

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's floating-point parameters (the default dtype without any)."""
        for param in self.parameters():
            if param.is_floating_point():
                return param.dtype
        return torch.get_default_dtype()

    @property
    def on_gpu(self) -> bool:
        """Whether the module computes on a CUDA device."""
        return self.device.type == "cuda"

    def to_torchscript(
        self,
        file_path: str | Path | None = None,
        method: str = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> torch.jit.ScriptModule:
        """The module compiled by ``torch.jit.script`` (``method="script"``) or traced by
        ``torch.jit.trace`` on ``example_inputs`` (default :attr:`example_input_array`), in eval
        mode (its own mode is put back), saved to ``file_path`` when given; ``kwargs`` go to torch."""
        training = self.training
        try:
            if method == "script":
                with jit_compiling(self):
                    compiled = torch.jit.script(self.eval(), **kwargs)
            elif method == "trace":
                example = self.example_input_array if example_inputs is None else example_inputs
                if example is None:
                    raise ValueError(
                        "to_torchscript(method='trace') needs inputs to trace with: pass example_inputs= or set "
                        "self.example_input_array."
                    )
                with jit_compiling(self):
                    compiled = torch.jit.trace(self.eval(), example_inputs=example, **kwargs)
            else:
                raise ValueError(f"to_torchscript(method={method!r}): use 'script' or 'trace'.")
        finally:
            self.train(training)
        if file_path is not None:
            torch.jit.save(compiled, str(file_path))
        return compiled  # type: ignore[no-any-return]

    def freeze(self) -> None:
        """No parameter requires a gradient, and the module is in eval mode."""
        for param in self.parameters():
            param.requires_grad = False
        self.eval()

    def unfreeze(self) -> None:
        """Every parameter requires a gradient, and the module is in training mode."""
        for param in self.parameters():
            param.requires_grad = True
        self.train()

    @property
    def device(self) -> torch.device:
        """The device this module computes on."""
        if self._trainer is not None and self._trainer.strategy.module is not None:
            return self._trainer.strategy.root_device
        for param in self.parameters():
            return param.device
        return torch.device("cpu")

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The strategy's ``DeviceMesh`` (None without a Trainer, or under a strategy that has none).

        Under ``strategy="model_parallel"`` it is the 2-D ``("data_parallel", "tensor_parallel")``
        mesh, ready in :meth:`configure_model`, where the layers are parallelised over it (as with
        Lightning's ``self.device_mesh``; docs/fsdp/2d-parallel.md).
        """
        if self._trainer is None:
            return None
        try:
            return self._trainer.strategy.device_mesh
        except RuntimeError:  # ModelParallelStrategy before its processes started: no mesh yet
            return None

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

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., Any] = "mean",
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
            on_epoch: record the ``reduce_fx`` over the epoch. Default: False in ``training_step``
                and the training batch hooks, True elsewhere (so ``on_step=True`` in
                ``validation_step`` logs both). With both on, the metric appears as ``name_step``
                and ``name_epoch`` (and ``name``, the epoch value, in ``callback_metrics``).
            reduce_fx: ``"mean"`` (or ``"avg"``), ``"sum"``, ``"max"``, ``"min"``, in any case, or
                ``torch.mean``/``torch.sum``/``torch.max``/``torch.min`` (epoch and cross-process reduction).
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
        if self.trainer.barebones:
            rank_zero_warn(
                f"self.log({name!r}) was called with Trainer(barebones=True), which turns logging off: the value "
                "is dropped. Drop barebones=True to log."
            )
            return
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
        if logger and self.trainer.logger is None:  # asked for explicitly, as Lightning warns
            rank_zero_warn(
                f"self.log({name!r}, ..., logger=True) was called but the Trainer has no logger configured, "
                "so the value reaches no logger. Pass Trainer(logger=...) (a CSVLogger, say) to record it."
            )

    def log_dict(self, dictionary: Mapping[str, Any] | Any, **kwargs: Any) -> None:
        """Call :meth:`log` for each entry of ``dictionary`` with the same options; a
        ``torchmetrics.MetricCollection`` logs each of its metrics under its (prefixed) name."""
        torchmetrics = sys.modules.get("torchmetrics")  # a MetricCollection, without importing torchmetrics
        if torchmetrics is not None and isinstance(dictionary, torchmetrics.MetricCollection):
            options = {"keep_base": False}
            if getattr(dictionary, "_enable_compute_groups", False):
                options["copy_state"] = False  # the members share their states: compute them as they are
            items = dictionary.items(**options)
        else:
            items = dictionary.items()
        for name, value in items:
            self.log(name, value, **kwargs)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Gather tensors (or collections of them) from every process: each tensor gets a new first
        dimension of size world size. A no-op stacking with one process."""
        from fullshard.nested import apply_to_collection

        strategy = self.trainer.strategy

        def gather(tensor: torch.Tensor) -> torch.Tensor:
            return strategy.all_gather(tensor, sync_grads=sync_grads)

        return apply_to_collection(data, torch.Tensor, gather)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self._trainer is None or self._trainer.is_global_zero:
            print(*args, **kwargs)

    def save_hyperparameters(
        self,
        *args: Any,
        ignore: str | list[str] | None = None,
        frame: FrameType | None = None,
        logger: bool = True,
        **values: Any,
    ) -> None:
        """Store constructor arguments in :attr:`hparams` (and so in every checkpoint).

        Called without arguments inside ``__init__`` it records every argument of ``__init__``;
        string ``args`` select some of them, ``ignore`` leaves some out; one dict,
        ``argparse.Namespace`` or omegaconf ``DictConfig`` argument records its entries (and
        ``load_from_checkpoint`` passes them back as that argument); keyword ``values`` are
        stored as given. ``logger=False``: the loggers do not get them (Lightning's rules:
        :mod:`fullshard.hyperparameters`). ``frame``: the frame whose function's arguments are
        recorded (default: the caller's).
        """
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        recorded = hyperparameters.record(self, frame, args, ignore, values, logger)
        if recorded is None:
            return
        self._hparams.update(recorded)
        self._hparams_initial = copy.deepcopy(dict(self._hparams))

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | Path,
        map_location: Any = None,
        strict: bool | None = None,
        trust_checkpoint: bool = False,
        **kwargs: Any,
    ) -> Self:
        """Build the module from a checkpoint (full or sharded, fullshard's or Lightning's).

        The module is created as ``cls(**hparams, **kwargs)`` from the hyperparameters saved with
        it (``kwargs`` override them), ``configure_model()`` and ``on_load_checkpoint()`` run,
        and the weights are loaded (``strict``: the keys must match exactly; None: :attr:`strict_loading`) onto
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
            Module,
            map_location=map_location,
            strict=strict,
            trust_checkpoint=trust_checkpoint,
            **kwargs,
        )


# [Note: what TorchScript compiles of a Module]
# torch.jit.script compiles every property of a module's class unless the class lists it in
# __jit_unused_properties__, and reads every attribute (getattr) while it looks for overloads.
# The Module's own properties (trainer, device_mesh, current_epoch, ...) are Trainer plumbing, not
# model code, so all of them are listed; `trainer`, which raises without a Trainer, returns None
# while to_torchscript compiles (Module._jit_is_scripting). A user's own properties are compiled.
Module.__jit_unused_properties__ = sorted(
    {
        name
        for klass in Module.__mro__
        if klass is not nn.Module
        for name, v in vars(klass).items()
        if isinstance(v, property)
    }
)

LightningModule = Module
"""Lightning's name for :class:`Module`, so ported scripts keep their class statements."""


@contextlib.contextmanager
def jit_compiling(model: nn.Module) -> Iterator[None]:
    """Inside, TorchScript may compile or trace ``model``: the ``trainer`` of every fullshard
    :class:`Module` in it gives None instead of raising when none is attached (TorchScript reads
    every property while it compiles; a logger traces a graph without a Trainer)."""
    modules = [m for m in model.modules() if isinstance(m, Module)]
    for module in modules:
        module._jit_is_scripting = True
    try:
        yield
    finally:
        for module in modules:
            module._jit_is_scripting = False

"""What the Trainer checks before starting any process, and where each stage's data comes from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from fullshard.datamodule import DataModule
from fullshard.errors import MisconfigurationError
from fullshard.module import Module
from fullshard.optimizer_config import parse_optimizers
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.combined_loader import MODES, CombinedLoader, as_combined, check_loaders

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer


class DataSources:
    """Where each stage's dataloader comes from: given to the call, a DataModule, or the module."""

    def __init__(self, datamodule: DataModule | None = None, **loaders: Any) -> None:
        self.datamodule = datamodule
        self.loaders = loaders

    def get(self, kind: str, module: Module) -> Any:
        """The ``"train"`` loader, or None when there is none (see :meth:`get_all` for the others)."""
        given = self._request(kind, module)
        return None if given is None else single_loader(given, kind)

    def get_all(self, kind: str, module: Module) -> list[DataLoader[Any]]:
        """The ``kind`` ("val", "test", "predict") loaders in order (none: an empty list)."""
        given = self._request(kind, module)
        return [] if given is None else eval_loaders(given, kind)

    def _request(self, kind: str, module: Module) -> Any:
        given = self.loaders.get(kind)
        if given is not None:
            return given
        method = f"{kind}_dataloader"
        for source, base in ((self.datamodule, DataModule), (module, Module)):
            if source is not None and overrides(source, base, method):
                return getattr(source, method)()
        return None

    def has(self, kind: str, module: Module) -> bool:
        """Whether a ``kind`` loader will be found (without building it)."""
        if self.loaders.get(kind) is not None:
            return True
        method = f"{kind}_dataloader"
        return any(
            source is not None and overrides(source, base, method)
            for source, base in ((self.datamodule, DataModule), (module, Module))
        )


# LightningModule hooks that fullshard does not call, with what to do instead. A hook that
# exists in Lightning and is silently not called is the worst kind of gap (docs/design.md,
# "Where users' code meets fullshard").
_LIGHTNING_ONLY_HOOKS = {
    "configure_sharded_model": "rename it configure_model",
}


def check_lightning_only_hooks(model: Module) -> None:
    """Warn of each Lightning hook ``model`` defines that fullshard does not call."""
    defined = [name for name in _LIGHTNING_ONLY_HOOKS if callable(getattr(type(model), name, None))]
    for name in defined:
        rank_zero_warn(
            f"{type(model).__name__}.{name}() is a Lightning hook that fullshard does not call; "
            f"{_LIGHTNING_ONLY_HOOKS[name]} (docs/lightning.md)."
        )


def check_manual_optimization(trainer: Trainer, model: Module) -> None:
    """Lightning's refusals for manual optimization: the Trainer neither clips nor accumulates
    for a module that steps its optimizers itself.

    Raises:
        MisconfigurationError: ``gradient_clip_val`` or ``accumulate_grad_batches`` > 1 is set.
    """
    if model.automatic_optimization:
        return
    name = type(model).__name__
    if trainer.gradient_clip_val is not None and trainer.gradient_clip_val > 0:
        raise MisconfigurationError(
            f"Trainer(gradient_clip_val={trainer.gradient_clip_val}) clips in automatic optimization only, and "
            f"{name} sets automatic_optimization = False. Remove gradient_clip_val and call "
            "self.clip_gradients(opt, gradient_clip_val=..., gradient_clip_algorithm=...) in training_step, "
            "or switch to automatic optimization."
        )
    if trainer.accumulate_grad_batches != 1:
        raise MisconfigurationError(
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) accumulates in automatic "
            f"optimization only, and {name} sets automatic_optimization = False. Remove it and step the "
            "optimizers every N batches in training_step (inside self.trainer.strategy.no_backward_sync("
            "enabled=...) for the other batches), or switch to automatic optimization."
        )


def overrides(obj: Any, base: type, name: str) -> bool:
    """Whether ``obj`` defines ``name`` itself: in its class, or on the instance (LightningCLI's
    ``--optimizer`` sets ``configure_optimizers`` so; set to None, it counts as not defined, as
    Lightning's ``is_overridden``)."""
    if name in vars(obj):  # set on the instance; None switches it off (`model.validation_step = None`)
        return vars(obj)[name] is not None
    defined = getattr(type(obj), name, None)  # `val_dataloader = None` in the class body: off too
    return defined is not None and defined is not getattr(base, name, None)


def _argument(kind: str) -> str:
    return {"train": "train_dataloaders", "val": "val_dataloaders"}.get(kind, "dataloaders")


def single_loader(loader: Any, kind: str) -> Any:
    """The training loader in ``loader``: a DataLoader, or a :class:`CombinedLoader` (a dict,
    list or tuple of dataloaders is read as ``CombinedLoader(loaders, "max_size_cycle")``, as in
    Lightning)."""
    argument = _argument(kind)
    combined = as_combined(loader, "max_size_cycle")
    if combined is not None:
        check_loaders(combined, argument)
        if combined.mode == "sequential":
            raise ValueError(
                f'{argument}: fit does not support the CombinedLoader(mode="sequential") mode. The available '
                f"modes are: {[m for m in MODES if m != 'sequential']}."
            )
        return combined
    if not isinstance(loader, DataLoader):
        raise MisconfigurationError(
            f"{argument} must be a torch.utils.data.DataLoader, got {type(loader).__name__}. "
            "Wrap your dataset: DataLoader(dataset, batch_size=...)."
        )
    return loader


def _values(loaders: Any) -> list[Any]:
    return list(loaders.values()) if isinstance(loaders, Mapping) else list(loaders)


def eval_loaders(loader: Any, kind: str) -> list[Any]:
    """The evaluation loaders in ``loader``: one DataLoader, or a list, tuple or dict of them, or
    a ``"sequential"`` :class:`CombinedLoader` (run one after the other, in order, as Lightning
    runs them), or a CombinedLoader of another mode (one loader of combined batches; not for
    ``predict``, as in Lightning); an empty one holds none, and the stage then runs no batches
    (``fit(val_dataloaders=[])`` does not validate), as in Lightning."""
    accepted = f"{_argument(kind)} must be a torch.utils.data.DataLoader or a list, tuple or dict of them"
    fix = "Wrap each dataset: DataLoader(dataset, batch_size=...)."
    if isinstance(loader, CombinedLoader):
        check_loaders(loader, _argument(kind))
        if loader.mode == "sequential":
            return list(loader.flattened)
        if kind == "predict":
            raise ValueError(
                '`trainer.predict()` only supports the `CombinedLoader(mode="sequential")` mode.'
            )
        return [loader]
    if not isinstance(loader, list | tuple | Mapping):
        if not isinstance(loader, DataLoader):
            raise MisconfigurationError(f"{accepted}, got {type(loader).__name__}. {fix}")
        return [loader]
    loaders = _values(loader)
    container = type(loader).__name__
    for item in loaders:
        if not isinstance(item, DataLoader):
            raise MisconfigurationError(f"{accepted}, got a {type(item).__name__} in the {container}. {fix}")
    return loaders


def make_sources(datamodule: Any, **loaders: Any) -> DataSources:
    """The data of a call, checked: a DataModule or dataloaders (one per stage), not both."""
    if datamodule is not None and not isinstance(datamodule, DataModule):
        raise MisconfigurationError(
            f"datamodule must be a fullshard.DataModule, got {type(datamodule).__name__}. Subclass "
            "fullshard.DataModule (a LightningDataModule ports by changing its import)."
        )
    if datamodule is not None and any(v is not None for v in loaders.values()):
        raise MisconfigurationError(
            "Both dataloaders and a datamodule were given; pass one of them (the DataModule's "
            "*_dataloader() methods provide the loaders)."
        )
    for kind, loader in loaders.items():
        if loader is not None:
            if kind == "train":
                single_loader(loader, kind)
            else:
                eval_loaders(loader, kind)
    return DataSources(datamodule, **loaders)


def check_call(stage: str, model: Any, sources: DataSources) -> None:
    """Find what needs no process before starting any (see docs/lightning.md, errors)."""
    if not isinstance(model, Module):
        raise MisconfigurationError(
            f"Trainer expects a fullshard.Module, got {type(model).__name__}. Subclass fullshard.Module "
            "(fullshard.LightningModule is the same class) and define training_step and "
            "configure_optimizers."
        )
    check_lightning_only_hooks(model)
    step = {"fit": "training_step", "validate": "validation_step", "test": "test_step"}.get(stage)
    if step is not None and not overrides(model, Module, step):
        raise MisconfigurationError(
            f"Trainer.{stage}() needs {type(model).__name__}.{step}(batch, batch_idx), which is not "
            f"defined. Define it in {type(model).__name__}."
        )
    kind = {"fit": "train", "validate": "val"}.get(stage, stage)
    if not sources.has(kind, model):
        raise MisconfigurationError(
            f"Trainer.{stage}() got no {kind} data: pass dataloaders, a datamodule= with "
            f"{kind}_dataloader(), or define {kind}_dataloader() in {type(model).__name__}."
        )
    if stage == "fit":
        if not overrides(model, Module, "configure_optimizers"):
            raise MisconfigurationError(
                f"{type(model).__name__} does not define configure_optimizers(); the Trainer needs an "
                "optimizer. Define it, e.g. `return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
            )
        if sources.has("val", model) and not overrides(model, Module, "validation_step"):
            rank_zero_warn(
                "Validation data was given but the module has no validation_step; validation is skipped."
            )


def check_optimizers_early(trainer: Trainer, model: Module, sources: DataSources) -> None:
    """Check what configure_optimizers returns, when the model has its parameters already.

    Global rank 0 does it as the first thing in its run, before joining the process group: the
    other processes are only starting then (importing torch), so a bad result ends the job at
    once with one message, and the check costs no start-up time (building a first optimizer
    imports ``torch._dynamo``, about a second, which would delay starting the others if done
    before launching them). A model whose layers are built in configure_model() (or that
    configure_optimizers cannot serve yet) is checked after setup instead. The optimizers built
    here are discarded.
    """
    if overrides(model, Module, "configure_model") or next(model.parameters(), None) is None:
        return
    loop = trainer.fit_loop
    loop.early_loader = sources.loaders.get("train")  # for estimated_stepping_batches
    model.trainer = trainer
    try:
        config = model.configure_optimizers()
    except Exception:  # needs something only a running fit has: checked after setup instead
        return
    finally:
        model.trainer = None
        loop.early_loader = loop.train_loader = None
    parse_optimizers(config, model)

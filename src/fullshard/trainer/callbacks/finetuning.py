"""``BaseFinetuning`` and ``BackboneFinetuning``: freeze part of a model, then unfreeze it into
the optimizer as training goes on.

Under FSDP the callbacks act on the module's own parameters: FSDP2's ``DTensor`` parameters and
FSDP1's original parameters (``use_orig_params=True``, fullshard's default), which are what the
optimizer holds, so freezing, unfreezing and adding a parameter group work as on one device.

[Note: parameters unfrozen under DDP]
torch's ``DistributedDataParallel`` averages the gradients of the parameters that required grad
when it wrapped the model, and only those: a backbone frozen in ``setup`` and unfrozen later
would train on each process's own gradients, and the processes' weights would drift apart.
``BaseFinetuning`` therefore averages the gradients of such parameters itself, before each
optimizer step (one all-reduce per unfrozen parameter). FSDP and FSDP2 reduce every gradient
that exists, so nothing is needed there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger(__name__)

Modules = nn.Module | Iterable[Any]


def multiplicative(epoch: int) -> float:
    """``BackboneFinetuning``'s default ``lambda_func``: the backbone's learning rate doubles each epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Base class of finetuning callbacks. Subclasses define :meth:`freeze_before_training`
    (called in ``setup``, before the optimizers are made) and :meth:`finetune_function`
    (called at the start of every training epoch for each optimizer).

    The parameter groups a subclass adds are stored (by parameter name) in the callback's
    checkpoint state and re-created on resume before training goes on.
    """

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False
        self._ddp_reduced: set[int] | None = None  # see [Note: parameters unfrozen under DDP]

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restarting = True
        self._internal_optimizer_metadata = state_dict.get("internal_optimizer_metadata", state_dict)

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        wrapped = trainer.strategy.model
        if isinstance(wrapped, DistributedDataParallel) and trainer.world_size > 1:
            self._ddp_reduced = {id(p) for p in pl_module.parameters() if p.requires_grad}
        else:
            self._ddp_reduced = None
        if self._restarting:
            named = dict(pl_module.named_parameters())
            for index, optimizer in enumerate(trainer.optimizers):
                if index in self._internal_optimizer_metadata:
                    optimizer.param_groups = self._apply_mapping_to_param_groups(
                        self._internal_optimizer_metadata[index], named
                    )
            self._restarting = False

    # ------------------------------------------------------------------ static helpers
    @staticmethod
    def flatten_modules(modules: Modules) -> list[nn.Module]:
        """The leaf modules (and modules with parameters of their own) of ``modules``: a module,
        a ``ModuleDict`` or a (nested) iterable of modules."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, nn.Module):
            found: Iterable[nn.Module] = modules.modules()
        elif isinstance(modules, Iterable):
            found = [leaf for m in modules for leaf in BaseFinetuning.flatten_modules(m)]
        else:
            raise TypeError(
                f"Expected a torch.nn.Module or an iterable of modules, got {type(modules).__name__}."
            )
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(
        modules: Modules, train_bn: bool = True, requires_grad: bool = True
    ) -> Generator[nn.Parameter, None, None]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad``; batch
        norm layers are left out when ``train_bn`` is False."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Let ``modules`` train again (``requires_grad=True``; batch norms track statistics)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        """Freeze one module's own parameters (a batch norm also stops tracking statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze ``modules``; with ``train_bn`` their batch norm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` without those ``optimizer`` holds already (with a warning when there are some)."""
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in held]
        if len(kept) < len(params):
            rank_zero_warn(
                "Some parameters to unfreeze are in the optimizer already and are not added again. Build the "
                f"optimizer from the trainable parameters only: {type(optimizer).__name__}(filter(lambda p: "
                "p.requires_grad, self.parameters()), ...)."
            )
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Modules,
        optimizer: Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new group, with
        learning rate ``lr``, or the first group's divided by ``initial_denom_lr`` when ``lr``
        is None."""
        BaseFinetuning.make_trainable(modules)
        base_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denominator = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_on_optimizer(
            optimizer, BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        )
        if params:
            optimizer.add_param_group({"params": params, "lr": base_lr / denominator})

    # ------------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self.freeze_before_training(pl_module)

    @staticmethod
    def _apply_mapping_to_param_groups(
        groups: list[dict[str, Any]], mapping: dict[Any, Any]
    ) -> list[dict[str, Any]]:
        return [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [mapping[p] for p in g["params"]]}
            for g in groups
        ]

    def _store(self, pl_module: Module, index: int, groups_before: int, groups: list[dict[str, Any]]) -> None:
        names = {p: n for n, p in pl_module.named_parameters()}
        if index not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[index] = self._apply_mapping_to_param_groups(groups, names)
        elif groups_before != len(groups):
            self._internal_optimizer_metadata[index].extend(
                self._apply_mapping_to_param_groups(groups[groups_before:], names)
            )

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            groups_before = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._store(pl_module, index, groups_before, optimizer.param_groups)

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Module, optimizer: Optimizer) -> None:
        reduced = self._ddp_reduced
        if reduced is None:
            return
        world_size = trainer.world_size
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None and id(param) not in reduced:
                    dist.all_reduce(param.grad)
                    param.grad.div_(world_size)

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        """Unfreeze (and re-weight) what this epoch trains. Subclasses define it."""
        raise NotImplementedError(
            f"{type(self).__name__} must define finetune_function(pl_module, epoch, optimizer)."
        )

    def freeze_before_training(self, pl_module: Module) -> None:
        """Freeze what must not train at first. Subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must define freeze_before_training(pl_module).")


class BackboneFinetuning(BaseFinetuning):
    """Freezes ``pl_module.backbone`` until epoch ``unfreeze_backbone_at_epoch``, then trains it
    in a parameter group of its own whose learning rate grows each epoch, as Lightning's.

    Args:
        unfreeze_backbone_at_epoch: the epoch (from 0) at which the backbone starts training.
        lambda_func: epoch to the factor the backbone's learning rate is multiplied by each epoch
            after unfreezing (default: 2).
        backbone_initial_ratio_lr: the backbone's first learning rate as a fraction of the
            first group's, when ``backbone_initial_lr`` is None.
        backbone_initial_lr: the backbone's first learning rate.
        should_align: never let the backbone's learning rate exceed the first group's.
        initial_denom_lr: as in :meth:`BaseFinetuning.unfreeze_and_add_param_group`.
        train_bn: keep the backbone's batch norm layers trainable while it is frozen.
        verbose: log the learning rates each epoch.
        rounding: digits of the learning rates in those log lines.
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 10e-2,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    @staticmethod
    def _backbone(pl_module: Module) -> nn.Module:
        backbone = getattr(pl_module, "backbone", None)
        if not isinstance(backbone, nn.Module):
            raise MisconfigurationError(
                f"BackboneFinetuning needs the module to have a torch.nn.Module attribute `backbone`; "
                f"{type(pl_module).__name__}.backbone is {type(backbone).__name__}. Name the part to freeze "
                "`self.backbone`, or subclass BaseFinetuning to choose it."
            )
        return backbone

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._backbone(pl_module)
        super().on_fit_start(trainer, pl_module)

    @override
    def freeze_before_training(self, pl_module: Module) -> None:
        self.freeze(self._backbone(pl_module))

    @override
    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = (
                self.backbone_initial_lr
                if self.backbone_initial_lr is not None
                else current_lr * self.backbone_initial_ratio_lr
            )
            self.unfreeze_and_add_param_group(
                self._backbone(pl_module),
                optimizer,
                backbone_lr,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr
            optimizer.param_groups[-1]["lr"] = backbone_lr
        else:
            return
        self.previous_backbone_lr = backbone_lr
        if self.verbose:
            log.info(
                f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: {round(backbone_lr, self.rounding)}"
            )


__all__ = ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]

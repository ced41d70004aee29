"""The type names a Lightning script annotates its hooks with (``lightning.pytorch.utilities.types``):
``def training_step(self, batch, batch_idx) -> STEP_OUTPUT`` and
``def configure_optimizers(self) -> OptimizerLRScheduler`` port by changing the import."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Optional, Protocol, TypedDict, Union, runtime_checkable

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from typing_extensions import NotRequired, Required

from fullshard.optimizer_config import LRSchedulerConfig

# Optional[...]/Union[...] rather than `|`: these are runtime values (aliases a script may use
# in isinstance checks or its own annotations), and `X | None` of a typing special form fails.
STEP_OUTPUT = Optional[Union[torch.Tensor, Mapping[str, Any]]]  # noqa: UP007, UP045
TRAIN_DATALOADERS = Any  # any iterable or collection of iterables
EVAL_DATALOADERS = Any
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]  # noqa: UP007
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]  # noqa: UP007
LRSchedulerPLType = LRSchedulerTypeUnion
OptimizerCallable = Callable[[Iterable[Any]], Optimizer]  # what LightningCLI's optimizer= takes
LRSchedulerCallable = Callable[[Optimizer], LRSchedulerTypeUnion]


@runtime_checkable
class DistributedDataParallel(Protocol):
    """What a data-parallel wrapper offers: ``no_sync()`` to skip the gradient reduction."""

    def no_sync(self) -> Any: ...


class LRSchedulerConfigType(TypedDict, total=False):
    """The scheduler dict ``configure_optimizers`` may return under ``"lr_scheduler"``."""

    scheduler: Required[LRSchedulerTypeUnion]
    name: str | None
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: str | None
    strict: bool


class OptimizerConfig(TypedDict):
    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict):
    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType
    monitor: NotRequired[str]


OptimizerLRScheduler = Optional[  # noqa: UP045
    Union[  # noqa: UP007
        Optimizer,
        Sequence[Optimizer],
        tuple[Sequence[Optimizer], Sequence[Union[LRSchedulerTypeUnion, LRSchedulerConfig]]],  # noqa: UP007
        OptimizerConfig,
        OptimizerLRSchedulerConfig,
        Sequence[OptimizerConfig],
        Sequence[OptimizerLRSchedulerConfig],
    ]
]

__all__ = [
    "EVAL_DATALOADERS",
    "STEP_OUTPUT",
    "TRAIN_DATALOADERS",
    "DistributedDataParallel",
    "LRSchedulerCallable",
    "LRSchedulerConfig",
    "LRSchedulerConfigType",
    "LRSchedulerPLType",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "OptimizerCallable",
    "OptimizerConfig",
    "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
]

"""Lightning's plugin objects fullshard has a setting for (``lightning.pytorch.plugins``):
``Trainer(plugins=[MixedPrecision("bf16-mixed", "cuda"), SLURMEnvironment(), AsyncCheckpointIO()])``
sets the precision, the cluster environment and background saves (:mod:`fullshard.plugins.resolve`
lists each mapping). The other plugins Lightning has are refused with what to do instead
(docs/lightning.md, "Module paths")."""

from typing import TYPE_CHECKING

from fullshard.lightning_aliases import lightning_names
from fullshard.plugins.settings import (
    AsyncCheckpointIO,
    HalfPrecision,
    LayerSync,
    MixedPrecision,
    TorchCheckpointIO,
    TorchSyncBatchNorm,
)
from fullshard.precision import FSDPPrecision, Precision

__all__ = [
    "AsyncCheckpointIO",
    "FSDPPrecision",
    "HalfPrecision",
    "LayerSync",
    "MixedPrecision",
    "Precision",
    "TorchCheckpointIO",
    "TorchSyncBatchNorm",
]

if not TYPE_CHECKING:  # Lightning's plugins fullshard has not: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)

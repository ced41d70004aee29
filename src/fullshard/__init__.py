"""fullshard: train PyTorch models too big for one device.

The names a Lightning script imports are here too (``LightningModule``, ``LightningDataModule``,
``Trainer``, ``Callback``, ``seed_everything``; callbacks in :mod:`fullshard.callbacks`, loggers
in :mod:`fullshard.loggers`), so a script ports by changing its imports (docs/lightning.md).
"""

import logging as _logging
from typing import TYPE_CHECKING as _TYPE_CHECKING

from fullshard import _startup  # noqa: F401  # first: [Note: torch's objects frozen at import]
from fullshard import lightning_aliases as _lightning_aliases
from fullshard.datamodule import DataModule, LightningDataModule
from fullshard.module import LightningModule, Module
from fullshard.planner import plan
from fullshard.seed import seed_everything
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.early_stopping import EarlyStopping
from fullshard.trainer.callbacks.lr_monitor import LearningRateMonitor
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.trainer import Trainer
from fullshard.version import __version__

__all__ = [
    "Callback",
    "DataModule",
    "EarlyStopping",
    "LearningRateMonitor",
    "LightningDataModule",
    "LightningModule",
    "ModelCheckpoint",
    "Module",
    "Trainer",
    "__version__",
    "plan",
    "seed_everything",
]

# Lightning's module paths (fullshard.core, fullshard.callbacks.finetuning, ...) and the names of
# lightning.pytorch that live elsewhere in fullshard: [Note: Lightning's module paths].
_lightning_aliases.install()
if not _TYPE_CHECKING:
    __getattr__ = _lightning_aliases.lightning_names(__name__)

# Info messages (the FSDP wrap plan, ...) go to stderr unless the application configures logging.
_log = _logging.getLogger("fullshard")
if not _log.handlers:
    _log.addHandler(_logging.StreamHandler())
    _log.setLevel(_logging.INFO)
    _log.propagate = False

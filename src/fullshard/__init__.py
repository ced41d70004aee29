"""fullshard: train PyTorch models too big for one device."""

__version__ = "0.1.0"

from fullshard.module import Module
from fullshard.seed import seed_everything
from fullshard.trainer.callbacks import Callback
from fullshard.trainer.model_checkpoint import ModelCheckpoint
from fullshard.trainer.trainer import Trainer

__all__ = ["Callback", "ModelCheckpoint", "Module", "Trainer", "__version__", "seed_everything"]

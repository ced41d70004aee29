"""fullshard: train PyTorch models too big for one device."""

__version__ = "0.1.0"

from fullshard.module import Module  # noqa: E402
from fullshard.seed import seed_everything  # noqa: E402
from fullshard.trainer.callbacks import Callback  # noqa: E402
from fullshard.trainer.model_checkpoint import ModelCheckpoint  # noqa: E402
from fullshard.trainer.trainer import Trainer  # noqa: E402

__all__ = ["Callback", "ModelCheckpoint", "Module", "Trainer", "__version__", "seed_everything"]

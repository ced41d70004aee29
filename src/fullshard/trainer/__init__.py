"""The host: Trainer, loops, callbacks, loggers and the progress bar."""

from typing import TYPE_CHECKING

from fullshard.lightning_aliases import lightning_names

if TYPE_CHECKING:
    from fullshard.seed import seed_everything
    from fullshard.trainer.trainer import Trainer

__all__ = ["Trainer", "seed_everything"]

if not TYPE_CHECKING:  # Lightning's names that live elsewhere: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)

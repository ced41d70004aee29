"""The tuner (Lightning's ``lightning.pytorch.tuner``): ``Tuner(trainer).lr_find(model)`` and
``Tuner(trainer).scale_batch_size(model)``; see docs/tuner.md."""

from fullshard.trainer.call import TunerExit
from fullshard.tuner.lr_finder import LRFinder
from fullshard.tuner.tuning import Tuner

__all__ = ["LRFinder", "Tuner", "TunerExit"]

"""The tuner's callbacks: ``BatchSizeFinder`` and ``LearningRateFinder`` run the tuner's searches
when ``fit`` starts. Users import them from :mod:`fullshard.callbacks`; they live here, above the
Trainer, because they drive the tuner (docs/design.md, "Principles")."""

from fullshard.tuner.callbacks.batch_size_finder import BatchSizeFinder
from fullshard.tuner.callbacks.lr_finder import LearningRateFinder

__all__ = ["BatchSizeFinder", "LearningRateFinder"]

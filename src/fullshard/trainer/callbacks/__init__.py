"""The Trainer's callbacks: the :class:`~fullshard.trainer.callbacks.base.Callback` base class
and the built-in ones, each in its own module. This package exports nothing itself: users import
the callbacks from :mod:`fullshard.callbacks` (their one public path), fullshard's own modules
from the module that defines each."""

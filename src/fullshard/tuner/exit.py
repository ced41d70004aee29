"""The signal a tuner's search uses to end the ``fit`` call it ran in."""


class TunerExit(Exception):
    """Raised by ``LearningRateFinder``/``BatchSizeFinder`` when the :class:`~fullshard.tuner.Tuner`
    started them: the search is done, and the Trainer ends the call without an error."""

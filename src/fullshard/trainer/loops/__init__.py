"""The loops the Trainer hands over to: :class:`FitLoop` (training, with the :class:`Progress` it
owns) and :class:`EvaluationLoop` (validation, test, predict)."""

from fullshard.trainer.loops.evaluation_loop import EvaluationLoop
from fullshard.trainer.loops.fit_loop import FitLoop
from fullshard.trainer.loops.progress import Progress

__all__ = ["EvaluationLoop", "FitLoop", "Progress"]

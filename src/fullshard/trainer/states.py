"""Where a Trainer is: which call runs (``TrainerFn``), how it ended (``TrainerStatus``) and which
loop is running (``RunningStage``), as Lightning's ``lightning.pytorch.trainer.states``.

``trainer.state`` holds one :class:`TrainerState`. During ``fit``, ``stage`` is ``TRAINING``
from ``setup`` on, ``SANITY_CHECKING`` during the sanity validation and ``VALIDATING`` during
each validation; ``validate``/``test``/``predict`` run in their own stage. A call that returns
leaves ``status`` ``FINISHED`` and ``stage`` None; one that raises leaves ``INTERRUPTED`` (set
before the callbacks' ``on_exception``), and ``stage`` None, except after Ctrl+C (Lightning
keeps the stage it was in then). The members are strings that compare equal to their values in
any case (``trainer.state.fn == "fit"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["LightningEnum", "RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]


class LightningEnum(str, Enum):
    """A string enum that compares equal to its value, case-insensitively (``"NORM" == member``)."""

    @classmethod
    def from_str(cls, value: str, source: str = "key") -> LightningEnum:
        """The member whose name (``source="key"``) or value (``"value"``) is ``value``, any case."""
        for member in cls:
            if (member.name if source == "key" else member.value).lower() == value.lower():
                return member
        choices = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{cls.__name__}.from_str({value!r}): no such member; choose one of {choices}.")

    def __eq__(self, other: object) -> bool:
        other = other.value if isinstance(other, Enum) else other
        return isinstance(other, str) and self.value.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.value.lower())


class TrainerStatus(LightningEnum):
    """How far the Trainer's current (or last) call got."""

    INITIALIZING = "initializing"  # no call yet
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        """Whether the call ended, either way."""
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(LightningEnum):
    """The Trainer's entry point that runs: ``fit``, ``validate``, ``test`` or ``predict``."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(LightningEnum):
    """The loop that runs within a call (``fit`` runs three of them)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        """Whether it is a validation or test run (the sanity validation included)."""
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str | None:
        """The dataloaders it runs over: ``"val"`` for both validations, else its value."""
        if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING):
            return "val"
        return str(self.value)


@dataclass
class TrainerState:
    """``trainer.state``: the call, its status and the running stage."""

    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        """Whether the last call returned."""
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """Whether the last call ended (returned or raised)."""
        return self.status.stopped


# the stage each call runs in from its start
CALL_STAGES = {
    "fit": RunningStage.TRAINING,
    "validate": RunningStage.VALIDATING,
    "test": RunningStage.TESTING,
    "predict": RunningStage.PREDICTING,
}

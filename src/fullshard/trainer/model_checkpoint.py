"""``ModelCheckpoint``: save checkpoints during training, keep the best ``k`` and the last one."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from fullshard.checkpoint.layout import RECORD_NAME
from fullshard.errors import MisconfigurationError
from fullshard.trainer.callbacks import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


class ModelCheckpoint(Callback):
    """Save a checkpoint every ``every_n_epochs`` epochs or ``every_n_train_steps`` optimizer steps.

    Args:
        dirpath: directory for the files; default ``<default_root_dir>/checkpoints``.
        filename: name template without extension; fields are ``{epoch}``, ``{step}`` and any
            logged metric, e.g. ``"{epoch}-{val_loss:.3f}"``. Default ``"epoch={epoch}-step={step}"``.
        monitor: metric ranking checkpoints for ``save_top_k``; None ranks by recency.
        mode: ``"min"`` or ``"max"``: which end of ``monitor`` is best.
        save_top_k: how many checkpoints to keep (-1 all, 0 none besides ``last``).
        save_last: also keep ``last.ckpt``, the newest checkpoint, for ``fit(ckpt_path="last")``.
        every_n_train_steps: save after every this many optimizer steps.
        every_n_epochs: save at the end of every this many epochs (the default, 1, when neither
            interval is given).

    A checkpoint that falls out of the top ``k`` is deleted only after its successor is written.
    """

    FILE_EXTENSION = ".ckpt"
    LAST_NAME = "last"

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: str = "min",
        save_top_k: int = 1,
        save_last: bool | None = None,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise MisconfigurationError(f"ModelCheckpoint(mode={mode!r}) is invalid: use 'min' or 'max'.")
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise MisconfigurationError(
                f"ModelCheckpoint(save_top_k={save_top_k!r}) is invalid: use -1 (keep all), 0 (none) or k >= 1."
            )
        for arg, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise MisconfigurationError(
                    f"ModelCheckpoint({arg}={value!r}) is invalid: use a positive int, or 0/None to disable."
                )
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.filename = filename or "epoch={epoch}-step={step}"
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps or 0
        self.every_n_epochs = (
            every_n_epochs if every_n_epochs is not None else (0 if every_n_train_steps else 1)
        )
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.last_model_path = ""
        self._saved: list[str] = []  # in order of saving, for monitor=None
        self._last_saved_step = -1

    @property
    @override
    def state_key(self) -> str:
        return (
            f"ModelCheckpoint{{monitor={self.monitor!r}, mode={self.mode!r}, every_n_train_steps="
            f"{self.every_n_train_steps}, every_n_epochs={self.every_n_epochs}}}"
        )

    @override
    def setup(self, trainer: Trainer, module: Module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "checkpoints"

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        every = self.every_n_train_steps
        due = every and step > 0 and step % every == 0 and step != self._last_saved_step
        if due and trainer._is_optimizer_step_boundary():
            self.save(trainer)

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        every = self.every_n_epochs
        if (
            every
            and (trainer.current_epoch + 1) % every == 0
            and trainer.global_step != self._last_saved_step
        ):
            self.save(trainer)

    # --------------------------------------------------------------------------------- saving
    def format_filename(self, trainer: Trainer) -> str:
        """The file name (with extension) for a checkpoint at the trainer's current position."""
        values: dict[str, Any] = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        values.update({k: float(v) for k, v in trainer.callback_metrics.items()})

        def substitute(match: re.Match[str]) -> str:
            key, spec = match.group(1), match.group(2) or ""
            if key not in values:
                raise MisconfigurationError(
                    f"ModelCheckpoint(filename={self.filename!r}) refers to {{{key}}}, which is not a logged "
                    f"metric. Known fields: {', '.join(sorted(values))}."
                )
            return ("{" + spec + "}").format(values[key]) if spec else str(values[key])

        return _FIELD.sub(substitute, self.filename) + self.FILE_EXTENSION

    def _score(self, trainer: Trainer) -> float | None:
        if self.monitor is None:
            return None
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            raise MisconfigurationError(
                f"ModelCheckpoint(monitor={self.monitor!r}) cannot find {self.monitor!r} among the logged "
                f"metrics ({', '.join(sorted(trainer.callback_metrics)) or 'none'}). Log it with "
                "self.log(...) in training_step or validation_step, or change `monitor`."
            )
        return float(value.item() if isinstance(value, torch.Tensor) else value)

    def _is_better(self, score: float, than: float) -> bool:
        return score < than if self.mode == "min" else score > than

    def save(self, trainer: Trainer) -> None:
        """Save a checkpoint now (all ranks call this), then apply the retention rules."""
        assert self.dirpath is not None
        self._last_saved_step = trainer.global_step
        score = self._score(trainer)
        path = str(self.dirpath / self.format_filename(trainer))
        to_delete: list[str] = []
        if self.save_top_k != 0:
            keep = self._admit(path, score)
            if keep:
                trainer.save_checkpoint(path)
                to_delete = self._evict()
        if self.save_last:
            last = str(self.dirpath / (self.LAST_NAME + self.FILE_EXTENSION))
            trainer.save_checkpoint(last)
            self.last_model_path = last
        # [Note: atomic commit] the new checkpoints are complete; only now drop old ones.
        if trainer.is_global_zero:
            for old in to_delete:
                if old != path:
                    _remove_checkpoint(Path(old))
        trainer.strategy.barrier("model_checkpoint")

    def _admit(self, path: str, score: float | None) -> bool:
        if score is None:
            if path in self._saved:
                self._saved.remove(path)
            self._saved.append(path)
            self.best_model_path = path
            return True
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k or path in self.best_k_models:
            self.best_k_models[path] = score
        else:
            worst = self._worst()
            if not self._is_better(score, self.best_k_models[worst]):
                return False
            self.best_k_models[path] = score
        best = min if self.mode == "min" else max
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.__getitem__)
        return True

    def _worst(self) -> str:
        worst = max if self.mode == "min" else min
        return worst(self.best_k_models, key=self.best_k_models.__getitem__)

    def _evict(self) -> list[str]:
        if self.save_top_k == -1:
            return []
        evicted: list[str] = []
        if self.monitor is None:
            while len(self._saved) > self.save_top_k:
                evicted.append(self._saved.pop(0))
        else:
            while len(self.best_k_models) > self.save_top_k:
                worst = self._worst()
                del self.best_k_models[worst]
                evicted.append(worst)
        return evicted

    @property
    def best_model_score(self) -> float | None:
        """The monitored value of :attr:`best_model_path` (None without ``monitor``)."""
        return self.best_k_models.get(self.best_model_path)

    def newest_checkpoint(self) -> str | None:
        """``last.ckpt`` when complete, else the newest complete checkpoint in :attr:`dirpath`
        (a sharded directory whose save was interrupted is skipped)."""
        if self.dirpath is None or not self.dirpath.is_dir():
            return None
        last = self.dirpath / (self.LAST_NAME + self.FILE_EXTENSION)
        if _is_complete(last):
            return str(last)
        found = [p for p in self.dirpath.glob("*" + self.FILE_EXTENSION) if _is_complete(p)]
        return str(max(found, key=commit_time)) if found else None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "dirpath": str(self.dirpath) if self.dirpath is not None else None,
            "best_model_path": self.best_model_path,
            "best_k_models": dict(self.best_k_models),
            "last_model_path": self.last_model_path,
            "saved": list(self._saved),
            "last_saved_step": self._last_saved_step,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        same_dir = state_dict.get("dirpath") == (str(self.dirpath) if self.dirpath is not None else None)
        self._last_saved_step = state_dict.get("last_saved_step", -1)
        if not same_dir:  # the files it lists live elsewhere; start a fresh ranking here
            return
        self.best_model_path = state_dict.get("best_model_path", "")
        self.best_k_models = dict(state_dict.get("best_k_models", {}))
        self.last_model_path = state_dict.get("last_model_path", "")
        self._saved = list(state_dict.get("saved", []))


def _is_complete(path: Path) -> bool:
    """A checkpoint file (written atomically) or a committed sharded checkpoint directory."""
    return path.is_file() or (path / RECORD_NAME).is_file()


def commit_time(path: Path) -> int:
    return (path if path.is_file() else path / RECORD_NAME).stat().st_mtime_ns


def _remove_checkpoint(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()

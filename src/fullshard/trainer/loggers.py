"""Experiment loggers: where the Trainer sends logged metrics and hyperparameters.

The Trainer calls a logger on global rank 0 only, so loggers hold no rank logic. They touch the
disk lazily: constructing one creates nothing, the run's folder appears at the first write.

Each run writes into ``save_dir/name/version_N``; when no version is given, ``N`` is the next
integer after the largest one already there, chosen the first time :attr:`Logger.version` or
:attr:`Logger.log_dir` is read.
"""

from __future__ import annotations

import csv
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_utilities.core.imports import RequirementCache
from typing_extensions import override

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]

_TENSORBOARD_AVAILABLE = RequirementCache("tensorboard")  # checked when a TensorBoardLogger is made
_VERSION_DIR = re.compile(r"version_(\d+)")


class Logger(ABC):
    """Interface the Trainer logs through. Methods are called on global rank 0 only."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Name of the experiment; runs of one experiment share a parent folder."""

    @property
    @abstractmethod
    def version(self) -> int | str:
        """Version of this run within the experiment."""

    @property
    @abstractmethod
    def log_dir(self) -> str:
        """Folder this run writes into."""

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalar ``metrics`` at ``step``. May buffer; :meth:`save` makes them durable."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters. Later calls add to (and override) earlier ones."""

    @abstractmethod
    def save(self) -> None:
        """Write everything buffered so far to disk."""

    def finalize(self, status: str) -> None:
        """Called once when the run ends; ``status`` is ``"success"`` or ``"failed"``. Saves by default."""
        self.save()


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    """Write ``content`` as JSON through a temporary file, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # default=str: hyperparameters often hold paths, dtypes or devices, which JSON cannot encode.
    tmp.write_text(json.dumps(dict(content), indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]], mode: str) -> None:
    """Write ``rows`` under ``columns`` (with a header line when ``mode`` is ``"w"``)."""
    with path.open(mode, newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="", lineterminator="\n")
        if mode == "w":
            writer.writeheader()
        writer.writerows(rows)


class _VersionedLogger(Logger):
    """Resolves ``save_dir/name/version`` lazily; shared by the file-based loggers."""

    def __init__(self, save_dir: str | os.PathLike[str], name: str, version: int | str | None) -> None:
        if isinstance(version, int) and version < 0:
            raise ValueError(f"`version` must be a non-negative integer, a string or None, got {version!r}.")
        self._save_dir = Path(save_dir)
        self._name = name
        self._version = version

    @property
    def save_dir(self) -> str:
        """Root folder given to the constructor."""
        return str(self._save_dir)

    @property
    @override
    def name(self) -> str:
        return self._name

    @property
    @override
    def version(self) -> int | str:
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @property
    @override
    def log_dir(self) -> str:
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return str(self._save_dir / self._name / folder)

    def _next_version(self) -> int:
        parent = self._save_dir / self._name
        if not parent.is_dir():
            return 0
        matches = (_VERSION_DIR.fullmatch(p.name) for p in parent.iterdir() if p.is_dir())
        taken = [int(m.group(1)) for m in matches if m is not None]
        return max(taken) + 1 if taken else 0


class CSVLogger(_VersionedLogger):
    """Writes metrics to ``log_dir/metrics.csv`` and hyperparameters to ``log_dir/hparams.json``.

    The CSV has one row per step, a ``step`` column first and one column per metric name; a
    metric missing from a row is left empty. Metrics logged for the same step between two
    flushes share a row. When a new metric name appears, the header grows and the file is
    rewritten.

    Rows are kept in memory and written by :meth:`save`, and automatically once
    ``flush_every_n_steps`` rows are waiting, so ``log_metrics`` costs no disk access on the
    training path. An existing ``metrics.csv`` in the run's folder (a resumed run that reuses
    its ``version``) is appended to.

    Args:
        save_dir: Root folder for all experiments.
        name: Experiment name, the folder under ``save_dir``.
        version: Run version: an integer gives ``version_<int>``, a string is the folder name
            as is, ``None`` picks the next free integer.
        flush_every_n_steps: Write buffered rows once this many are waiting.
    """

    METRICS_FILE = "metrics.csv"
    HPARAMS_FILE = "hparams.json"

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str = "fullshard_logs",
        version: int | str | None = None,
        flush_every_n_steps: int = 100,
    ) -> None:
        if flush_every_n_steps < 1:
            raise ValueError(
                f"`flush_every_n_steps` must be a positive integer, got {flush_every_n_steps!r}. "
                "Pass 1 to write every row as soon as its step is over."
            )
        super().__init__(save_dir, name, version)
        self._flush_every = flush_every_n_steps
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] | None = None  # header on disk; None until first read or written
        self._hparams: dict[str, Any] = {}

    @override
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if "step" in metrics:
            raise ValueError(
                "The metric name 'step' is reserved for the CSV's step column. Log it under another name."
            )
        rows = self._rows
        if rows and rows[-1]["step"] == step:
            row = rows[-1]
        else:
            # Flush only when a new step begins, so the row of the current step stays in memory
            # and later metrics of that step still land in it.
            if len(rows) >= self._flush_every:
                self._flush()
            row = {"step": step}
            self._rows.append(row)
        for key, value in metrics.items():
            row[key] = float(value)

    @override
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self._hparams.update(params)
        _write_json(Path(self.log_dir, self.HPARAMS_FILE), self._hparams)

    @override
    def save(self) -> None:
        self._flush()

    @override
    def finalize(self, status: str) -> None:
        # A run too short to log anything still gets its folder (hparams.json appears in it when
        # hyperparameters were saved), so every run can be found where the docs say.
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        self.save()

    def _flush(self) -> None:
        if not self._rows:
            return
        path = Path(self.log_dir, self.METRICS_FILE)
        if self._columns is None:
            self._columns = self._read_header(path)
        new_keys = dict.fromkeys(key for row in self._rows for key in row if key not in self._columns)
        if not self._columns:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._columns = ["step", *(key for key in new_keys if key != "step")]
            _write_csv(path, self._columns, self._rows, mode="w")
        elif new_keys:
            with path.open(newline="", encoding="utf-8") as f:
                old_rows: list[dict[str, Any]] = list(csv.DictReader(f))
            self._columns += new_keys
            tmp = path.with_name(path.name + ".tmp")
            _write_csv(tmp, self._columns, old_rows + self._rows, mode="w")
            os.replace(tmp, path)
        else:
            _write_csv(path, self._columns, self._rows, mode="a")
        self._rows = []

    @staticmethod
    def _read_header(path: Path) -> list[str]:
        if not path.is_file():
            return []
        with path.open(newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])


class TensorBoardLogger(_VersionedLogger):
    """Writes metrics as TensorBoard scalars into ``save_dir/name/version_N``.

    Needs the optional ``tensorboard`` package (``pip install tensorboard``; in a fullshard clone
    ``pip install -e '.[tensorboard]'``).
    Hyperparameters are shown as text in TensorBoard and also written to ``hparams.json``.
    The event file is opened at the first write.

    Args:
        save_dir: Root folder for all experiments.
        name: Experiment name, the folder under ``save_dir``.
        version: Run version, as for :class:`CSVLogger`.
    """

    HPARAMS_FILE = "hparams.json"

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str = "fullshard_logs",
        version: int | str | None = None,
    ) -> None:
        if not _TENSORBOARD_AVAILABLE:
            raise ModuleNotFoundError(
                "TensorBoardLogger needs the `tensorboard` package, which is not installed. "
                "Install it with `pip install tensorboard` (in a fullshard clone: `pip install -e '.[tensorboard]'`), "
                "or log with `CSVLogger` instead."
            )
        super().__init__(save_dir, name, version)
        self._writer: Any = None
        self._hparams: dict[str, Any] = {}

    @property
    def experiment(self) -> Any:
        """The underlying ``torch.utils.tensorboard.SummaryWriter``, created on first use."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.log_dir)
        return self._writer

    @override
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        writer = self.experiment
        for key, value in metrics.items():
            writer.add_scalar(key, float(value), global_step=step)

    @override
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self._hparams.update(params)
        _write_json(Path(self.log_dir, self.HPARAMS_FILE), self._hparams)
        table = "\n".join(f"| {key} | {value} |" for key, value in self._hparams.items())
        self.experiment.add_text("hparams", "| name | value |\n|---|---|\n" + table)

    @override
    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    @override
    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def send_to_loggers(trainer: Trainer, values: dict[str, float], step: int) -> None:
    """Send ``values`` (with the current ``epoch``) to the Trainer's loggers, from global rank 0."""
    if trainer.is_global_zero and trainer.loggers:
        values = {**values, "epoch": float(trainer.current_epoch)}
        for logger in trainer.loggers:
            logger.log_metrics(values, step=step)


def finalize_loggers(trainer: Trainer, status: str) -> None:
    """Tell the Trainer's loggers that the run ended (``status``: ``"success"`` or ``"failed"``),
    from global rank 0."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.finalize(status)

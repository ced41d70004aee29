"""``CSVLogger``: metrics to ``metrics.csv``, hyperparameters to ``hparams.yaml``."""

from __future__ import annotations

import csv
import os
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from typing_extensions import override

from fullshard.rank_zero import rank_zero_only, rank_zero_warn
from fullshard.trainer.loggers.base import add_prefix, convert_params, rank_zero_experiment, scalar
from fullshard.trainer.loggers.files import HPARAMS_FILE, VersionedLogger, write_hparams_yaml


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]], mode: str) -> None:
    """Write ``rows`` under ``columns`` (with a header line when ``mode`` is ``"w"``)."""
    with path.open(mode, newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="", lineterminator="\n")
        if mode == "w":
            writer.writeheader()
        writer.writerows(rows)


class ExperimentWriter:
    """What ``CSVLogger.experiment`` is on global rank 0 (Lightning's name): the run's files and
    the logger's own methods under Lightning's writer names."""

    def __init__(self, logger: CSVLogger) -> None:
        self._logger = logger
        self.log_dir = logger.log_dir
        self.metrics_file_path = os.path.join(self.log_dir, logger.METRICS_FILE)

    @property
    def hparams(self) -> dict[str, Any]:
        """Every hyperparameter logged so far."""
        return self._logger.hparams

    def log_metrics(self, metrics_dict: Mapping[str, float], step: int | None = None) -> None:
        """Record ``metrics_dict`` at ``step`` (as :meth:`CSVLogger.log_metrics`, without its prefix)."""
        self._logger._record(metrics_dict, step)

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        """Add ``params`` to ``hparams.yaml``."""
        self._logger.log_hyperparams(params)

    def save(self) -> None:
        """Write the buffered rows."""
        self._logger.save()


class CSVLogger(VersionedLogger):
    """Writes metrics to ``log_dir/metrics.csv`` and hyperparameters to ``log_dir/hparams.yaml``.

    The CSV has one row per ``log_metrics`` call and one column per metric name and ``step``,
    sorted by name (Lightning's layout); a metric missing from a row is left empty. When a new
    metric name appears, the header grows and the file is rewritten. ``hparams.yaml`` holds every hyperparameter logged so far, written as Lightning
    writes it (keys sorted; the same file for the same hyperparameters).

    Rows are kept in memory and written by :meth:`save`, and automatically once
    ``flush_logs_every_n_steps`` rows are waiting, so ``log_metrics`` costs no disk access on the
    training path. An existing ``metrics.csv`` in the run's folder (a resumed run that reuses
    its ``version``) is appended to; a warning says so when the logger first writes into a
    folder that is not empty (Lightning deletes its ``metrics.csv`` there instead). Only global
    rank 0 writes ([Note: loggers on rank zero]).

    Args:
        save_dir: Root folder for all experiments.
        name: Experiment name, the folder under ``save_dir`` (None or ``""``: none).
        version: Run version: an integer gives ``version_<int>``, a string is the folder name
            as is, ``None`` picks the next free integer.
        prefix: Put before every metric name, joined by ``"-"`` (``prefix="run"``: ``run-loss``).
        flush_logs_every_n_steps: Write buffered rows once this many are waiting.
    """

    METRICS_FILE = "metrics.csv"
    HPARAMS_FILE = HPARAMS_FILE
    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        if not isinstance(flush_logs_every_n_steps, int) or flush_logs_every_n_steps < 1:
            raise ValueError(
                f"`flush_logs_every_n_steps` must be a positive integer, got {flush_logs_every_n_steps!r}. "
                "Pass 1 to write every row as soon as its step is over."
            )
        super().__init__(save_dir, name, version)
        self._prefix = prefix
        self._flush_every = flush_logs_every_n_steps
        self._rows: list[dict[str, Any]] = []
        self._logged = 0  # rows started so far: the step of a call without one
        self._columns: list[str] | None = None  # header on disk; None until first read or written
        self.hparams: dict[str, Any] = {}
        self._writer: ExperimentWriter | None = None
        self._dir_checked = False

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The run's :class:`ExperimentWriter` (a do-nothing stand-in on ranks other than 0)."""
        if self._writer is None:
            self._check_dir()
            self._writer = ExperimentWriter(self)
        return self._writer

    def _check_dir(self) -> None:
        """Warn, once, when the run's folder already holds files (another run's, or this run's
        before a restart): the logs are added to them."""
        if self._dir_checked:
            return
        self._dir_checked = True
        folder = Path(self.log_dir)
        if folder.is_dir() and any(folder.iterdir()):
            rank_zero_warn(
                f"Experiment logs directory {folder} exists and is not empty: this run's logs are added to the "
                f"files there ({self.METRICS_FILE} is appended to). Pass another `version=` (or none, for the "
                "next free one) to keep the runs apart."
            )

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._check_dir()
        self._record(add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR), step)

    def _record(self, metrics: Mapping[str, Any], step: int | None) -> None:
        if "step" in metrics:
            raise ValueError(
                "The metric name 'step' is reserved for the CSV's step column. Log it under another name."
            )
        step = self._logged if step is None else step
        # one row per call, as Lightning writes it: a validation row and the training epoch's row
        # of the same step stay two rows
        if len(self._rows) >= self._flush_every:
            self._flush()
        row: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            number = scalar(value)
            row[key] = number if isinstance(number, int) and not isinstance(number, bool) else float(number)
        self._rows.append(row)
        self._logged += 1

    @override
    @rank_zero_only
    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any
    ) -> None:
        self._check_dir()
        self.hparams.update(convert_params(params))
        write_hparams_yaml(Path(self.log_dir, self.HPARAMS_FILE), self.hparams)

    @override
    @rank_zero_only
    def save(self) -> None:
        self._check_dir()  # the Trainer saves when a call starts: before its checkpoints land there
        self._flush()

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        # A run too short to log anything still gets its folder, so every run can be found
        # where the docs say.
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        path = Path(self.log_dir, self.METRICS_FILE)
        if self._columns is None:
            self._columns = self._read_header(path)
        new_keys = {key for row in self._rows for key in row} - set(self._columns)
        # Lightning's header: every name sorted ("step" among them), widened (and the file
        # rewritten) when a name appears
        columns = sorted({*self._columns, *new_keys})
        if not self._columns:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._columns = columns
            _write_csv(path, self._columns, self._rows, mode="w")
        elif new_keys:
            with path.open(newline="", encoding="utf-8") as f:
                old_rows: list[dict[str, Any]] = list(csv.DictReader(f))
            self._columns = columns
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

"""``TensorBoardLogger``: metrics, hyperparameters and the model's graph as TensorBoard events."""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from typing_extensions import override

from fullshard.rank_zero import rank_zero_only, rank_zero_warn
from fullshard.trainer.loggers.base import (
    add_prefix,
    convert_params,
    flatten_params,
    primitive_params,
    rank_zero_experiment,
    require,
    scalar,
)
from fullshard.trainer.loggers.files import HPARAMS_FILE, VersionedLogger, write_hparams_yaml


class TensorBoardLogger(VersionedLogger):
    """Writes TensorBoard event files into ``save_dir/name/version_N`` (``/sub_dir`` when given).

    Needs the optional ``tensorboard`` package: ``pip install "fullshard[tensorboard]"``.
    Metrics are scalars (a dict value is a group of scalars, ``add_scalars``). Hyperparameters go
    to TensorBoard's HParams tab, with the metric ``hp_metric`` set to -1 unless
    ``default_hp_metric=False`` or :meth:`log_hyperparams` is given ``metrics``; ``hparams.yaml``
    in the run's folder holds them as Lightning writes it. With ``log_graph=True`` the module's
    graph is traced from its ``example_input_array`` when a run starts. The event file is opened
    at the first write; only global rank 0 writes ([Note: loggers on rank zero]).

    Args:
        save_dir: Root folder for all experiments.
        name: Experiment name, the folder under ``save_dir`` (None or ``""``: none).
        version: Run version: an integer gives ``version_<int>``, a string is the folder name
            as is, ``None`` picks the next free integer.
        log_graph: Trace the module's graph from ``example_input_array`` when a run starts.
        default_hp_metric: Log ``hp_metric = -1`` with the hyperparameters (TensorBoard's
            HParams tab shows a run only with a metric).
        prefix: Put before every metric name, joined by ``"-"``.
        sub_dir: A folder under the version's folder to write into (``~`` and ``$VARS`` expanded).
        **kwargs: Passed to ``torch.utils.tensorboard.SummaryWriter`` (``flush_secs=``, ``max_queue=``).
    """

    HPARAMS_FILE = HPARAMS_FILE
    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        require("tensorboard", "tensorboard", "TensorBoardLogger")
        super().__init__(save_dir, name, version)
        self._log_graph = log_graph
        self._default_hp_metric = default_hp_metric
        self._prefix = prefix
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs
        self._writer: Any = None
        self.hparams: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # the SummaryWriter holds an open event file and a thread: a pickled logger (spawn, a
        # deepcopy of the Trainer) leaves it, and opens a new one at its next write
        state = self.__dict__.copy()
        state["_writer"] = None
        return state

    @property
    def sub_dir(self) -> str | None:
        """The folder under the version's folder this logger writes into, if any."""
        return self._sub_dir

    @property
    @override
    def log_dir(self) -> str:
        path = super().log_dir
        if self._sub_dir is not None:
            path = os.path.join(path, self._sub_dir)
        return os.path.expanduser(os.path.expandvars(path))

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter``, created on first use (a do-nothing
        stand-in on ranks other than 0)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.log_dir, **self._kwargs)
        return self._writer

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        writer = self.experiment
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            value = scalar(value)
            if isinstance(value, Mapping):
                writer.add_scalars(key, {k: scalar(v) for k, v in value.items()}, step)
                continue
            try:
                writer.add_scalar(key, value, step)
            except Exception as error:
                raise ValueError(
                    f"TensorBoardLogger cannot log {key}={value!r}: log a number, a one-element tensor, "
                    "or a dict of them."
                ) from error

    @override
    @rank_zero_only
    def log_hyperparams(
        self,
        params: Mapping[str, Any] | Namespace | None = None,
        metrics: Mapping[str, Any] | float | None = None,
        step: int | None = None,
    ) -> None:
        """Record hyperparameters in the HParams tab, with ``metrics`` to show beside them (a number
        is ``hp_metric``; None: ``hp_metric = -1`` unless ``default_hp_metric=False``)."""
        params = convert_params(params)
        self.hparams.update(params)
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else None
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if not metrics:
            return
        self.log_metrics(metrics, step)
        from torch.utils.tensorboard.summary import hparams

        flat = {k: str(v) if getattr(v, "ndim", 0) > 1 else v for k, v in flatten_params(params).items()}
        writer: Any = self.experiment._get_file_writer()
        for summary in hparams(primitive_params(flat), dict(metrics)):
            writer.add_summary(summary, step)

    @override
    @rank_zero_only
    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        """Trace ``model`` with ``input_array`` (default: its ``example_input_array``) into the
        Graphs tab, when the logger was made with ``log_graph=True``."""
        if not self._log_graph:
            return
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is None:
            rank_zero_warn(
                "TensorBoardLogger(log_graph=True) logs no graph: the module's `example_input_array` is not "
                "set and no `input_array` was given."
            )
            return
        if not isinstance(input_array, torch.Tensor | tuple):
            rank_zero_warn(
                f"TensorBoardLogger(log_graph=True) logs no graph: the input is a {type(input_array).__name__}, "
                "which TensorBoard cannot trace. Make `example_input_array` a tensor, or a tuple of the "
                "positional arguments of `forward`."
            )
            return
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        input_array = apply_to_collection(input_array, torch.Tensor, lambda t: t.to(device))
        from fullshard.module import jit_compiling

        with jit_compiling(model):  # with or without a Trainer attached
            self.experiment.add_graph(model, input_array)

    @override
    @rank_zero_only
    def save(self) -> None:
        self.experiment.flush()
        hparams_file = Path(self.log_dir, self.HPARAMS_FILE)
        if hparams_file.parent.is_dir() and not hparams_file.is_file():
            write_hparams_yaml(hparams_file, self.hparams)

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        if status == "success":
            self.save()

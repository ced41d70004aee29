"""``MLFlowLogger``: metrics and hyperparameters to an MLflow tracking store or server."""

from __future__ import annotations

import logging
import os
import re
import time
from argparse import Namespace
from collections.abc import Mapping
from typing import Any, Literal

from typing_extensions import override

from fullshard.rank_zero import rank_zero_only, rank_zero_warn
from fullshard.trainer.loggers.base import (
    Logger,
    add_prefix,
    convert_params,
    flatten_params,
    rank_zero_experiment,
    require,
    scalar,
)

log = logging.getLogger("fullshard")
LOCAL_FILE_URI_PREFIX = "file:"
_PARAM_VALUE_LIMIT = 250  # MLflow stores at most this many characters of a param's value (older servers)
_BATCH = 100  # MLflow's log_batch takes at most 100 params per call
_METRIC_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")


class MLFlowLogger(Logger):
    """Logs to an MLflow run through ``mlflow.tracking.MlflowClient``.

    Needs the optional ``mlflow`` package: ``pip install "fullshard[mlflow]"``. Takes Lightning's
    arguments. The experiment (made when missing) and the run are created on first use; the run
    ends as ``FINISHED`` or ``FAILED`` when the Trainer's call ends. Metric names keep only
    letters, digits and ``_/. -`` (MLflow's rule; others are dropped with a warning), a metric
    with a string value is skipped, and hyperparameters are flattened (``{"a": {"b": 1}}`` is
    ``a/b``) and stored as strings of at most 250 characters. Only global rank 0 creates a run or
    writes ([Note: loggers on rank zero]).

    Args:
        experiment_name: The MLflow experiment the run belongs to.
        run_name: The run's name (the ``mlflow.runName`` tag).
        tracking_uri: Where MLflow stores runs: ``http://host:port`` for a tracking server,
            ``sqlite:///path.db``, ``file:/path``. Default: ``$MLFLOW_TRACKING_URI`` when set,
            else ``file:<save_dir>``.
        tags: Tags of the run.
        save_dir: The local folder used when no ``tracking_uri`` is given.
        log_model: Log ``ModelCheckpoint`` files as run artifacts. Only False is supported.
        prefix: Put before every metric name, joined by ``"-"``.
        artifact_location: Where a newly made experiment stores artifacts.
        run_id: Log into this existing run instead of making one.
        synchronous: MLflow's ``synchronous=`` for each ``log_batch`` (None: MLflow's default).
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str | None = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
    ) -> None:
        require("mlflow", "mlflow", "MLFlowLogger")
        if log_model:
            raise ValueError(
                f"MLFlowLogger(log_model={log_model!r}) is not supported by fullshard yet: its ModelCheckpoint does "
                "not hand checkpoints to loggers. Log a checkpoint yourself with "
                "`logger.experiment.log_artifact(logger.run_id, path)`."
            )
        if tracking_uri is None:
            tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or f"{LOCAL_FILE_URI_PREFIX}{save_dir}"
        self._experiment_name = experiment_name
        self._experiment_id: str | None = None
        self._tracking_uri = tracking_uri
        self._run_name = run_name
        self._run_id = run_id
        self.tags = tags
        self._log_model = log_model
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._log_batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._initialized = False
        from mlflow.tracking import MlflowClient

        self._mlflow_client = MlflowClient(tracking_uri)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``mlflow.tracking.MlflowClient``, with the experiment and run made on first use;
        a do-nothing stand-in on ranks other than 0."""
        if self._initialized:
            return self._mlflow_client
        import mlflow

        mlflow.set_tracking_uri(self._tracking_uri)
        client = self._mlflow_client
        if self._run_id is not None:
            self._experiment_id = client.get_run(self._run_id).info.experiment_id
            self._initialized = True
            return client
        if self._experiment_id is None:
            found = client.get_experiment_by_name(self._experiment_name)
            if found is not None and found.lifecycle_stage != "deleted":
                self._experiment_id = found.experiment_id
            else:
                log.info("MLflow experiment %r not found: creating it.", self._experiment_name)
                self._experiment_id = client.create_experiment(
                    name=self._experiment_name, artifact_location=self._artifact_location
                )
        from mlflow.tracking.context.registry import resolve_tags
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        tags = dict(self.tags or {})
        if self._run_name is not None:
            if MLFLOW_RUN_NAME in tags:
                rank_zero_warn(f"The tag {MLFLOW_RUN_NAME} is replaced by run_name={self._run_name!r}.")
            tags[MLFLOW_RUN_NAME] = self._run_name
            self.tags = tags
        run = client.create_run(experiment_id=self._experiment_id, tags=resolve_tags(tags))
        self._run_id = run.info.run_id
        self._initialized = True
        return client

    @property
    def run_id(self) -> str | None:
        """The run's id (makes the experiment and run when not done yet)."""
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id (makes the experiment and run when not done yet)."""
        _ = self.experiment
        return self._experiment_id

    @override
    @rank_zero_only
    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any
    ) -> None:
        from mlflow.entities import Param

        flat = flatten_params(convert_params(params))
        batch = [Param(key=k, value=str(v)[:_PARAM_VALUE_LIMIT]) for k, v in flat.items()]
        for start in range(0, len(batch), _BATCH):
            self.experiment.log_batch(
                run_id=self.run_id, params=batch[start : start + _BATCH], **self._log_batch_kwargs
            )

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        batch = []
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, str):
                log.warning("MLFlowLogger skips the metric %s=%r: its value is a string.", key, value)
                continue
            clean = _METRIC_NAME.sub("", key)
            if clean != key:
                rank_zero_warn(
                    f"MLflow allows only letters, digits and '_', '/', '.', ' ', '-' in metric names: "
                    f"logging {key!r} as {clean!r}.",
                    RuntimeWarning,
                )
            batch.append(
                Metric(key=clean, value=float(scalar(value)), timestamp=timestamp_ms, step=step or 0)
            )
        self.experiment.log_batch(run_id=self.run_id, metrics=batch, **self._log_batch_kwargs)

    @override
    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """End the run: ``"success"`` as ``FINISHED``, ``"failed"`` as ``FAILED``."""
        if not self._initialized:
            return
        state = {"success": "FINISHED", "failed": "FAILED", "finished": "FINISHED"}.get(status, status)
        if self.experiment.get_run(self.run_id):
            self.experiment.set_terminated(self.run_id, state)

    @property
    @override
    def save_dir(self) -> str | None:
        """The local folder of a ``file:`` tracking URI, else None."""
        if self._tracking_uri.startswith(LOCAL_FILE_URI_PREFIX):
            return self._tracking_uri[len(LOCAL_FILE_URI_PREFIX) :]
        return None

    @property
    @override
    def name(self) -> str | None:
        """The experiment's id."""
        return self.experiment_id

    @property
    @override
    def version(self) -> str | None:
        """The run's id."""
        return self.run_id

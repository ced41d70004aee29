"""``CometLogger``: metrics and hyperparameters to a Comet experiment (online or offline)."""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any, Literal

import torch
from typing_extensions import override

from fullshard.rank_zero import rank_zero_only, rank_zero_warn
from fullshard.trainer.loggers.base import Logger, convert_params, rank_zero_experiment, require

FRAMEWORK_NAME = "fullshard"
# Lightning's older argument names -> the current ones (Lightning accepts both, with a warning).
_RENAMED = {"experiment_name": "name", "project_name": "project", "save_dir": "offline_directory"}


class CometLogger(Logger):
    """Logs to a Comet experiment started with ``comet_ml.start``.

    Needs the optional ``comet_ml`` package: ``pip install "fullshard[comet]"``. Takes Lightning's
    arguments. With ``online=False`` the experiment is written to ``offline_directory`` (a
    keyword passed on to ``comet_ml.ExperimentConfig``) as a zip archive when it ends
    (``logger.experiment.end()``, or the process exiting), to be sent later with
    ``comet upload``. The experiment is made on global rank 0 at first use (Lightning makes it
    in the constructor; fullshard waits until the process knows its rank, so a logger built at
    the top of a script never starts one per process) and is left open when ``fit`` ends, so
    the script can go on logging to it. Metrics are logged with the Trainer's step and the
    ``epoch`` metric as Comet's epoch; hyperparameters are flattened (``a|b``). Comet's
    auto-logging is turned off (``COMET_DISABLE_AUTO_LOGGING=1``), as Lightning does, so values
    are not logged twice.

    Args:
        api_key: Comet API key (default: Comet's configuration, ``comet login``).
        workspace: Comet workspace (default: the account's default).
        project: Comet project (default: ``Uncategorized``).
        experiment_key: The experiment's key, to continue one or to choose a new one's key.
        mode: ``"get_or_create"``, ``"get"`` (continue ``experiment_key``) or ``"create"``.
        online: False writes the experiment locally (default: Comet's configuration, online).
        prefix: Comet's prefix for metric names.
        **kwargs: Passed to ``comet_ml.ExperimentConfig`` (``name=``, ``offline_directory=``,
            ``log_code=``, ...).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        workspace: str | None = None,
        project: str | None = None,
        experiment_key: str | None = None,
        mode: Literal["get_or_create", "get", "create"] | None = None,
        online: bool | None = None,
        prefix: str | None = None,
        **kwargs: Any,
    ) -> None:
        require("comet_ml", "comet", "CometLogger")
        if mode not in (None, "get_or_create", "get", "create"):
            raise ValueError(f"`mode` must be None, 'get_or_create', 'get' or 'create', got {mode!r}.")
        for old, new in _RENAMED.items():
            if old in kwargs:
                rank_zero_warn(
                    f"CometLogger({old}=...) is an old name: pass {new}= instead.", DeprecationWarning
                )
                value = kwargs.pop(old)
                if new == "project":
                    project = project if project is not None else value
                else:
                    kwargs.setdefault(new, value)
        if "offline" in kwargs:
            rank_zero_warn(
                "CometLogger(offline=...) is an old name: pass online= instead.", DeprecationWarning
            )
            offline = kwargs.pop("offline")
            if online is None:
                online = not offline
        self._api_key = api_key
        self._workspace = workspace
        self._mode = mode
        self._online = online
        self._project_name = project
        self._experiment_key = experiment_key
        self._prefix = prefix
        self._kwargs = kwargs
        self._experiment: Any = None
        # Comet's framework integrations would log torch and the Trainer's values a second time.
        os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
        import comet_ml

        # Lightning 2.6.6 also passes disabled=True when online=False, which makes comet_ml write
        # nothing at all; fullshard keeps the offline experiment its docs promise.
        self._comet_config = comet_ml.ExperimentConfig(**kwargs)

    def _create_experiment(self) -> None:
        import comet_ml

        self._experiment = comet_ml.start(
            api_key=self._api_key,
            workspace=self._workspace,
            project=self._project_name,
            experiment_key=self._experiment_key,
            mode=self._mode,
            online=self._online,
            experiment_config=self._comet_config,
        )
        if self._experiment is None:
            raise comet_ml.exceptions.ExperimentNotFound("comet_ml.start made no experiment.")
        self._experiment_key = self._experiment.get_key()
        self._project_name = self._experiment.project_name
        self._experiment.log_other("Created from", FRAMEWORK_NAME)

    def __getstate__(self) -> dict[str, Any]:
        # a spawned process continues the experiment by its key, not with the live object
        state = self.__dict__.copy()
        if self._experiment is not None:
            state["_experiment_key"] = self._experiment.get_key()
        state["_experiment"] = None
        return state

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``comet_ml`` experiment, made on first use if the constructor did not; a do-nothing
        stand-in on ranks other than 0."""
        if self._experiment is None:
            self._create_experiment()
        return self._experiment

    @override
    @rank_zero_only
    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any
    ) -> None:
        self.experiment.__internal_api__log_parameters__(
            parameters=convert_params(params), framework=FRAMEWORK_NAME, flatten_nested=True, source="manual"
        )

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        epoch = values.pop("epoch", None)
        self.experiment.__internal_api__log_metrics__(
            values, step=step, epoch=epoch, prefix=self._prefix, framework=FRAMEWORK_NAME
        )

    @override
    @rank_zero_only
    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        if self._experiment is not None:
            self._experiment.__internal_api__set_model_graph__(graph=model, framework=FRAMEWORK_NAME)

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Send (or write) what is buffered; the experiment stays open (see the class docstring)."""
        if self._experiment is not None:
            self._experiment.flush()

    @property
    @override
    def save_dir(self) -> str | None:
        """The folder an offline experiment is written to."""
        folder = self._comet_config.offline_directory
        return None if folder is None else str(folder)

    @property
    @override
    def name(self) -> str | None:
        """The Comet project."""
        return self._project_name

    @property
    @override
    def version(self) -> str | None:
        """The experiment's key, once the experiment is made."""
        return None if self._experiment is None else str(self._experiment.get_key())

"""``WandbLogger``: metrics, hyperparameters and media to Weights & Biases (online or offline)."""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any, Literal

import torch
from typing_extensions import override

from fullshard.rank_zero import rank_zero_only, rank_zero_warn
from fullshard.trainer.loggers.base import (
    Logger,
    add_prefix,
    callable_params,
    convert_params,
    json_params,
    rank_zero_experiment,
    require,
    scalar,
)

STEP_KEY = "trainer/global_step"


class WandbLogger(Logger):
    """Logs to a Weights & Biases run, created on first use with ``wandb.init``.

    Needs the optional ``wandb`` package: ``pip install "fullshard[wandb]"``. Takes Lightning's
    arguments. Each ``log_metrics`` call is one ``run.log`` with the Trainer's step under
    ``trainer/global_step`` (W&B's x-axis for every metric); hyperparameters go to
    ``run.config``. ``offline=True`` writes the run under ``save_dir/wandb/offline-run-*`` to be
    sent later with ``wandb sync``. Only global rank 0 creates a run or writes
    ([Note: loggers on rank zero]). The run is left open at the end of ``fit`` so that the
    script can go on logging to it; W&B closes it when the process exits (or call
    ``logger.experiment.finish()``).

    Args:
        name: The run's display name.
        save_dir: Folder W&B writes its files under (``save_dir/wandb``).
        version: The run's id, to resume a run (``resume="allow"``); same as ``id``.
        offline: Write the run locally instead of sending it.
        dir: Same as ``save_dir`` (used when ``save_dir`` is None).
        id: Same as ``version``.
        anonymous: Log anonymously (W&B's ``anonymous="allow"``).
        project: The W&B project (default: ``$WANDB_PROJECT``, else ``"lightning_logs"``).
        log_model: Log ``ModelCheckpoint`` files as W&B artifacts. Only False is supported.
        experiment: A run already made with ``wandb.init``, to log into.
        prefix: Put before every metric name, joined by ``"-"``.
        checkpoint_name: The artifact name checkpoints would be logged under.
        add_file_policy: ``"mutable"`` or ``"immutable"``, for logged files.
        **kwargs: Passed to ``wandb.init`` (``entity=``, ``group=``, ``tags=``, ``mode=``, ...).
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike[str] | None = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike[str] | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Literal["all"] | bool = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        add_file_policy: Literal["mutable", "immutable"] = "mutable",
        **kwargs: Any,
    ) -> None:
        require("wandb", "wandb", "WandbLogger")
        if log_model and offline:
            raise ValueError(
                f"WandbLogger(log_model={log_model!r}, offline=True): checkpoints cannot be uploaded offline. "
                "Set offline=False to log them, or log_model=False."
            )
        if log_model:
            raise ValueError(
                f"WandbLogger(log_model={log_model!r}) is not supported by fullshard yet: its ModelCheckpoint does "
                "not hand checkpoints to loggers. Log a checkpoint yourself with "
                "`wandb.Artifact(...).add_file(path)` and `logger.experiment.log_artifact(artifact)`."
            )
        if add_file_policy not in ("mutable", "immutable"):
            raise ValueError(f"`add_file_policy` must be 'mutable' or 'immutable', got {add_file_policy!r}.")
        self._offline = offline
        self._log_model = log_model
        self._prefix = prefix
        self._experiment = experiment
        self._checkpoint_name = checkpoint_name
        self.add_file_policy = add_file_policy
        folder = save_dir if save_dir is not None else dir
        self._wandb_init: dict[str, Any] = {
            "name": name,
            "project": project or os.environ.get("WANDB_PROJECT", "lightning_logs"),
            "dir": None if folder is None else os.fspath(folder),
            "id": version or id,
            "resume": "allow",
            "anonymous": "allow" if anonymous else None,
        }
        if offline:
            self._wandb_init["mode"] = "offline"
        self._wandb_init.update(kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # a spawned process gets the run's id and resumes it, not the live run object
        state = self.__dict__.copy()
        if self._experiment is not None:
            state["_wandb_init"] = {
                **self._wandb_init,
                "id": self._experiment.id,
                "name": self._experiment.name,
            }
        state["_experiment"] = None
        return state

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``wandb`` run (``wandb.Run``), started on first use; a do-nothing stand-in on
        ranks other than 0."""
        if self._experiment is None:
            import wandb

            if wandb.run is not None:
                rank_zero_warn(
                    "A W&B run is already in progress: WandbLogger logs into it. Call `wandb.finish()` before "
                    "making the logger to start a new run instead."
                )
                self._experiment = wandb.run
            else:
                self._experiment = wandb.init(**self._wandb_init)
                if self._wandb_init.get("sync_tensorboard"):
                    self._experiment.define_metric("*", step_metric="global_step")
                else:
                    self._experiment.define_metric(STEP_KEY)
                    self._experiment.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        return self._experiment

    def watch(
        self,
        model: torch.nn.Module,
        log: str | None = "gradients",
        log_freq: int = 100,
        log_graph: bool = True,
    ) -> None:
        """Have W&B log ``model``'s gradients (and/or parameters) every ``log_freq`` steps."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    @override
    @rank_zero_only
    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any
    ) -> None:
        params = json_params(callable_params(convert_params(params)))
        self.experiment.config.update(params, allow_val_change=True)

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = {k: scalar(v) for k, v in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items()}
        if step is not None and not self._wandb_init.get("sync_tensorboard"):
            values[STEP_KEY] = step
        self.experiment.log(values)

    @rank_zero_only
    def log_table(
        self,
        key: str,
        columns: list[Any] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log a ``wandb.Table`` from ``columns`` and ``data`` rows, or from a ``dataframe``."""
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    @rank_zero_only
    def log_text(
        self,
        key: str,
        columns: list[Any] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log text as a ``wandb.Table``."""
        self.log_table(key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``images`` (tensors, arrays, PIL images or paths); each keyword is a list with one
        value per image (``caption=[...]``)."""
        self._log_media("Image", key, images, step, kwargs)

    @rank_zero_only
    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log audio clips (arrays or paths); keywords as for :meth:`log_image` (``sample_rate=[...]``)."""
        self._log_media("Audio", key, audios, step, kwargs)

    @rank_zero_only
    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log videos (arrays or paths); keywords as for :meth:`log_image` (``fps=[...]``)."""
        self._log_media("Video", key, videos, step, kwargs)

    def _log_media(
        self, kind: str, key: str, items: list[Any], step: int | None, kwargs: dict[str, Any]
    ) -> None:
        if not isinstance(items, list):
            raise TypeError(f"log_{kind.lower()} takes a list of items, got {type(items).__name__}.")
        for name, values in kwargs.items():
            if len(values) != len(items):
                raise ValueError(
                    f"log_{kind.lower()}: `{name}` has {len(values)} values for {len(items)} items; give one per item."
                )
        import wandb

        media = getattr(wandb, kind)
        logged = [media(item, **{k: v[i] for k, v in kwargs.items()}) for i, item in enumerate(items)]
        self.log_metrics({key: logged}, step)

    def use_artifact(self, artifact: str, artifact_type: str | None = None) -> Any:
        """Mark ``artifact`` as used by this run and return it (``wandb.Artifact``)."""
        return self.experiment.use_artifact(artifact, type=artifact_type)

    @staticmethod
    @rank_zero_only
    def download_artifact(
        artifact: str,
        save_dir: str | os.PathLike[str] | None = None,
        artifact_type: str | None = None,
        use_artifact: bool | None = True,
    ) -> str:
        """Download ``artifact`` (through the current run when there is one and ``use_artifact``);
        returns the folder it was written to."""
        import wandb

        if wandb.run is not None and use_artifact:
            found = wandb.run.use_artifact(artifact)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        return str(found.download(root=None if save_dir is None else os.fspath(save_dir)))

    @property
    @override
    def save_dir(self) -> str | None:
        """The folder W&B writes under."""
        folder = self._wandb_init.get("dir")
        return None if folder is None else str(folder)

    @property
    @override
    def name(self) -> str | None:
        """The W&B project (the run's own name is ``logger.experiment.name``)."""
        project = self._wandb_init.get("project")
        return None if project is None else str(project)

    @property
    @override
    def version(self) -> str | None:
        """The run's id: the started run's, else the one given to the constructor."""
        if self._experiment is not None:
            return str(self._experiment.id)
        run_id = self._wandb_init.get("id")
        return None if run_id is None else str(run_id)

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        # Nothing to flush: W&B writes as it goes, and the run stays open (see the class docstring).
        pass

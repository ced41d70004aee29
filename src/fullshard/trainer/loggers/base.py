"""The logger interface, the rank-zero rule its methods follow, and the helpers that turn
hyperparameters and metrics into what a tracking backend accepts.

[Note: loggers on rank zero]
Every process of a job runs the user's code, so ``self.logger.log_hyperparams(...)`` in a
module hook runs on every rank. Only global rank 0 may write: the others would each open a run
of their own (a second ``version_N`` folder, a second W&B or MLflow run). fullshard's loggers
therefore mark each method that writes with :func:`~fullshard.rank_zero.rank_zero_only`, which
makes it do nothing on the other ranks, and their ``experiment`` property gives those ranks a
:class:`DummyExperiment` whose every method does nothing (as Lightning's loggers do). The
Trainer itself calls loggers on rank 0 only; the marks are for the user's calls.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
from abc import ABC, abstractmethod
from argparse import Namespace
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, is_dataclass
from typing import Any, TypeVar, cast

import torch

from fullshard.rank_zero import rank_zero_only

__all__ = ["DummyExperiment", "DummyLogger", "Logger", "rank_zero_experiment"]

_T = TypeVar("_T")


class Logger(ABC):
    """Interface the Trainer logs through (Lightning's ``Logger``).

    The Trainer calls it on global rank 0 only; fullshard's loggers also do nothing on the other
    ranks when the user's code calls them ([Note: loggers on rank zero]).
    """

    @property
    @abstractmethod
    def name(self) -> str | None:
        """Name of the experiment; runs of one experiment share a parent folder or project."""

    @property
    @abstractmethod
    def version(self) -> int | str | None:
        """Version (run id) of this run within the experiment."""

    @property
    def save_dir(self) -> str | None:
        """Local root folder of the logs, or None for a logger that writes nowhere on this disk."""
        return None

    @property
    def root_dir(self) -> str | None:
        """Folder holding all versions of the experiment, or None."""
        return None

    @property
    def log_dir(self) -> str | None:
        """Folder this run writes into, or None for a logger without one."""
        return None

    @property
    def group_separator(self) -> str:
        """What separates a group from a name in metric keys (``"train/loss"``)."""
        return "/"

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record scalar ``metrics`` at ``step``. May buffer; :meth:`save` makes them durable."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """Record the run's hyperparameters. Later calls add to (and override) earlier ones."""

    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        """Record the model's graph, where the backend shows one. Does nothing by default."""
        return None

    def save(self) -> None:
        """Write everything buffered so far. Does nothing by default."""
        return None

    def finalize(self, status: str) -> None:
        """Called once when the run ends; ``status`` is ``"success"`` or ``"failed"``. Saves by default."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called on global rank 0 after a ``ModelCheckpoint`` saved. Does nothing by default."""
        return None


class DummyExperiment:
    """What ``logger.experiment`` is on ranks other than 0: any method called on it does nothing."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        """Do nothing."""

    def __getattr__(self, _: str) -> Callable[..., None]:
        return self.nop

    def __getitem__(self, idx: int) -> DummyExperiment:
        return self

    def __setitem__(self, *args: Any, **kwargs: Any) -> None:
        pass


class DummyLogger(Logger):
    """The Trainer's logger under ``fast_dev_run`` when it was given one (as Lightning's): user code
    that calls ``self.logger`` still runs, and nothing is written. Any method does nothing."""

    def __init__(self) -> None:
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        """A :class:`DummyExperiment`."""
        return self._experiment

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        return None

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        return None

    def __getitem__(self, idx: int) -> DummyLogger:
        return self  # self.logger[0].experiment... in code written for several loggers

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):  # not set up yet (copy, pickle): no stand-in for private names
            raise AttributeError(name)
        return self._experiment.nop  # a real logger's method (log_image, watch, ...) does nothing


def rank_zero_experiment(fn: Callable[[Any], _T]) -> Callable[[Any], _T]:
    """Wrap a logger's ``experiment`` getter so that ranks other than 0 get a :class:`DummyExperiment`
    (typed as the real experiment: it answers every method the same way, by doing nothing)."""

    @functools.wraps(fn)
    def experiment(self: Any) -> _T:
        if getattr(rank_zero_only, "rank", 0) > 0:
            return cast(_T, DummyExperiment())
        return fn(self)

    return experiment


def importable(package: str) -> bool:
    """Whether the module ``package`` can be imported (installed, and not blocked with
    ``sys.modules[package] = None``)."""
    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # in sys.modules as None: imports of it fail
        return False


def require(package: str, extra: str, logger: str) -> None:
    """Raise ``ModuleNotFoundError`` naming the fullshard extra to install when the module
    ``package`` cannot be imported (not installed, or blocked with ``sys.modules[package] = None``)."""
    if not importable(package):
        raise ModuleNotFoundError(
            f"{logger} needs the `{package}` package, which is not installed. Install it with "
            f'`pip install "fullshard[{extra}]"` (in a fullshard clone: `pip install -e ".[{extra}]"`), '
            "or log with `CSVLogger` instead."
        )


def convert_params(params: Mapping[str, Any] | Namespace | None) -> dict[str, Any]:
    """Hyperparameters as a plain dict (a Namespace gives its attributes, None an empty dict)."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        return dict(vars(params))
    if not isinstance(params, Mapping):
        raise TypeError(
            f"Hyperparameters must be a dict (or a Namespace), got {type(params).__name__}. "
            "Pass e.g. `{'lr': 0.1}`."
        )
    return dict(params)


def flatten_params(params: Mapping[Any, Any], separator: str = "/", parent: str = "") -> dict[str, Any]:
    """Nested dicts (and dataclasses, Namespaces, lists of dicts) as one level: ``{"a": {"b": 1}}``
    gives ``{"a/b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent}{separator}{key}" if parent else str(key)
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, MutableMapping):
            flat.update(flatten_params(value, separator, name))
        elif isinstance(value, list) and value and all(isinstance(v, MutableMapping) for v in value):
            for i, item in enumerate(value):
                flat.update(flatten_params(item, separator, f"{name}{separator}{i}"))
        else:
            flat[name] = value
    return flat


def primitive_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Values TensorBoard's hparams plugin takes (bool, int, float, str, tensor) kept, numpy scalars
    as Python numbers, anything else as its ``str``."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if hasattr(value, "item") and type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0:
            value = value.item()
        out[key] = value if type(value) in (bool, int, float, str, torch.Tensor) else str(value)
    return out


def callable_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A class becomes its name; another callable its result when calling it with no argument
    gives something that is not callable, else its name."""

    def resolve(value: Any) -> Any:
        if inspect.isclass(value):
            return value.__name__
        if callable(value):
            try:
                result = value()
            except Exception:
                return getattr(value, "__name__", None)
            return value.__name__ if callable(result) else result
        return value

    return {key: resolve(value) for key, value in params.items()}


def json_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Values JSON cannot encode as their ``str``."""

    def encodable(value: Any) -> bool:
        try:
            json.dumps(value)
        except (TypeError, ValueError, OverflowError):
            return False
        return True

    return {key: value if encodable(value) else str(value) for key, value in params.items()}


def add_prefix(metrics: Mapping[str, Any], prefix: str | None, separator: str) -> dict[str, Any]:
    """``metrics`` with each name preceded by ``prefix`` and ``separator`` (unchanged without a prefix)."""
    if not prefix:
        return dict(metrics)
    return {f"{prefix}{separator}{key}": value for key, value in metrics.items()}


def scalar(value: Any) -> Any:
    """A one-element tensor as a Python number; anything else unchanged."""
    return value.item() if isinstance(value, torch.Tensor) else value

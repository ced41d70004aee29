"""What the loggers that write into ``save_dir/name/version_N`` share: the lazily chosen version
and the ``hparams.yaml`` file Lightning's CSV and TensorBoard loggers write."""

from __future__ import annotations

import enum
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from typing_extensions import override

from fullshard.trainer.loggers.base import Logger

_VERSION_DIR = re.compile(r"version_(\d+)")
HPARAMS_FILE = "hparams.yaml"


class VersionedLogger(Logger):
    """Resolves ``save_dir/name/version`` lazily: ``version=None`` becomes the next integer after
    the largest ``version_N`` folder there, the first time :attr:`version` or :attr:`log_dir` is read."""

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None, version: int | str | None) -> None:
        if isinstance(version, int) and version < 0:
            raise ValueError(f"`version` must be a non-negative integer, a string or None, got {version!r}.")
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version

    @property
    @override
    def save_dir(self) -> str:
        """Root folder given to the constructor."""
        return self._save_dir

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

    def use_version(self, version: int | str | None) -> None:
        """Write under ``version`` from now on: the Trainer gives every process rank 0's choice,
        so that all of them name one run folder (another rank choosing by itself would find rank
        0's new ``version_N`` and pick ``version_N+1``)."""
        self._version = version

    # root_dir and log_dir read `save_dir`, `name` and `version` through the properties, so a
    # subclass that overrides one of them moves the folders with it (as in Lightning).
    @property
    @override
    def root_dir(self) -> str:
        """``save_dir/name``: the folder holding every version of the experiment."""
        return os.path.join(self.save_dir, self.name or "")

    @property
    @override
    def log_dir(self) -> str:
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return os.path.join(self.root_dir, folder)

    def _next_version(self) -> int:
        parent = Path(self.root_dir)
        if not parent.is_dir():
            return 0
        matches = (_VERSION_DIR.fullmatch(p.name) for p in parent.iterdir() if p.is_dir())
        taken = [int(m.group(1)) for m in matches if m is not None]
        return max(taken) + 1 if taken else 0


def write_hparams_yaml(path: str | os.PathLike[str], hparams: Mapping[str, Any]) -> None:
    """Write ``hparams`` to ``path`` as YAML, the way Lightning writes ``hparams.yaml``: keys sorted,
    an Enum as its name, and a value YAML cannot represent left out with a warning."""
    import yaml

    kept: dict[str, Any] = {}
    for key, value in hparams.items():
        if isinstance(value, enum.Enum):
            value = value.name
        try:
            yaml.dump(value)
        except (TypeError, ValueError, yaml.YAMLError):
            warnings.warn(
                f"hparams.yaml leaves out '{key}': its value ({type(value).__name__}) cannot be written as YAML.",
                stacklevel=3,
            )
            continue
        kept[key] = value
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        yaml.dump(kept, f)
    os.replace(tmp, target)

"""Command lines: the ``fullshard`` tool and a LightningCLI for the user's training script.

- :func:`main` is the ``fullshard`` console command (``fullshard checkpoint inspect|consolidate|export``,
  :mod:`fullshard.cli.checkpoint`); it needs nothing beyond fullshard itself.
- :class:`LightningCLI` (with :class:`LightningArgumentParser`, :class:`SaveConfigCallback`)
  builds a script's command line from its classes' signatures, as Lightning's does
  (``python train.py fit --config run.yaml``, docs/cli.md). It needs ``jsonargparse``:
  ``pip install 'fullshard[cli]'``. Importing it without that raises ImportError saying so.
- :func:`instantiate_class` and :func:`strategy_from_config` build objects (a strategy with its
  FSDP options and policies, a callback, ...) from ``{"class_path": ..., "init_args": ...}``
  dicts or registry names, for config-driven code without jsonargparse (:mod:`fullshard.cli.config`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fullshard.cli.checkpoint import build_parser, main
from fullshard.cli.config import instantiate_class, lightning_class_path, strategy_from_config
from fullshard.lightning_aliases import lightning_names

if TYPE_CHECKING:
    from fullshard.cli.lightning_cli import (
        ArgsType,
        LightningArgumentParser,
        LightningCLI,
        ReduceLROnPlateau,
    )
    from fullshard.cli.save_config import SaveConfigCallback

_NEEDS_JSONARGPARSE = (
    "ArgsType",
    "LightningArgumentParser",
    "LightningCLI",
    "ReduceLROnPlateau",
    "SaveConfigCallback",
)

__all__ = [
    "ArgsType",
    "LightningArgumentParser",
    "LightningCLI",
    "ReduceLROnPlateau",
    "SaveConfigCallback",
    "build_parser",
    "instantiate_class",
    "lightning_class_path",
    "main",
    "strategy_from_config",
]


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the `fullshard` console command works without jsonargparse.
    if name in _NEEDS_JSONARGPARSE:
        from fullshard.cli import lightning_cli

        return getattr(lightning_cli, name)
    return lightning_names(__name__)(name)  # [Note: Lightning's module paths]

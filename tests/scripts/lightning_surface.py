"""Lightning's public surface, as the names a script can use: run with a Python that has
lightning==2.6.6, it prints them as a JSON list (tests/fixtures/lightning_2.6.6_surface.json holds
the recorded list; tests/test_lightning_table.py checks that docs/lightning.md accounts for each).

/tmp/lvenv/bin/python tests/scripts/lightning_surface.py > tests/fixtures/lightning_2.6.6_surface.json

The names, in the forms docs/lightning.md uses:

    L.NAME                   lightning.pytorch.__all__
    callbacks.NAME           lightning.pytorch.callbacks.__all__ (also loggers., profilers.)
    utilities.NAME           lightning.pytorch.utilities.__all__
    Tuner.NAME               the public methods of lightning.pytorch.tuner.Tuner
    CLASS(ARG=)              a named constructor argument of Trainer, LightningModule,
                             LightningDataModule, Callback and the strategies fullshard has
    CLASS.NAME               a public method, property or attribute of those classes; the
                             LightningModule's only where Lightning adds or overrides it (what
                             it inherits from torch.nn.Module unchanged, fullshard's inherits too)
    Strategy.NAME            a member of Lightning's base Strategy, which all four strategies have
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import torch
from lightning.pytorch import (
    Callback,
    LightningDataModule,
    LightningModule,
    Trainer,
    callbacks,
    loggers,
    profilers,
)
from lightning.pytorch import __all__ as top_level
from lightning.pytorch import utilities as lightning_utilities
from lightning.pytorch.strategies import (
    DDPStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
)
from lightning.pytorch.tuner import Tuner

CLASSES: list[type] = [Trainer, LightningModule, LightningDataModule, Callback]
STRATEGIES: list[type] = [SingleDeviceStrategy, DDPStrategy, FSDPStrategy, ModelParallelStrategy]


def _public(cls: type) -> list[str]:
    return [name for name in dir(cls) if not name.startswith("_")]


def _arguments(cls: type) -> list[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
    return [
        p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _inherited_from_torch(cls: type, name: str) -> bool:
    """``name`` is torch.nn.Module's own member, which ``cls`` does not override."""
    mine = inspect.getattr_static(cls, name, None)
    return mine is not None and mine is inspect.getattr_static(torch.nn.Module, name, None)


def surface() -> list[str]:
    names = [f"L.{n}" for n in top_level]
    for prefix, module in (("callbacks", callbacks), ("loggers", loggers), ("profilers", profilers)):
        names += [f"{prefix}.{n}" for n in module.__all__]
    names += [f"utilities.{n}" for n in lightning_utilities.__all__]
    names += [f"Tuner.{n}" for n in _public(Tuner)]
    for cls in CLASSES:
        names += [f"{cls.__name__}({a}=)" for a in _arguments(cls)]
        names += [
            f"{cls.__name__}.{n}"
            for n in _public(cls)
            if not (cls is LightningModule and _inherited_from_torch(cls, n))
        ]
    base = set(_public(Strategy))
    names += sorted({f"Strategy.{n}" for cls in STRATEGIES for n in _public(cls) if n in base})
    for cls in STRATEGIES:
        names += [f"{cls.__name__}({a}=)" for a in _arguments(cls)]
        names += [f"{cls.__name__}.{n}" for n in _public(cls) if n not in base]
    return sorted(set(names))


def main() -> Any:
    print(json.dumps(surface(), indent=0))


if __name__ == "__main__":
    main()

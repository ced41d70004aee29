"""``get_torchvision_model`` and ``is_overridden``, as Lightning's
``lightning.pytorch.utilities.model_helpers`` has them."""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn


def get_torchvision_model(model_name: str, **kwargs: Any) -> nn.Module:
    """``torchvision.models.get_model(model_name, **kwargs)``; torchvision is imported here, not
    by fullshard (it is no dependency)."""
    try:
        models = importlib.import_module("torchvision.models")
    except ImportError as error:
        raise ModuleNotFoundError(
            f"get_torchvision_model({model_name!r}) needs torchvision, which fullshard does not install: "
            "pip install torchvision (the build that matches your torch)"
        ) from error
    model: nn.Module = models.get_model(model_name, **kwargs)
    return model


def is_overridden(method_name: str, instance: object | None = None, parent: type | None = None) -> bool:
    """Whether ``instance``'s class defines ``method_name`` itself rather than inheriting it
    unchanged from ``parent`` (by default fullshard's LightningModule, LightningDataModule or
    Callback, whichever the instance is)."""
    if instance is None:
        return False
    if parent is None:
        from fullshard import Callback, LightningDataModule, LightningModule

        parent = next(
            (p for p in (LightningModule, LightningDataModule, Callback) if isinstance(instance, p)), None
        )
        if parent is None:
            raise ValueError(
                f"is_overridden({method_name!r}): {type(instance).__name__} is no LightningModule, "
                "LightningDataModule or Callback; pass parent= (the class to compare with)"
            )
    mine = getattr(type(instance), method_name, None)
    if mine is None:
        return False
    original = getattr(parent, method_name, None)
    if original is None:
        raise ValueError(f"is_overridden({method_name!r}): {parent.__name__} has no method {method_name!r}")
    return getattr(mine, "__code__", mine) is not getattr(original, "__code__", original)

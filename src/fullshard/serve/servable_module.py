"""``ServableModule``: the interface a model implements to be served (Lightning's
``lightning.pytorch.serve``): a request payload, how to turn it into tensors and back, and the
step that answers it. :class:`~fullshard.serve.servable_module_validator.ServableModuleValidator`
checks it when training starts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch


class ServableModule(ABC, torch.nn.Module):
    """Mix into a LightningModule: ``class Model(LitModel, ServableModule)``."""

    @abstractmethod
    def configure_payload(self) -> dict[str, Any]:
        """An example request: a dict with the ``serve_step`` inputs under ``"body"``."""

    @abstractmethod
    def configure_serialization(self) -> tuple[dict[str, Callable[..., Any]], dict[str, Callable[..., Any]]]:
        """The deserializers of the inputs (payload value -> tensor) and the serializers of the
        outputs (tensor -> JSON value), each keyed by name."""

    @abstractmethod
    def serve_step(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The predictions for the deserialized inputs, as a dict."""

    def configure_response(self) -> dict[str, Any]:
        """The response expected for :meth:`configure_payload` (optional: override to check it)."""
        return {}

"""``ServableModuleValidator``: checks at the start of training that the model answers its own
example request (Lightning's ``lightning.pytorch.serve``).

Lightning's starts a FastAPI server in a child process and posts the payload to it over HTTP;
fullshard's answers the request in the training process itself, the same way that server does
(deserialize the body, ``serve_step`` in eval mode without gradients, serialize, and a JSON round
trip), so it needs neither fastapi, uvicorn nor requests. What is checked is the same: the
methods exist, the payload has a ``"body"``, the output is a dict, the response is JSON and
equals ``configure_response()`` when the module defines it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.serve.servable_module import ServableModule
from fullshard.trainer.callbacks.base import Callback
from fullshard.utilities.model_helpers import is_overridden

_log = logging.getLogger(__name__)


class ServeResponse:
    """The answer to the example request, shaped like the ``requests.Response`` Lightning keeps:
    ``status_code`` (200, or 500 when answering failed) and ``json()``."""

    def __init__(self, status_code: int, body: Any) -> None:
        self.status_code = status_code
        self._body = body

    def json(self) -> Any:
        return json.loads(json.dumps(self._body))


class ServableModuleValidator(Callback):
    """Answer the module's :meth:`~ServableModule.configure_payload` at ``on_train_start`` (global
    rank 0), and fail the run when it cannot be served (``exit_on_failure=True``).

    ``host``, ``port`` and ``timeout`` are accepted for Lightning's scripts and unused: no server
    is started (module docstring)."""

    def __init__(
        self,
        optimization: str | None = None,
        server: str = "fastapi",
        host: str = "127.0.0.1",
        port: int = 8080,
        timeout: int = 20,
        exit_on_failure: bool = True,
    ) -> None:
        super().__init__()
        if optimization is not None:
            raise MisconfigurationError(
                f"ServableModuleValidator(optimization={optimization!r}): the module is checked as it is; "
                "leave optimization out (Lightning supports none either)."
            )
        if server != "fastapi":
            raise MisconfigurationError(
                f"ServableModuleValidator(server={server!r}): only 'fastapi' (Lightning's one server) is accepted."
            )
        self.optimization, self.server = optimization, server
        self.host, self.port, self.timeout = host, port, timeout
        self.exit_on_failure = exit_on_failure
        self.resp: ServeResponse | None = None

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero:
            return
        if trainer.strategy.shards_parameters:
            raise MisconfigurationError(
                f"ServableModuleValidator under {type(trainer.strategy).__name__}: the parameters are sharded "
                "across processes, so one process cannot answer a request (Lightning refuses FSDP too). Check "
                "serving with strategy='ddp' or one device."
            )
        if not isinstance(pl_module, ServableModule):
            raise TypeError(
                f"ServableModuleValidator: {type(pl_module).__name__} is not a ServableModule; mix it in."
            )
        for method in ("configure_payload", "configure_serialization", "serve_step"):
            if not is_overridden(method, pl_module, ServableModule):
                raise NotImplementedError(
                    f"ServableModuleValidator: {type(pl_module).__name__}.{method} is not defined."
                )
        payload = pl_module.configure_payload()
        if "body" not in payload:
            raise MisconfigurationError(
                f'ServableModuleValidator: the payload {payload} has no "body" entry.'
            )
        self.resp = self._answer(pl_module, payload)
        if self.resp.status_code == 200 and is_overridden("configure_response", pl_module, ServableModule):
            expected = pl_module.configure_response()
            if self.resp.json() != expected:
                raise MisconfigurationError(
                    f"ServableModuleValidator: the expected response {expected} is not the one served, {self.resp.json()}."
                )
        if self.exit_on_failure and not self.successful:
            raise MisconfigurationError(f"The model isn't servable: {self.resp.json()}")
        if self.successful:
            _log.info("Your model is servable; the response was %s.", self.resp.json())

    @staticmethod
    def _answer(module: ServableModule, payload: dict[str, Any]) -> ServeResponse:
        deserializers, serializers = module.configure_serialization()
        body = dict(payload["body"])
        training = module.training
        module.eval()
        try:
            for key, deserialize in deserializers.items():
                body[key] = deserialize(body[key])
            with torch.no_grad():
                output = module.serve_step(**body)
            if not isinstance(output, dict):
                raise TypeError(f"serve_step must return a dict, got {type(output).__name__}")
            for key, serialize in serializers.items():
                output[key] = serialize(output[key])
            return ServeResponse(200, json.loads(json.dumps(output)))
        except Exception as error:  # the server's 500: the response says what went wrong
            return ServeResponse(500, {"error": f"{type(error).__name__}: {error}"})
        finally:
            module.train(training)

    @property
    def successful(self) -> bool | None:
        """Whether the example request was answered (None before training starts)."""
        return self.resp.status_code == 200 if self.resp else None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"successful": self.successful, "optimization": self.optimization, "server": self.server}

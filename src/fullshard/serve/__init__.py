"""Checking that a model can be served (Lightning's ``lightning.pytorch.serve``), without a server:
see :mod:`fullshard.serve.servable_module_validator`."""

from fullshard.serve.servable_module import ServableModule
from fullshard.serve.servable_module_validator import ServableModuleValidator

__all__ = ["ServableModule", "ServableModuleValidator"]

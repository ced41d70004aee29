"""Strategies: how and where a model is trained, and the registry of their names."""

from typing import TYPE_CHECKING

from fullshard.lightning_aliases import lightning_names
from fullshard.strategies.ddp import DDPStrategy
from fullshard.strategies.fsdp import FSDPStrategy
from fullshard.strategies.fsdp2 import FSDP2Strategy
from fullshard.strategies.model_parallel import ModelParallelStrategy
from fullshard.strategies.parallel import ParallelStrategy
from fullshard.strategies.registry import StrategyRegistry
from fullshard.strategies.sharded import ShardedStrategy
from fullshard.strategies.single_device import SingleDeviceStrategy
from fullshard.strategies.strategy import Strategy

STRATEGY_REGISTRY = StrategyRegistry()
"""The registry ``Trainer(strategy="name")`` looks names up in."""

for _strategy_class in (
    SingleDeviceStrategy,
    DDPStrategy,
    FSDPStrategy,
    FSDP2Strategy,
    ModelParallelStrategy,
):
    _strategy_class.register_strategies(STRATEGY_REGISTRY)
STRATEGY_REGISTRY.load_entry_points()

__all__ = [
    "STRATEGY_REGISTRY",
    "DDPStrategy",
    "FSDP2Strategy",
    "FSDPStrategy",
    "ModelParallelStrategy",
    "ParallelStrategy",
    "ShardedStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "StrategyRegistry",
]

if not TYPE_CHECKING:  # Lightning's names that live elsewhere: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)

"""``Trainer(plugins=[...])``: Lightning's plugin objects for which fullshard has a setting,
turned into that setting once, before the strategy is configured; any other is refused with
what to pass instead.

=====================================================  ==========================================
plugin                                                 fullshard's setting
=====================================================  ==========================================
``MixedPrecision``, ``HalfPrecision``, ``Precision``,  ``Trainer(precision=)`` (its string)
``FSDPPrecision`` (fullshard's own)
``SLURMEnvironment``, ``TorchElasticEnvironment``,     the cluster environment, instead of the
``LightningEnvironment``, a ``ClusterEnvironment``     one fullshard detects
``AsyncCheckpointIO``                                  the strategy's ``async_save=True``
``TorchCheckpointIO``                                  nothing (it is the default)
``TorchSyncBatchNorm``                                 ``Trainer(sync_batchnorm=True)``
=====================================================  ==========================================

As in Lightning, two plugins of one kind, or a precision plugin with a ``precision=`` other than
the default, is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError
from fullshard.launch.environments import ClusterEnvironment
from fullshard.plugins.settings import (
    AsyncCheckpointIO,
    HalfPrecision,
    LayerSync,
    MixedPrecision,
    TorchCheckpointIO,
    TorchSyncBatchNorm,
)
from fullshard.precision import Precision

if TYPE_CHECKING:
    from fullshard.strategies.strategy import Strategy

_DEFAULT_PRECISION = "32-true"
_ACCEPTED = (
    "MixedPrecision, HalfPrecision, Precision, FSDPPrecision (fullshard.plugins), a cluster environment "
    "(SLURMEnvironment, TorchElasticEnvironment, LightningEnvironment), AsyncCheckpointIO, "
    "TorchCheckpointIO, TorchSyncBatchNorm"
)


@dataclass(frozen=True)
class PluginSettings:
    """What the plugins set: the precision string, a cluster environment, asynchronous saves,
    synchronised batch norm (None/False: the Trainer's own arguments stand)."""

    precision: Any
    environment: ClusterEnvironment | None = None
    async_save: bool = False
    sync_batchnorm: bool = False


def _kind(plugin: Any) -> str:
    if isinstance(plugin, MixedPrecision | HalfPrecision | Precision):
        return "precision"
    if isinstance(plugin, ClusterEnvironment):
        return "cluster environment"
    if isinstance(plugin, AsyncCheckpointIO | TorchCheckpointIO):
        return "checkpoint io"
    if isinstance(plugin, LayerSync):
        return "layer sync"
    what = (
        repr(plugin) if isinstance(plugin, str) else f"{type(plugin).__module__}.{type(plugin).__qualname__}"
    )
    raise MisconfigurationError(
        f"Trainer(plugins=[{what}]): fullshard takes only the plugins it has a setting for: {_ACCEPTED}. "
        "For another, pass the setting itself (Trainer(precision=), strategy=, sync_batchnorm=) or leave "
        "it out; docs/lightning.md lists why the rest are not supported."
    )


def resolve_plugins(plugins: Any, precision: Any) -> PluginSettings:
    """The settings ``Trainer(plugins=plugins, precision=precision)`` means; raises
    ``MisconfigurationError`` for a plugin fullshard has not, or for two of one kind."""
    if plugins is None:
        return PluginSettings(precision)
    given = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    by_kind: dict[str, Any] = {}
    for plugin in given:
        kind = _kind(plugin)
        if kind in by_kind:
            raise MisconfigurationError(
                f"Trainer(plugins=[...]) got two {kind} plugins, {type(by_kind[kind]).__name__} and "
                f"{type(plugin).__name__}: give one."
            )
        by_kind[kind] = plugin
    if "precision" in by_kind:
        plugin = by_kind["precision"]
        if precision != _DEFAULT_PRECISION:
            raise MisconfigurationError(
                f"Trainer(precision={precision!r}, plugins=[{type(plugin).__name__}(...)]): both set the "
                "precision; give one of them."
            )
        precision = plugin.precision
    checkpoint_io = by_kind.get("checkpoint io")
    return PluginSettings(
        precision=precision,
        environment=by_kind.get("cluster environment"),
        async_save=isinstance(checkpoint_io, AsyncCheckpointIO),
        sync_batchnorm=isinstance(by_kind.get("layer sync"), TorchSyncBatchNorm),
    )


def apply_async_save(strategy: Strategy) -> None:
    """Turn on ``strategy``'s asynchronous saves for ``AsyncCheckpointIO``, under the rule its own
    ``async_save=True`` keeps."""
    name = type(strategy).__name__
    if not strategy.can_save_async:
        raise MisconfigurationError(
            f"Trainer(plugins=[AsyncCheckpointIO()]) with {name}: fullshard saves in the background under "
            "FSDP2Strategy(state_dict_type='sharded') and ModelParallelStrategy(save_distributed_checkpoint=True) "
            "only; use one of those, or leave AsyncCheckpointIO out."
        )
    if strategy.state_dict_type != "sharded":  # ModelParallelStrategy: save_distributed_checkpoint=True
        raise MisconfigurationError(
            f"Trainer(plugins=[AsyncCheckpointIO()]) with {name} writing full checkpoints: background saves "
            "write sharded ones; pass state_dict_type='sharded' (FSDP2Strategy) or save_distributed_checkpoint=True "
            "(ModelParallelStrategy), or leave AsyncCheckpointIO out."
        )
    strategy.async_save = True

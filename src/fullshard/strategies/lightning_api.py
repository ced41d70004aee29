"""Lightning's names on a strategy for what fullshard's strategies already do.

A Lightning script (and Lightning's own strategy tests) reads ``trainer.strategy.precision_plugin``,
``.lightning_module``, calls ``.lightning_module_state_dict()``, ``.optimizer_state(optimizer)``,
``.reduce(...)``; these are those names, each a thin view of the fullshard member that does the
work (docs/lightning.md, "Lightning's public surface"). Kept apart from
:class:`~fullshard.strategies.Strategy`, the contract the Trainer drives, which they do not extend.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from fullshard.checkpoint.checkpointer import Checkpointer
    from fullshard.precision import Precision
    from fullshard.strategies.strategy import ReduceOp

# Lightning's strategy constructor arguments that hand it Lightning's own plugin objects; fullshard
# has none of those objects, and says at once what to pass instead.
_LIGHTNING_PLUGINS = {
    "precision_plugin": "pass the precision string to the Trainer (Trainer(precision='bf16-mixed'))"
    "; for FSDP's own dtypes pass mixed_precision= (a torch MixedPrecision / MixedPrecisionPolicy)",
    "checkpoint_io": "checkpoints are written by fullshard's checkpoint manager; state_dict_type= picks "
    "'full' or 'sharded'",
    "cluster_environment": "the cluster is detected (torchrun, SLURM; docs/launching.md)",
    "accelerator": "pass accelerator= to the Trainer",
    "parallel_devices": "pass devices= to the Trainer",
}

_REDUCE_OPS: dict[str | None, ReduceOp] = {
    "mean": "mean",
    "avg": "mean",
    None: "mean",
    "sum": "sum",
    "max": "max",
    "min": "min",
}


def refuse_lightning_plugins(strategy: str, kwargs: dict[str, Any]) -> None:
    """Raise for a Lightning plugin argument in ``kwargs`` (the extra keyword arguments given to
    ``strategy``'s constructor); None, Lightning's default, is dropped from ``kwargs``."""
    for name, instead in _LIGHTNING_PLUGINS.items():
        if name not in kwargs:
            continue
        value = kwargs.pop(name)
        if value is not None:
            raise MisconfigurationError(
                f"{strategy}({name}={value!r}) is a Lightning plugin argument, which fullshard does not take: "
                f"{instead}."
            )


class LightningStrategyAPI:
    """Lightning's strategy members, on every fullshard strategy (a mixin of
    :class:`~fullshard.strategies.Strategy`, whose members these read)."""

    precision: Precision
    module: nn.Module | None
    model: nn.Module | None
    state_dict_type: str
    async_save: bool

    if TYPE_CHECKING:  # what Strategy provides

        def own_checkpointer(self) -> Checkpointer: ...

        def _require_model(self) -> nn.Module: ...
        def _state_dict_options(self, *, full: bool, to_save: bool = False) -> StateDictOptions: ...
        def get_state(
            self, optimizers: Sequence[Optimizer], *, full: bool, to_load: bool = False, to_save: bool = False
        ) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...
        def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor: ...
        def evaluation_step(self, method: str, batch: Any, batch_idx: int, *extra: Any) -> Any: ...
        def barrier(self, name: str | None = None) -> None: ...
        @property
        def is_global_zero(self) -> bool: ...

    @property
    def precision_plugin(self) -> Precision:
        """The precision in force (fullshard's :class:`~fullshard.precision.Precision`, which
        plays the part of Lightning's precision plugin: ``.precision``, ``.scaler``,
        ``.convert_module``, ``.forward_context``; under FSDP ``.mixed_precision_config``)."""
        return self.precision

    @property
    def lightning_module(self) -> nn.Module | None:
        """The user's module, unwrapped (None before the Trainer set it up)."""
        return self.module

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The module's state dict, with the module's own key names (collective under FSDP).

        With ``state_dict_type="full"`` whole tensors (gathered under FSDP, on every rank), with
        ``"sharded"`` each rank's shards, as the checkpoint holds them.
        """
        return self.get_state((), full=self.state_dict_type != "sharded")[0]

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """``optimizer``'s state as the checkpoint holds it (collective under FSDP): keyed by the
        module's parameter names (torch's distributed state-dict form), whole tensors with
        ``state_dict_type="full"``, each rank's shards with ``"sharded"``."""
        from fullshard.strategies.optimizer_state import optimizer_states

        options = self._state_dict_options(full=self.state_dict_type != "sharded")
        return optimizer_states(self._require_model(), [optimizer], options, to_load=False)[0]

    def reduce(
        self, tensor: torch.Tensor | Any, group: Any = None, reduce_op: str | None = "mean"
    ) -> torch.Tensor | Any:
        """Reduce ``tensor`` over all processes (``reduce_op``: ``"mean"``/``"avg"``, ``"sum"``,
        ``"max"``, ``"min"``; None is ``"mean"``); anything but a tensor is returned as it is."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if group is not None:
            raise MisconfigurationError(
                f"reduce(group={group!r}): fullshard reduces over the whole job; pass no group."
            )
        op = _REDUCE_OPS.get(reduce_op)
        if op is not None:
            return self.all_reduce(tensor, op)
        raise MisconfigurationError(
            f"reduce(reduce_op={reduce_op!r}) is not supported: use 'mean' (or 'avg'), 'sum', 'max' or 'min'."
        )

    def test_step(self, batch: Any, batch_idx: int, *extra: Any) -> Any:
        """Run the user's ``test_step`` through the wrapper, in the precision's context."""
        return self.evaluation_step("test_step", batch, batch_idx, *extra)

    def predict_step(self, batch: Any, batch_idx: int, *extra: Any) -> Any:
        """Run the user's ``predict_step`` through the wrapper, in the precision's context."""
        return self.evaluation_step("predict_step", batch, batch_idx, *extra)

    def remove_checkpoint(self, filepath: str | Path) -> None:
        """Delete a checkpoint (a file, or a sharded checkpoint's directory) from global rank 0;
        every process calls it."""
        path = Path(filepath)
        if self.is_global_zero:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        self.barrier("remove_checkpoint")

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        filepath: str | Path,
        storage_options: Any = None,
        *,
        optimizers: Sequence[Optimizer] = (),
    ) -> None:
        """Write ``checkpoint`` to ``filepath`` (collective), as Lightning's ``Strategy.save_checkpoint``.

        ``storage_options`` must be None: they are for a checkpoint plugin, which fullshard has not
        (Lightning's default one refuses them too).

        The Trainer saves through its :class:`~fullshard.checkpoint.manager.CheckpointManager`,
        which builds the whole dict; this is for a dict built by hand, written by the strategy's
        :class:`~fullshard.checkpoint.checkpointer.Checkpointer` (the Trainer's, which owns the
        save being written in the background; without a Trainer, the strategy's own: a strategy
        set up by hand saves and loads too). Its ``"state_dict"`` and
        ``"optimizer_states"`` are written as they are; where it has none, the model's and
        ``optimizers``' states are taken (:meth:`get_state`). The format follows
        :attr:`state_dict_type`: ``"full"`` writes one file from rank 0, ``"sharded"`` one
        directory with a file per rank; both commit atomically. With :attr:`async_save` it returns
        at once and the files are written in the background (docs/checkpoints.md, "Asynchronous
        checkpoints").
        """
        if storage_options is not None:
            raise TypeError(
                f"save_checkpoint(storage_options={storage_options!r}): fullshard writes checkpoints itself and "
                "takes no storage options; leave them out."
            )
        sharded = self.state_dict_type == "sharded"
        self.own_checkpointer().write(
            checkpoint, filepath, optimizers, sharded=sharded, background=self.async_save
        )

    def load_checkpoint(
        self,
        checkpoint_path: str | Path,
        optimizers: Sequence[Optimizer] = (),
        *,
        weights_only: bool = False,
        check: Callable[[dict[str, Any]], None] | None = None,
        verify: bool = True,
        trust_checkpoint: bool = False,
        strict: bool = True,
    ) -> dict[str, Any]:
        """Load the model (and optimizer) states of a checkpoint of either format into place and
        return the rest of it (collective). Nothing changes when the checkpoint is incomplete, damaged,
        of another model or optimizer, holds more than plain data, or fails ``check``.

        ``weights_only``: load the model state only (the optimizers keep theirs). ``verify``: check
        the CRC-32 of every file read first, spread over the ranks (docs/checkpoints.md); False
        loads a damaged checkpoint's bytes as they are. ``trust_checkpoint``: unpickle it
        unrestricted, which runs any code its files name; by default anything but plain data
        raises ``UntrustedCheckpointError`` (docs/checkpoints.md, "Loading checkpoints you did not
        write"). Only for a checkpoint from someone you trust. ``strict=False``: the checkpoint may
        hold part of the model's state (the rest stays as it is), as ``load_state_dict(strict=False)``.
        """
        return self.own_checkpointer().read(
            checkpoint_path,
            optimizers,
            weights_only=weights_only,
            check=check,
            verify=verify,
            trust=trust_checkpoint,
            strict=strict,
        )

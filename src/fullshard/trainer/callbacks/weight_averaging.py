"""``WeightAveraging`` and ``EMAWeightAveraging``: keep an average of the weights while training,
validate with it, and end training with it.

The average is kept as each process's share of the weights (see [Note: averaging the local
shards] in ``local_state.py``): under FSDP and FSDP2 it stays sharded like the parameters, and no
process ever holds a whole copy of the model. Lightning keeps a ``torch.optim.swa_utils.
AveragedModel`` (a whole copy); the arithmetic is the same (``avg_fn``/``multi_avg_fn`` are
called as ``AveragedModel`` calls them), so one process gives Lightning's numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import get_ema_avg_fn
from typing_extensions import override

from fullshard.rank_zero import rank_zero_info, rank_zero_warn
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.local_state import clone_to, copy_into, local_tensors, swap

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

AvgFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MultiAvgFn = Callable[[list[torch.Tensor], list[torch.Tensor], torch.Tensor], None]
_AVERAGED_MODEL_OPTIONS = ("avg_fn", "multi_avg_fn")


def _copied(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


class ShardAverage:
    """A running average of a model's local tensors (parameters, then buffers), updated as
    ``AveragedModel.update_parameters`` updates its copy."""

    def __init__(
        self,
        module: torch.nn.Module,
        device: torch.device | None,
        use_buffers: bool,
        avg_fn: AvgFn | None = None,
        multi_avg_fn: MultiAvgFn | None = None,
    ) -> None:
        self.use_buffers = use_buffers
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.num_params = len(list(module.parameters()))
        self.tensors = clone_to(local_tensors(module), device)
        self.n_averaged = torch.tensor(0, dtype=torch.long, device=device)

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        current = self.check_same_tensors(module)
        averaged = self.tensors if self.use_buffers else self.tensors[: self.num_params]
        sources = current if self.use_buffers else current[: self.num_params]
        self._update(averaged, sources, current)

    def check_same_tensors(self, module: torch.nn.Module) -> list[torch.Tensor]:
        """The module's tensors, which must be those the average was made of.

        Raises:
            RuntimeError: a callback re-parametrized the model since (ModelPruning).
        """
        current = local_tensors(module)
        if [t.shape for t in current] != [t.shape for t in self.tensors]:
            raise RuntimeError(
                f"WeightAveraging: the model's parameters and buffers are not those the average was made of "
                f"({len(self.tensors)} tensors then, {len(current)} now, or of other shapes): a callback such as "
                "ModelPruning re-parametrized the model during fit. Averaging them pairwise would mix unrelated "
                "tensors; prune before fit (or after it), or train without one of the two callbacks."
            )
        return current

    def _update(
        self, averaged: list[torch.Tensor], sources: list[torch.Tensor], current: list[torch.Tensor]
    ) -> None:
        if int(self.n_averaged) == 0:
            copy_into(averaged, sources)
        elif self.multi_avg_fn is not None:
            self.multi_avg_fn(
                averaged, [s.to(a.device) for a, s in zip(averaged, sources, strict=True)], self.n_averaged
            )
        else:
            for average, source in zip(averaged, sources, strict=True):
                source = source.to(average.device)
                if self.avg_fn is not None:
                    average.copy_(self.avg_fn(average, source, self.n_averaged.to(average.device)))
                else:  # torch's default: the equal-weight running mean
                    average.copy_(average + (source - average) / (self.n_averaged.to(average.device) + 1))
        if not self.use_buffers:  # buffers follow the model (AveragedModel's rule)
            copy_into(self.tensors[self.num_params :], current[self.num_params :])
        self.n_averaged += 1


class WeightAveraging(Callback):
    """Averages the weights after each optimizer step (or where :meth:`should_update` says), uses
    the average for validation, and leaves it in the model when training ends; checkpoints hold
    the average as ``"state_dict"`` and the trained weights as ``"current_model_state"``, as in
    Lightning.

    Args:
        device: where the average is kept (None: beside the parameters).
        use_buffers: average the buffers too (else they are copied from the model at each update).
        **kwargs: ``avg_fn`` or ``multi_avg_fn`` as for ``torch.optim.swa_utils.AveragedModel``
            (default: the equal-weight mean).

    Raises:
        TypeError: for another keyword argument.
    """

    def __init__(
        self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any
    ) -> None:
        unknown = sorted(set(kwargs) - set(_AVERAGED_MODEL_OPTIONS))
        if unknown:
            raise TypeError(
                f"WeightAveraging got unexpected keyword arguments {unknown}; it accepts device, use_buffers and "
                f"AveragedModel's {', '.join(_AVERAGED_MODEL_OPTIONS)}."
            )
        self._device = (
            torch.device(device) if isinstance(device, str | int) and not isinstance(device, bool) else device
        )
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average: ShardAverage | None = None
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._fitting = False  # between setup and teardown of fit
        self._in_fit = False  # between on_fit_start and on_train_end: validation uses the average
        self._warned_sharded = False

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update after optimizer step ``step_idx`` (from 0) or at the end of epoch
        ``epoch_idx``. By default after every step."""
        return step_idx is not None

    @property
    def average_tensors(self) -> list[torch.Tensor] | None:
        """This process's share of the averaged parameters, then buffers (None before ``fit``)."""
        return None if self._average is None else self._average.tensors

    def _ensure_average(self, pl_module: Module) -> ShardAverage:
        if self._average is None:
            self._average = ShardAverage(pl_module, self._device, self._use_buffers, **self._kwargs)  # type: ignore[arg-type]
        return self._average

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        # set afresh: a fit that raised ended without on_train_end and teardown (as in Lightning)
        self._fitting, self._in_fit = stage == "fit", False
        if stage == "fit":
            self._average = None  # made from the set-up (possibly sharded) model when fit starts

    @override
    def teardown(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        if stage == "fit":
            self._fitting = self._in_fit = False

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._ensure_average(pl_module)
        self._in_fit = True

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step_idx = trainer.global_step - 1
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=step_idx):
            self._ensure_average(pl_module).update(pl_module)
            self._latest_update_step = trainer.global_step

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if trainer.current_epoch > self._latest_update_epoch and self.should_update(
            epoch_idx=trainer.current_epoch
        ):
            self._ensure_average(pl_module).update(pl_module)
            self._latest_update_epoch = trainer.current_epoch

    @override
    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._in_fit = False
        if self._average is not None:
            copy_into(local_tensors(pl_module), self._average.tensors, trainer.strategy)

    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        if self._in_fit and self._average is not None:
            swap(self._average.tensors, local_tensors(pl_module), trainer.strategy)

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._in_fit and self._average is not None:
            swap(self._average.tensors, local_tensors(pl_module), trainer.strategy)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        if self._average is None and self._fitting:  # saved from an earlier on_fit_start (a tuner's)
            self._ensure_average(pl_module)
        if self._average is None:
            rank_zero_info(
                "WeightAveraging: a checkpoint saved outside fit holds no averaging state; after training, the "
                "model's weights are the average already."
            )
            return
        strategy = trainer.strategy
        # The states may hold the parameters themselves (one process, DDP, sharded checkpoints),
        # which the swap below changes: both are copied.
        sharded = strategy.state_dict_type == "sharded"
        current_state = None if sharded else _copied(checkpoint["state_dict"])
        self._average.check_same_tensors(pl_module)
        # the average in the strategy's own format: swapped into the model for the read (collective)
        swap(self._average.tensors, local_tensors(pl_module), strategy)
        try:
            # on every rank (not to_save): a tuner's snapshot loads it back on every rank
            average_state = _copied(strategy.get_state((), full=not sharded)[0])
        finally:
            swap(self._average.tensors, local_tensors(pl_module), strategy)
        checkpoint["state_dict"] = average_state
        checkpoint["averaging_state"] = {"n_averaged": self._average.n_averaged.clone()}
        if sharded:
            # The sharded format writes one model state (state_dict) as shards; a second one would
            # be pickled as rank 0's shards only. The checkpoint holds the average.
            if not self._warned_sharded:
                rank_zero_warn(
                    "WeightAveraging: a sharded checkpoint holds the averaged weights only (not the trained ones, "
                    "current_model_state), so a run resumed from it trains on from the average. Use "
                    "state_dict_type='full' to resume exactly."
                )
                self._warned_sharded = True
            return
        checkpoint["current_model_state"] = current_state

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        if not self._fitting:
            rank_zero_warn(
                "WeightAveraging keeps its average during fit only: a checkpoint loaded for validate, test or predict "
                "restores no averaging state (its state_dict is the average already, when WeightAveraging wrote it). "
                "Remove the callback from this Trainer to silence this warning."
            )
            return
        average = self._ensure_average(pl_module)
        # the model was loaded from "state_dict": the average (or, from a checkpoint written
        # without this callback, the weights, which then start both)
        copy_into(average.tensors, local_tensors(pl_module))
        current = checkpoint.get("current_model_state")
        if current is None:
            if "averaging_state" not in checkpoint:
                rank_zero_warn(
                    "The checkpoint was not written with WeightAveraging: the model and the average both start from "
                    "its state_dict."
                )
            return
        rank_zero_info("WeightAveraging: the model goes on from the checkpoint's current_model_state.")
        strategy = trainer.strategy
        strategy.set_state(current, [], [], full=strategy.state_dict_type != "sharded", from_rank0=False)
        n_averaged = checkpoint.get("averaging_state", {}).get("n_averaged")
        if n_averaged is not None:
            average.n_averaged.fill_(int(n_averaged))


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights, ``decay * average + (1 - decay) * weights``,
    updated every ``update_every_n_steps`` optimizer steps from step ``update_starting_at_step``
    (and at the end of each epoch from epoch ``update_starting_at_epoch``, when given).

    Raises:
        TypeError: as :class:`WeightAveraging` (``avg_fn`` is this class's own).
        ValueError: for a ``decay`` outside [0, 1].
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(
                f"EMAWeightAveraging(decay={decay!r}): the decay must lie in [0, 1], e.g. 0.999."
            )
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    @override
    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        return (
            epoch_idx is not None
            and self.update_starting_at_epoch is not None
            and epoch_idx >= self.update_starting_at_epoch
        )

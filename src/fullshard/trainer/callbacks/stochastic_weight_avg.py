"""``StochasticWeightAveraging``: average the weights of the last epochs under a constant or
annealed learning rate (Izmailov et al., 2018), as Lightning's callback.

The average is each process's share of the parameters ([Note: averaging the local shards] in
``local_state.py``), so it runs under FSDP and FSDP2 as well, sharded like the parameters
(Lightning refuses sharded strategies: it copies the whole module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.optim.swa_utils import SWALR
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.optimizer_config import LRSchedulerConfig
from fullshard.rank_zero import rank_zero_info, rank_zero_warn
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.local_state import clone_to, copy_into, local_tensors

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

AvgFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _shards_parameters(trainer: Trainer) -> bool:
    return trainer.strategy.shards_parameters


class StochasticWeightAveraging(Callback):
    """From epoch ``swa_epoch_start`` on, switches the learning rate schedule to ``SWALR``
    (annealing to ``swa_lrs`` over ``annealing_epochs``) and averages the weights at the start
    of each epoch; when training ends the model holds the average. A model with batch norm
    layers then gets their statistics recomputed with the averaged weights, in one pass over the
    training data (Lightning runs an extra epoch for it; see docs/callbacks.md).

    Args:
        swa_lrs: the SWA learning rate, one float for every parameter group or a list of them.
        swa_epoch_start: the epoch to start at: an int counted from 1, or a fraction of
            ``max_epochs`` (``0.8``: the last fifth of training).
        annealing_epochs: epochs to anneal from the learning rate to ``swa_lrs``.
        annealing_strategy: ``"cos"`` or ``"linear"``.
        avg_fn: ``(averaged, current, num_averaged) -> new average``; the equal-weight mean by default.
        device: where the average is kept (None: beside the parameters; default the CPU, as in
            Lightning).

    Raises:
        MisconfigurationError: for a bad argument (the message says which), and when fit starts
            with more than one optimizer or scheduler.
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: Literal["cos", "linear"] = "cos",
        avg_fn: AvgFn | None = None,
        device: torch.device | str | None = torch.device("cpu"),  # noqa: B008 (Lightning's default)
    ) -> None:
        if (isinstance(swa_epoch_start, int) and swa_epoch_start < 1) or (
            isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1
        ):
            raise MisconfigurationError(
                f"swa_epoch_start={swa_epoch_start!r}: give an int >= 1 (the epoch, counted from 1) or a float in "
                "[0, 1] (a fraction of max_epochs)."
            )
        bad_float = isinstance(swa_lrs, float) and swa_lrs <= 0
        bad_list = isinstance(swa_lrs, list) and not all(isinstance(lr, float) and lr > 0 for lr in swa_lrs)
        if not isinstance(swa_lrs, float | list) or bad_float or bad_list:
            raise MisconfigurationError(
                f"swa_lrs={swa_lrs!r}: give a positive float, or a list of positive floats (one per parameter group)."
            )
        if annealing_strategy not in ("cos", "linear"):
            raise MisconfigurationError(f"annealing_strategy={annealing_strategy!r}: use 'cos' or 'linear'.")
        if avg_fn is not None and not callable(avg_fn):
            raise MisconfigurationError(f"avg_fn must be callable, got {type(avg_fn).__name__}.")
        if device is not None and not isinstance(device, torch.device | str):
            raise MisconfigurationError(f"device must be a torch.device, a str or None, got {device!r}.")
        self.n_averaged: torch.Tensor | None = None
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = None if device is None else torch.device(device)
        self._model_contains_batch_norm: bool | None = None
        self._average: list[torch.Tensor] | None = None
        self._initialized = False
        self._swa_scheduler: Any = None
        self._scheduler_state: dict[str, Any] | None = None
        self._average_state: list[torch.Tensor] | None = None
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self._max_epochs = -1
        self._shares_differ = False

    @property
    def swa_start(self) -> int:
        """The first averaged epoch, counted from 0 (known once fit starts)."""
        return max(int(self._swa_epoch_start) - 1, 0)

    @property
    def swa_end(self) -> float:
        """The last averaged epoch, counted from 0 (infinite without ``max_epochs``)."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: Module) -> bool:
        """Whether the module has batch norm layers (their statistics are recomputed at the end)."""
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in pl_module.modules())

    @staticmethod
    def avg_fn(averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor) -> torch.Tensor:
        """The equal-weight running mean."""
        return averaged + (current - averaged) / (num_averaged + 1)

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        if len(trainer.optimizers) != 1:
            raise MisconfigurationError(
                f"StochasticWeightAveraging works with one optimizer; configure_optimizers returned {len(trainer.optimizers)}."
            )
        if len(trainer.lr_scheduler_configs) > 1:
            raise MisconfigurationError(
                "StochasticWeightAveraging replaces the learning rate scheduler and works with at most one; "
                f"configure_optimizers returned {len(trainer.lr_scheduler_configs)}."
            )
        if isinstance(self._swa_epoch_start, float):
            if trainer.max_epochs == -1:
                raise MisconfigurationError(
                    "swa_epoch_start as a fraction needs max_epochs; with max_epochs=-1 give the epoch as an int."
                )
            self._swa_epoch_start = int(trainer.max_epochs * self._swa_epoch_start)
        self._model_contains_batch_norm = self.pl_module_contains_batch_norm(pl_module)
        self._max_epochs = trainer.max_epochs
        params = local_tensors(pl_module, buffers=False)
        self._average = clone_to(params, self._device)
        # a sharded average differs by process, and callback states are saved from rank 0 only
        self._shares_differ = trainer.world_size > 1 and _shards_parameters(trainer)
        if self._average_state is not None and not self._shares_differ:
            copy_into(self._average, self._average_state)
            self._average_state = None
        if self._scheduler_state is not None and trainer.lr_scheduler_configs:
            trainer.lr_scheduler_configs.clear()  # SWALR takes over again, from its saved state

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        epoch = trainer.current_epoch
        if not self._initialized and self.swa_start <= epoch <= self.swa_end:
            self._initialized = True
            self._start_swalr(trainer, pl_module)
        if self.swa_start <= epoch <= self.swa_end and epoch > self._latest_update_epoch:
            self._update(pl_module)
            self._latest_update_epoch = epoch

    def _start_swalr(self, trainer: Trainer, pl_module: Module) -> None:
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        for lr, group in zip(self._swa_lrs, optimizer.param_groups, strict=False):
            group["initial_lr"] = lr
        self._swa_scheduler = SWALR(
            optimizer,
            swa_lr=self._swa_lrs,  # type: ignore[arg-type]  # torch takes a list per group too
            anneal_epochs=self._annealing_epochs,
            anneal_strategy=self._annealing_strategy,
            last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1,
        )
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
        elif trainer.current_epoch != self.swa_start:
            rank_zero_warn(
                "SWA starts after swa_start without a checkpoint's SWA state: the average begins now."
            )
        config = LRSchedulerConfig(self._swa_scheduler)
        if trainer.lr_scheduler_configs:
            previous = trainer.lr_scheduler_configs[0]
            if previous.interval != "epoch" or previous.frequency != 1:
                rank_zero_warn(
                    f"SWA steps its scheduler every epoch; the replaced one stepped differently ({previous})."
                )
            rank_zero_info(f"Swapping scheduler `{type(previous.scheduler).__name__}` for `SWALR`")
            trainer.lr_scheduler_configs[0] = config
        else:
            trainer.lr_scheduler_configs.append(config)
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long)

    @torch.no_grad()
    def _update(self, pl_module: Module) -> None:
        assert self._average is not None and self.n_averaged is not None
        for average, current in zip(self._average, local_tensors(pl_module, buffers=False), strict=True):
            current = current.to(average.device)
            average.copy_(
                current if int(self.n_averaged) == 0 else self._avg_fn(average, current, self.n_averaged)
            )
        self.n_averaged += 1

    @override
    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        finished = self._max_epochs == -1 or trainer.current_epoch - 1 >= self.swa_end
        if self._average is None or not self._initialized or not finished:
            return
        copy_into(local_tensors(pl_module, buffers=False), self._average, trainer.strategy)
        if self._model_contains_batch_norm:
            self._recompute_batch_norm(trainer, pl_module)

    @torch.no_grad()
    def _recompute_batch_norm(self, trainer: Trainer, pl_module: Module) -> None:
        """Batch norm statistics of the averaged weights: one pass over the training data in
        training mode, with cumulative averages (momentum None), as torch's ``update_bn``."""
        momenta: dict[nn.modules.batchnorm._BatchNorm, float | None] = {}
        for module in pl_module.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                assert module.running_var is not None and module.num_batches_tracked is not None
                module.running_mean.zero_()
                module.running_var.fill_(1.0)
                module.num_batches_tracked.zero_()
                momenta[module] = module.momentum
                module.momentum = None
        loader = trainer.fit_loop.train_loader
        if loader is None:
            return
        was_training = pl_module.training
        pl_module.train()
        strategy = trainer.strategy
        try:
            for index, batch in enumerate(loader.iterate(0, (0, 0))):
                if index >= trainer.num_training_batches:
                    break
                strategy.training_step(strategy.batch_to_device(batch), index)
        finally:
            for module, momentum in momenta.items():
                module.momentum = momentum
            pl_module.train(was_training)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "n_averaged": 0 if self.n_averaged is None else int(self.n_averaged),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": (
                None if self._average is None or self._shares_differ else [t.cpu() for t in self._average]
            ),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._init_n_averaged = state_dict["n_averaged"]
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._scheduler_state = state_dict["scheduler_state"]
        self._average_state = state_dict.get("average_model_state")

"""DistributedDataParallel: every process holds the whole model; gradients are averaged."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.launch.stuck_ranks import DEFAULT_STUCK_RANK_TIMEOUT
from fullshard.strategies.forward_redirection import redirected_call
from fullshard.strategies.lightning_api import refuse_lightning_plugins
from fullshard.strategies.parallel import DEFAULT_RANK_AGREEMENT_TIMEOUT, DEFAULT_TIMEOUT, ParallelStrategy
from fullshard.strategies.step_args import step_arguments
from fullshard.strategies.strategy import NULL_CONTEXT

if TYPE_CHECKING:
    from collections.abc import Callable

    from fullshard.strategies.registry import StrategyRegistry


class DDPStrategy(ParallelStrategy):
    """Data-parallel training with ``torch.nn.parallel.DistributedDataParallel``.

    Args:
        process_group_backend: see :class:`~fullshard.strategies.parallel.ParallelStrategy`.
        timeout: see :class:`~fullshard.strategies.parallel.ParallelStrategy`.
        start_method: see :class:`~fullshard.strategies.parallel.ParallelStrategy`.
        state_dict_type: see :class:`~fullshard.strategies.parallel.ParallelStrategy`.
        rank_agreement_timeout: see :class:`~fullshard.strategies.parallel.ParallelStrategy`.
        stuck_rank_timeout: see :class:`~fullshard.strategies.parallel.ParallelStrategy`.
        ddp_comm_hook: a DDP communication hook (``torch.distributed.algorithms.ddp_comm_hooks``:
            ``default_hooks.fp16_compress_hook``, PowerSGD's ``powerSGD_hook``, ...), registered on
            the wrapped model with ``ddp_comm_state`` as its state; ``ddp_comm_wrapper`` wraps it
            (``default_hooks.fp16_compress_wrapper``). As Lightning's, also on CPU processes (gloo).
        **ddp_kwargs: passed on to ``DistributedDataParallel`` (``find_unused_parameters``,
            ``gradient_as_bucket_view``, ``static_graph``, ...).
    """

    strategy_name = "ddp"

    def __init__(
        self,
        *,
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        start_method: str = "popen",
        state_dict_type: str = "full",
        rank_agreement_timeout: timedelta = DEFAULT_RANK_AGREEMENT_TIMEOUT,
        stuck_rank_timeout: timedelta | None = DEFAULT_STUCK_RANK_TIMEOUT,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        refuse_lightning_plugins("DDPStrategy", ddp_kwargs)
        super().__init__(
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            state_dict_type=state_dict_type,
            rank_agreement_timeout=rank_agreement_timeout,
            stuck_rank_timeout=stuck_rank_timeout,
        )
        self.ddp_kwargs = ddp_kwargs
        if ddp_comm_hook is None and (ddp_comm_state is not None or ddp_comm_wrapper is not None):
            raise MisconfigurationError(
                "DDPStrategy(ddp_comm_state=/ddp_comm_wrapper=) configure a communication hook: pass the hook "
                "too (ddp_comm_hook=, e.g. torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook)."
            )
        self._comm_hook = (ddp_comm_state, ddp_comm_hook, ddp_comm_wrapper)

    @classmethod
    @override
    def register_strategies(cls, registry: StrategyRegistry) -> None:
        registry.register(
            "ddp",
            cls,
            description="DistributedDataParallel; one process per device, script re-run per process.",
        )
        registry.register(
            "ddp_spawn",
            cls,
            description=(
                "DistributedDataParallel with fresh workers started by torch.multiprocessing; model and data"
                " must pickle and their classes be importable (not defined in a notebook)."
            ),
            start_method="spawn",
        )
        for name in ("ddp_notebook", "ddp_fork"):
            registry.register(
                name,
                cls,
                description=(
                    "DistributedDataParallel with workers forked from this process: for notebooks and"
                    " `python -c` (classes defined there work); one CPU thread per worker."
                ),
                start_method="fork",
            )
        registry.register(
            "ddp_find_unused_parameters_true",
            cls,
            description="DDP that tolerates parameters without gradients in a step.",
            find_unused_parameters=True,
        )

    @override
    def _wrap(self, module: nn.Module) -> nn.Module:
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        model = DistributedDataParallel(module, device_ids=device_ids, **self.ddp_kwargs)
        state, hook, wrapper = self._comm_hook
        if hook is not None:
            model.register_comm_hook(state, wrapper(hook) if wrapper is not None else hook)
        return model

    @override
    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        model = self._require_model()
        if enabled and isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return NULL_CONTEXT

    # [Note: DDP under manual optimization]
    # DDP prepares its reducer for one backward at the end of each forward, and the training step
    # is DDP's forward here (see [Note: forward redirection]). Under manual optimization the
    # module calls backward inside its training step, possibly several times (a GAN's generator
    # and discriminator losses), and maybe none. So, as Lightning does, the reducer is prepared by
    # each backward instead, for that loss; and once the step returned, DDP is told not to
    # prepare it again (``require_backward_grad_sync`` is False while the forward ends). A
    # backward inside ``no_backward_sync(enabled=True)`` (``no_sync``) is not prepared: its
    # gradients stay local and the next synchronised backward reduces their sum.
    @override
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        model = self._require_model()
        if not self.manual_optimization or not isinstance(model, DistributedDataParallel):
            return super().training_step(batch, batch_idx)

        def no_reducer_after_step() -> None:
            model.require_backward_grad_sync = False

        try:
            with self.precision.forward_context():
                return redirected_call(
                    model,
                    self.module,  # type: ignore[arg-type]
                    "training_step",
                    *step_arguments(self.module, "training_step", batch, batch_idx, ()),
                    after_step=no_reducer_after_step,
                )
        finally:
            model.require_backward_grad_sync = True

    @override
    def backward(
        self, loss: torch.Tensor, *args: Any, backward: Callable[..., Any] | None = None, **kwargs: Any
    ) -> None:
        model = self.model
        if self.manual_optimization and isinstance(model, DistributedDataParallel):
            _prepare_reducer(model, loss)
        super().backward(loss, *args, backward=backward, **kwargs)


def _prepare_reducer(model: DistributedDataParallel, loss: torch.Tensor) -> None:
    """Get DDP's reducer ready for a backward of ``loss``, as DDP's forward does at its end.

    DDP has no public API for this (it is what ``DistributedDataParallel._post_forward`` does):
    the private calls are kept here, in one place. See [Note: DDP under manual optimization].
    """
    if not (torch.is_grad_enabled() and model.require_backward_grad_sync):
        model.require_forward_param_sync = False
        return
    from torch.nn.parallel.distributed import _find_tensors

    model.require_forward_param_sync = True
    tensors = list(_find_tensors(loss)) if model.find_unused_parameters and not model.static_graph else []
    reducer = model.reducer
    reducer._rebuild_buckets()  # as DDP's forward does before preparing (builds buckets on the first step)
    reducer.prepare_for_backward(tensors)

"""FullyShardedDataParallel (FSDP1): parameters, gradients and optimizer state sharded across
processes, each unit a ``FullyShardedDataParallel`` wrapper holding flat shards."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from fullshard.compile import fsdp_units
from fullshard.errors import MisconfigurationError
from fullshard.launch.stuck_ranks import DEFAULT_STUCK_RANK_TIMEOUT
from fullshard.precision import FSDPPrecision, Precision
from fullshard.strategies.auto_plan import check_plan_setting, settings_a_plan_replaces
from fullshard.strategies.flat_params import drop_gathered_copies, flat_parameter_sizes
from fullshard.strategies.fsdp_options import (
    check_mixed_precision,
    parse_backward_prefetch,
    parse_cpu_offload,
    sharding_name,
    torch_fsdp,
)
from fullshard.strategies.lightning_api import refuse_lightning_plugins
from fullshard.strategies.manual_steps import (
    clip_sharded_gradients,
    finish_backward,
    inside_forward,
    no_sync_in_step_error,
)
from fullshard.strategies.meta_init import MetaInit, user_init_of
from fullshard.strategies.parallel import DEFAULT_RANK_AGREEMENT_TIMEOUT, DEFAULT_TIMEOUT
from fullshard.strategies.parallel_layout import ParallelLayout
from fullshard.strategies.parameter_sizes import ParameterSize
from fullshard.strategies.sharded import ShardedStrategy
from fullshard.strategies.wrapping import wrap_fsdp1

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffload

    from fullshard.strategies.registry import StrategyRegistry


class FSDPStrategy(ShardedStrategy):
    """Fully Sharded Data Parallel training with ``torch.distributed.fsdp.FullyShardedDataParallel``.

    Args:
        sharding_strategy: ``"FULL_SHARD"`` (default), ``"SHARD_GRAD_OP"``, ``"NO_SHARD"``,
            ``"HYBRID_SHARD"`` (any case) or a ``ShardingStrategy``.
        cpu_offload: keep sharded parameters (and gradients, optimizer state) in host memory:
            True, False or a ``CPUOffload``. On CPU devices they are there already and the
            setting changes nothing.
        mixed_precision: a ``torch.distributed.fsdp.MixedPrecision``; replaces what the Trainer's
            precision string would choose.
        auto_wrap_policy, activation_checkpointing_policy, state_dict_type, device_mesh,
            empty_init, cpu_mmap_threshold, compile, process_group_backend, timeout,
            start_method, rank_agreement_timeout, stuck_rank_timeout: as for
            :class:`~fullshard.strategies.sharded.ShardedStrategy`. Without ``auto_wrap_policy``
            the whole model is one unit, unless ``configure_model`` wrapped layers itself with
            ``torch.distributed.fsdp.wrap.wrap``.
        activation_checkpointing: Lightning's deprecated form of ``activation_checkpointing_policy``
            (a layer class or a list of them); a ``DeprecationWarning`` says so.
        plan, plan_batch, plan_device_memory, plan_host_memory: ``plan="auto"`` chooses the sharding, wrapping,
            checkpointing and offload by the memory planner before wrapping, as for
            :class:`~fullshard.strategies.FSDP2Strategy` (docs/fsdp/plan.md).
        **kwargs: passed to ``FullyShardedDataParallel`` (``limit_all_gathers``, ``forward_prefetch``,
            ``backward_prefetch``, ``sync_module_states``, ``process_group``, ...).
            ``use_orig_params`` defaults to True, so optimizers may use ``self.parameters()`` and
            several parameter groups.
    """

    strategy_name = "fsdp"

    def __init__(
        self,
        *,
        auto_wrap_policy: Any = None,
        activation_checkpointing_policy: Any = None,
        sharding_strategy: Any = "FULL_SHARD",
        cpu_offload: bool | CPUOffload | None = None,
        mixed_precision: Any = None,
        state_dict_type: str = "full",
        device_mesh: tuple[int, int] | DeviceMesh | None = None,
        empty_init: bool = False,
        cpu_mmap_threshold: int | None = 128 * 1024,
        compile: bool | dict[str, Any] | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        start_method: str = "popen",
        rank_agreement_timeout: timedelta = DEFAULT_RANK_AGREEMENT_TIMEOUT,
        stuck_rank_timeout: timedelta | None = DEFAULT_STUCK_RANK_TIMEOUT,
        activation_checkpointing: type[nn.Module] | list[type[nn.Module]] | None = None,
        plan: str | None = None,
        plan_batch: Any = None,
        plan_device_memory: int | str | None = None,
        plan_host_memory: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        # torch's FSDP is imported only to check torch objects given here: [Note: torch's FSDP
        # imported after launch] in fullshard.strategies.fsdp_options
        refuse_lightning_plugins("FSDPStrategy", kwargs)
        if activation_checkpointing is not None:  # Lightning's deprecated spelling of the policy
            if activation_checkpointing_policy is not None:
                raise MisconfigurationError(
                    "FSDPStrategy got both activation_checkpointing= and activation_checkpointing_policy=: "
                    "pass the layer classes as activation_checkpointing_policy only."
                )
            classes = (
                activation_checkpointing
                if isinstance(activation_checkpointing, list)
                else [activation_checkpointing]
            )
            activation_checkpointing_policy = set(classes)
            warnings.warn(
                f"FSDPStrategy(activation_checkpointing=...) is deprecated (as in Lightning): pass "
                f"activation_checkpointing_policy={{{', '.join(c.__name__ for c in classes)}}} instead.",
                DeprecationWarning,
                stacklevel=2,
            )
        name = sharding_name(sharding_strategy)
        self._cpu_offload: bool | CPUOffload = (
            bool(cpu_offload)
            if cpu_offload is None or isinstance(cpu_offload, bool)
            else parse_cpu_offload(cpu_offload)
        )
        super().__init__(
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing_policy=activation_checkpointing_policy,
            sharding_name=name,
            mixed_precision=check_mixed_precision(mixed_precision),
            fsdp_kwargs=_check_fsdp_kwargs(kwargs),
            state_dict_type=state_dict_type,
            device_mesh=device_mesh,
            empty_init=empty_init,
            cpu_mmap_threshold=cpu_mmap_threshold,
            compile=compile,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            rank_agreement_timeout=rank_agreement_timeout,
            stuck_rank_timeout=stuck_rank_timeout,
            plan=check_plan_setting(
                plan,
                plan_batch,
                plan_device_memory,
                given=settings_a_plan_replaces(
                    sharding_strategy, auto_wrap_policy, activation_checkpointing_policy, cpu_offload
                ),
                host_memory=plan_host_memory,
            ),
        )

    @property
    def cpu_offload(self) -> Any:
        """The ``torch.distributed.fsdp.CPUOffload`` in force."""
        return parse_cpu_offload(self._cpu_offload)

    @property
    @override
    def offloads_params(self) -> bool:
        offload = self._cpu_offload
        return offload if isinstance(offload, bool) else bool(offload.offload_params)

    @classmethod
    @override
    def register_strategies(cls, registry: StrategyRegistry) -> None:
        registry.register("fsdp", cls, description="Fully Sharded Data Parallel (FULL_SHARD), CPU or CUDA.")
        registry.register(
            "fsdp_cpu_offload",
            cls,
            description="Fully Sharded Data Parallel with parameters offloaded to host memory.",
            cpu_offload=True,
        )

    @override
    def _apply_candidate(self, candidate: Any) -> None:
        super()._apply_candidate(candidate)
        self._cpu_offload = candidate.cpu_offload

    # ------------------------------------------------------------------------ configuration
    @override
    def make_precision(self, precision: Any, device_type: str) -> Precision:
        return FSDPPrecision(precision, device_type, self.mixed_precision)

    @override
    def _planned_sharding(self, layout: ParallelLayout) -> str:
        # torch's FSDP1 turns FULL_SHARD and SHARD_GRAD_OP into NO_SHARD when there is one
        # process to shard over (one GPU): the plan says what runs
        if layout.shards == 1 and self._sharding_name in ("FULL_SHARD", "SHARD_GRAD_OP"):
            return "NO_SHARD"
        return self._sharding_name

    @override
    def layout_for(self, world_size: int) -> ParallelLayout:
        if self._sharding_name in ("FULL_SHARD", "SHARD_GRAD_OP"):
            # torch's FSDP1 takes a device mesh for the hybrid strategies only (see _make_mesh):
            # these shard over every process, whatever device_mesh= says
            return ParallelLayout.split(world_size)
        return super().layout_for(world_size)

    @override
    def _make_mesh(self) -> DeviceMesh | None:
        """HYBRID_SHARD's ``("replicate", "shard")`` mesh (FSDP makes its process groups from it),
        unless a ``process_group`` was given; the other sharding strategies use the default group."""
        if not self.is_hybrid or (self._mesh_setting is None and "process_group" in self.fsdp_kwargs):
            return None
        if self._mesh_setting is None or isinstance(self._mesh_setting, tuple):
            return self.layout.build_mesh(self.root_device.type)
        return self._mesh_setting

    # ----------------------------------------------------------------------- wrapping
    def _fsdp_kwargs(self, root: nn.Module | None = None) -> dict[str, Any]:
        """FSDP's arguments; ``root``: the model being wrapped (None inside ``configure_model``)."""
        mixed_precision = self.precision.mixed_precision_config  # type: ignore[attr-defined]
        kwargs = self.wrapping_kwargs(self.root_device, mixed_precision, self._mesh)
        if self.empty_init:
            kwargs["param_init_fn"] = MetaInit(self.root_device, root, user_init_of(root))
        return kwargs

    def wrapping_kwargs(
        self, device: torch.device, mixed_precision: Any, mesh: DeviceMesh | None
    ) -> dict[str, Any]:
        """``FullyShardedDataParallel``'s arguments on ``device`` with ``mixed_precision`` over
        ``mesh`` (None: the default group), but for ``param_init_fn``: what the strategy wraps
        with, and what the memory planner simulates it with (on fake CPU tensors)."""
        kwargs = dict(self.fsdp_kwargs)
        kwargs["sharding_strategy"] = self.sharding_strategy
        kwargs["mixed_precision"] = mixed_precision
        kwargs["device_id"] = device
        if device.type != "cpu":
            # On CPU the parameters are in host memory already, and torch's offload path needs an accelerator.
            kwargs["cpu_offload"] = self.cpu_offload
        if mesh is not None:
            kwargs["device_mesh"] = mesh
        return kwargs

    @override
    def model_sharded_context(self) -> contextlib.AbstractContextManager[Any]:
        """Inside ``configure_model``, ``torch.distributed.fsdp.wrap.wrap(layer)`` shards at once."""
        from torch.distributed.fsdp.wrap import enable_wrap

        return enable_wrap(wrapper_cls=torch_fsdp().FullyShardedDataParallel, **self._fsdp_kwargs())

    @override
    def _unit_type(self) -> type:
        return torch_fsdp().FullyShardedDataParallel  # type: ignore[no-any-return]

    @override
    def _wrap(self, module: nn.Module) -> nn.Module:
        kwargs = self._fsdp_kwargs(module)
        manually_wrapped = self._manually_wrapped(module)
        auto_wrap, checkpointing, _, _ = self.resolve_policies(module)  # the plan raised the warnings
        if manually_wrapped:
            auto_wrap = None
        if manually_wrapped and self.auto_wrap_policy is not None and self.is_global_zero:
            warnings.warn(
                "configure_model() already wrapped layers with FSDP, so auto_wrap_policy is ignored (the "
                "model is not wrapped twice). Remove one of the two.",
                stacklevel=3,
            )
        wrapped = wrap_fsdp1(module, auto_wrap=auto_wrap, checkpointing=checkpointing, **kwargs)
        self.compile_model(module, fsdp_units(wrapped), root=wrapped)  # see [Note: where compile happens]
        return wrapped

    # ---------------------------------------------------------------------------- steps
    @override
    def clip_gradients_norm(
        self, optimizer: Optimizer, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip with FSDP's own ``clip_grad_norm_``, which reduces the norm over all shards;
        inside a training step (manual optimization), where that one refuses to run, by the norm
        of ``optimizer``'s gradient shards reduced over the shard group."""
        self.precision.unscale_gradients(optimizer)
        model = self._require_model()
        if not inside_forward(model):
            return model.clip_grad_norm_(max_norm, norm_type=norm_type)  # type: ignore[operator,no-any-return]
        group = None if self._sharding_name == "NO_SHARD" else model.process_group
        return clip_sharded_gradients(optimizer, max_norm, float(norm_type), group)

    @override
    def backward(
        self, loss: torch.Tensor, *args: Any, backward: Callable[..., Any] | None = None, **kwargs: Any
    ) -> None:
        super().backward(loss, *args, backward=backward, **kwargs)
        if self.manual_optimization:  # see [Note: FSDP under manual optimization]
            finish_backward(self._require_model())

    @override
    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        model = self._require_model()
        if not enabled:
            return contextlib.nullcontext()
        if inside_forward(model):  # manual optimization: see [Note: FSDP under manual optimization]
            raise no_sync_in_step_error()
        return model.no_sync()  # type: ignore[operator,no-any-return]

    # ------------------------------------------------------------------------- checkpoints
    @override
    def parameter_sizes(self, module: nn.Module) -> list[ParameterSize]:
        """Full sizes read from FSDP's flat-parameter metadata (see [Note: FSDP1 full sizes])."""
        root = self.model if module is self.module and self.model is not None else module
        return flat_parameter_sizes(root, module, torch_fsdp().FullyShardedDataParallel)

    @override
    def local_weights_written(self) -> None:
        if self.model is not None:  # see [Note: FSDP1 keeps the root's gathered parameters]
            drop_gathered_copies(self.model, torch_fsdp().FullyShardedDataParallel)


def _check_fsdp_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The extra keyword arguments for ``FullyShardedDataParallel``, checked."""
    if "backward_prefetch" in kwargs:
        kwargs["backward_prefetch"] = parse_backward_prefetch(kwargs["backward_prefetch"])
    kwargs.setdefault("use_orig_params", True)
    for reserved in ("auto_wrap_policy", "param_init_fn", "device_id", "mixed_precision", "cpu_offload"):
        if reserved in kwargs:
            raise MisconfigurationError(
                f"{reserved} is set by FSDPStrategy itself; pass it as its FSDPStrategy argument instead "
                "(param_init_fn / device_id are chosen from empty_init and the Trainer's devices)."
            )
    return kwargs

"""FSDP2: torch's ``fully_shard``, each parameter a ``DTensor`` sharded across processes.

``FSDP2Strategy`` is ``FSDPStrategy``'s sibling over
:class:`~fullshard.strategies.sharded.ShardedStrategy`: it takes the same arguments where they
mean the same thing and goes through the same policy, plan and fast-init code; what differs is
how a unit is made (``fully_shard`` on a module, in place, instead of a
``FullyShardedDataParallel`` wrapper), the tensor-parallel plan it can apply first, and what its
state dict holds: ``DTensor`` shards, read without any communication, which is what makes
sharded checkpoints cheap and asynchronous saves possible (docs/fsdp/fsdp2.md).

[Note: FSDP2 units, bottom-up]
``fully_shard`` is applied to every module the auto-wrap policy selects, children before
parents, then to the root: each call makes one parameter group that is all-gathered before the
module's forward and resharded after it. The root's own parameters (embeddings, head) form the
last group. Activation checkpointing wraps its modules first; a selected module that ended up
inside a ``CheckpointWrapper`` is sharded through its wrapper, so the wrapper's forward (which
recomputes) runs inside the unit. With ``empty_init=True`` each unit is materialised just before
it is sharded (:class:`~fullshard.strategies.meta_init.MetaInit`), so a process never holds more
than its shards plus one unit's full tensors.
"""

from __future__ import annotations

import contextlib
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torch import nn
from typing_extensions import override

from fullshard.compile import CompileUnit
from fullshard.errors import MisconfigurationError
from fullshard.launch.stuck_ranks import DEFAULT_STUCK_RANK_TIMEOUT
from fullshard.precision import FSDP2Precision, Precision
from fullshard.strategies.auto_plan import check_plan_setting, settings_a_plan_replaces
from fullshard.strategies.dtensor_ops import DTensorSteps, register_step_methods
from fullshard.strategies.fsdp_options import (
    check_fsdp2_cpu_offload,
    check_fsdp2_mixed_precision,
    parse_fsdp2_sharding,
)
from fullshard.strategies.lightning_api import refuse_lightning_plugins
from fullshard.strategies.meta_init import MetaInit, ShardedMetaInit, user_init_of
from fullshard.strategies.parallel import DEFAULT_RANK_AGREEMENT_TIMEOUT, DEFAULT_TIMEOUT
from fullshard.strategies.parallel_layout import ParallelLayout
from fullshard.strategies.sharded import ShardedStrategy
from fullshard.strategies.step_args import step_arguments
from fullshard.strategies.tensor_parallel import (
    check_tensor_parallel,
    parallelize,
    refuse_compile_with_checkpointing,
    tensor_parallel_layout,
)
from fullshard.strategies.wrapping import fully_shard_model

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import OffloadPolicy

    from fullshard.strategies.registry import StrategyRegistry

_RESERVED = ("mesh", "reshard_after_forward", "mp_policy", "offload_policy")


class FSDP2Strategy(DTensorSteps, ShardedStrategy):
    """Fully Sharded Data Parallel with ``torch.distributed.fsdp.fully_shard`` (FSDP2).

    Args:
        sharding_strategy: ``"FULL_SHARD"`` (reshard after forward, default), ``"SHARD_GRAD_OP"``
            (keep gathered from forward to backward), ``"HYBRID_SHARD"`` (shard within a group,
            replicate across groups, over ``device_mesh``), ``"NO_SHARD"`` (replicate everywhere),
            any case; or an int: FULL_SHARD that reshards after forward to groups of that many
            processes (``reshard_after_forward=int``).
        cpu_offload: True keeps the sharded parameters, gradients and optimizer step in host
            memory (``CPUOffloadPolicy``) on CUDA; on CPU devices they are there already and
            the setting changes nothing. A ``CPUOffloadPolicy`` is passed as given.
        mixed_precision: a ``torch.distributed.fsdp.MixedPrecisionPolicy``, replacing what the
            Trainer's precision string would choose.
        async_save: with ``state_dict_type="sharded"``, ``save_checkpoint`` returns at once; the
            state is copied to host memory (the next optimizer step waits for the copy) and the
            files are written in the background (docs/checkpoints.md, "Asynchronous checkpoints").
        tensor_parallel_size: processes one layer is split over (tensor parallelism); 1, the
            default, splits none. With N > 1 the processes form a ``("data_parallel",
            "tensor_parallel")`` mesh of ``world_size / N`` x N: ``tp_plan`` is applied over the
            tensor-parallel sub-mesh, then the model is sharded as usual over the data-parallel
            one (docs/fsdp/2d-parallel.md).
        tp_plan: with ``tensor_parallel_size > 1``: a dict from module-name patterns (relative to the
            ``fullshard.Module``; ``*`` stands for one name part) to ``torch.distributed.tensor.parallel``
            styles or style strings (``"colwise"``, ``"rowwise"``, ...); or ``"auto"``: the plan of the
            Hugging Face model inside the module (docs/fsdp/tp-plans.md).
        auto_wrap_policy, activation_checkpointing_policy, state_dict_type, device_mesh,
            empty_init, cpu_mmap_threshold, compile, process_group_backend, timeout,
            start_method, rank_agreement_timeout, stuck_rank_timeout: as for
            :class:`~fullshard.strategies.sharded.ShardedStrategy` (and ``FSDPStrategy``).
        plan: ``"auto"``: before wrapping, predict each process's peak memory for each sharding,
            checkpointing and offload choice and apply the fastest that fits (docs/fsdp/plan.md;
            [Note: plan="auto"] in fullshard.planner.in_strategy); the choice replaces
            ``sharding_strategy``, ``auto_wrap_policy``, ``activation_checkpointing_policy`` and
            ``cpu_offload``, which stay at their defaults. ``plan_batch``: one batch as a process
            gets it (default: the module's ``example_input_array``); ``plan_device_memory``: bytes
            per process (``"16GiB"``), needed on CPU (CUDA: the device's free memory);
            ``plan_host_memory``: host memory of one machine (``"512GiB"``), which the rows that
            offload to the CPU must fit (None: not checked).
        **kwargs: passed to every ``fully_shard`` call (e.g. ``shard_placement_fn``).
    """

    strategy_name = "fsdp2"
    can_save_async = True

    def __init__(
        self,
        *,
        async_save: bool = False,
        tensor_parallel_size: int = 1,
        tp_plan: Any = None,
        auto_wrap_policy: Any = None,
        activation_checkpointing_policy: Any = None,
        sharding_strategy: Any = "FULL_SHARD",
        cpu_offload: bool | OffloadPolicy | None = None,
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
        plan: str | None = None,
        plan_batch: Any = None,
        plan_device_memory: int | str | None = None,
        plan_host_memory: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        # torch's FSDP is imported only to check torch objects given here: [Note: torch's FSDP
        # imported after launch] in fullshard.strategies.fsdp_options
        refuse_lightning_plugins("FSDP2Strategy", kwargs)
        name, self.reshard_after_forward = parse_fsdp2_sharding(sharding_strategy)
        self._cpu_offload = check_fsdp2_cpu_offload(cpu_offload)
        super().__init__(
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing_policy=activation_checkpointing_policy,
            sharding_name=name,
            mixed_precision=check_fsdp2_mixed_precision(mixed_precision),
            fsdp_kwargs=_check_fully_shard_kwargs(kwargs),
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
        #: processes each layer is split over by tensor parallelism before FSDP2 shards it
        self.tensor_parallel_size = check_tensor_parallel(tensor_parallel_size, tp_plan)
        self.tp_plan = tp_plan
        if self.tensor_parallel_size > 1:
            self._check_tensor_parallel_options()
        if not isinstance(async_save, bool):
            raise MisconfigurationError(f"async_save={async_save!r} must be True or False.")
        if async_save and self.state_dict_type != "sharded":
            raise MisconfigurationError(
                f"async_save=True writes sharded checkpoints in the background, but state_dict_type="
                f"{self.state_dict_type!r}: a full checkpoint is gathered and written by rank 0 and cannot be. "
                "Pass state_dict_type='sharded' with async_save=True, or async_save=False."
            )
        self.async_save = async_save

    def _check_tensor_parallel_options(self) -> None:
        """What tensor parallelism does not combine with (see [Note: FSDP2 with a tensor-parallel plan])."""
        if self._sharding_name in ("HYBRID_SHARD", "NO_SHARD") or self._mesh_setting is not None:
            raise MisconfigurationError(
                f"tensor_parallel_size={self.tensor_parallel_size} lays the processes out on a (data_parallel, "
                f"tensor_parallel) mesh itself, so sharding_strategy={self._sharding_name!r} and device_mesh= cannot "
                "choose another. Use FULL_SHARD or SHARD_GRAD_OP without device_mesh, or ModelParallelStrategy for "
                "a layout of your own."
            )

    @classmethod
    @override
    def register_strategies(cls, registry: StrategyRegistry) -> None:
        registry.register("fsdp2", cls, description="FSDP2 (fully_shard, DTensor parameters), CPU or CUDA.")
        registry.register(
            "fsdp2_cpu_offload",
            cls,
            description="FSDP2 with parameters, gradients and optimizer step offloaded to host memory.",
            cpu_offload=True,
        )
        registry.register(
            "fsdp_auto",
            cls,
            description="FSDP2 configured by the memory planner: the fastest sharding, checkpointing and offload "
            "that fit (docs/fsdp/plan.md).",
            plan="auto",
        )

    @override
    def _plannable_shardings(self) -> tuple[str, ...] | None:
        if self.tensor_parallel_size > 1:  # its 2-D mesh: see _check_tensor_parallel_options
            return ("FULL_SHARD", "SHARD_GRAD_OP")
        return super()._plannable_shardings()

    @override
    def _apply_candidate(self, candidate: Any) -> None:
        super()._apply_candidate(candidate)
        self.reshard_after_forward = candidate.sharding != "SHARD_GRAD_OP"
        self._cpu_offload = candidate.cpu_offload

    @property
    def cpu_offload(self) -> Any:
        """The ``torch.distributed.fsdp.OffloadPolicy`` each ``fully_shard`` call gets."""
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        if isinstance(self._cpu_offload, bool):
            return CPUOffloadPolicy() if self._cpu_offload else OffloadPolicy()
        return self._cpu_offload

    @property
    @override
    def offloads_params(self) -> bool:
        if isinstance(self._cpu_offload, bool):
            return self._cpu_offload
        from torch.distributed.fsdp import CPUOffloadPolicy

        return isinstance(self._cpu_offload, CPUOffloadPolicy)

    # ------------------------------------------------------------------------ configuration
    @override
    def make_precision(self, precision: Any, device_type: str) -> Precision:
        return FSDP2Precision(precision, device_type, self.mixed_precision)

    @override
    def configure(self, **kwargs: Any) -> None:
        super().configure(**kwargs)
        if self.tensor_parallel_size > 1:
            compiled = self.compile is not None and self.compile.enabled
            checkpointed = self.activation_checkpointing_policy is not None
            refuse_compile_with_checkpointing(checkpointed, compiled, "activation_checkpointing_policy")

    @override
    def _check_job(self) -> None:
        super()._check_job()
        if self.world_size % self.tensor_parallel_size:
            raise MisconfigurationError(
                f"tensor_parallel_size={self.tensor_parallel_size} does not divide the job's {self.world_size} "
                f"processes (num_nodes={self.num_nodes} x devices={self.num_processes}). Use a divisor of "
                f"{self.world_size}, such as the devices of one machine."
            )

    @override
    def layout_for(self, world_size: int) -> ParallelLayout:
        if self.tensor_parallel_size == 1:
            return super().layout_for(world_size)
        # ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size=N)'s layout: see
        # [Note: FSDP2 with a tensor-parallel plan]
        return tensor_parallel_layout(
            world_size,
            "auto",
            self.tensor_parallel_size,
            num_nodes=self.num_nodes if world_size == self.world_size else None,
            owner=f"FSDP2Strategy(tensor_parallel_size={self.tensor_parallel_size})",
        )

    @override
    def _make_mesh(self) -> DeviceMesh:
        """The layout's mesh (under tensor parallelism the 2-D ``("data_parallel",
        "tensor_parallel")`` one: FSDP2 shards over its ``"data_parallel"`` sub-mesh), or a
        ``DeviceMesh`` given as ``device_mesh=``."""
        if self._mesh_setting is None or isinstance(self._mesh_setting, tuple):
            return self.layout.build_mesh(self.root_device.type)
        return self._mesh_setting

    @override
    def model_sharded_context(self) -> contextlib.AbstractContextManager[Any]:
        """Nothing to enter: ``configure_model`` may call ``fully_shard(layer)`` itself, and the
        strategy then shards only the root around those layers."""
        return contextlib.nullcontext()

    # ----------------------------------------------------------------------- wrapping
    def _fully_shard_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.fsdp_kwargs)
        kwargs["mp_policy"] = self.precision.mixed_precision_config  # type: ignore[attr-defined]
        if self.root_device.type != "cpu":
            # On CPU the parameters are in host memory already, and torch's offload path needs an accelerator.
            kwargs["offload_policy"] = self.cpu_offload
        return kwargs

    @override
    def _unit_type(self) -> type:
        from torch.distributed.fsdp import FSDPModule

        return FSDPModule

    @override
    def _wrap(self, module: nn.Module) -> nn.Module:
        """Shard ``module`` in place, unit by unit (see [Note: FSDP2 units, bottom-up]), with
        :func:`~fullshard.strategies.wrapping.fully_shard_model` (the planner's wrapping too)."""
        from torch.distributed.fsdp import FSDPModule

        tp_mesh = self._mesh if self.tensor_parallel_size > 1 else None  # the 2-D mesh
        if tp_mesh is not None:  # see [Note: FSDP2 with a tensor-parallel plan]
            parallelize(module, tp_mesh["tensor_parallel"], self.tp_plan)
        manually_wrapped = self._manually_wrapped(module)
        auto_wrap, checkpointing, _, _ = self.resolve_policies(module)  # the plan raised the warnings
        if manually_wrapped and self.auto_wrap_policy is not None and self.is_global_zero:
            warnings.warn(
                "configure_model() already applied fully_shard to layers, so auto_wrap_policy is ignored (the "
                "model is not sharded twice). Remove one of the two.",
                stacklevel=3,
            )
        # under tensor parallelism the plan split the meta-device layers already, so they are
        # initialised once sharded: [Note: initialising a model sharded on the meta device]
        per_unit = self.empty_init and tp_mesh is None
        init = MetaInit(self.root_device, module, user_init_of(module)) if per_unit else None
        if not self.empty_init and any(t.is_meta for t in module.parameters()):
            raise MisconfigurationError(
                "The model has parameters on the meta device but FSDP2Strategy(empty_init=False) does not "
                "initialise them. Pass empty_init=True, or build the model without torch.device('meta')."
            )
        fully_shard_model(
            module,
            self.layout,
            self._mesh,
            auto_wrap=None if manually_wrapped else auto_wrap,
            checkpointing=checkpointing,
            reshard_after_forward=self.reshard_after_forward,
            init=init,
            **self._fully_shard_kwargs(),
        )
        if self.empty_init and not per_unit:
            ShardedMetaInit(
                module, self.root_device, user_init_of(module), "FSDP2Strategy(empty_init=True)"
            )()
        register_step_methods(module)
        inner = [m for m in module.modules() if isinstance(m, FSDPModule) and m is not module]
        self.compile_model(module, [CompileUnit(m) for m in inner if not _holds_unit(m)])
        return module

    # ---------------------------------------------------------------------------- steps
    @override
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        # the step methods were registered with FSDP2 (register_fsdp_forward_method): calling
        # one runs the root's all-gather and backward hooks around it, as a forward would
        model = self._require_model()
        args = step_arguments(model, "training_step", batch, batch_idx, ())
        with self.precision.forward_context():
            return model.training_step(*args)  # type: ignore[operator]

    @override
    def evaluation_step(self, method: str, batch: Any, batch_idx: int, *extra: Any) -> Any:
        model = self._require_model()
        args = step_arguments(model, method, batch, batch_idx, extra)
        with self.precision.forward_context():
            return getattr(model, method)(*args)


def _check_fully_shard_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The extra keyword arguments for ``fully_shard``, checked."""
    if "use_orig_params" in kwargs:
        raise MisconfigurationError(
            "use_orig_params is an FSDP1 option: FSDP2 always keeps the original parameters (as "
            "DTensors). Remove it, or use strategy='fsdp'."
        )
    for reserved in _RESERVED:
        if reserved in kwargs:
            raise MisconfigurationError(
                f"{reserved} is set by FSDP2Strategy itself: pass device_mesh=, sharding_strategy=, "
                "mixed_precision= or cpu_offload= instead."
            )
    return kwargs


def _holds_unit(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules() if m is not module)

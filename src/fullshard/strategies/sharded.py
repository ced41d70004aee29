"""What the two FSDP strategies share: ``FSDPStrategy`` (FSDP1, strategies/fsdp.py) and
``FSDP2Strategy`` (FSDP2, strategies/fsdp2.py) are siblings over :class:`ShardedStrategy`.

The base holds what means the same under both: the auto-wrap and activation-checkpointing
policies, the wrap plan, ``empty_init``, the checkpoint format, the CPU memory settings,
``compile=``, the parallel layout and its checks, and setting up a module (planning it, then
handing it to the sibling's ``_wrap``). Each sibling parses the options whose accepted forms
differ (``sharding_strategy``, ``cpu_offload``, ``mixed_precision``, the extra keyword
arguments), makes its units, and runs its steps.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import warnings
import weakref
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from fullshard.compile import parse_compile
from fullshard.errors import MisconfigurationError
from fullshard.launch.stuck_ranks import DEFAULT_STUCK_RANK_TIMEOUT
from fullshard.policies import (
    Policy,
    WrapPlan,
    build_wrap_plan,
    keep_tied_together,
    normalize_policy,
    resolve_policy,
)
from fullshard.strategies.auto_plan import planner
from fullshard.strategies.cpu_memory import check_mmap_threshold, request_huge_pages, set_up_cpu_memory
from fullshard.strategies.fsdp_options import HYBRID_NAMES, check_device_mesh, torch_fsdp
from fullshard.strategies.manual_steps import check_root_holds_nothing
from fullshard.strategies.module_aliases import add_alias_keys, detached, drop_alias_keys, find_aliases
from fullshard.strategies.parallel import (
    DEFAULT_RANK_AGREEMENT_TIMEOUT,
    DEFAULT_TIMEOUT,
    ParallelStrategy,
    refuse_optimizer_outside,
)
from fullshard.strategies.parallel_layout import ParallelLayout

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from fullshard.planner.config import Candidate
    from fullshard.planner.result import MemoryPlan
    from fullshard.strategies.auto_plan import AutoPlanSetting

log = logging.getLogger("fullshard")

# [Note: one sharding per module]
# FSDP wraps a module in place (its layers become FSDP units holding flat shards), so it cannot
# be wrapped again. A module that one Trainer's FSDP strategy sharded keeps that sharding when
# another Trainer in the same process runs it (fit, then a new Trainer for validate/test, as
# Lightning scripts do): the strategy reuses the wrapper instead of wrapping the wrapped layers.
_SHARDED: weakref.WeakKeyDictionary[nn.Module, tuple[nn.Module, dict[str, torch.Size], Any]] = (
    weakref.WeakKeyDictionary()
)


class ShardedStrategy(ParallelStrategy, abc.ABC):
    """Base of the FSDP strategies (:class:`~fullshard.strategies.FSDPStrategy`,
    :class:`~fullshard.strategies.FSDP2Strategy`): the arguments they share.

    Args:
        auto_wrap_policy: which submodules become FSDP units (see :mod:`fullshard.policies` for
            the accepted forms). None: one unit for the whole model, unless ``configure_model``
            sharded layers itself.
        activation_checkpointing_policy: which submodules recompute their activations in backward.
        sharding_name: the sharding strategy's name (``"FULL_SHARD"``, ...), parsed by the sibling.
        mixed_precision: torch's mixed-precision object of the sibling's FSDP, checked by it; None:
            the Trainer's precision string chooses.
        fsdp_kwargs: the extra keyword arguments for torch's FSDP, checked by the sibling.
        state_dict_type: checkpoint format, ``"full"`` (one file) or ``"sharded"`` (one directory).
        device_mesh: for HYBRID_SHARD: a ``(replicas, shard_size)`` tuple or a 2-D ``DeviceMesh``;
            by default ``(num_nodes, devices)``.
        empty_init: build ``configure_model``'s layers on the meta device and materialise them
            one FSDP unit at a time (``reset_parameters``, then shard), so a model bigger than one
            process's memory can be created.
        cpu_mmap_threshold: on CPU devices with glibc, allocations of at least this many bytes
            are mapped separately and returned to the system when freed, so gathered units do
            not stay resident (see [Note: CPU memory under FSDP]); None keeps glibc's adaptive
            default (faster, much more memory). Fresh mappings cost page faults, which
            transparent huge pages make cheap: with a threshold, the strategy asks torch for them
            when created (``THP_MEM_ALLOC_ENABLE=1``), and says once at setup when they are not
            in use.
        compile: ``torch.compile`` each FSDP unit's inner module in place, after wrapping (with no
            units, the module's ``forward``): True, False/None, or a dict of ``torch.compile``
            keyword arguments (docs/compile.md). The same as ``Trainer(compile=...)``; giving both
            with different values raises.
        process_group_backend, timeout, start_method, rank_agreement_timeout, stuck_rank_timeout: as for
            :class:`~fullshard.strategies.parallel.ParallelStrategy`.
    """

    shards_parameters = True

    def __init__(
        self,
        *,
        auto_wrap_policy: Any,
        activation_checkpointing_policy: Any,
        sharding_name: str,
        mixed_precision: Any,
        fsdp_kwargs: dict[str, Any],
        state_dict_type: str,
        device_mesh: tuple[int, int] | DeviceMesh | None,
        empty_init: bool,
        cpu_mmap_threshold: int | None,
        compile: bool | dict[str, Any] | None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        start_method: str = "popen",
        rank_agreement_timeout: timedelta = DEFAULT_RANK_AGREEMENT_TIMEOUT,
        stuck_rank_timeout: timedelta | None = DEFAULT_STUCK_RANK_TIMEOUT,
        plan: AutoPlanSetting | None = None,
    ) -> None:
        super().__init__(
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            state_dict_type=state_dict_type,
            rank_agreement_timeout=rank_agreement_timeout,
            stuck_rank_timeout=stuck_rank_timeout,
        )
        self.auto_wrap_policy: Policy | None = normalize_policy(auto_wrap_policy, "auto_wrap_policy")
        self.activation_checkpointing_policy: Policy | None = normalize_policy(
            activation_checkpointing_policy, "activation_checkpointing_policy"
        )
        self._sharding_name = sharding_name
        self.mixed_precision: Any = mixed_precision
        self.fsdp_kwargs = fsdp_kwargs
        self._mesh_setting = check_device_mesh(device_mesh)  # as given; the mesh in use is device_mesh
        self.empty_init = empty_init
        self.cpu_mmap_threshold = check_mmap_threshold(cpu_mmap_threshold)
        if cpu_mmap_threshold is not None:
            request_huge_pages()  # now, before the model's large tensors: [Note: CPU memory under FSDP]
        self._compile_setting = self.compile = parse_compile(compile, type(self).__name__)
        self.wrap_plan: WrapPlan | None = None
        self._mesh: DeviceMesh | None = None
        self._auto_plan = plan  # plan="auto": [Note: plan="auto"] in fullshard.planner.in_strategy
        #: with plan="auto", the planner's result on rank 0 (None elsewhere and without it)
        self.memory_plan: MemoryPlan | None = None

    @property
    def mixed_precision_config(self) -> Any:
        """The torch mixed-precision settings FSDP runs with (Lightning's
        ``FSDPStrategy.mixed_precision_config``): ``mixed_precision=`` when given, else the
        Trainer's precision string's row of the table in :class:`~fullshard.precision.FSDPPrecision`
        (FSDP1: a ``MixedPrecision``) or :class:`~fullshard.precision.FSDP2Precision` (FSDP2: a
        ``MixedPrecisionPolicy``). Before the Trainer configured the strategy: ``"32-true"``'s."""
        precision = self.precision
        if not hasattr(precision, "mixed_precision_config"):  # not configured yet
            precision = self.make_precision(precision.precision, precision.device_type)
        return precision.mixed_precision_config  # type: ignore[attr-defined]

    @property
    def kwargs(self) -> dict[str, Any]:
        """The extra keyword arguments every FSDP wrapping gets (Lightning's ``FSDPStrategy.kwargs``):
        the constructor's ``**kwargs``, with fullshard's defaults (``use_orig_params=True`` under FSDP1)."""
        return self.fsdp_kwargs

    @property
    def sharding_strategy(self) -> Any:
        """The ``torch.distributed.fsdp.ShardingStrategy`` in force (of that name, under FSDP2)."""
        return torch_fsdp().ShardingStrategy[self._sharding_name]

    @property
    def is_hybrid(self) -> bool:
        """True for the sharding strategies that shard within a group and replicate across groups."""
        return self._sharding_name in HYBRID_NAMES

    @property
    @abc.abstractmethod
    def offloads_params(self) -> bool:
        """Whether the sharded parameters are kept in host memory (the ``cpu_offload`` setting)."""

    @abc.abstractmethod
    def _unit_type(self) -> type:
        """The type of this FSDP's units (what ``configure_model`` shards by hand is one)."""

    @abc.abstractmethod
    def _make_mesh(self) -> DeviceMesh | None:
        """The device mesh to shard over, made once the process group is up (None: FSDP's default group)."""

    # ------------------------------------------------------------------------ the layout
    def _check_job(self) -> None:
        """Check the arguments against the job's size before :meth:`_make_layout` lays it out."""
        if self.world_size == 1 and self.root_device.type == "cpu":
            raise MisconfigurationError(
                f"strategy={self.strategy_name!r} with a single CPU process shards nothing. Use devices=2 or "
                "more (each a CPU process), or strategy='single_device' for one process."
            )
        if (
            self.is_global_zero  # the same on every rank: said once
            and self.is_hybrid
            and self._mesh_setting is None
            and self.num_nodes == 1
            and "process_group" not in self.fsdp_kwargs
        ):
            warnings.warn(
                "HYBRID_SHARD on one node shards within the node and has nothing to replicate across; "
                "pass device_mesh=(replicas, shard_size) to split the processes differently.",
                stacklevel=4,
            )
        shape = self._given_mesh_shape()
        if shape is not None and shape[0] * shape[1] != self.world_size:
            raise MisconfigurationError(
                f"device_mesh={shape} covers {shape[0] * shape[1]} processes, but the job has {self.world_size} "
                f"(num_nodes={self.num_nodes} x devices={self.num_processes}). Make replicas x shard_size equal "
                "the number of processes."
            )

    @override
    def _make_layout(self) -> ParallelLayout:
        self._check_job()
        return self.layout_for(self.world_size)

    def layout_for(self, world_size: int) -> ParallelLayout:
        """The layout of ``world_size`` processes under these settings (the job's, one planned ahead,
        or a simulated job's for the memory planner)."""
        if self._sharding_name == "NO_SHARD":  # replicate over every process, shard over none
            return ParallelLayout(replicas=world_size, shards=1, mesh_dims=("replicate", "shard"))
        shape = self._given_mesh_shape()
        if shape is not None:
            return ParallelLayout.split(world_size, replicas=shape[0], mesh_dims=("replicate", "shard"))
        if self.is_hybrid and "process_group" not in self.fsdp_kwargs:  # a replica per node
            return ParallelLayout.split(world_size, replicas=self.num_nodes, mesh_dims=("replicate", "shard"))
        return ParallelLayout.split(world_size)

    def _given_mesh_shape(self) -> tuple[int, int] | None:
        if self._mesh_setting is None or isinstance(self._mesh_setting, tuple):
            return self._mesh_setting
        return tuple(self._mesh_setting.shape)  # type: ignore[return-value]

    @property
    def shard_size(self) -> int:
        """How many processes FSDP shards one parameter over (within its tensor-parallel slice, if any)."""
        return self.layout.shards

    @property
    @override
    def device_mesh(self) -> DeviceMesh | None:
        """The mesh the model is sharded over once :meth:`setup_environment` ran (FSDP2 always has
        one; FSDP1 for HYBRID_SHARD); before that, a ``DeviceMesh`` given as ``device_mesh=``."""
        if self._mesh is not None:
            return self._mesh
        return None if isinstance(self._mesh_setting, tuple) else self._mesh_setting

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.root_device.type == "cpu":
            set_up_cpu_memory(self.cpu_mmap_threshold)
        if self._mesh is None:
            self._mesh = self._make_mesh()

    # ----------------------------------------------------------------------- planning
    @override
    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        if empty_init:  # the host builds on the meta device: fill it when sharding, as with empty_init=True
            self.empty_init = True
        return super().tensor_init_context(self.empty_init if empty_init is None else empty_init)

    def plan_wrapping(
        self, model: nn.Module, world_size: int | None = None, optimizer_states_per_param: int = 2
    ) -> WrapPlan:
        """The wrap plan for ``model``: units, checkpointed modules, memory estimate. No process group needed.
        (``plan`` is its older name; the memory planner is ``fullshard.plan`` and ``plan="auto"``.)

        Args:
            model: the unwrapped model (it may live on the meta device).
            world_size: processes to plan for (default: this strategy's world size).
            optimizer_states_per_param: float32 optimizer values per parameter (Adam/AdamW: 2, SGD with momentum: 1).
        """
        if world_size is None and self._layout is not None:
            layout = self._layout
        else:
            layout = self.layout_for(self.world_size if world_size is None else world_size)
        auto_wrap, checkpointing, found, notes = self.resolve_policies(model)
        plan = build_wrap_plan(
            model,
            auto_wrap,
            checkpointing,
            world_size=layout.world_size,
            shard_size=layout.shards,
            sharding_strategy=self._planned_sharding(layout),
            # a configured CPU run does not offload (see the siblings' kwargs); a plan made ahead is for the target
            cpu_offload=self.offloads_params
            and not (self.cluster_environment is not None and self.root_device.type == "cpu"),
            param_dtype=self.precision.param_dtype if self.mixed_precision is None else torch.float32,
            compute_dtype=self.precision.compute_dtype
            if self.mixed_precision is None
            else (self.mixed_precision.param_dtype or torch.float32),
            optimizer_states_per_param=optimizer_states_per_param,
            use_orig_params=bool(self.fsdp_kwargs.get("use_orig_params", True)),
            tensor_parallel_size=layout.tensor_parallel,
        )
        plan.warnings[:0] = found
        plan.notes[:0] = notes
        if plan.sharding_strategy != self._sharding_name:
            plan.notes.append(
                f"sharding_strategy={self._sharding_name!r} runs as {plan.sharding_strategy} with "
                f"{layout.shards} process(es) to shard over (torch's FSDP1 has nothing to split)"
            )
        return plan

    plan = plan_wrapping  # the older name, kept: docs/fsdp/plan.md, "Which plan is which"

    def _planned_sharding(self, layout: ParallelLayout) -> str:
        """The sharding torch will run for ``layout`` (the one asked for, unless the engine changes it)."""
        return self._sharding_name

    def resolve_policies(self, model: nn.Module) -> tuple[Policy | None, Policy | None, list[str], list[str]]:
        """Both policies resolved against ``model`` (the auto-wrap one keeping tied parameters in
        one unit), the warnings that raised (not emitted), and the wrap plan's notes on ties: what
        the wrapping (the strategy's, and the memory planner's simulation of it) selects."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            auto_wrap = resolve_policy(self.auto_wrap_policy, model)
            checkpointing = resolve_policy(self.activation_checkpointing_policy, model)
        auto_wrap, notes = keep_tied_together(auto_wrap, model)
        return auto_wrap, checkpointing, [str(w.message) for w in caught], notes

    def _plan_automatically(self, module: nn.Module) -> None:
        """Run the planner and apply its choice (see [Note: plan="auto"] in fullshard.planner.in_strategy)."""
        assert self._auto_plan is not None
        candidate, self.memory_plan = planner()(
            self._auto_plan,
            module,
            engine=self.strategy_name,
            devices=self.num_processes,
            num_nodes=self.num_nodes,
            device_type=self.root_device.type,
            precision=str(self.precision.precision),
            is_global_zero=self.is_global_zero,
            broadcast=self.broadcast,
            shardings=self._plannable_shardings(),
        )
        self._apply_candidate(candidate)

    def _plannable_shardings(self) -> tuple[str, ...] | None:
        """The shardings ``plan="auto"`` may choose: all (None), unless the layout was fixed by hand
        (``device_mesh=``, ``process_group=``), which HYBRID_SHARD and NO_SHARD would lay out anew."""
        if self._mesh_setting is not None or "process_group" in self.fsdp_kwargs:
            return ("FULL_SHARD", "SHARD_GRAD_OP")
        return None

    def _apply_candidate(self, candidate: Candidate) -> None:
        """Take the planner's choice: sharding, wrapped blocks, checkpointing, offload; lay the job
        out again where the sharding does so differently ([Note: plan="auto"] in fullshard.planner.in_strategy)."""
        kwargs = candidate.strategy_kwargs()
        self.auto_wrap_policy = normalize_policy(kwargs["auto_wrap_policy"], "auto_wrap_policy")
        self.activation_checkpointing_policy = normalize_policy(
            kwargs.get("activation_checkpointing_policy"), "activation_checkpointing_policy"
        )
        self._sharding_name = candidate.sharding
        if self._layout is None:  # not configured by a Trainer yet: the layout is made with the choice
            return
        layout = self.layout_for(self.world_size)
        if layout != self._layout:
            # every rank applies the same choice, so every rank makes the new mesh's groups together
            self._layout = layout
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                self._mesh = self._make_mesh()

    def _manually_wrapped(self, module: nn.Module) -> bool:
        """Whether ``configure_model`` sharded layers of ``module`` itself."""
        unit_type = self._unit_type()
        return any(isinstance(m, unit_type) for m in module.modules())

    # ----------------------------------------------------------------------- the model
    @override
    def setup_module(self, module: nn.Module) -> nn.Module:
        if module is self.module and self.model is not None:  # validate() after fit(): already sharded
            return self.model
        sharded = _SHARDED.get(module)
        if sharded is not None:  # sharded by another Trainer's strategy in this process: reuse it
            self.module, self.model, self._param_shapes, self.wrap_plan = module, *sharded
            return sharded[0]
        module = self.convert_sync_batchnorm(module)
        module = self.precision.convert_module(module)
        if not any(t.is_meta for t in module.parameters()):
            module = module.to(self.root_device)
        manually_wrapped = self._manually_wrapped(module)
        # Full shapes, to check checkpoints against without gathering; with layers sharded by
        # hand they are read at load time instead.
        self._param_shapes = {} if manually_wrapped else _full_shapes(module)
        if self._auto_plan is not None and not manually_wrapped:
            self._plan_automatically(module)
        self.wrap_plan = self.plan_wrapping(module)
        if self.wrap_plan.errors:
            raise MisconfigurationError(
                "FSDP cannot wrap this model as planned:\n- " + "\n- ".join(self.wrap_plan.errors)
            )
        if self.is_global_zero:  # every rank plans the same model alike: say it once
            for message in self.wrap_plan.warnings:
                warnings.warn(message, stacklevel=2)
            if self.memory_plan is not None and self.memory_plan.choice is not None:
                self.wrap_plan.notes.append(self.memory_plan.choice.summary())
            else:
                self.wrap_plan.notes.append(
                    "the estimate leaves out activations: plan='auto' (or fullshard.plan, `fullshard plan`) "
                    "predicts the whole peak (docs/fsdp/plan.md)"
                )
            log.info(self.wrap_plan.summary())
        self.module = module
        self.model = self._wrap(module)
        _SHARDED[module] = (self.model, self._param_shapes, self.wrap_plan)
        return self.model

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        refuse_optimizer_outside(
            self._require_model(),
            optimizer,
            "FSDP-wrapped",
            "after sharding. Do not build them in __init__ or before fit()",
        )
        return optimizer

    @override
    def set_manual_optimization(self, enabled: bool) -> None:
        """Refuse a root unit that holds parameters: see [Note: FSDP under manual optimization]
        in fullshard.strategies.manual_steps."""
        super().set_manual_optimization(enabled)
        if enabled:
            check_root_holds_nothing(self._require_model(), self._unit_type(), type(self).__name__)

    # ------------------------------------------------------------------------- checkpoints
    @override
    def get_state(
        self, optimizers: Sequence[Optimizer], *, full: bool, to_load: bool = False, to_save: bool = False
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        aliases = find_aliases(self._require_model(), self._unit_type())
        with detached(aliases):  # see [Note: a module wrapped by hand and kept under its old name]
            model_state, optimizer_states = super().get_state(
                optimizers, full=full, to_load=to_load, to_save=to_save
            )
        return add_alias_keys(model_state, aliases), optimizer_states

    @override
    def set_state(
        self,
        model_state: dict[str, Any],
        optimizer_states: Sequence[dict[str, Any]],
        optimizers: Sequence[Optimizer],
        *,
        full: bool,
        from_rank0: bool,
        strict: bool = True,
    ) -> None:
        aliases = find_aliases(self._require_model(), self._unit_type())
        with detached(aliases):
            super().set_state(
                drop_alias_keys(model_state, aliases),
                optimizer_states,
                optimizers,
                full=full,
                from_rank0=from_rank0,
                strict=strict,
            )

    @override
    def set_optimizer_states(
        self,
        optimizer_states: Sequence[dict[str, Any]],
        optimizers: Sequence[Optimizer],
        *,
        full: bool,
        from_rank0: bool,
    ) -> None:
        with detached(find_aliases(self._require_model(), self._unit_type())):
            super().set_optimizer_states(optimizer_states, optimizers, full=full, from_rank0=from_rank0)

    @override
    def full_shapes(self) -> dict[str, torch.Size]:
        if not self._param_shapes:  # sharded by hand before we saw it: gather once to learn them
            full = self.get_state((), full=True)[0]
            self._param_shapes = {k: v.shape for k, v in full.items() if isinstance(v, torch.Tensor)}
        return self._param_shapes


def _full_shapes(module: nn.Module) -> dict[str, torch.Size]:
    """Full tensor shapes of ``module``'s state (meta tensors included), before any sharding."""
    return {k: v.shape for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}

"""FullyShardedDataParallel: parameters, gradients and optimizer state sharded across processes."""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from fullshard.compile import fsdp_units, parse_compile
from fullshard.errors import MisconfigurationError
from fullshard.launch.stuck_ranks import DEFAULT_STUCK_RANK_TIMEOUT
from fullshard.policies import (
    Policy,
    WrapPlan,
    build_plan,
    keep_tied_together,
    normalize_policy,
    resolve_policy,
)
from fullshard.precision import FSDPPrecision, Precision
from fullshard.strategies.cpu_memory import check_mmap_threshold, request_huge_pages, set_up_cpu_memory
from fullshard.strategies.flat_params import flat_parameter_sizes
from fullshard.strategies.fsdp_options import (
    parse_backward_prefetch,
    parse_cpu_offload,
    sharding_name,
    torch_fsdp,
)
from fullshard.strategies.manual_steps import (
    check_root_holds_nothing,
    clip_sharded_gradients,
    finish_backward,
    inside_forward,
    no_sync_in_step_error,
)
from fullshard.strategies.meta_init import MetaInit, user_init_of
from fullshard.strategies.module_aliases import add_alias_keys, detached, drop_alias_keys, find_aliases
from fullshard.strategies.parallel import (
    DEFAULT_RANK_AGREEMENT_TIMEOUT,
    DEFAULT_TIMEOUT,
    ParallelStrategy,
    refuse_optimizer_outside,
)
from fullshard.strategies.parameter_sizes import ParameterSize

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffload

    from fullshard.strategies.registry import StrategyRegistry

log = logging.getLogger("fullshard")

# [Note: one sharding per module]
# FSDP wraps a module in place (its layers become FSDP units holding flat shards), so it cannot
# be wrapped again. A module that one Trainer's FSDP strategy sharded keeps that sharding when
# another Trainer in the same process runs it (fit, then a new Trainer for validate/test, as
# Lightning scripts do): the strategy reuses the wrapper instead of wrapping the wrapped layers.
_SHARDED: weakref.WeakKeyDictionary[nn.Module, tuple[nn.Module, dict[str, torch.Size], Any]] = (
    weakref.WeakKeyDictionary()
)


class FSDPStrategy(ParallelStrategy):
    """Fully Sharded Data Parallel training with ``torch.distributed.fsdp.FullyShardedDataParallel``.

    Args:
        auto_wrap_policy: which submodules become FSDP units (see :mod:`fullshard.policies` for
            the accepted forms). None: one unit for the whole model, unless ``configure_model``
            wrapped layers itself with ``torch.distributed.fsdp.wrap.wrap``.
        activation_checkpointing_policy: which submodules recompute their activations in backward.
        sharding_strategy: ``"FULL_SHARD"`` (default), ``"SHARD_GRAD_OP"``, ``"NO_SHARD"``,
            ``"HYBRID_SHARD"`` (any case) or a ``ShardingStrategy``.
        cpu_offload: keep sharded parameters (and gradients, optimizer state) in host memory:
            True, False or a ``CPUOffload``. On CPU devices they are there already and the
            setting changes nothing.
        mixed_precision: a ``torch.distributed.fsdp.MixedPrecision``; replaces what the Trainer's
            precision string would choose.
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
        **kwargs: passed to ``FullyShardedDataParallel`` (``limit_all_gathers``, ``forward_prefetch``,
            ``backward_prefetch``, ``sync_module_states``, ``process_group``, ...).
            ``use_orig_params`` defaults to True, so optimizers may use ``self.parameters()`` and
            several parameter groups.
    """

    strategy_name = "fsdp"
    #: processes each layer is split over by tensor parallelism before FSDP shards it: FSDP1 has
    #: none; ``FSDP2Strategy(tensor_parallel_size=N)`` sets it
    tensor_parallel_size: int = 1

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
        **kwargs: Any,
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
        self._set_sharding_options(sharding_strategy, cpu_offload, mixed_precision)
        if device_mesh is not None and not isinstance(device_mesh, tuple):
            from torch.distributed.device_mesh import DeviceMesh

            if not isinstance(device_mesh, DeviceMesh):
                raise TypeError(
                    f"device_mesh must be a (replicas, shard_size) tuple or a DeviceMesh, got {type(device_mesh).__name__}."
                )
        if isinstance(device_mesh, tuple) and (
            len(device_mesh) != 2 or not all(isinstance(d, int) and d > 0 for d in device_mesh)
        ):
            raise MisconfigurationError(
                f"device_mesh={device_mesh!r} must be a tuple of two positive ints: (replicas, shard_size)."
            )
        self._mesh_setting = device_mesh  # as given; the DeviceMesh in use is device_mesh
        self.empty_init = empty_init
        self.cpu_mmap_threshold = check_mmap_threshold(cpu_mmap_threshold)
        if cpu_mmap_threshold is not None:
            request_huge_pages()  # now, before the model's large tensors: [Note: CPU memory under FSDP]
        self._compile_setting = self.compile = parse_compile(compile, type(self).__name__)
        self.fsdp_kwargs = self._check_fsdp_kwargs(kwargs)
        self.wrap_plan: WrapPlan | None = None
        self._mesh: DeviceMesh | None = None

    def _set_sharding_options(self, sharding_strategy: Any, cpu_offload: Any, mixed_precision: Any) -> None:
        """Check and keep the options whose accepted forms differ between FSDP1 and FSDP2.

        [Note: torch's FSDP imported after launch]
        The strategy is built in the user's process before the other processes start, so
        importing torch's FSDP here (0.7 s, it pulls in DTensor) would be paid once before the
        launch and once more in every started process, one after the other. Plain values (a
        sharding name, a bool) are checked without it; torch objects are checked against their
        types only when given (their owner imported them already).
        """
        self._sharding_name = sharding_name(sharding_strategy)
        # FSDP1's CPUOffload / MixedPrecision here; FSDP2's OffloadPolicy / MixedPrecisionPolicy there
        self._cpu_offload: Any = (
            bool(cpu_offload)
            if cpu_offload is None or isinstance(cpu_offload, bool)
            else parse_cpu_offload(cpu_offload)
        )
        if mixed_precision is not None:
            from torch.distributed.fsdp import MixedPrecision

            if not isinstance(mixed_precision, MixedPrecision):
                raise TypeError(
                    f"mixed_precision must be a torch.distributed.fsdp.MixedPrecision, got {type(mixed_precision).__name__}. "
                    "For the common settings pass Trainer(precision='bf16-mixed') instead."
                )
        self.mixed_precision: Any = mixed_precision

    @property
    def sharding_strategy(self) -> Any:
        """The ``torch.distributed.fsdp.ShardingStrategy`` in force."""
        return torch_fsdp().ShardingStrategy[self._sharding_name]

    @property
    def cpu_offload(self) -> Any:
        """The ``torch.distributed.fsdp.CPUOffload`` in force."""
        return parse_cpu_offload(self._cpu_offload)

    def _check_fsdp_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
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

    @property
    def offloads_params(self) -> bool:
        """Whether the sharded parameters are kept in host memory (the ``cpu_offload`` setting)."""
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

    # ------------------------------------------------------------------------ configuration
    @override
    def make_precision(self, precision: Any, device_type: str) -> Precision:
        return FSDPPrecision(precision, device_type, self.mixed_precision)

    @override
    def configure(self, **kwargs: Any) -> None:
        super().configure(**kwargs)
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
                stacklevel=2,
            )
        shape = self._mesh_shape()
        if shape is not None and shape[0] * shape[1] != self.world_size:
            raise MisconfigurationError(
                f"device_mesh={shape} covers {shape[0] * shape[1]} processes, but the job has {self.world_size} "
                f"(num_nodes={self.num_nodes} x devices={self.num_processes}). Make replicas x shard_size equal "
                "the number of processes."
            )

    @property
    def is_hybrid(self) -> bool:
        """True for the sharding strategies that shard within a group and replicate across groups."""
        return self._sharding_name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")

    def _mesh_shape(self) -> tuple[int, int] | None:
        if isinstance(self._mesh_setting, tuple):
            return self._mesh_setting
        if self._mesh_setting is not None:
            return tuple(self._mesh_setting.shape)  # type: ignore[return-value]
        if self.is_hybrid and "process_group" not in self.fsdp_kwargs:
            return (self.num_nodes, self.num_processes)
        return None

    @property
    @override
    def device_mesh(self) -> DeviceMesh | None:
        """The mesh the model is sharded over once :meth:`setup_environment` ran (FSDP2 always has
        one; FSDP1 for HYBRID_SHARD); before that, a ``DeviceMesh`` given as ``device_mesh=``."""
        if self._mesh is not None:
            return self._mesh
        return None if isinstance(self._mesh_setting, tuple) else self._mesh_setting

    @property
    def shard_size(self) -> int:
        """How many processes FSDP shards one parameter over (within its tensor-parallel slice, if any)."""
        if self._sharding_name == "NO_SHARD":
            return 1
        shape = self._mesh_shape()
        return shape[1] if shape is not None else self.world_size // self.tensor_parallel_size

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.root_device.type == "cpu":
            set_up_cpu_memory(self.cpu_mmap_threshold)
        shape = self._mesh_shape()
        if self.is_hybrid and shape is not None and self._mesh is None:
            if isinstance(self._mesh_setting, tuple) or self._mesh_setting is None:
                from torch.distributed.device_mesh import init_device_mesh

                self._mesh = init_device_mesh(
                    self.root_device.type, shape, mesh_dim_names=("replicate", "shard")
                )
            else:
                self._mesh = self._mesh_setting

    # ----------------------------------------------------------------------- wrapping
    def _fsdp_kwargs(self, root: nn.Module | None = None) -> dict[str, Any]:
        """FSDP's arguments; ``root``: the model being wrapped (None inside ``configure_model``)."""
        kwargs = dict(self.fsdp_kwargs)
        kwargs["sharding_strategy"] = self.sharding_strategy
        kwargs["mixed_precision"] = self.precision.mixed_precision_config  # type: ignore[attr-defined]
        kwargs["device_id"] = self.root_device
        if self.root_device.type != "cpu":
            # On CPU the parameters are in host memory already, and torch's offload path needs an accelerator.
            kwargs["cpu_offload"] = self.cpu_offload
        if self._mesh is not None:
            kwargs["device_mesh"] = self._mesh
        if self.empty_init:
            kwargs["param_init_fn"] = MetaInit(self.root_device, root, user_init_of(root))
        return kwargs

    @override
    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        return super().tensor_init_context(self.empty_init if empty_init is None else empty_init)

    @override
    def model_sharded_context(self) -> contextlib.AbstractContextManager[Any]:
        """Inside ``configure_model``, ``torch.distributed.fsdp.wrap.wrap(layer)`` shards at once."""
        from torch.distributed.fsdp.wrap import enable_wrap

        return enable_wrap(wrapper_cls=torch_fsdp().FullyShardedDataParallel, **self._fsdp_kwargs())

    def plan(
        self, model: nn.Module, world_size: int | None = None, optimizer_states_per_param: int = 2
    ) -> WrapPlan:
        """The wrap plan for ``model``: units, checkpointed modules, memory estimate. No process group needed.

        Args:
            model: the unwrapped model (it may live on the meta device).
            world_size: processes to plan for (default: this strategy's world size).
            optimizer_states_per_param: float32 optimizer values per parameter (Adam/AdamW: 2, SGD with momentum: 1).
        """
        world = world_size if world_size is not None else self.world_size
        tp = self.tensor_parallel_size
        shard = (
            self.shard_size
            if world_size is None
            else (
                1
                if self._sharding_name == "NO_SHARD"
                else (world // (self._mesh_shape() or (1, world))[0] if self.is_hybrid else world // tp)
            )
        )
        auto_wrap, checkpointing, found, notes = self._resolve_policies(model)
        plan = build_plan(
            model,
            auto_wrap,
            checkpointing,
            world_size=world,
            shard_size=shard,
            sharding_strategy=self._sharding_name,
            # a configured CPU run does not offload (see _fsdp_kwargs); a plan made ahead is for the target
            cpu_offload=self.offloads_params
            and not (self.cluster_environment is not None and self.root_device.type == "cpu"),
            param_dtype=self.precision.param_dtype if self.mixed_precision is None else torch.float32,
            compute_dtype=self.precision.compute_dtype
            if self.mixed_precision is None
            else (self.mixed_precision.param_dtype or torch.float32),
            optimizer_states_per_param=optimizer_states_per_param,
            use_orig_params=bool(self.fsdp_kwargs.get("use_orig_params", True)),
            tensor_parallel_size=tp,
        )
        plan.warnings[:0] = found
        plan.notes[:0] = notes
        return plan

    def _resolve_policies(
        self, model: nn.Module
    ) -> tuple[Policy | None, Policy | None, list[str], list[str]]:
        """Both policies resolved against ``model`` (the auto-wrap one keeping tied parameters in
        one unit), the warnings that raised (not emitted), and the plan's notes on ties."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            auto_wrap = resolve_policy(self.auto_wrap_policy, model)
            checkpointing = resolve_policy(self.activation_checkpointing_policy, model)
        auto_wrap, notes = keep_tied_together(auto_wrap, model)
        return auto_wrap, checkpointing, [str(w.message) for w in caught], notes

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
        # Full shapes, to check checkpoints against without gathering; with manual wrap()
        # the layers are sharded already and the shapes are read at load time instead.
        self._param_shapes = {} if manually_wrapped else _full_shapes(module)
        self.wrap_plan = self.plan(module)
        if self.wrap_plan.errors:
            raise MisconfigurationError(
                "FSDP cannot wrap this model as planned:\n- " + "\n- ".join(self.wrap_plan.errors)
            )
        if self.is_global_zero:  # every rank plans the same model alike: say it once
            for message in self.wrap_plan.warnings:
                warnings.warn(message, stacklevel=2)
            log.info(self.wrap_plan.summary())
        self.module = module
        self.model = self._wrap(module)
        _SHARDED[module] = (self.model, self._param_shapes, self.wrap_plan)
        return self.model

    def _manually_wrapped(self, module: nn.Module) -> bool:
        """Whether ``configure_model`` sharded layers of ``module`` itself (``wrap()``)."""
        return any(isinstance(m, torch_fsdp().FullyShardedDataParallel) for m in module.modules())

    @override
    def _wrap(self, module: nn.Module) -> nn.Module:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        fsdp_class = torch_fsdp().FullyShardedDataParallel
        kwargs = self._fsdp_kwargs(module)
        manually_wrapped = any(isinstance(m, fsdp_class) for m in module.modules())
        auto_wrap, checkpointing, _, _ = self._resolve_policies(module)  # the plan raised the warnings
        if manually_wrapped:
            auto_wrap = None
        if manually_wrapped and self.auto_wrap_policy is not None and self.is_global_zero:
            warnings.warn(
                "configure_model() already wrapped layers with FSDP, so auto_wrap_policy is ignored (the "
                "model is not wrapped twice). Remove one of the two.",
                stacklevel=3,
            )
        if auto_wrap is not None:
            kwargs["auto_wrap_policy"] = auto_wrap.torch_policy()
        wrapped = fsdp_class(module, **kwargs)
        if checkpointing is not None:
            wrapper = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            if checkpointing.classes:
                classes = tuple(checkpointing.classes)
                apply_activation_checkpointing(
                    wrapped, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, classes)
                )
            else:
                apply_activation_checkpointing(
                    wrapped, checkpoint_wrapper_fn=wrapper, auto_wrap_policy=checkpointing.torch_policy()
                )
        self.compile_model(module, fsdp_units(wrapped), root=wrapped)  # see [Note: where compile happens]
        return wrapped  # type: ignore[no-any-return]

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        refuse_optimizer_outside(
            self._require_model(),
            optimizer,
            "FSDP-wrapped",
            "after sharding. Do not build them in __init__ or before fit()",
        )
        return optimizer

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
    def set_manual_optimization(self, enabled: bool) -> None:
        """Refuse a root unit that holds parameters: see [Note: FSDP under manual optimization]
        in fullshard.strategies.manual_steps."""
        super().set_manual_optimization(enabled)
        if enabled:
            check_root_holds_nothing(self._require_model(), self._unit_type(), type(self).__name__)

    def _unit_type(self) -> type:
        return torch_fsdp().FullyShardedDataParallel  # type: ignore[no-any-return]

    @override
    def backward(
        self, loss: torch.Tensor, *args: Any, backward: Callable[..., Any] | None = None, **kwargs: Any
    ) -> None:
        super().backward(loss, *args, backward=backward, **kwargs)
        model = self.model
        if self.manual_optimization and isinstance(model, torch_fsdp().FullyShardedDataParallel):
            finish_backward(model)

    @override
    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        model = self._require_model()
        if enabled and isinstance(model, torch_fsdp().FullyShardedDataParallel):
            if inside_forward(model):  # manual optimization: see [Note: FSDP under manual optimization]
                raise no_sync_in_step_error()
            return model.no_sync()  # type: ignore[no-any-return]
        return contextlib.nullcontext()

    # ------------------------------------------------------------------------- checkpoints
    @override
    def get_state(
        self, optimizers: Sequence[Optimizer], *, full: bool, to_load: bool = False
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        aliases = find_aliases(self._require_model(), torch_fsdp().FullyShardedDataParallel)
        with detached(aliases):  # see [Note: a module wrapped by hand and kept under its old name]
            model_state, optimizer_states = super().get_state(optimizers, full=full, to_load=to_load)
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
        aliases = find_aliases(self._require_model(), torch_fsdp().FullyShardedDataParallel)
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
    def full_shapes(self) -> dict[str, torch.Size]:
        if not self._param_shapes:  # manual wrap(): sharded before we saw it, gather once to learn them
            full = self.get_state((), full=True)[0]
            self._param_shapes = {k: v.shape for k, v in full.items() if isinstance(v, torch.Tensor)}
        return self._param_shapes

    @override
    def parameter_sizes(self, module: nn.Module) -> list[ParameterSize]:
        """Full sizes read from FSDP's flat-parameter metadata (see [Note: FSDP1 full sizes])."""
        root = self.model if module is self.module and self.model is not None else module
        return flat_parameter_sizes(root, module, torch_fsdp().FullyShardedDataParallel)


def _full_shapes(module: nn.Module) -> dict[str, torch.Size]:
    """Full tensor shapes of ``module``'s state (meta tensors included), before any sharding."""
    return {k: v.shape for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}

"""2D parallelism: tensor parallelism and FSDP2 on one ``("data_parallel", "tensor_parallel")`` mesh.

``ModelParallelStrategy`` takes Lightning's arguments and works as Lightning's does: it starts
the processes, builds the 2-D ``DeviceMesh`` and hands it to the user's ``configure_model`` as
``self.device_mesh``, where the user parallelises the layers (``parallelize_module`` over
``self.device_mesh["tensor_parallel"]``, ``fully_shard`` over ``self.device_mesh["data_parallel"]``).
The strategy wraps nothing itself; it checks that the model came out sharded, and then trains,
clips, reduces, logs and checkpoints it on that mesh (docs/fsdp/2d-parallel.md).
``FSDP2Strategy(tensor_parallel_size=T, tp_plan=...)`` is the preset of this path where the
strategy parallelises the model itself, with the same layout function, mesh and step code:
[Note: FSDP2 with a tensor-parallel plan] in fullshard.strategies.tensor_parallel.

[Note: the 2-D mesh layout]
Ranks fill the mesh row by row: rank ``r`` is data replica ``r // tp`` and tensor-parallel rank
``r % tp``. With ``tp`` processes per machine, one tensor-parallel group is one machine, so the
per-layer all-gathers and reduce-scatters of tensor parallelism stay on the fast links inside it,
and only FSDP's traffic (once per layer group and step) crosses machines. "auto" chooses exactly
that: ``tensor_parallel_size`` = processes per machine, ``data_parallel_size`` = machines.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.launch.stuck_ranks import DEFAULT_STUCK_RANK_TIMEOUT
from fullshard.policies import WrapPlan, build_wrap_plan
from fullshard.strategies.cpu_memory import check_mmap_threshold, request_huge_pages, set_up_cpu_memory
from fullshard.strategies.dtensor_ops import DTensorSteps, register_step_methods
from fullshard.strategies.meta_init import ShardedMetaInit, user_init_of
from fullshard.strategies.parallel import (
    DEFAULT_RANK_AGREEMENT_TIMEOUT,
    DEFAULT_TIMEOUT,
    ParallelStrategy,
    refuse_optimizer_outside,
)
from fullshard.strategies.parallel_layout import ParallelLayout
from fullshard.strategies.tensor_parallel import (
    check_mesh_size,
    refuse_compile_with_checkpointing,
    tensor_parallel_layout,
)

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.optim import Optimizer

    from fullshard.strategies.registry import StrategyRegistry

log = logging.getLogger("fullshard")


class ModelParallelStrategy(DTensorSteps, ParallelStrategy):
    """Tensor parallelism and FSDP2 together, applied by the user in ``configure_model`` over
    :attr:`device_mesh` (Lightning's ``ModelParallelStrategy``; its arguments mean the same).

    Args:
        data_parallel_size: processes in one tensor-parallel slice's data-parallel group, i.e. the
            number of data replicas; ``"auto"``: the number of machines (``num_nodes``), or the
            processes left over when ``tensor_parallel_size`` is given.
        tensor_parallel_size: processes one layer is split over; ``"auto"``: the processes per
            machine, or those left over when ``data_parallel_size`` is given. Their product must
            be the number of processes.
        save_distributed_checkpoint: True writes sharded checkpoints (a directory, a file per
            process, loadable at any layout); False gathers full ones (one file, written by rank 0).
        process_group_backend, timeout: as for
            :class:`~fullshard.strategies.parallel.ParallelStrategy` (default: "gloo" on CPU,
            "nccl" on CUDA; 30 minutes).
        async_save: with ``save_distributed_checkpoint=True``, checkpoints are written in the
            background (docs/checkpoints.md, "Asynchronous checkpoints").
        compile: ``torch.compile`` the module's forward after setup (as ``Trainer(compile=...)``).
        cpu_mmap_threshold: on CPU, FSDP's gathered units are mapped afresh and returned when
            freed, as under ``FSDPStrategy`` ([Note: CPU memory under FSDP]); None keeps glibc's
            adaptive default.
        start_method, rank_agreement_timeout, stuck_rank_timeout: as for
            :class:`~fullshard.strategies.parallel.ParallelStrategy`.
    """

    strategy_name = "model_parallel"
    can_save_async = True
    shards_parameters = True

    def __init__(
        self,
        data_parallel_size: int | Literal["auto"] = "auto",
        tensor_parallel_size: int | Literal["auto"] = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        *,
        async_save: bool = False,
        compile: bool | dict[str, Any] | None = None,
        cpu_mmap_threshold: int | None = 128 * 1024,
        start_method: str = "popen",
        rank_agreement_timeout: timedelta = DEFAULT_RANK_AGREEMENT_TIMEOUT,
        stuck_rank_timeout: timedelta | None = DEFAULT_STUCK_RANK_TIMEOUT,
    ) -> None:
        from fullshard.compile import parse_compile

        if not isinstance(save_distributed_checkpoint, bool):
            raise MisconfigurationError(
                f"save_distributed_checkpoint={save_distributed_checkpoint!r} must be True (sharded checkpoints) "
                "or False (full checkpoints, one file)."
            )
        if not isinstance(async_save, bool):
            raise MisconfigurationError(f"async_save={async_save!r} must be True or False.")
        if async_save and not save_distributed_checkpoint:
            raise MisconfigurationError(
                "async_save=True writes sharded checkpoints in the background, but save_distributed_checkpoint="
                "False asks for full ones, which rank 0 gathers and writes itself. Pass "
                "save_distributed_checkpoint=True with async_save=True, or async_save=False."
            )
        super().__init__(
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            state_dict_type="sharded" if save_distributed_checkpoint else "full",
            rank_agreement_timeout=rank_agreement_timeout,
            stuck_rank_timeout=stuck_rank_timeout,
        )
        self._data_parallel_setting = check_mesh_size("data_parallel_size", data_parallel_size)
        self._tensor_parallel_setting = check_mesh_size("tensor_parallel_size", tensor_parallel_size)
        self.save_distributed_checkpoint = save_distributed_checkpoint
        self.async_save = async_save
        self._compile_setting = self.compile = parse_compile(compile, type(self).__name__)
        self.cpu_mmap_threshold = check_mmap_threshold(cpu_mmap_threshold)
        if self.cpu_mmap_threshold is not None:
            request_huge_pages()  # now, before the model's large tensors: [Note: CPU memory under FSDP]
        self._mesh: DeviceMesh | None = None
        self.wrap_plan: WrapPlan | None = None  # the layout configure_model made: see layout_plan()

    @classmethod
    @override
    def register_strategies(cls, registry: StrategyRegistry) -> None:
        registry.register(
            "model_parallel",
            cls,
            description="Tensor parallel + FSDP2 on a 2-D device mesh, applied in configure_model (CPU or CUDA).",
        )

    # ------------------------------------------------------------------------ configuration
    @override
    def _make_layout(self) -> ParallelLayout:
        """The ``(data parallel, tensor parallel)`` layout of this job; see [Note: the 2-D mesh layout]."""
        given = f"data_parallel_size={self._data_parallel_setting!r}, tensor_parallel_size={self._tensor_parallel_setting!r}"
        return tensor_parallel_layout(
            self.world_size,
            self._data_parallel_setting,
            self._tensor_parallel_setting,
            num_nodes=self.num_nodes,
            owner=f"ModelParallelStrategy({given})",
        )

    @property
    def tensor_parallel_size(self) -> int:
        """Processes one layer is split over (known once the host configured the strategy)."""
        return self.layout.tensor_parallel

    @property
    @override
    def device_mesh(self) -> DeviceMesh:
        """The 2-D ``("data_parallel", "tensor_parallel")`` mesh, from :meth:`setup_environment` on;
        before that a ``RuntimeError``, as in Lightning (there is no mesh before the processes)."""
        if self._mesh is None:
            raise RuntimeError(
                "ModelParallelStrategy.device_mesh is built once the processes started: read it from "
                "configure_model() or a later hook (self.device_mesh), not before fit()/validate()/test()/predict()."
            )
        return self._mesh

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.root_device.type == "cpu":
            set_up_cpu_memory(self.cpu_mmap_threshold)
        if self._mesh is None:
            self._mesh = self.layout.build_mesh(self.root_device.type)

    # ----------------------------------------------------------------------- the model
    @override
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Check that ``configure_model`` parallelised ``module`` over :attr:`device_mesh`, and
        run it as it is: the strategy wraps nothing itself."""
        if module is self.module and self.model is not None:  # validate() after fit()
            return self.model
        self._check_sharded(module)
        # layers configure_model built on the meta device and split: [Note: initialising a model
        # sharded on the meta device]
        ShardedMetaInit(module, self.root_device, user_init_of(module), "ModelParallelStrategy")()
        module = self.precision.convert_module(module)  # "-true": layers built outside configure_model
        self.wrap_plan = self.layout_plan(module)
        if self.tensor_parallel_size > 1:
            refuse_compile_with_checkpointing(
                bool(self.wrap_plan.checkpointed),
                self.compile is not None and self.compile.enabled,
                "checkpoint_wrapper in configure_model",
            )
        if self.is_global_zero:
            log.info(self.wrap_plan.summary())
        if self.root_device.type != "cpu":
            module = module.to(self.root_device)  # layers configure_model left on the host
        from torch.distributed.fsdp import FSDPModule

        if isinstance(module, FSDPModule):
            register_step_methods(module)
        self._param_shapes = {
            k: v.shape for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)
        }
        self.module = self.model = module
        self.compile_model(module)
        return module

    def layout_plan(self, module: nn.Module, optimizer_states_per_param: int = 2) -> WrapPlan:
        """The units ``configure_model`` sharded with ``fully_shard``, the modules it wrapped in
        ``checkpoint_wrapper``, and the per-process memory estimate of that layout, as
        :meth:`FSDPStrategy.plan <fullshard.strategies.FSDPStrategy.plan>` gives them for the
        layout the strategy makes (every parameter counted as split over the tensor-parallel group,
        and gathered in the dtype it is stored in). Reads sizes only: no communication.

        Args:
            module: the model after ``configure_model``.
            optimizer_states_per_param: float32 optimizer values per parameter (Adam/AdamW: 2, SGD with momentum: 1).
        """
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
        from torch.distributed.fsdp import FSDPModule

        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
        sharded = any(isinstance(m, FSDPModule) for m in module.modules())  # else tensor parallel only
        plan = build_wrap_plan(
            module,
            None,
            None,
            world_size=self.layout.world_size,
            shard_size=self.layout.shards if sharded else 1,
            sharding_strategy="FULL_SHARD" if sharded else "NO_SHARD",
            cpu_offload=False,
            param_dtype=dtype,
            compute_dtype=dtype,
            optimizer_states_per_param=optimizer_states_per_param,
            tensor_parallel_size=self.layout.tensor_parallel,
        )
        checkpointed = [name for name, m in module.named_modules() if isinstance(m, CheckpointWrapper)]
        note = "the layout configure_model made (ModelParallelStrategy wraps nothing itself)"
        return dataclasses.replace(plan, checkpointed=checkpointed, notes=[note, *plan.notes])

    def _check_sharded(self, module: nn.Module) -> None:
        """Refuse a model that ``configure_model`` left unparallelised, or whose replicas would
        never exchange gradients (a parameter outside every ``fully_shard`` with several replicas)."""
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.tensor import DTensor

        name = type(module).__name__
        if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
            raise MisconfigurationError(
                f"{name} holds torch.distributed.fsdp.FullyShardedDataParallel (FSDP1) modules; ModelParallelStrategy "
                "works with FSDP2 only. In configure_model use torch.distributed.fsdp.fully_shard(layer, "
                "mesh=self.device_mesh['data_parallel']), or train with strategy='fsdp'."
            )
        params = dict(module.named_parameters())
        if self.world_size > 1 and params and not any(isinstance(p, DTensor) for p in params.values()):
            raise MisconfigurationError(
                f"ModelParallelStrategy does not shard models itself, and configure_model() of {name} left every "
                "parameter a plain tensor. In configure_model apply parallelize_module(layer, "
                "self.device_mesh['tensor_parallel'], plan) and fully_shard(layer, mesh=self.device_mesh['data_parallel']) "
                "(docs/fsdp/2d-parallel.md), or use strategy='fsdp2', which shards the model for you."
            )
        if self.data_parallel_size > 1:
            unsynced = [
                n
                for n, p in params.items()
                if not (isinstance(p, DTensor) and "data_parallel" in (p.device_mesh.mesh_dim_names or ()))
            ]
            if unsynced:
                listed = ", ".join(unsynced[:5]) + (
                    f" and {len(unsynced) - 5} more" if len(unsynced) > 5 else ""
                )
                raise MisconfigurationError(
                    f"{len(unsynced)} parameter(s) of {name} are not sharded over the data-parallel mesh ({listed}), so "
                    f"the {self.data_parallel_size} data replicas would never exchange their gradients and would drift "
                    "apart. In configure_model apply fully_shard(model, mesh=self.device_mesh['data_parallel']) to the "
                    "root module as well (after its layers)."
                )

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        refuse_optimizer_outside(self._require_model(), optimizer, "parallelised", "after configure_model()")
        return optimizer

    @override
    def __repr__(self) -> str:
        layout = self._layout
        sizes = f"{layout.data_parallel_size}x{layout.tensor_parallel}" if layout else "not configured"
        return f"ModelParallelStrategy(mesh={sizes}, devices={[str(d) for d in self.devices]}, precision={self.precision})"

"""The Strategy contract: what a host (the Trainer) calls, in this order.

1. :meth:`Strategy.configure` (by the host, once it knows devices, nodes, environment, precision)
   and :meth:`Strategy.setup_environment`: ranks, device and process group.
2. :meth:`Strategy.tensor_init_context` and :meth:`Strategy.model_sharded_context`, entered
   around ``Module.configure_model()``.
3. :meth:`Strategy.setup_module`: wrap the module (DDP, FSDP, ...), apply precision, then
   ``compile=`` (:meth:`Strategy.compile_model`).
4. :meth:`Strategy.setup_optimizer`: validate optimizers built after wrapping.
5. Per step: :meth:`training_step`, :meth:`backward`, :meth:`clip_gradients_norm`,
   :meth:`optimizer_step`, and :meth:`no_backward_sync` for gradient accumulation.
6. Collectives: :meth:`barrier`, :meth:`broadcast`, :meth:`all_reduce` (and
   :meth:`all_reduce_data_parallel`, over the data replicas only), :meth:`all_gather_object`,
   :meth:`gather_object`.
7. Checkpoints: the model and optimizer states (:meth:`get_state`, :meth:`set_state`,
   :meth:`full_shapes`), which a :class:`~fullshard.checkpoint.checkpointer.Checkpointer` saves
   and loads (the host's, :attr:`checkpointer`); :meth:`save_checkpoint` and
   :meth:`load_checkpoint` go through it, or without a host through one of the strategy's own.
8. :meth:`teardown`.

A strategy knows nothing of loops or callbacks, so another host can drive it the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.batch_transfer import Transfer, move_data_to_device, resolve_transfer
from fullshard.compile import CompileConfig, CompileUnit, apply_compile, resolve_compile
from fullshard.errors import MisconfigurationError
from fullshard.precision import Precision
from fullshard.strategies.forward_redirection import redirected_call
from fullshard.strategies.lightning_api import LightningStrategyAPI
from fullshard.strategies.optimizer_state import load_optimizer_states, optimizer_states
from fullshard.strategies.parameter_sizes import ParameterSize, unsharded_parameter_sizes
from fullshard.strategies.state_dict_options import state_dict_options
from fullshard.strategies.step_args import step_arguments

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.device_mesh import DeviceMesh

    from fullshard.checkpoint.checkpointer import Checkpointer
    from fullshard.launch import ClusterEnvironment, Launcher
    from fullshard.strategies.registry import StrategyRegistry

T = TypeVar("T")
NULL_CONTEXT: contextlib.nullcontext[None] = contextlib.nullcontext()  # stateless: one shared instance
STATE_DICT_TYPES = ("full", "sharded")
ReduceOp = Literal["sum", "mean", "max", "min"]


class Strategy(LightningStrategyAPI):
    """Base class of every strategy: where a model runs and how its training step is carried out.

    Lightning's names for what it does (``precision_plugin``, ``lightning_module_state_dict``,
    ``optimizer_state``, ...) come from :class:`~fullshard.strategies.lightning_api.LightningStrategyAPI`.
    """

    strategy_name: ClassVar[str] = ""
    #: Write sharded checkpoints in the background (set by the strategies that can:
    #: ``FSDP2Strategy(async_save=True)``; see fullshard.checkpoint.async_save).
    async_save: bool = False
    #: The strategy can write its sharded checkpoints in the background (``async_save=True``).
    can_save_async: ClassVar[bool] = False
    #: Saves and loads the states this strategy provides and owns the save being written in the
    #: background: the host's (the Trainer connects its CheckpointManager's), else the strategy's
    #: own, made by the first save_checkpoint/load_checkpoint without a Trainer.
    checkpointer: Checkpointer | None = None
    #: Set by the host for each ``fit``: the module steps its optimizers itself (Lightning's manual
    #: optimization), calling :meth:`backward` inside its training step, possibly several times.
    manual_optimization: bool = False
    #: The parameters are split over the processes: the host never runs a forward on one alone.
    shards_parameters: ClassVar[bool] = False
    #: One process per device (DDP, FSDP, model parallel; Lightning's ``ParallelStrategy``): the
    #: sampler the host adds shuffles the training data, even with one process (see
    #: [Note: the training sampler's order] in fullshard.trainer.data).
    one_process_per_device: ClassVar[bool] = False
    #: Runs in this process alone: the host refuses a job of several devices.
    runs_in_one_process: ClassVar[bool] = False

    def __init__(self, *, state_dict_type: str = "full") -> None:
        if state_dict_type not in STATE_DICT_TYPES:
            raise MisconfigurationError(
                f"state_dict_type={state_dict_type!r} is not supported. Use 'full' (one checkpoint file) or "
                "'sharded' (one directory with a file per process)."
            )
        self.state_dict_type = state_dict_type
        self.devices: list[torch.device] = [torch.device("cpu")]
        self.num_nodes = 1
        self.cluster_environment: ClusterEnvironment | None = None
        self.precision = Precision("32-true")
        self.module: nn.Module | None = None  # the user's module, unwrapped
        self.model: nn.Module | None = None  # what forward runs through (possibly wrapped)
        self._param_shapes: dict[str, torch.Size] = {}
        self._root_device: torch.device | None = None  # fixed once setup_environment ran
        # compile=: what this strategy's own constructor was given, and what is in force once the
        # host's setting is known (configure); see fullshard/compile.py
        self._compile_setting: CompileConfig | None = None
        self.compile: CompileConfig | None = None
        self._batch_passthrough = False  # CPU and no input casting: batch_to_device has nothing to do
        # Trainer(sync_batchnorm=True): BatchNorm layers synchronised across processes (setup_module)
        self.sync_batchnorm = False

    # ----------------------------------------------------------------- configuration by the host
    def configure(
        self,
        *,
        devices: list[torch.device],
        num_nodes: int,
        cluster_environment: ClusterEnvironment,
        precision: Any,
        compile: CompileConfig | None = None,
    ) -> None:
        """Called by the host once it has resolved devices, nodes, cluster environment, precision and
        ``compile=`` (:func:`fullshard.compile.parse_compile`; it must agree with the strategy's own)."""
        self.devices = devices
        self.num_nodes = num_nodes
        self.cluster_environment = cluster_environment
        self.precision = self.make_precision(precision, devices[0].type)
        self.compile = resolve_compile(compile, self._compile_setting, type(self).__name__)

    def make_precision(self, precision: Any, device_type: str) -> Precision:
        """Build this strategy's precision object from a precision string."""
        return Precision(precision, device_type)

    @classmethod
    def register_strategies(cls, registry: StrategyRegistry) -> None:
        """Register the names this class answers to. Subclasses override."""

    # ----------------------------------------------------------------------------- topology
    @property
    def launcher(self) -> Launcher | None:
        """Starts the processes of the job; None when the host should call fit directly."""
        return None

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def root_device(self) -> torch.device:
        """The device this process computes on."""
        if self._root_device is not None:
            return self._root_device
        return self.devices[self.local_rank % len(self.devices)]

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The ``torch.distributed.device_mesh.DeviceMesh`` the model is laid out on, once
        :meth:`setup_environment` built it; None for strategies that use none."""
        return None

    @property
    def data_parallel_rank(self) -> int:
        """Which data replica this process is: the part of each global batch it reads.

        [Note: data-parallel ranks]
        Under data parallelism alone (DDP, FSDP) every process is a replica of its own, so this is
        :attr:`global_rank` and :attr:`data_parallel_size` is :attr:`world_size`. Under tensor
        parallelism the processes of one tensor-parallel group hold parts of one replica and must
        see the same batch: the host splits data, and reduces what is logged across replicas,
        by these two properties, never by the global rank and world size.
        """
        return self.global_rank

    @property
    def data_parallel_size(self) -> int:
        """How many data replicas the job has (see [Note: data-parallel ranks])."""
        return self.world_size

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """How the host should split a map-style dataset: ``num_replicas`` and ``rank``, one part
        per data replica (see [Note: data-parallel ranks])."""
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    def setup_environment(self) -> None:
        """Prepare the device (and, for distributed strategies, the process group)."""
        self._root_device = None
        self._root_device = self.root_device  # ranks are known now; the hot path reads the cache
        self._batch_passthrough = self._root_device.type == "cpu" and (
            self.precision.is_mixed or self.precision.compute_dtype == torch.float32
        )
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)

    # ---------------------------------------------------------------------- model and optimizer
    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        """Context in which the host builds the model: right device and dtype from the start."""
        stack = contextlib.ExitStack()
        if empty_init:  # see [Note: exact meta-device initialisation]
            from fullshard.strategies.meta_init import parameters_on_meta

            stack.enter_context(parameters_on_meta())
        if self.root_device.type != "cpu":
            stack.enter_context(self.root_device)
        stack.enter_context(self.precision.module_init_context())
        return stack

    def model_sharded_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context for ``configure_model()`` in which manual wrapping applies (FSDP); no-op here."""
        return contextlib.nullcontext()

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Move ``module`` to the device, apply precision and wrap it; returns what forward runs through.

        Setting up the module this strategy already wrapped (``validate`` after ``fit``) returns the
        existing wrapper instead of wrapping twice.
        """
        if module is self.module and self.model is not None:
            return self.model
        if any(p.is_meta for p in module.parameters()):  # built in Trainer.init_module(empty_init=True)
            from fullshard.strategies.meta_init import MetaInit, user_init_of

            MetaInit(self.root_device, module, user_init_of(module))(module)
        module = self.convert_sync_batchnorm(module)
        module = self.precision.convert_module(module).to(self.root_device)
        self._param_shapes = {
            k: v.shape for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)
        }
        self.module = module
        self.model = self._wrap(module)
        self.compile_model(module)
        return self.model

    def convert_sync_batchnorm(self, module: nn.Module) -> nn.Module:
        """With :attr:`sync_batchnorm` and several processes, ``module`` with its BatchNorm layers
        synchronised across them (before wrapping; see fullshard/strategies/sync_batchnorm.py)."""
        if not self.sync_batchnorm or self.world_size == 1:
            return module
        from fullshard.strategies.sync_batchnorm import convert_sync_batchnorm

        return convert_sync_batchnorm(module, self.root_device)

    def compile_model(
        self, module: nn.Module, units: Sequence[CompileUnit] = (), root: nn.Module | None = None
    ) -> None:
        """Apply :attr:`compile` in this (launched) process, after wrapping: ``units`` (FSDP's) in
        place, else ``module``'s forward (``root``: an FSDP root around it). See [Note: where
        compile happens] in fullshard/compile.py."""
        apply_compile(module, self.compile, units, root)

    def _wrap(self, module: nn.Module) -> nn.Module:
        """Wrap the module (DDP, FSDP, ...). Identity by default."""
        return module

    def set_manual_optimization(self, enabled: bool) -> None:
        """Called by the host at the start of each ``fit``: whether the module steps its optimizers
        itself (Lightning's manual optimization), calling :meth:`backward` inside its training step.

        Raises:
            MisconfigurationError: this strategy cannot run the module that way (see FSDPStrategy).
        """
        self.manual_optimization = enabled
        self.precision.start_fit(manual=enabled)

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Check (and, for some strategies, adapt) an optimizer created after :meth:`setup_module`."""
        return optimizer

    def local_weights_written(self) -> None:
        """The host wrote into this process's share of the weights: the next forward must see it."""

    # --------------------------------------------------------------------------------- steps
    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.setup_module() must be called before running steps.")
        return self.model

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Run the user's ``training_step`` through the wrapper, in the precision's context."""
        model = self._require_model()
        args = step_arguments(self.module, "training_step", batch, batch_idx, ())
        with self.precision.forward_context():
            if model is self.module:
                return model.training_step(*args)  # type: ignore[operator]
            return redirected_call(model, self.module, "training_step", *args)  # type: ignore[arg-type]

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Run the user's ``validation_step`` through the wrapper, in the precision's context."""
        return self.evaluation_step("validation_step", batch, batch_idx)

    def evaluation_step(self, method: str, batch: Any, batch_idx: int, *extra: Any) -> Any:
        """Run the user's ``validation_step``, ``test_step`` or ``predict_step`` (``method``)
        through the wrapper, in the precision's context."""
        model = self._require_model()
        args = step_arguments(self.module, method, batch, batch_idx, extra)
        with self.precision.forward_context():
            if model is self.module:
                return getattr(model, method)(*args)
            return redirected_call(model, self.module, method, *args)  # type: ignore[arg-type]

    def backward(
        self, loss: torch.Tensor, *args: Any, backward: Callable[..., Any] | None = None, **kwargs: Any
    ) -> None:
        """Backpropagate ``loss`` (scaled under "16-mixed"); ``args`` and ``kwargs`` go to
        ``Tensor.backward``. ``backward``: called with the (scaled) loss instead of
        ``loss.backward`` (the module's ``backward`` hook, when it overrides it)."""
        if backward is None:
            self.precision.backward(loss, *args, **kwargs)
        else:
            backward(self.precision.scale_loss(loss), *args, **kwargs)

    def clip_gradients_norm(
        self, optimizer: Optimizer, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradients of ``optimizer``'s parameters to a total norm of ``max_norm``.

        Returns the total norm before clipping.
        """
        self.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    def clip_gradients(self, optimizer: Optimizer, clip_val: float, algorithm: str = "norm") -> None:
        """Clip ``optimizer``'s gradients to a total norm (``algorithm="norm"``, see
        :meth:`clip_gradients_norm`) or to a value per element (``"value"``), unscaled first; nothing
        without a backward pass since its last step ([Note: a window with no gradients] in precision.py)."""
        if not self.precision.has_new_gradients(optimizer):
            return
        if algorithm == "norm":
            self.clip_gradients_norm(optimizer, clip_val)
            return
        self.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_value_(params, clip_val)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling before gradients are inspected or clipped."""
        self.precision.unscale_gradients(optimizer)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> bool:
        """Step ``optimizer`` (``kwargs`` go to its ``step``); False when the grad scaler skipped the step."""
        return self.precision.optimizer_step(optimizer, **kwargs)

    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """Context skipping gradient synchronisation (all micro-batches but the last one)."""
        return NULL_CONTEXT

    def batch_to_device(
        self,
        batch: Any,
        device: torch.device | None = None,
        dataloader_idx: int = 0,
        transfer: Transfer = "module",
    ) -> Any:
        """``batch`` on ``device`` (default :attr:`root_device`), cast for "-true" precisions, after ``transfer``."""
        transfer = resolve_transfer(transfer, self.module)  # see fullshard.batch_transfer.Transfer
        if transfer is not None:
            batch = transfer(batch, device or self.root_device, dataloader_idx)
        elif self._batch_passthrough and device is None:
            return batch
        elif (device := device or self.root_device).type != "cpu":
            batch = move_data_to_device(batch, device)
        if transfer is not None and self._batch_passthrough:
            return batch
        return self.precision.convert_input(batch)

    # --------------------------------------------------------------------------- collectives
    def barrier(self, name: str | None = None) -> None:
        """Wait until every process reaches this point."""

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Send a picklable object from rank ``src`` to all ranks."""
        return obj

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        """Reduce ``tensor`` over all processes (returns a new tensor)."""
        return tensor

    def all_reduce_data_parallel(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        """Reduce ``tensor`` over the data replicas only (``sync_dist`` logging): the processes of
        one replica hold the same value, which must count once (see [Note: data-parallel ranks])."""
        return self.all_reduce(tensor, op)

    def all_gather_object(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order."""
        return [obj]

    def gather_object(self, obj: T) -> list[T] | None:
        """Every rank's ``obj``, in rank order, on global rank 0; None on the other ranks (which
        receive nothing, unlike :meth:`all_gather_object`)."""
        return [obj]

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a decision across ranks: all of them (``all=True``) or any of them."""
        return decision

    def all_gather(self, tensor: torch.Tensor, sync_grads: bool = False) -> torch.Tensor:
        """Every rank's ``tensor`` stacked along a new first dimension (of size world size).

        ``sync_grads``: let gradients flow back through the gather.
        """
        import torch.distributed as dist

        if self.world_size == 1 or not dist.is_initialized():
            return tensor.unsqueeze(0)
        tensor = tensor.contiguous()
        if sync_grads:
            from torch.distributed.nn.functional import all_gather as differentiable_all_gather

            return torch.stack(differentiable_all_gather(tensor))
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor)
        return torch.stack(gathered)

    def key_value_store(self) -> Any:
        """The process group's key-value store (a ``torch.distributed.Store``), for agreements
        that must not be collectives; None with one process."""
        return None

    def check_rank_agreement(self, event: str, key: str, detail: str) -> None:
        """Called by the host on a rank that does something its peers must do too, at the same
        point: a ``training_step`` that returned None, or run out of data.

        Multi-process strategies wait (briefly) for every rank to report the same ``event`` and
        ``key``, and raise :class:`~fullshard.errors.RankDivergenceError` naming the ranks that
        did and did not, instead of leaving the others blocked in a collective. Nothing to check
        with one process.
        """

    # ----------------------------------------------------------------------------- checkpoints
    def get_state(
        self, optimizers: Sequence[Optimizer], *, full: bool, to_load: bool = False, to_save: bool = False
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Model and optimizer states keyed by the module's own parameter names.

        ``full``: whole tensors (gathered under FSDP) rather than each rank's shards; with
        ``to_save``, a sharded model's on CUDA on rank 0 only, in host memory (the other ranks get
        empty states: [Note: full saves gathered off the GPU] in strategies/state_dict_options.py).
        ``to_load``: the states are a template that a sharded load reads into, so an optimizer that
        has not stepped yet gets torch's initial state (every tensor a saved one may hold); to save,
        such an optimizer's state is empty (see [Note: unstepped optimizers] in
        fullshard/strategies/optimizer_state.py).
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        model = self._require_model()
        options = self._state_dict_options(full=full, to_save=to_save and not to_load)
        model_state = get_model_state_dict(model, options=options)
        return model_state, optimizer_states(model, optimizers, options, to_load=to_load)

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
        """Load states produced by :meth:`get_state`. With ``from_rank0`` only rank 0 passes data,
        which is broadcast to the other ranks piece by piece (each rank keeps only its shards).
        ``strict=False``: ``model_state`` may hold part of the model's keys; the rest stays."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        model = self._require_model()
        options = replace(self._state_dict_options(full=full), broadcast_from_rank0=from_rank0, strict=strict)
        set_model_state_dict(model, model_state, options=options)
        broadcast = self.broadcast if from_rank0 else None
        load_optimizer_states(model, optimizer_states, optimizers, options, broadcast)

    def set_optimizer_states(
        self,
        optimizer_states: Sequence[dict[str, Any]],
        optimizers: Sequence[Optimizer],
        *,
        full: bool,
        from_rank0: bool,
    ) -> None:
        """Load the optimizers' part of :meth:`set_state` alone (the model's state is in place)."""
        model = self._require_model()
        options = replace(self._state_dict_options(full=full), broadcast_from_rank0=from_rank0)
        broadcast = self.broadcast if from_rank0 else None
        load_optimizer_states(model, optimizer_states, optimizers, options, broadcast)

    def _state_dict_options(self, *, full: bool, to_save: bool = False) -> StateDictOptions:
        device = self.root_device.type
        return state_dict_options(
            full=full, device_type=device, sharded=self.shards_parameters, to_save=to_save
        )

    def module_state_dict(self) -> dict[str, Any]:
        """The model's full state dict, with the user's key names (no wrapper prefixes). Collective."""
        return self.get_state((), full=True)[0]

    def full_shapes(self) -> dict[str, torch.Size]:
        """Full (unsharded) shapes of the model's state, to check checkpoints against."""
        return self._param_shapes

    def parameter_sizes(self, module: nn.Module) -> list[ParameterSize]:
        """Each parameter of ``module`` (set up by this strategy) with its full size and this
        process's share, for the model summary. Reads metadata only: no communication.

        Strategies that shard parameters override this, so that a sharded model is counted whole.
        """
        return unsharded_parameter_sizes(module)

    def own_checkpointer(self) -> Checkpointer:
        """What saves and loads this strategy's checkpoints (:meth:`save_checkpoint`,
        :meth:`load_checkpoint`): the host's, else (no Trainer) one of its own, made now."""
        if self.checkpointer is None:
            from fullshard.checkpoint.checkpointer import Checkpointer

            self.checkpointer = Checkpointer(self, timeout=getattr(self, "timeout", None))
        return self.checkpointer

    def on_exception(self, exception: BaseException) -> None:
        """Called by the host when a run fails in this process, before the error propagates."""

    def teardown(self) -> None:
        """Release what :meth:`setup_environment` and :meth:`setup_module` took."""
        self.model = None
        self.module = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(devices={[str(d) for d in self.devices]}, precision={self.precision})"

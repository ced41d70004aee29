"""One training step of one candidate, on rank 0 of a simulated job, on fake tensors.

[Note: how a candidate is simulated]
A copy of the user's model is made on the meta device (no parameter memory), cast as the
precision asks, then, inside ``FakeTensorMode`` and the fake process group of the job's size, over
the mesh of the layout the candidate's strategy makes for the job, sharded by the strategy's own
wrapping (``fully_shard_model``, with the policies the strategy built from the candidate resolves):
activation checkpointing wrappers first, then ``fully_shard`` on each selected block, children
first, then on the root.
Its tensors are then made (fake: shapes only), the optimizer built from ``configure_optimizers``,
and a training step run through the user's own ``training_step`` under the precision's
autocast, watched by torch's ``FSDPMemTracker`` (the peak, split by kind). FLOPs are counted by
``FlopCounterMode`` in an untracked step before that (where asked): it cannot watch the tracked
step, as it keeps checkpointed activations alive (torch 2.13). The tracked step is a second
step, in the Trainer's (and Lightning's) order: forward, ``zero_grad``, backward, optimizer
step, so the gradients of the step before are alive through forward and the optimizer's state
exists. The first step is not run: each parameter is given a zero gradient of its own and the
optimizer steps on those (``_as_after_a_step``), which leaves the same tensors a first step
leaves, at a fraction of its cost. Optimizers run their for-loop step (``foreach=False``):
torch 2.13's tracker over-counts the foreach and fused steps on fake tensors.

That is FSDP2's simulation; an FSDP1 candidate (engine ``"fsdp"``) is simulated as FSDP1, by
FSDP1's own wrapping (``wrap_fsdp1``) and a tracker of its own, as [Note: how an FSDP1 candidate
is simulated] in fullshard.planner.simulate_fsdp1 says: torch (2.13) has no tracker for FSDP1
(``FSDPMemTracker`` follows ``fully_shard``'s parameter groups only, and the generic
``MemTracker`` stops at the first forward with ``use_orig_params=True``).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from fullshard.errors import MisconfigurationError
from fullshard.planner import data_dependent, torch_tools
from fullshard.planner.config import Candidate
from fullshard.planner.data_dependent import Recording

if TYPE_CHECKING:
    from fullshard.strategies.parallel_layout import ParallelLayout


@dataclass(frozen=True)
class Simulated:
    """What one simulated step measured on rank 0 (bytes; FLOPs per step, one process)."""

    peak: int
    split: dict[str, int]
    offloadable: dict[str, int]  # of the peak, what CPU offload keeps in host memory, by category
    forward_flops: int  # of the counted step's forward; 0 where not counted
    backward_flops: int  # of its backward (the recomputed forward of checkpointed blocks included)
    param_numel: int
    block_forward_flops: int = 0  # of the forward, those inside the wrapped blocks
    counted_every: int = 0  # the checkpointing period of the step whose FLOPs were counted
    #: the peak of each phase (forward, backward, optimizer step): [Note: a peak per phase]
    phases: tuple[torch_tools.Phase, ...] = ()
    extended_from: tuple[int, ...] = ()  # the blocks per list simulated, where extended to the model's


def meta_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are on the meta device (nothing allocated)."""
    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        meta = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = (
            nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
        )
    trainer = getattr(module, "_trainer", None)
    if trainer is not None:
        memo[id(trainer)] = None  # the copy does not belong to a Trainer
    copied = copy.deepcopy(module, memo)
    for name in ("log", "log_dict"):  # no Trainer to log to while planning: logging does nothing
        if callable(getattr(copied, name, None)):
            setattr(copied, name, _no_log)
    configure = getattr(copied, "configure_model", None)
    if callable(configure):  # a fullshard.Module may build its layers here: on the meta device too
        with torch.device("meta"):
            configure()
    return copied


def _shard(
    model: nn.Module, candidate: Candidate, layout: ParallelLayout, mesh: Any, mp_policy: Any
) -> list[str]:
    """Shard ``model`` as the candidate's strategy shards it: its policies, resolved as it resolves
    them, through its own wrapping (:func:`~fullshard.strategies.wrapping.fully_shard_model`); the
    paths of the blocks made units."""
    from fullshard.strategies import FSDP2Strategy
    from fullshard.strategies.wrapping import fully_shard_model

    strategy = candidate.strategy(cpu_mmap_threshold=None)
    if not isinstance(strategy, FSDP2Strategy):  # see [Note: how a candidate is simulated]
        raise MisconfigurationError(
            f"_shard() shards FSDP2 candidates only, but got the {candidate.engine!r} candidate {candidate.label()}. "
            "Call simulate(), which simulates an FSDP1 candidate through simulate_fsdp1()."
        )
    auto_wrap, checkpointing, _, _ = strategy.resolve_policies(model)
    paths = {m: name for name, m in model.named_modules()}
    blocks = fully_shard_model(
        model,
        layout,
        mesh,
        auto_wrap=auto_wrap,
        checkpointing=checkpointing,
        reshard_after_forward=strategy.reshard_after_forward,
        mp_policy=mp_policy,
        **strategy.fsdp_kwargs,
    )
    return [paths[block] for block in blocks]


def _step_as_forward(model: nn.Module) -> Any:
    """The root's forward for a simulated step: ``training_step``, called as the root's forward so
    that FSDP's and the tracker's module hooks run around it (the strategy registers
    ``training_step`` with FSDP instead; the same hooks run). Within it, ``self(x)`` runs the
    module's own ``forward`` without the root's hooks again: they ran already (FSDP's are a no-op
    the second time; the tracker refuses a second root forward in a step)."""
    step: Any = type(model).training_step  # type: ignore[attr-defined]
    outer = type(model)
    forward: Any = outer.forward
    inner = type(
        outer.__name__, (outer,), {"__call__": lambda self, *args, **kwargs: forward(self, *args, **kwargs)}
    )

    def root_forward(*args: Any, **kwargs: Any) -> Any:
        model.__class__ = inner
        try:
            return step(model, *args, **kwargs)
        finally:
            model.__class__ = outer

    return root_forward


def step_loss(model: nn.Module, batch: Any, precision: Any) -> torch.Tensor:
    """The loss of one step: ``training_step``'s, or the sum of a plain module's output
    (:func:`loss_of_result`)."""
    from fullshard.strategies.step_args import step_arguments

    with precision.forward_context():
        if hasattr(model, "training_step"):
            model.forward = _step_as_forward(model)  # type: ignore[method-assign]
            return loss_of_result(model(*step_arguments(model, "training_step", batch, 0, ())), True)
        return loss_of_result(model(*batch) if isinstance(batch, tuple | list) else model(batch), False)


def loss_of_result(out: Any, from_training_step: bool) -> torch.Tensor:
    """The loss in a step's result, for either engine's simulation: ``training_step``'s taken as
    the Trainer takes it (so a result the Trainer refuses is refused with the Trainer's error, and
    a loss that is not a scalar fails at backward as in the Trainer), a plain module's output summed."""
    from fullshard.module_optimization import extract_loss

    if from_training_step:
        out = extract_loss(out)
    elif isinstance(out, torch.Tensor):
        out = out.sum()
    if not isinstance(out, torch.Tensor):
        raise MisconfigurationError(
            f"The planner runs training_step (or forward) to find the loss, but it returned {type(out).__name__}. "
            "Return the loss tensor (or a dict with 'loss') for the planner to run backward on."
        )
    return out


def planning_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """The module's optimizer (``configure_optimizers``; AdamW for a plain module), for-loop step."""
    if hasattr(model, "configure_optimizers"):
        from fullshard.optimizer_config import parse_optimizers

        optimizers, _ = parse_optimizers(model.configure_optimizers())  # type: ignore[operator]
        if len(optimizers) != 1:
            raise MisconfigurationError(
                f"The planner simulates one optimizer, but configure_optimizers() returned {len(optimizers)}. "
                "Plan with a module that returns one, or choose the configuration by hand."
            )
        optimizer = optimizers[0]
    else:
        optimizer = torch.optim.AdamW(model.parameters())
    for group in optimizer.param_groups:  # see [Note: how a candidate is simulated]
        for key in ("foreach", "fused"):
            if key in group:
                group[key] = False if key == "foreach" else None
    return optimizer


def simulate(
    module: nn.Module,
    batch: Any,
    candidate: Candidate,
    *,
    layout: ParallelLayout,
    precision: str,
    count_flops: bool = False,
    device_type: str = "cuda",
    recording: Recording | None = None,
) -> Simulated:
    """Run a simulated step of ``candidate`` on rank 0 of a job laid out as ``layout`` (see [Note:
    how a candidate is simulated]); ``count_flops``: also count the FLOPs of a step, in a step of its own before the tracked ones;
    ``recording``: the outputs of the step's data-dependent operations (see [Note: data-dependent steps])."""
    from torch.utils.flop_counter import FlopCounterMode

    from fullshard.precision import FSDP2Precision

    if candidate.engine == "fsdp":  # see [Note: how an FSDP1 candidate is simulated]
        from fullshard.planner.simulate_fsdp1 import simulate_fsdp1

        return simulate_fsdp1(
            module,
            batch,
            candidate,
            layout=layout,
            precision=precision,
            count_flops=count_flops,
            device_type=device_type,
            recording=recording,
        )
    prec = FSDP2Precision(precision, "cpu")
    model = prec.convert_module(meta_copy(module))
    numel = sum(p.numel() for p in model.parameters())
    fake_mode = torch_tools.fake_tensor_mode()
    with (
        torch_tools.simulated_world(layout) as world,
        fake_mode,
        warnings.catch_warnings(),
        contextlib.ExitStack() as stack,
    ):
        warnings.simplefilter("ignore")
        to_empty_keeping_ties(model)  # fake tensors before sharding, as FSDP2 shards real ones
        block_paths = _shard(model, candidate, layout, world.mesh, prec.mixed_precision_config)
        fake_batch = tree_map_only(torch.Tensor, fake_mode.from_tensor, batch)
        stack.enter_context(data_dependent.replaying(model, recording, batch, fake_batch))
        optimizer = planning_optimizer(model)
        tracker = torch_tools.memory_tracker(model, optimizer)
        tracker.track_inputs((fake_batch,))
        forward_flops = backward_flops = block_flops = 0
        if count_flops:  # an untracked step of its own: the counter keeps checkpointed activations alive
            forward, backward = FlopCounterMode(display=False), FlopCounterMode(display=False)
            with forward:
                loss = step_loss(model, fake_batch, prec)
            with backward:
                loss.backward()
            optimizer.zero_grad()
            forward_flops, backward_flops = int(forward.get_total_flops()), int(backward.get_total_flops())
            block_flops = flops_inside(forward.get_flop_counts(), block_paths, forward_flops)
        _as_after_a_step(model, optimizer)
        staging = torch_tools.gloo_staging() if device_type == "cpu" else contextlib.nullcontext()
        cpu = torch.device("cpu")
        with tracker, staging:  # see [Note: gloo's staging copies] in torch_tools
            phases = tracked_step(
                lambda: step_loss(model, fake_batch, prec),
                optimizer,
                lambda: torch_tools.end_phase(tracker, cpu),
            )
    return of_phases(phases, (forward_flops, backward_flops, block_flops), numel, candidate.checkpoint_every)


def tracked_step(
    loss_of: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    end_phase: Callable[[], torch_tools.Phase],
) -> tuple[torch_tools.Phase, ...]:
    """The tracked step, in the Trainer's order (see [Note: how a candidate is simulated]): the
    forward, ``zero_grad``, backward, the optimizer step; ``end_phase`` ends each of its three
    phases ([Note: a peak per phase] in fullshard.planner.candidates)."""
    loss = loss_of()
    optimizer.zero_grad(set_to_none=True)
    phases = [end_phase()]
    loss.backward()
    phases.append(end_phase())
    optimizer.step()
    phases.append(end_phase())
    return tuple(phases)


def of_phases(
    phases: tuple[torch_tools.Phase, ...], flops: tuple[int, int, int], numel: int, every: int
) -> Simulated:
    """What a simulated step measured: its highest phase's peak and split, with its phases and
    ``flops`` (forward, backward, the forward's inside the wrapped blocks)."""
    top = max(phases, key=lambda phase: phase.peak)
    return Simulated(top.peak, top.split, top.offloadable, *flops[:2], numel, flops[2], every, phases)


def flops_inside(counts: dict[str, dict[Any, int]], paths: list[str], whole: int) -> int:
    """The FLOPs ``FlopCounterMode`` counted inside the modules at ``paths`` (it names a module by
    its root's class and its path); ``whole`` (the forward's) when one of them was not seen."""
    by_path = {key.split(".", 1)[1]: sum(ops.values()) for key, ops in counts.items() if "." in key}
    found = [by_path.get(path) for path in paths]
    return whole if not found or None in found else sum(f for f in found if f is not None)


def to_empty_keeping_ties(model: nn.Module) -> None:
    """``model.to_empty(device="cpu")`` (fake tensors, inside the fake mode), with a parameter that
    several modules share (tied embeddings) still one parameter after: ``to_empty`` makes a new
    parameter per place it finds one on the meta device, which would count a tied weight, its
    gradient and its optimizer state twice (GPT-2: 5% of the peak)."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for owner in model.modules():
        for name, parameter in owner.named_parameters(recurse=False):
            places.setdefault(id(parameter), []).append((owner, name))
    model.to_empty(device="cpu")
    for (first, first_name), *others in places.values():
        shared = first.get_parameter(first_name)
        for owner, name in others:
            owner.register_parameter(name, shared)


def _as_after_a_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Put ``model`` and ``optimizer`` as a training step leaves them, without running one: each
    trained parameter gets a (fake, zero) gradient of its own shape and the optimizer steps once on
    them, making its state. The tracker, entered after, files the gradients and the state it finds
    as such."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
    optimizer.step()


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None

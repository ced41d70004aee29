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

Only FSDP2 is simulated; an FSDP1 candidate's row is its FSDP2 twin's, marked as modelled. FSDP1's
own wrapping (``wrap_fsdp1``) runs on fake tensors over the fake process group, but torch (2.13)
has no tracker for it: ``FSDPMemTracker`` follows ``fully_shard``'s parameter groups only, and the
generic ``MemTracker`` stops at the first forward with ``use_orig_params=True`` (the strategy's
default: the parameters are views into the flat parameter, and it registers a post-accumulate-grad
hook on each, which torch refuses on a non-leaf tensor); with ``use_orig_params=False`` it runs, but
files the gathered flat parameters under temporaries and the sharded gradients nowhere, so its
split could not be trusted without measurements of its own.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from fullshard.errors import MisconfigurationError
from fullshard.planner import torch_tools
from fullshard.planner.config import Candidate

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
            f"The planner simulates FSDP2 only, but got the {candidate.engine!r} candidate {candidate.label()}. "
            "Simulate its FSDP2 twin (engine='fsdp2'), as fullshard.plan does for FSDP1 rows."
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


def _loss_of(model: nn.Module, batch: Any, precision: Any) -> torch.Tensor:
    """The loss of one step: ``training_step``'s (a tensor or a dict with ``"loss"``), or the sum of
    a plain module's output."""
    from fullshard.strategies.step_args import step_arguments

    with precision.forward_context():
        if hasattr(model, "training_step"):
            model.forward = _step_as_forward(model)  # type: ignore[method-assign]
            out = model(*step_arguments(model, "training_step", batch, 0, ()))
        else:
            out = model(*batch) if isinstance(batch, tuple | list) else model(batch)
    if isinstance(out, dict):
        out = out.get("loss")
    if not isinstance(out, torch.Tensor):
        raise MisconfigurationError(
            f"The planner runs training_step (or forward) to find the loss, but it returned {type(out).__name__}. "
            "Return the loss tensor (or a dict with 'loss') for the planner to run backward on."
        )
    return out if out.dim() == 0 else out.sum()


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
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
) -> Simulated:
    """Run a simulated step of ``candidate`` on rank 0 of a job laid out as ``layout`` (see [Note:
    how a candidate is simulated]); ``count_flops``: also count the FLOPs of a step, in a step of its own before the tracked ones."""
    from torch.utils.flop_counter import FlopCounterMode

    from fullshard.precision import FSDP2Precision

    prec = FSDP2Precision(precision, "cpu")
    model = prec.convert_module(meta_copy(module))
    numel = sum(p.numel() for p in model.parameters())
    fake_mode = torch_tools.fake_tensor_mode()
    with torch_tools.simulated_world(layout) as world, fake_mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _to_empty_keeping_ties(model)  # fake tensors before sharding, as FSDP2 shards real ones
        block_paths = _shard(model, candidate, layout, world.mesh, prec.mixed_precision_config)
        fake_batch = tree_map_only(torch.Tensor, fake_mode.from_tensor, batch)
        optimizer = _optimizer(model)
        tracker = torch_tools.memory_tracker(model, optimizer)
        tracker.track_inputs((fake_batch,))
        forward_flops = backward_flops = block_flops = 0
        if count_flops:  # an untracked step of its own: the counter keeps checkpointed activations alive
            forward, backward = FlopCounterMode(display=False), FlopCounterMode(display=False)
            with forward:
                loss = _loss_of(model, fake_batch, prec)
            with backward:
                loss.backward()
            optimizer.zero_grad()
            forward_flops, backward_flops = int(forward.get_total_flops()), int(backward.get_total_flops())
            block_flops = _flops_inside(forward.get_flop_counts(), block_paths, forward_flops)
        _as_after_a_step(model, optimizer)
        staging = torch_tools.gloo_staging() if device_type == "cpu" else contextlib.nullcontext()
        with tracker, staging:  # see [Note: gloo's staging copies] in torch_tools
            loss = _loss_of(model, fake_batch, prec)  # the Trainer's order: see the Note above
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        peak, split = torch_tools.peak_by_category(tracker, torch.device("cpu"))
        offloadable = torch_tools.offloadable_at_peak(tracker)
    return Simulated(
        peak,
        split,
        offloadable,
        forward_flops,
        backward_flops,
        numel,
        block_flops,
        candidate.checkpoint_every,
    )


def _flops_inside(counts: dict[str, dict[Any, int]], paths: list[str], whole: int) -> int:
    """The FLOPs ``FlopCounterMode`` counted inside the modules at ``paths`` (it names a module by
    its root's class and its path); ``whole`` (the forward's) when one of them was not seen."""
    by_path = {key.split(".", 1)[1]: sum(ops.values()) for key, ops in counts.items() if "." in key}
    found = [by_path.get(path) for path in paths]
    return whole if not found or None in found else sum(f for f in found if f is not None)


def _to_empty_keeping_ties(model: nn.Module) -> None:
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

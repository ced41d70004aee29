"""One training step of an FSDP1 candidate, on rank 0 of a simulated job, on fake tensors.

[Note: how an FSDP1 candidate is simulated]
As an FSDP2 one is ([Note: how a candidate is simulated] in fullshard.planner.simulate), with
FSDP1's own pieces: the model is cast as ``FSDPPrecision`` casts it, made of fake tensors,
and wrapped by the strategy's own wrapping (:func:`~fullshard.strategies.wrapping.wrap_fsdp1`,
with the arguments :meth:`FSDPStrategy.wrapping_kwargs` gives it: the sharding, the precision's
``MixedPrecision``, ``use_orig_params``, the prefetch settings and the rest the candidate's
strategy holds), on CPU over the fake process group. The step runs as the Trainer runs it under
FSDP1: ``training_step`` through the root wrapper (:func:`~fullshard.strategies.forward_redirection.redirected_call`),
in the precision's autocast, then ``zero_grad``, backward, the optimizer step; FSDP1's hooks
gather, prefetch, reduce and reshard as they do in a real run, and
:class:`~fullshard.planner.fsdp1_tracker.FSDP1MemoryTracker` records the peak. So what FSDP1 does
differently from FSDP2 is in the numbers without being modelled: whole flat parameters gathered
per unit, a flat gradient for every parameter of a unit where one of them trains (the frozen
ones' share included, under ``use_orig_params=True``), the backward prefetch's second gathered
unit, the low-precision shard of mixed precision.

The tracked step is the second: before it, the model and the optimizer are put as a first step
leaves them (:func:`~fullshard.planner.fsdp1_tracker.as_after_a_step`): FSDP1's lazy
initialisation done, each trained unit's sharded flat gradient (zeros; the frozen parameters'
share included) with the original parameters' gradients viewing it, as FSDP1 leaves them after
backward, and the optimizer stepped once on those, making its state. Running a real first step
instead gave the same peak on every case of benchmarks/planner.py's fsdp matrix and on all 24
FSDP1 rows of Llama 2 7B on 64 processes, and costs a forward and a backward more: the 7B plan
took 48 CPU-seconds with it, 41 without (the planner's speed matters: issue 40 item 6). What
it leaves out is FSDP1's record of the units' order in the first step, which only
``forward_prefetch`` uses, and the candidates never set. Where FLOPs are to be counted, a real
first step is run and counted instead.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from fullshard.errors import MisconfigurationError
from fullshard.planner import data_dependent, torch_tools
from fullshard.planner.fsdp1_tracker import FSDP1MemoryTracker, as_after_a_step, storage_checks_by_identity
from fullshard.planner.simulate import (
    Simulated,
    flops_inside,
    loss_of_result,
    meta_copy,
    of_phases,
    planning_optimizer,
    to_empty_keeping_ties,
    tracked_step,
)

if TYPE_CHECKING:
    from fullshard.planner.config import Candidate
    from fullshard.planner.data_dependent import Recording
    from fullshard.strategies.parallel_layout import ParallelLayout


def simulate_fsdp1(
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
    """Run a simulated step of the FSDP1 ``candidate`` on rank 0 of ``layout``'s job (see [Note:
    how an FSDP1 candidate is simulated]); arguments as for :func:`~fullshard.planner.simulate.simulate`."""
    from torch.utils.flop_counter import FlopCounterMode

    from fullshard.precision import FSDPPrecision
    from fullshard.strategies import FSDPStrategy
    from fullshard.strategies.wrapping import wrap_fsdp1

    strategy = candidate.strategy(cpu_mmap_threshold=None)
    if not isinstance(strategy, FSDPStrategy):
        raise MisconfigurationError(
            f"simulate_fsdp1() simulates FSDP1 candidates (engine='fsdp'), but got {candidate.label()}. "
            "Call fullshard.planner.simulate.simulate(), which simulates either engine."
        )
    prec = FSDPPrecision(precision, "cpu", strategy.mixed_precision)
    model = prec.convert_module(meta_copy(module))
    numel = sum(p.numel() for p in model.parameters())
    fake_mode = torch_tools.fake_tensor_mode()
    null = contextlib.nullcontext()
    checks = storage_checks_by_identity()  # see [Note: FSDP1's storage checks on fake tensors]
    with (
        torch_tools.simulated_world(layout) as world,
        fake_mode,
        checks,
        warnings.catch_warnings(),
        contextlib.ExitStack() as stack,
    ):
        warnings.simplefilter("ignore")
        to_empty_keeping_ties(model)
        auto_wrap, checkpointing, _, _ = strategy.resolve_policies(model)
        blocks = [] if auto_wrap is None else [m for m in auto_wrap.selected(model) if m is not model]
        mesh = world.mesh if strategy.is_hybrid else None  # as FSDPStrategy._make_mesh: hybrid only
        kwargs = strategy.wrapping_kwargs(torch.device("cpu"), prec.mixed_precision_config, mesh)
        wrapped = wrap_fsdp1(model, auto_wrap=auto_wrap, checkpointing=checkpointing, **kwargs)
        fake_batch = tree_map_only(torch.Tensor, fake_mode.from_tensor, batch)
        stack.enter_context(data_dependent.replaying(model, recording, batch, fake_batch))
        optimizer = planning_optimizer(model)
        forward, backward = FlopCounterMode(display=False), FlopCounterMode(display=False)
        if count_flops:  # a real first step, counted
            with forward:
                loss = _loss_of(wrapped, model, fake_batch, prec)
            with backward:
                loss.backward()
            optimizer.step()
        else:  # the state a first step leaves, put in place: see the Note
            as_after_a_step(wrapped, optimizer)
        tracker = FSDP1MemoryTracker(wrapped, optimizer, (fake_batch,))
        staging = torch_tools.gloo_staging() if device_type == "cpu" else null
        with tracker, staging:  # see [Note: gloo's staging copies] in torch_tools
            phases = tracked_step(
                lambda: _loss_of(wrapped, model, fake_batch, prec), optimizer, tracker.end_phase
            )
    forward_flops = backward_flops = block_flops = 0
    if count_flops:
        paths = {m: name for name, m in wrapped.named_modules()}
        forward_flops, backward_flops = int(forward.get_total_flops()), int(backward.get_total_flops())
        block_flops = flops_inside(forward.get_flop_counts(), [paths[b] for b in blocks], forward_flops)
    return of_phases(phases, (forward_flops, backward_flops, block_flops), numel, candidate.checkpoint_every)


def _loss_of(wrapped: nn.Module, model: nn.Module, batch: Any, precision: Any) -> torch.Tensor:
    """The loss of one step, run as FSDPStrategy runs it: ``training_step`` through the root
    wrapper, in the precision's context (the sum of a plain module's output through the wrapper),
    taken by :func:`~fullshard.planner.simulate.loss_of_result` as for FSDP2."""
    from fullshard.strategies.forward_redirection import redirected_call
    from fullshard.strategies.step_args import step_arguments

    with precision.forward_context():
        if hasattr(model, "training_step"):
            args = step_arguments(model, "training_step", batch, 0, ())
            return loss_of_result(redirected_call(wrapped, model, "training_step", *args), True)
        return loss_of_result(wrapped(*batch) if isinstance(batch, tuple | list) else wrapped(batch), False)

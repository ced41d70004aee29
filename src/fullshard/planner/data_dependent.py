"""Steps whose shapes or control flow depend on tensor values, simulated on fake tensors.

[Note: data-dependent steps]
A fake tensor has a shape and no values, so an operation whose output shape or result depends on
values cannot run on one: ``nonzero`` (``torch.where(mask)``, boolean indexing), ``unique``,
``masked_select``, ``repeat_interleave`` with tensor repeats, and every read of a value into
Python (``.item()``, ``bool(t)``, ``int(t)``, ``tolist()``). A mixture of experts routes so: the
tokens each expert gets are ``torch.where(expert_mask[e])``, a loop skips experts that got none.
Such a step is planned by recording and replaying:

1. The planner simulates as usual. When a fake step hits such an operation, torch raises
   (``DynamicOutputShapeException`` / ``DataDependentOutputException``), the simulation stops
   early (the first router is usually in the first block) and raises :class:`NeedsRecording`.
2. :func:`record` then runs **one real forward** (``training_step`` under ``no_grad``, the
   step's precision, the module's training mode as the simulation has it, the random state
   restored after) of a real copy of the model on the example batch, on the CPU, and records,
   for every operation torch tags as data-dependent (``dynamic_output_shape``,
   ``data_dependent_output``), its output: shapes, strides and dtypes of tensors, and Python
   values (the ``.item()`` results that steer control flow). The real copy shares the user's
   weights when every parameter and buffer is on the CPU (no copy is made: the routing is the
   trained model's); otherwise it is initialised as
   ``empty_init=True`` would initialise it (:class:`~fullshard.strategies.meta_init.MetaInit`:
   ``reset_parameters``, a Hugging Face ``_init_weights``, the module's ``init_weights``).
3. Every simulation is run again with :func:`replaying`: an operation fake tensors cannot run is
   given the recorded output (a fake tensor of the recorded shape, or the recorded value).

Operations are matched by where they run: the innermost module running them (its path, with
wrappers' ``_checkpoint_wrapped_module`` / ``_fsdp_wrapped_module`` / ``_orig_mod`` left out),
that module's call number in the step, and the line of code outside torch that led to them; at
one place, in order, by operation and the shapes and dtypes of its tensor arguments. A real run
has data-dependent operations a fake one skips (``one_hot`` checks its indices with ``.item()``
on real tensors only, inside the kernel): the replay passes over recorded ones that match
nothing. So the match holds with FSDP's hooks around the modules, for a model cut to fewer
blocks ([Note: simulating fewer layers]: the recording is made on the deepest model simulated,
the cut one reuses its blocks' records), and for checkpointed blocks, whose forward runs again
in backward (a module's calls are counted modulo its calls in the recorded forward).

What it assumes: the step's data-dependent operations happen in its forward, and their outputs
on the example batch with these weights stand for every step (the tokens per expert of this
batch; with freshly initialised weights, an untrained router's). A step whose control flow
changes with anything else (randomness, a step counter) or that reads values in backward or in
the optimizer step is refused with :class:`~fullshard.errors.MisconfigurationError` naming the
operation, the module and the line, never planned on a guess. What it costs: one real forward
on the planning machine's CPU, with a real copy of the (cut) model's parameters where the user's
are not on the CPU: for a large model, the compute of a forward (one process's batch) and the
memory of the (at most 8-block) model's weights, once per plan (docs/fsdp/plan.md has a measured
case); nothing for a model without such operations.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from fullshard.errors import MisconfigurationError
from fullshard.planner.torch_tools import (
    TorchDispatchMode,
    data_dependent_errors,
    float_grouped_mm,
    outside_fake_mode,
)

#: path components of the wrappers FSDP, activation checkpointing and torch.compile put around a module
_WRAPPERS = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod")
_OUTSIDE = "<no module: backward or the optimizer step>"


class NeedsRecording(MisconfigurationError):
    """A simulated step hit an operation fake tensors cannot run, and had no recording to replay
    (see [Note: data-dependent steps]); the planner records one and simulates again."""


def _is_data_dependent(func: Any) -> bool:
    tags = getattr(func, "tags", ())
    return torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags


@dataclass(frozen=True)
class _Spec:
    """A recorded tensor output: what a fake tensor needs to stand for it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


#: where an operation ran: (module path, its call number in the step, the line of code outside torch)
_Place = tuple[str, int, str]
#: what ran: the operation and its tensor arguments' shapes and dtypes
_Signature = tuple[str, tuple[Any, ...]]


@dataclass
class Recording:
    """The data-dependent operations of one real forward, in order, by where they ran; and how
    many times each module ran."""

    entries: dict[_Place, list[tuple[_Signature, Any]]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)


def _signature(func: Any, args: Any) -> _Signature:
    tensors = tuple((tuple(a.shape), a.dtype) for a in args if isinstance(a, torch.Tensor))
    return (str(func), tensors)


_TORCH_DIR = os.path.dirname(torch.__file__)
# the planner's own dispatch modes (a tracker) are not the step's code
_PLANNER_DIR = os.path.dirname(__file__) + os.sep


def _code_line() -> str:
    """The innermost line of code outside torch and this file that led to this operation: an
    operation a torch kernel runs inside another (``one_hot`` checks its indices with ``.item()``
    on real tensors, not on fake ones) is filed under the line that called that kernel."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith((_TORCH_DIR, _PLANNER_DIR))):
        frame = frame.f_back  # type: ignore[assignment]
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


class _Frames:
    """Which module is running and its call number in this step; the step starts again at each
    call of the root (``generation`` counts the steps)."""

    def __init__(self, root: nn.Module) -> None:
        by_path: dict[str, nn.Module] = {}
        for name, module in root.named_modules():  # a wrapper's child takes its path after it
            by_path[".".join(p for p in name.split(".") if p not in _WRAPPERS)] = module
        self.paths = {id(m): path for path, m in by_path.items()}
        self.stack: list[tuple[str, int]] = []
        self.calls: dict[str, int] = {}
        self.generation = 0

    def push(self, module: nn.Module, *args: Any) -> None:
        path = self.paths.get(id(module))
        if path is None:
            return
        if path == "":  # the root: a new step
            self.calls.clear()
            self.stack.clear()
            self.generation += 1
        call = self.calls.get(path, 0)
        self.calls[path] = call + 1
        self.stack.append((path, call))

    def pop(self, module: nn.Module, *args: Any) -> None:
        path = self.paths.get(id(module))
        if path is not None and self.stack and self.stack[-1][0] == path:
            self.stack.pop()

    def place(self) -> _Place:
        path, call = self.stack[-1] if self.stack else (_OUTSIDE, 0)
        return (path, call, _code_line())

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        pre = register_module_forward_pre_hook(self.push)
        post = register_module_forward_hook(self.pop, always_call=True)
        try:
            yield
        finally:
            pre.remove()
            post.remove()


class _Recorder(TorchDispatchMode):
    def __init__(self, frames: _Frames, recording: Recording) -> None:
        super().__init__()
        self.frames, self.recording = frames, recording

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if _is_data_dependent(func):
            spec = tree_map(
                lambda x: (
                    _Spec(tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else x
                ),
                out,
            )
            entries = self.recording.entries.setdefault(self.frames.place(), [])
            entries.append((_signature(func, args), spec))
        return out


class _Replayer(TorchDispatchMode):
    """Replays a recording: each data-dependent operation is matched, at its place, with the next
    recorded one of the same signature; recorded ones between (run inside a real kernel only)
    are passed over."""

    def __init__(self, frames: _Frames, recording: Recording) -> None:
        super().__init__()
        self.frames, self.recording = frames, recording
        self.failures = data_dependent_errors()
        self.cursors: dict[_Place, int] = {}
        self.generation = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not _is_data_dependent(func):
            return func(*args, **kwargs)
        found = self._next(func, args)
        try:
            return func(*args, **kwargs)
        except self.failures:
            pass
        if found is None:
            raise _unmatched(func, self.frames.place())
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        return tree_map(
            lambda x: (
                torch.empty_strided(x.shape, x.stride, dtype=x.dtype, device=device)
                if isinstance(x, _Spec)
                else x
            ),
            found,
        )

    def _next(self, func: Any, args: Any) -> Any:
        """The recorded output of this operation, consumed; None when none matches."""
        if self.generation != self.frames.generation:
            self.cursors.clear()
            self.generation = self.frames.generation
        place = self.frames.place()
        path, call, line = place
        calls = self.recording.calls.get(path, 1)  # a call past the recorded ones: recomputed
        entries = self.recording.entries.get((path, call % calls, line), [])
        signature = _signature(func, args)
        for index in range(self.cursors.get(place, 0), len(entries)):
            if entries[index][0] == signature:
                self.cursors[place] = index + 1
                return entries[index][1]
        return None


def _unmatched(func: Any, place: _Place) -> MisconfigurationError:
    path, call, line = place
    where = path if path != _OUTSIDE else "no module (backward or the optimizer step)"
    return MisconfigurationError(
        f"The planner cannot simulate {func} in {where or 'the root module'} (its call {call + 1} in the step; "
        f"{line}): its output depends on tensor values, which fake tensors do not have, and the recorded real forward "
        "ran no such operation there. The planner replays the data-dependent operations of one real forward on the "
        "example batch (see [Note: data-dependent steps] in fullshard/planner/data_dependent.py), which holds only "
        "when the step's control flow depends on the batch and the weights alone, in forward. Make the step's "
        "control flow independent of randomness and step counts while planning, or choose the configuration by hand."
    )


@contextlib.contextmanager
def replaying(
    model: nn.Module, recording: Recording | None, batch: Any = None, fake_batch: Any = None
) -> Iterator[None]:
    """Within this context, run ``model``'s step on fake tensors with ``recording``'s outputs for
    the operations fake tensors cannot run; without a recording, such an operation raises
    :class:`NeedsRecording` (see [Note: data-dependent steps]). A library that takes another path
    on fake tensors than on real ones is given the real path (see [Note: a library's path on fake
    tensors]; ``fake_batch``: the fake tensors made of ``batch``'s). Enter it inside the fake
    mode, after the model is wrapped."""
    with _real_paths(batch, fake_batch), float_grouped_mm(), _replay(model, recording):
        yield


@contextlib.contextmanager
def _replay(model: nn.Module, recording: Recording | None) -> Iterator[None]:
    if recording is None:
        try:
            yield
        except data_dependent_errors() as error:
            raise NeedsRecording(
                f"The simulated step ran {getattr(error, 'func', error)}, whose output depends on tensor values; "
                "record one real forward to replay it (fullshard.planner.data_dependent.record)."
            ) from None
        return
    frames = _Frames(model)
    with frames.watching(), _Replayer(frames, recording):
        yield


def record(module: nn.Module, model: nn.Module, batch: Any, precision: str) -> Recording:
    """The data-dependent operations of one real forward of ``model`` (a meta copy of ``module``,
    maybe cut to fewer blocks) on ``batch`` (see [Note: data-dependent steps]).

    Raises:
        MisconfigurationError: the real copy cannot be initialised, or its forward fails.
    """
    from fullshard.planner.simulate import step_loss
    from fullshard.precision import FSDP2Precision

    prec = FSDP2Precision(precision, "cpu")
    try:
        real = prec.convert_module(real_copy(module, model))
    except MisconfigurationError as error:
        raise MisconfigurationError(
            f"The planner records the data-dependent operations of {type(module).__name__}'s step in one real forward, "
            f"and could not make the real copy of the model it needs: {error}"
        ) from error
    frames, recording = _Frames(real), Recording()
    try:
        with (
            torch.random.fork_rng(devices=[]),
            torch.no_grad(),
            frames.watching(),
            _Recorder(frames, recording),
        ):
            step_loss(real, batch, prec)
    except MisconfigurationError:
        raise
    except Exception as error:
        raise MisconfigurationError(
            f"The planner runs one real forward of {type(module).__name__}'s training_step on the example batch, on "
            f"CPU, to record its data-dependent operations (see [Note: data-dependent steps]), and it failed: "
            f"{type(error).__name__}: {error}. Give fullshard.plan an example batch of CPU tensors that the step runs "
            "on, or choose the configuration by hand."
        ) from error
    recording.calls = dict(frames.calls)
    return recording


def real_copy(module: nn.Module, model: nn.Module) -> nn.Module:
    """A copy of ``model`` (a meta copy of ``module``) with real CPU tensors: new parameters viewing
    ``module``'s own where every parameter and buffer of ``module`` at ``model``'s names is on the
    CPU (nothing copied; buffers are cloned, a forward may update them); else initialised afresh
    as ``empty_init=True`` initialises (``module`` is never written)."""
    from fullshard.strategies.meta_init import MetaInit, user_init_of

    made = copy.deepcopy(model)
    originals: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    originals.update(module.named_buffers(remove_duplicate=False))
    names = [n for n, _ in made.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in made.named_buffers(remove_duplicate=False)]
    shared = all(n in originals and originals[n].device.type == "cpu" for n in names)
    new: dict[int, torch.Tensor] = {}  # a meta tensor's id -> its real one (tied parameters stay tied)
    for owner_name, owner in made.named_modules(remove_duplicate=False):
        prefix = f"{owner_name}." if owner_name else ""
        for name, param in owner._parameters.items():
            if param is not None and shared:
                if id(param) not in new:
                    source = originals[prefix + name].detach()
                    new[id(param)] = nn.Parameter(source, param.requires_grad)
                owner._parameters[name] = new[id(param)]  # type: ignore[assignment]
        for name, buffer in owner._buffers.items():
            if buffer is None or not buffer.is_meta:
                continue
            real = originals.get(prefix + name)
            if real is not None and not real.is_meta:
                owner._buffers[name] = real.detach().clone()
            elif not (buffer.is_floating_point() or buffer.is_complex()):
                owner._buffers[name] = torch.zeros_like(buffer, device="cpu")
    if not shared:
        MetaInit(torch.device("cpu"), made, user_init_of(made))(made)
    return made


@contextlib.contextmanager
def _real_paths(batch: Any, fake_batch: Any) -> Iterator[None]:
    """Hugging Face's mask building, given the path it takes on real tensors.

    [Note: a library's path on fake tensors]
    Hugging Face transformers (5.x) treats a fake tensor as a sign of tracing (``is_tracing``:
    compile, export) and then avoids reading tensor values: ``find_packed_sequence_indices``
    cannot tell that the position ids hold one sequence per row, returns a packed-sequence mask
    instead of None, and the model builds and keeps a full attention mask where a real run passes
    ``is_causal=True`` to SDPA with none. Its SDPA models were predicted 3-8% high so (one
    ``batch x heads x seq x seq`` tensor too many on a tiny Llama), its eager ones exact. During a
    simulation that function is given its real answer: computed on the real tensor where the
    position ids are one of the batch's tensors, and None (one sequence per row) where the model
    made them itself (from ``cache_position``, as Hugging Face does when none are passed). Only
    when ``transformers.masking_utils`` is imported already; nothing else of it is changed.
    """
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if masking is None or original is None:
        yield
        return
    fake_to_real: dict[int, torch.Tensor] = {}
    for real, fake in zip(tree_leaves(batch), tree_leaves(fake_batch), strict=False):
        if isinstance(real, torch.Tensor) and isinstance(fake, torch.Tensor):
            fake_to_real[id(fake)] = real

    def packed_sequences(position_ids: torch.Tensor) -> Any:
        real = fake_to_real.get(id(position_ids))
        if real is None:
            return None  # made in the model: one sequence per row
        with outside_fake_mode():
            found = original(real)
        return None if found is None else torch.empty_like(position_ids).copy_(found)

    setattr(masking, "find_packed_sequence_indices", packed_sequences)  # noqa: B010
    try:
        yield
    finally:
        setattr(masking, "find_packed_sequence_indices", original)  # noqa: B010

"""The ``compile=`` option: ``torch.compile`` per FSDP unit, or on the whole model.

``Trainer(compile=...)`` and ``FSDPStrategy(compile=...)`` take ``False``/``None`` (off), ``True``
(``torch.compile``'s defaults) or a dict of ``torch.compile`` keyword arguments
(``{"mode": "max-autotune", "backend": "aot_eager", "dynamic": False, "fullgraph": True}``).
:func:`parse_compile` checks a value once, before any process starts, into a
:class:`CompileConfig`; the strategy applies it with :func:`apply_compile` in each launched
process while it sets up the module.

[Note: where compile happens]
Under FSDP each unit's inner module (what the auto-wrap policy or a manual ``wrap()`` selected,
e.g. a transformer block, with its activation-checkpoint wrapper if it has one) is compiled in
place, as ``nn.Module.compile()`` does (see :func:`_compile_in_place`), *after* FSDP wrapped it,
as torchtitan compiles blocks:

- the FSDP unit calls its inner module between its all-gather and its reshard, so the compiled
  graph sees the unsharded parameters; FSDP's hooks and collectives stay eager, outside the graph;
- compiling in place keeps the module object and its children, so state-dict keys do not change
  (``torch.compile(module)`` would add an ``_orig_mod.`` level);
- compiling after wrapping finds the units FSDP really made (auto-wrap and manual ``wrap()``
  alike), and encloses the activation-checkpoint wrapper, which dynamo traces as a region to
  recompute (torchtitan's order: checkpointing, then compile, then sharding; the unit boundary
  is the same here);
- only the innermost units are compiled: a unit holding other units stays eager, so no graph
  ever contains FSDP1's own forward; the root's own layers (embeddings, head) stay eager too.

With no units (no auto-wrap policy, or a DDP or single-device strategy), the user's module is
compiled as a whole, as a Lightning user would with ``torch.compile(model)``: its ``forward``,
or, when its class defines none (``training_step`` calls ``self.model(x)``), each child module
holding parameters, in place. ``training_step`` and the other step methods stay eager. The bound
``forward`` is replaced on the instance rather than ``nn.Module.compile()`` called on the module:
DDP and FSDP point the wrapped module's ``forward`` at ``training_step`` for one call (see
[Note: forward redirection]), and a compiled ``__call__`` would trace that step method, a new
closure each time, recompiling every step.

Under FSDP1, gradients are set aside around every compiled call: see [Note: FSDP1 gradients and
dynamo].
"""

from __future__ import annotations

import difflib
import functools
import inspect
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn

__all__ = ["CompileConfig", "CompileUnit", "apply_compile", "fsdp_units", "parse_compile", "resolve_compile"]

_EXAMPLE = '{"mode": "max-autotune", "backend": "aot_eager", "dynamic": False, "fullgraph": True}'
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "fullgraph": ((bool,), "a bool"),
    "dynamic": ((bool, type(None)), "True, False or None"),
    "disable": ((bool,), "a bool"),
    "mode": ((str, type(None)), "a mode name such as 'max-autotune', or None"),
    "options": ((dict, type(None)), "a dict of inductor options, or None"),
}
_MARK = "_fullshard_compile"  # on each callable apply_compile installs: (config, the forward it replaced)


@dataclass(frozen=True)
class CompileConfig:
    """A checked ``compile=`` setting: off, or on with these ``torch.compile`` keyword arguments."""

    enabled: bool
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``torch.compile`` / ``nn.Module.compile``."""
        return dict(self.options)

    def __str__(self) -> str:
        if not self.enabled:
            return "False"
        return repr(self.kwargs) if self.options else "True"


def _compile_keywords() -> list[str]:
    return [name for name in inspect.signature(torch.compile).parameters if name != "model"]


def parse_compile(value: Any, owner: str = "Trainer") -> CompileConfig | None:
    """Check a ``compile=`` value of ``owner`` (``"Trainer"``, ``"FSDPStrategy"``).

    Returns None when it was not given (None), else a :class:`CompileConfig` (``False`` is an
    explicit "off", which a contradicting setting elsewhere is checked against).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return CompileConfig(enabled=value)
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{owner}(compile={value!r}) ({type(value).__name__}) is not accepted. Use True "
            "(torch.compile's defaults), False or None (off), or a dict of torch.compile keyword "
            f"arguments, e.g. {_EXAMPLE}."
        )
    keywords = _compile_keywords()
    for key, item in value.items():
        if key not in keywords:
            close = difflib.get_close_matches(str(key), keywords, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise MisconfigurationError(
                f"{owner}(compile=...) has the key {key!r}, which torch.compile does not take.{hint} "
                f"Accepted keys: {', '.join(keywords)}."
            )
        accepted, expected = _TYPES.get(key, ((object,), ""))
        if not isinstance(item, accepted):
            raise TypeError(f"{owner}(compile={{{key!r}: {item!r}}}): {key} must be {expected}.")
        if key == "backend" and not (isinstance(item, str) or callable(item)):
            raise TypeError(
                f"{owner}(compile={{'backend': {item!r}}}): backend must be a backend name "
                "('inductor', 'aot_eager', ...; see torch.compiler.list_backends()) or a callable."
            )
    config = CompileConfig(enabled=True, options=tuple(sorted(value.items())))  # order-free equality
    _dry_run(config, owner)
    return config


def _dry_run(config: CompileConfig, owner: str) -> None:
    """Let ``torch.compile`` judge the values (backend and mode names, options) now, in the
    launching process, rather than in every worker once the model is set up. Nothing is traced."""
    try:
        torch.compile(_identity, **config.kwargs)
    except Exception as err:  # torch raises InvalidBackend, RuntimeError, AssertionError here
        message = str(err).strip()
        message = message if len(message) <= 300 else message[:300] + " ..."
        raise MisconfigurationError(
            f"{owner}(compile={config}) is rejected by torch.compile: {message}"
        ) from err


def _identity(x: Any) -> Any:
    return x


def resolve_compile(
    host: CompileConfig | None, strategy: CompileConfig | None, strategy_name: str = "strategy"
) -> CompileConfig | None:
    """The setting in force when the host (``Trainer(compile=...)``) and the strategy
    (``FSDPStrategy(compile=...)``) may both give one: the one that was given, or both when they
    agree. Different settings in the two places raise rather than one silently winning."""
    if host is None or host == strategy:
        return strategy
    if strategy is None:
        return host
    raise MisconfigurationError(
        f"Trainer(compile={host}) and {strategy_name}(compile={strategy}) disagree. Set compile in "
        "one place only (the other one left at None), or give both the same value."
    )


@dataclass(frozen=True)
class CompileUnit:
    """A module to compile in place, and the FSDP flat parameters its forward reads
    (held aside while it runs, see [Note: FSDP1 gradients and dynamo])."""

    module: nn.Module
    flat_params: tuple[torch.Tensor, ...] = ()


def fsdp_units(wrapped: nn.Module) -> list[CompileUnit]:
    """The innermost FSDP units below the root of ``wrapped``: their inner modules (what FSDP1 runs
    between a unit's all-gather and reshard) with their flat parameters. A unit holding other
    units stays eager, so no compiled graph contains FSDP's own forward, hooks and collectives."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    def holds_unit(inner: nn.Module) -> bool:
        return any(isinstance(m, FullyShardedDataParallel) for m in inner.modules())

    return [
        CompileUnit(m.module, _flat_params(m))
        for m in wrapped.modules()
        if isinstance(m, FullyShardedDataParallel) and m is not wrapped and not holds_unit(m.module)
    ]


def _flat_params(*fsdp_modules: nn.Module) -> tuple[torch.Tensor, ...]:
    # FSDP1's FlatParameter of a unit is only reachable through the private ``_flat_param``.
    found = (getattr(m, "_flat_param", None) for m in fsdp_modules)
    return tuple(p for p in found if p is not None)


def apply_compile(
    module: nn.Module,
    config: CompileConfig | None,
    units: Sequence[CompileUnit] = (),
    root: nn.Module | None = None,
) -> None:
    """Compile ``units`` in place or, when there are none, ``module`` as a whole (see [Note: where
    compile happens]). Keeps every state-dict key. ``root``: the FSDP root wrapping ``module``, if
    any (the compiled code reads its flat parameters).

    Run it in the process that trains (after launch): compiled code does not travel between
    processes. A ``module`` compiled as a whole before is compiled again only for another
    setting, and put back to eager for a disabled one.
    """
    if config is not None and config.enabled and not getattr(root, "_use_orig_params", True):
        raise MisconfigurationError(
            f"compile={config} needs FSDP's use_orig_params=True (dynamo traces the original parameters, "
            "not FSDP's flat ones). Leave use_orig_params at its default (True), or turn compile off."
        )
    if units and config is not None and config.enabled:
        for unit in units:
            _compile_in_place(unit.module, config, unit.flat_params)
        return
    _compile_whole(module, config, _flat_params(root) if root is not None else ())


def _compile_in_place(
    module: nn.Module, config: CompileConfig, flat_params: tuple[torch.Tensor, ...]
) -> None:
    """What ``module.compile()`` does, entered through a frame dynamo traces.

    ``nn.Module.compile()`` keeps ``torch.compile(module._call_impl)`` in the private
    ``_compiled_call_impl``, which ``__call__`` runs. But dynamo skips frames in torch's own files,
    so for a torch.nn layer whose ``forward`` is one (``nn.TransformerEncoderLayer``) that compiles
    nothing, silently (https://github.com/pytorch/pytorch/issues/150915). The compiled function
    here is :func:`_call` (one copy per module class, see :func:`_call_for`), defined in this
    file, which calls ``_call_impl``; the module is its argument (a ``partial``), so
    ``copy.deepcopy`` gives a copy that calls the copy.
    """
    compiled = torch.compile(_call_for(type(module)), **config.kwargs)
    call: Callable[..., Any] = functools.partial(compiled, module)
    if flat_params:
        call = _holding_grads(call, flat_params)
    setattr(call, _MARK, (config, None))
    module._compiled_call_impl = call


def _call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module._call_impl(*args, **kwargs)


_CALLS: weakref.WeakKeyDictionary[type, Callable[..., Any]] = weakref.WeakKeyDictionary()


def _call_for(cls: type[nn.Module]) -> Callable[..., Any]:
    """:func:`_call` with a code object of its own for the module class ``cls``.

    Dynamo keeps compiled graphs, and counts them against ``recompile_limit`` (8 by default), per
    code object. ``module.compile()`` enters through each class's ``forward``: blocks of one class
    share their graphs, other classes have their own limit. One shared ``_call`` would put the
    graphs of every class under one limit, past which dynamo silently runs eagerly.
    """
    call = _CALLS.get(cls)
    if call is None:
        code = _call.__code__.replace(co_name=f"_call_{cls.__name__}")
        call = _CALLS[cls] = types.FunctionType(code, _call.__globals__, code.co_name)
    return call


def _compile_whole(
    module: nn.Module, config: CompileConfig | None, flat_params: tuple[torch.Tensor, ...]
) -> None:
    """Compile ``module``'s ``forward``, or, when its class defines none (a LightningModule whose
    ``training_step`` calls its layers directly), each child module that holds parameters."""
    done = _applied(module)
    if done is not None and done == config:
        return  # compiled with this setting already (a second Trainer on the same module)
    if done is not None:
        _undo(module)
    if config is None or not config.enabled:
        return
    if "forward" in module.__dict__ or type(module).forward is not nn.Module.forward:
        _compile_forward(module, config, flat_params)
        return
    children = [child for child in module.children() if any(True for _ in child.parameters())]
    if not children:
        rank_zero_warn(
            f"compile={config}: {type(module).__name__} defines no forward and has no layers with "
            "parameters, so nothing was compiled.",
            stacklevel=3,
        )
    for child in children:
        _compile_in_place(child, config, flat_params)


def _applied(module: nn.Module) -> CompileConfig | None:
    """The setting :func:`_compile_whole` compiled ``module`` with, if it did."""
    for fn in (module.__dict__.get("forward"), *(c._compiled_call_impl for c in module.children())):
        mark = getattr(fn, _MARK, None)
        if mark is not None:
            return mark[0]  # type: ignore[no-any-return]
    return None


def _undo(module: nn.Module) -> None:
    mark = getattr(module.__dict__.get("forward"), _MARK, None)
    if mark is not None:
        if mark[1] is None:
            del module.forward  # back to the class's forward
        else:
            module.forward = mark[1]  # type: ignore[method-assign]
    for child in module.children():
        if getattr(child._compiled_call_impl, _MARK, None) is not None:
            child._compiled_call_impl = None


def _holding_grads(fn: Callable[..., Any], flat_params: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
    """``fn``, run with the gradients of ``flat_params`` that do not match their parameter set aside.

    [Note: FSDP1 gradients and dynamo]
    While a unit runs, FSDP1 points its ``FlatParameter`` at the unsharded (gathered, maybe
    low-precision) data but leaves ``.grad`` holding the sharded float32 gradient of the last
    backward. The Trainer zeroes gradients after ``training_step`` (Lightning's order), so from
    the second step on the gradient is there during forward. When dynamo compiles (the first call,
    or a recompile for a new batch shape, eval mode, no_grad in ``validate`` after ``fit``), it
    copies each parameter's base with its gradient into a fake tensor and fails: "attempting to
    assign a gradient of size [152] to a tensor of size [304]"
    (https://github.com/pytorch/pytorch/issues/111317, /139110; FSDP2 has no such state). So
    the gradient is taken off for the call and put back after it, unchanged.
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        held = []
        for param in flat_params:
            grad = param.grad
            if grad is not None and (grad.shape != param.shape or grad.dtype != param.dtype):
                param.grad = None
                held.append((param, grad))
        try:
            return fn(*args, **kwargs)
        finally:
            for param, grad in held:
                _put_back_grad(param, grad)

    return call


def _put_back_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    """``param.grad = grad`` though their shapes or dtypes differ (the state FSDP1 left it in).

    The ``.grad`` setter insists on a match with the current data, so the data is swapped for the
    assignment, as FSDP1 swaps ``.data`` itself to get there."""
    data = param.data
    param.data = grad
    param.grad = grad
    param.data = data


def _compile_forward(module: nn.Module, config: CompileConfig, flat_params: tuple[torch.Tensor, ...]) -> None:
    replaced = module.__dict__.get("forward")  # a forward the user set on the instance, if any
    forward = module.forward
    bound = isinstance(forward, types.MethodType) and forward.__self__ is module
    # A bound forward: compile its function and bind the result, so the instance holds no
    # reference to itself through a closure and copy.deepcopy rebinds the method to the copy.
    target: Callable[..., Any] = torch.compile(forward.__func__ if bound else forward, **config.kwargs)  # type: ignore[attr-defined]
    if flat_params:
        target = _holding_grads(target, flat_params)
    setattr(target, _MARK, (config, replaced))
    module.forward = types.MethodType(target, module) if bound else target  # type: ignore[method-assign]

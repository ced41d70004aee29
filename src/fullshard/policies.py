"""Auto-wrap and activation-checkpointing policies, and the pre-flight wrap plan.

A policy may be given in any of these forms (for ``auto_wrap_policy`` and
``activation_checkpointing_policy`` alike):

- a set, list or tuple of ``nn.Module`` subclasses: every instance is selected;
- class names as strings (``"TransformerEncoderLayer"`` or a dotted ``"torch.nn.TransformerEncoderLayer"``),
  resolved against the classes present in the model (for configuration files);
- a callable ``policy(module, recurse, nonwrapped_numel) -> bool`` (torch's function policies,
  e.g. ``functools.partial(size_based_auto_wrap_policy, min_num_params=10_000)``);
- a torch policy object (``ModuleWrapPolicy``, ``CustomPolicy``, ...).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fullshard.errors import MisconfigurationError


def _is_torch_policy(value: Any) -> bool:
    """Whether ``value`` is one of torch's policy objects (``torch.distributed.fsdp.wrap._Policy``).

    ``_Policy`` is private in torch but the only common base of ModuleWrapPolicy, CustomPolicy,
    ... . ``torch.distributed.fsdp`` is slow to import and strategies are built before the
    processes start (see [Note: torch's FSDP imported after launch] in strategies/fsdp_options.py): a
    policy object exists only if its module was imported, so nothing is imported here.
    """
    wrap = sys.modules.get("torch.distributed.fsdp.wrap")
    return wrap is not None and isinstance(value, wrap._Policy)


PolicyInput = Any  # see the module docstring for the accepted forms
_ACCEPTED = (
    "a set/list of nn.Module classes, class names as strings, a callable "
    "policy(module, recurse, nonwrapped_numel) -> bool, or a torch policy object such as ModuleWrapPolicy"
)


@dataclass(frozen=True)
class Policy:
    """A normalised policy: ``classes`` when given as classes/names, else a torch ``policy``."""

    name: str
    classes: frozenset[type[nn.Module]] = frozenset()
    policy: Any = None

    def torch_policy(self) -> Any:
        """What FSDP's ``auto_wrap_policy`` / ``apply_activation_checkpointing`` expects."""
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return ModuleWrapPolicy(self.classes) if self.classes else self.policy

    def selected(self, model: nn.Module) -> list[nn.Module]:
        """The submodules this policy selects (in ``model.modules()`` order; the root excluded)."""
        root_kwargs: dict[str, Any] = {}
        if self.classes:
            return [m for m in model.modules() if m is not model and isinstance(m, tuple(self.classes))]
        if _is_torch_policy(self.policy):
            # ``_run_policy`` is how FSDP itself asks a policy object for its modules (private API,
            # the only way to evaluate a CustomPolicy/ModuleWrapPolicy without wrapping).
            chosen = self.policy._run_policy(model, set(), root_kwargs)  # type: ignore[attr-defined]
            return [m for m in model.modules() if m is not model and m in chosen]
        return _simulate_function_policy(model, self.policy)


def _simulate_function_policy(model: nn.Module, fn: Callable[..., bool]) -> list[nn.Module]:
    """Which modules torch's recursive wrapping would wrap under a function policy.

    Mirrors FSDP's rule: children first; a module is wrapped when ``fn(module, recurse=False,
    nonwrapped_numel=n)`` holds for its parameters not already claimed by a wrapped module
    (a parameter tied into several modules belongs to the first one wrapped).
    """
    chosen: list[nn.Module] = []
    claimed: set[int] = set()

    def unclaimed(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters() if id(p) not in claimed)

    def visit(module: nn.Module) -> None:
        if not fn(module=module, recurse=True, nonwrapped_numel=unclaimed(module)):
            return
        for child in module.children():
            visit(child)
        if module is not model and fn(module=module, recurse=False, nonwrapped_numel=unclaimed(module)):
            chosen.append(module)
            claimed.update(id(p) for p in module.parameters())

    visit(model)
    order = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(chosen, key=lambda m: order[id(m)])


def _resolve_names(names: list[str], model: nn.Module, option: str) -> set[type[nn.Module]]:
    present = {type(m) for m in model.modules()}
    resolved: set[type[nn.Module]] = set()
    for name in names:
        matches = {cls for cls in present if name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")}
        if not matches and "." in name:  # torch.nn.X is defined in torch.nn.modules.x
            package, _, short = name.rpartition(".")
            matches = {cls for cls in present if cls.__name__ == short and cls.__module__.startswith(package)}
        if not matches:
            available = sorted({cls.__name__ for cls in present})
            raise MisconfigurationError(
                f"{option} names the class {name!r}, but no module of that class is in the model. "
                f"Classes in the model: {', '.join(available)}. Fix the name, or pass the class itself."
            )
        resolved |= matches
    return resolved


def normalize_policy(value: PolicyInput, option: str) -> Policy | None:
    """Check a user's policy and bring it into one form. Class names stay unresolved until
    :func:`resolve_policy` sees the model.

    Raises:
        TypeError: the value has none of the accepted forms.
    """
    if value is None:
        return None
    if _is_torch_policy(value):
        return Policy(option, policy=value)
    if isinstance(value, type) and issubclass(value, nn.Module):
        return Policy(option, classes=frozenset({value}))
    if isinstance(value, set | frozenset | list | tuple):
        items = list(value)
        bad = [
            item
            for item in items
            if not (isinstance(item, str) or (isinstance(item, type) and issubclass(item, nn.Module)))
        ]
        if bad or not items:
            raise TypeError(
                f"{option} got a {type(value).__name__} holding {', '.join(repr(b) for b in bad) or 'nothing'}; "
                f"a collection must hold nn.Module subclasses or class names. Accepted: {_ACCEPTED}."
            )
        return Policy(option, classes=frozenset(items))  # type: ignore[arg-type]
    if isinstance(value, str):
        return Policy(option, classes=frozenset({value}))  # type: ignore[arg-type]
    if callable(value):
        return Policy(option, policy=value)
    raise TypeError(f"{option} got {type(value).__name__} ({value!r}). Accepted: {_ACCEPTED}.")


def resolve_policy(policy: Policy | None, model: nn.Module) -> Policy | None:
    """Resolve class names against ``model``; warn when the policy selects no submodule."""
    if policy is None:
        return None
    if policy.classes:
        names: list[str] = [c for c in policy.classes if isinstance(c, str)]  # type: ignore[misc]
        classes = {c for c in policy.classes if not isinstance(c, str)}
        if names:
            classes |= _resolve_names(names, model, policy.name)
        policy = Policy(policy.name, classes=frozenset(classes))
    if not policy.selected(model):
        warnings.warn(
            f"{policy.name} selects no submodule of {type(model).__name__}"
            + (
                f" (classes: {', '.join(sorted(c.__name__ for c in policy.classes))})"
                if policy.classes
                else ""
            )
            + ". Check the layer classes, or the whole model becomes one unit.",
            stacklevel=3,
        )
    return policy


def tied_parameter_groups(model: nn.Module) -> list[list[str]]:
    """Names of parameters shared by several modules (one ``nn.Parameter`` under several names),
    one sorted list per shared parameter.

    [Note: a tie is two modules, not two names]
    A module can be reachable under several names: Lightning's manual-wrapping guide keeps
    ``self.linear_layer`` and also puts ``wrap(self.linear_layer)`` into ``self.model``, so the
    same ``Linear`` is ``linear_layer`` and ``model.0._fsdp_wrapped_module``. Its weight then has
    two names, but it is not tied: one module owns it, and FSDP manages it wherever it wrapped
    that module. A parameter is tied only when *different* modules (or one module under two
    attribute names) hold it, as tied input and output embeddings do; a group lists one name per
    holder, the first under which ``named_parameters`` reaches it.
    """
    holders: dict[int, dict[tuple[int, str], str]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for local, param in module.named_parameters(recurse=False, remove_duplicate=False):
            name = f"{module_name}.{local}" if module_name else local
            holders.setdefault(id(param), {}).setdefault((id(module), local), name)
    return [sorted(names.values()) for names in holders.values() if len(names) > 1]


def _common_prefix(paths: list[str]) -> str:
    split = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def keep_tied_together(policy: Policy | None, model: nn.Module) -> tuple[Policy | None, list[str]]:
    """``policy`` changed so that no parameter shared by several modules is split across units.

    [Note: tied parameters stay in one unit]
    A parameter shared by two modules (tied input and output embeddings) must belong to one
    FSDP unit: split across two, FSDP shards it in one and the other keeps a stale view, and
    the first forward fails with a size mismatch. When the policy would split a tied group, the
    modules it selects between the group's owners and their common ancestor are not wrapped,
    so the shared parameter lands in the unit of that ancestor (or of its nearest wrapped
    ancestor). Returns the policy (an explicit module set, when changed) and one note per
    group that needed it, for the wrap plan.
    """
    if policy is None:
        return None, []
    groups = tied_parameter_groups(model)
    if not groups:
        return policy, []
    selected = policy.selected(model)
    names = {m: n for n, m in model.named_modules()}
    dropped: set[nn.Module] = set()
    notes = []
    for group in groups:
        owners = [name.rpartition(".")[0] for name in group]
        common = _common_prefix(owners)
        below = [
            m
            for m in selected
            if len(names[m]) > len(common)
            and (not common or names[m].startswith(common + "."))
            and any(owner == names[m] or owner.startswith(names[m] + ".") for owner in owners)
        ]
        if below:
            dropped.update(below)
            notes.append(
                f"tied parameters {', '.join(group)} are kept in one unit, that of their common ancestor "
                f"{common or '(root)'}: not wrapping {', '.join(sorted(names[m] for m in below))} on its own"
            )
    if not dropped:
        return policy, []
    from torch.distributed.fsdp.wrap import CustomPolicy

    keep = {m for m in selected if m not in dropped}
    return Policy(policy.name, policy=CustomPolicy(lambda module: module in keep)), notes


# ---------------------------------------------------------------------------------- wrap plan
_SHARDING_FACTORS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


@dataclass(frozen=True)
class Unit:
    """One FSDP unit: the module it wraps and the parameters it owns (not those of nested units)."""

    name: str
    module_type: str
    numel: int


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes per rank for parameters, gradients and optimizer state (device memory)."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


@dataclass(frozen=True)
class WrapPlan:
    """What wrapping a model with FSDP will produce, computed without a process group."""

    units: list[Unit]
    checkpointed: list[str]
    total_numel: int
    world_size: int
    shard_size: int
    sharding_strategy: str
    cpu_offload: bool
    param_bytes: int
    estimate: MemoryEstimate
    estimate_no_shard: MemoryEstimate
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tensor_parallel_size: int = 1  # processes each layer is split over before FSDP shards it

    @property
    def root_numel(self) -> int:
        """Parameters left in the root unit (not in any wrapped submodule)."""
        return self.units[0].numel

    @property
    def largest(self) -> Unit:
        """The unit with most parameters."""
        return max(self.units, key=lambda u: u.numel)

    def summary(self) -> str:
        """A human-readable table of the plan."""
        lines = [
            f"FSDP wrap plan: {len(self.units)} unit(s), {_fmt_count(self.total_numel)} parameters, "
            f"{self.sharding_strategy} over {self.shard_size} of {self.world_size} rank(s)"
            + (f" x tensor parallel {self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else "")
            + (", CPU offload" if self.cpu_offload else ""),
            f"  {'unit':<40} {'type':<28} {'params':>10}",
        ]
        shown = self.units if len(self.units) <= 12 else [*self.units[:6], None, *self.units[-5:]]
        for unit in shown:
            if unit is None:
                lines.append(f"  {'...':<40} {'':<28} {'':>10}")
                continue
            lines.append(f"  {unit.name or '(root)':<40} {unit.module_type:<28} {_fmt_count(unit.numel):>10}")
        lines.append(
            f"  largest unit: {self.largest.name or '(root)'} ({_fmt_count(self.largest.numel)}); "
            f"left in root: {_fmt_count(self.root_numel)}"
        )
        lines.append(
            f"  activation checkpointing: {len(self.checkpointed)} module(s)"
            + (
                f" ({', '.join(self.checkpointed[:4])}{', ...' if len(self.checkpointed) > 4 else ''})"
                if self.checkpointed
                else ""
            )
        )
        est, base = self.estimate, self.estimate_no_shard
        lines.append(
            f"  per-rank memory estimate: params {_fmt_bytes(est.params)}, grads {_fmt_bytes(est.grads)}, "
            f"optimizer {_fmt_bytes(est.optimizer)} = {_fmt_bytes(est.total)} "
            f"(NO_SHARD: {_fmt_bytes(base.total)}, {est.total / max(base.total, 1):.2f}x)"
        )
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  warning: {w}" for w in self.warnings)
        lines.extend(f"  error: {e}" for e in self.errors)
        return "\n".join(lines)


def _fmt_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def estimate_memory(
    total_numel: int,
    largest_unit_numel: int,
    *,
    num_units: int = 2,
    sharding_strategy: str,
    shard_size: int,
    param_bytes: int,
    compute_bytes: int,
    optimizer_states_per_param: int,
    cpu_offload: bool,
    tensor_parallel_size: int = 1,
) -> MemoryEstimate:
    """Device bytes per rank for parameters, gradients and optimizer state.

    Sharded state is divided by the shard group size. While a unit computes, its parameters are
    gathered in the compute dtype; with prefetching two units can be gathered at once. Under
    SHARD_GRAD_OP parameters stay gathered between forward and backward (a full copy).
    ``num_units``: how many units the model has (a single unit is never gathered twice).
    Optimizer state counts ``optimizer_states_per_param`` float32 values per parameter (Adam: 2).
    With CPU offload, sharded parameters, gradients and optimizer state live in host memory.
    Activations are not included: they depend on the batch. ``tensor_parallel_size``: each
    parameter is split that many ways before FSDP shards it, and gathered only within its
    tensor-parallel slice (counted as if every parameter were split: the norms and biases that
    are not are small).
    """
    tp = max(tensor_parallel_size, 1)
    total_numel, largest_unit_numel = -(-total_numel // tp), -(-largest_unit_numel // tp)
    n = max(shard_size, 1)
    if sharding_strategy == "NO_SHARD":
        params, grads = total_numel * param_bytes, total_numel * param_bytes
        optimizer = total_numel * 4 * optimizer_states_per_param
        return MemoryEstimate(params, grads, optimizer)
    sharded_params = total_numel * param_bytes // n
    transient = min(num_units, 2) * largest_unit_numel * compute_bytes
    if sharding_strategy in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        transient = total_numel * compute_bytes
    grads = total_numel * param_bytes // n + largest_unit_numel * compute_bytes
    optimizer = total_numel * 4 * optimizer_states_per_param // n
    if cpu_offload:
        return MemoryEstimate(transient, largest_unit_numel * compute_bytes, 0)
    return MemoryEstimate(sharded_params + transient, grads, optimizer)


def _owner_units(model: nn.Module, wrapped: set[nn.Module]) -> dict[str, str]:
    """Map each parameter name to the name of the unit (nearest wrapped ancestor) owning it.

    A module reachable under several names (see [Note: a tie is two modules, not two names])
    belongs to the unit that wraps it on one of its paths, as FSDP manages it there; only a
    module no unit wraps on any path belongs to the root. A unit is named by its first name.
    """
    first_name = {m: n for n, m in model.named_modules()}
    unit_of: dict[int, str] = {}

    def visit(module: nn.Module, unit: str) -> None:
        if module in wrapped:
            unit = first_name[module]
        if unit_of.get(id(module)):  # already in a unit on another path: that unit manages it
            return
        unit_of[id(module)] = unit
        for child in module.children():
            visit(child, unit)

    visit(model, "")
    return {
        f"{module_name}.{local}" if module_name else local: unit_of[id(module)]
        for module_name, module in model.named_modules(remove_duplicate=False)
        for local, _ in module.named_parameters(recurse=False, remove_duplicate=False)
    }


def _units(
    model: nn.Module, wrapped: set[nn.Module], names: dict[nn.Module, str], owners: dict[str, str]
) -> list[Unit]:
    """The units: the root ("") and each wrapped module, with the parameters each holds (a
    shared parameter counted once, in the unit of its first name)."""
    counts: dict[str, int] = {"": 0}
    counts.update({names[m]: 0 for m in model.modules() if m in wrapped})
    seen: set[int] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            continue
        seen.add(id(param))
        counts[owners[name]] += param.numel()
    return [
        Unit(n, type(model if n == "" else model.get_submodule(n)).__name__, c) for n, c in counts.items()
    ]


def _tied_parameter_errors(model: nn.Module, owners: dict[str, str]) -> list[str]:
    """A line for each group of tied parameters split between units, which FSDP cannot shard."""
    plan_errors = []
    for group in tied_parameter_groups(model):
        homes = {owners[n] or "(root)" for n in group}
        if len(homes) > 1:
            plan_errors.append(
                f"tied parameters {', '.join(group)} are in different units ({', '.join(sorted(homes))}), "
                "which FSDP cannot shard: wrap their modules in one unit (their common ancestor's), "
                "e.g. do not wrap them by hand in configure_model()"
            )
    return plan_errors


def build_wrap_plan(
    model: nn.Module,
    auto_wrap: Policy | None,
    checkpointing: Policy | None,
    *,
    world_size: int,
    shard_size: int,
    sharding_strategy: str,
    cpu_offload: bool,
    param_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    optimizer_states_per_param: int = 2,
    use_orig_params: bool = True,
    tensor_parallel_size: int = 1,
) -> WrapPlan:
    """Compute the :class:`WrapPlan` for ``model`` (policies already resolved); ``shard_size``:
    the FSDP shard group, within each of ``tensor_parallel_size`` tensor-parallel slices."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    names = {m: n for n, m in model.named_modules()}
    # units sharded by hand in configure_model(): FSDP1's wrap() or FSDP2's fully_shard()
    preexisting: list[nn.Module] = [
        m for m in model.modules() if isinstance(m, FullyShardedDataParallel | FSDPModule)
    ]
    wrapped: set[nn.Module] = set(preexisting) or (
        set(auto_wrap.selected(model)) if auto_wrap is not None else set()
    )
    wrapped.discard(model)
    owners = _owner_units(model, wrapped)
    units = _units(model, wrapped, names, owners)
    plan_errors = _tied_parameter_errors(model, owners)
    if not preexisting:
        plan_errors += flat_parameter_errors(model, owners, use_orig_params=use_orig_params)
    checkpointed = [names[m] for m in checkpointing.selected(model)] if checkpointing is not None else []
    total = sum(u.numel for u in units)
    param_bytes = torch.finfo(param_dtype).bits // 8
    compute_bytes = torch.finfo(compute_dtype).bits // 8
    largest = max(u.numel for u in units)
    common = dict(
        param_bytes=param_bytes,
        compute_bytes=compute_bytes,
        optimizer_states_per_param=optimizer_states_per_param,
        num_units=len(units),
    )
    estimate = estimate_memory(
        total,
        largest,
        sharding_strategy=sharding_strategy,
        shard_size=shard_size,
        cpu_offload=cpu_offload,
        tensor_parallel_size=tensor_parallel_size,
        **common,
    )  # type: ignore[arg-type]
    baseline = estimate_memory(
        total, largest, sharding_strategy="NO_SHARD", shard_size=1, cpu_offload=False, **common
    )  # type: ignore[arg-type]
    return WrapPlan(
        units,
        checkpointed,
        total,
        world_size,
        shard_size,
        sharding_strategy,
        cpu_offload,
        param_bytes,
        estimate,
        baseline,
        errors=plan_errors,
        tensor_parallel_size=tensor_parallel_size,
    )


def _listed(names: list[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def flat_parameter_errors(model: nn.Module, owners: dict[str, str], *, use_orig_params: bool) -> list[str]:
    """What FSDP's flat parameters cannot hold, unit by unit, said before torch says it.

    A unit's parameters are flattened into one tensor, so they must share a dtype, and, with
    ``use_orig_params=False``, a ``requires_grad`` flag (torch: "Must flatten tensors with
    uniform dtype / requires_grad").
    """
    units: dict[str, list[tuple[str, nn.Parameter]]] = {}
    seen: set[int] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in seen:
            seen.add(id(param))
            units.setdefault(owners[name], []).append((name, param))
    errors = []
    for unit, params in units.items():
        label = unit or "(root)"
        kind = type(model if unit == "" else model.get_submodule(unit)).__name__
        by_dtype: dict[torch.dtype, list[str]] = {}
        for name, param in params:
            by_dtype.setdefault(param.dtype, []).append(name)
        if len(by_dtype) > 1:
            found = "; ".join(f"{dtype}: {_listed(names)}" for dtype, names in by_dtype.items())
            errors.append(
                f"unit {label} ({kind}) holds parameters of {len(by_dtype)} dtypes ({found}), but FSDP flattens "
                "a unit into one tensor of one dtype. Give the model one dtype (model.to(torch.float32); "
                "compute in another with precision= or mixed_precision=), or make the modules of the other "
                "dtype units of their own (add their class to auto_wrap_policy)"
            )
        frozen = [name for name, param in params if not param.requires_grad]
        if not use_orig_params and frozen and len(frozen) < len(params):
            trainable = [name for name, param in params if param.requires_grad]
            errors.append(
                f"unit {label} ({kind}) mixes frozen parameters ({_listed(frozen)}) and trainable ones "
                f"({_listed(trainable)}), which FSDP's flat parameters cannot hold with use_orig_params=False. "
                "Keep use_orig_params=True (FSDPStrategy's default), or make the frozen modules units of "
                "their own (add their class to auto_wrap_policy)"
            )
    return errors

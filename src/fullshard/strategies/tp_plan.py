"""Tensor-parallel plans: from a Hugging Face model's own plan, or a user's, to torch ``ParallelStyle``s.

:func:`resolve_tp_plan` turns ``tp_plan="auto"`` (the plan a Hugging Face model ships) or a user's
``{module-name pattern: style}`` dict into ``{module name: ParallelStyle}``, one entry per concrete
module; :func:`apply_tp_plan` checks the model can be split that way and applies it with
``torch.distributed.tensor.parallel.parallelize_module`` (docs/fsdp/tp-plans.md).

[Note: where a Hugging Face model keeps its plan]
transformers stores the plan of the base model (``LlamaModel``) on its config class,
``LlamaConfig.base_model_tp_plan = {"layers.*.self_attn.q_proj": "colwise", ...}``, its keys relative
to the base model; a head class adds its own on the class, ``LlamaForCausalLM._tp_plan = {"lm_head":
"colwise_gather_output"}`` (``"colwise_rep"`` in transformers 4), keys relative to itself. A model
merges them at construction: the class plan, then the config's if the model is its own base model
(``base_model`` is itself), then each child's plan under the child's name, so ``LlamaForCausalLM``'s
plan reads ``{"lm_head": ..., "model.layers.*.self_attn.q_proj": ...}``. transformers 5 also
splits a base model's input embedding by vocabulary when the plan does not name it (``"embed_tokens":
"embedding_rowwise"``, ``init_parallel_plans`` in ``transformers/distributed/mixin.py``): that is
what lets a head tied to the embedding (``tie_word_embeddings``) be split by vocabulary with it.
fullshard redoes that merge, the embedding rule included, from the class and config attributes
rather than reading the instance's merged ``_tp_plan``, so that it reads the same plan from models
of transformers 4 (whose embedding stayed whole) and from models written in that style without
transformers. ``*`` in a key stands for one dotted name segment (a layer number in transformers' plans).

[Note: attention heads under tensor parallelism]
A colwise ``q_proj``/``k_proj``/``v_proj`` leaves each rank the output features of
``heads / tp_size`` whole heads, so both head counts must divide by the TP size; that is checked
before anything is sharded. transformers' attention (Llama and the models copied from it since
transformers 4.48) reshapes with ``view(*shape, -1, head_dim)`` and ``reshape(*shape, -1)`` and so
works on the local heads unchanged; it never reads a head count at run time (``num_key_value_groups``,
heads per key/value head, is the same on every rank). Older attention code read ``self.num_heads``
and ``self.num_key_value_heads`` to reshape: :func:`apply_tp_plan` sets those instance attributes,
where a module has them, to the per-rank counts (as torchtitan does for its ``n_heads``). The
config is left alone: other modules read it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from fullshard.errors import MisconfigurationError, did_you_mean

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["ACCEPTED_STYLES", "apply_tp_plan", "resolve_tp_plan"]

# The style strings of transformers' plans that one torch ParallelStyle expresses, and what each
# becomes (documented in docs/fsdp/tp-plans.md). "replicate" leaves the module whole on every rank.
ACCEPTED_STYLES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "colwise_gather_output",
    "rowwise_rep",
    "rowwise_split_input",
    "embedding_rowwise",
    "embedding_colwise",
    "replicate",
)
_EMBEDDING_STYLES = ("embedding_rowwise", "embedding_colwise")

# transformers styles that need more than one torch ParallelStyle can say, and why.
_REFUSED_STYLES = {
    "sequence_parallel": "its neighbours must hand over and take sequence-sharded activations, which one "
    "style per module cannot say; write those layouts with torch's SequenceParallel() and "
    "ColwiseParallel(input_layouts=Shard(1)) / RowwiseParallel(output_layouts=Shard(1))",
    "replicated_with_grad_allreduce": "it sums the gradients of a replicated parameter that sees only this "
    "rank's heads (per-head q_norm/k_norm), which no torch ParallelStyle does",
    "packed_colwise": "the weight holds fused projections (gate and up) that must be split one by one",
    "packed_rowwise": "the weight holds fused projections that must be split one by one",
    "local_params": "it runs a module on local shards of a parameter the plan names by itself",
    "mla_kv_a_proj": "it splits a multi-head latent attention projection by hand",
    "all_reduce": "it all-reduces a module's partial output outside any torch ParallelStyle",
    "moe_tp_experts": "mixture-of-experts layers are split by transformers' own expert code",
    "moe_identity_expert": "mixture-of-experts layers are split by transformers' own expert code",
}
# transformers 4's styles that left part of the communication to the model's own code
_REFUSED_STYLES.update(
    dict.fromkeys(
        ("local_colwise", "local_rowwise", "local_packed_rowwise", "local", "gather", "isolated"),
        "it is one of transformers 4's styles that leave part of the communication to the model's own code",
    )
)
_HEAD_ATTRIBUTES = ("num_heads", "num_attention_heads", "num_key_value_heads", "n_heads", "n_kv_heads")
_PLAN_EXAMPLE = "{'layers.*.self_attn.q_proj': 'colwise', 'layers.*.self_attn.o_proj': 'rowwise'}"


def resolve_tp_plan(model: nn.Module, tp_plan: str | Mapping[str, Any]) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of ``model``, one ``ParallelStyle`` per concrete module name.

    Args:
        model: the module to parallelise; plan keys are names in its ``named_modules()``.
        tp_plan: ``"auto"``: the plan of the Hugging Face model(s) inside ``model`` (see [Note: where
            a Hugging Face model keeps its plan]), their keys prefixed with where they sit in
            ``model``. Or a dict ``{pattern: style}``: ``pattern`` a module name in which ``*``
            (fnmatch) stands for any part of one dotted segment, ``style`` a
            ``torch.distributed.tensor.parallel.ParallelStyle`` or one of :data:`ACCEPTED_STYLES`.

    Returns:
        ``{module name: ParallelStyle}``; modules styled ``"replicate"`` are left out (kept whole).

    Raises:
        MisconfigurationError: ``"auto"`` for a model without a plan, an unknown or unsupported
            style, a pattern that matches no module, a style on a module it cannot split, or two
            patterns giving one module different styles.
    """
    if isinstance(tp_plan, str):
        if tp_plan != "auto":
            raise MisconfigurationError(
                f"tp_plan={tp_plan!r} is not understood: pass tp_plan='auto' (the plan a Hugging Face model "
                f"carries) or a dict of module-name patterns to styles, e.g. tp_plan={_PLAN_EXAMPLE}."
            )
        return _resolve(model, _hf_plan_of(model), source="the model's own plan (tp_plan='auto')")
    if not isinstance(tp_plan, Mapping) or not all(isinstance(k, str) for k in tp_plan):
        raise MisconfigurationError(
            f"tp_plan must be 'auto' or a dict of module-name patterns to styles, got {type(tp_plan).__name__}: "
            f"e.g. tp_plan={_PLAN_EXAMPLE}."
        )
    if not tp_plan:
        raise MisconfigurationError(
            f"tp_plan={{}} splits nothing: name the modules to split, e.g. tp_plan={_PLAN_EXAMPLE}, or pass "
            "tp_plan='auto' for a Hugging Face model's own plan."
        )
    return _resolve(model, dict(tp_plan), source="tp_plan")


def apply_tp_plan(model: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, ParallelStyle]) -> nn.Module:
    """Split ``model`` in place over the 1-D ``tp_mesh`` by a plan from :func:`resolve_tp_plan`.

    Before anything is sharded it checks that every attention module whose projections are split
    has head counts divisible by the TP size, and that no parameter to be split is shared with
    (tied to) a module that is split differently or not at all; a parameter that all its modules
    split along the same dimension (a vocabulary-split embedding and head) is tied again after the
    split. After ``parallelize_module`` the head-count attributes of those attention modules hold
    the per-rank counts (see [Note: attention heads under tensor parallelism]).

    Raises:
        MisconfigurationError: a mesh that is not 1-D, head counts not divisible by its size,
            a plan naming a module ``model`` does not have, a module split (or sharded) already,
            or tied parameters split apart.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    if tp_mesh.ndim != 1:
        raise MisconfigurationError(
            f"apply_tp_plan takes the 1-D tensor-parallel mesh, got a {tp_mesh.ndim}-D mesh "
            f"{tp_mesh.mesh_dim_names}: pass its tensor-parallel dimension, e.g. mesh['tensor_parallel']."
        )
    tp_size = tp_mesh.size()
    modules = dict(model.named_modules())
    if missing := [name for name in plan if name not in modules]:
        raise MisconfigurationError(
            f"The plan names {missing} that {type(model).__name__} does not have: pass the plan "
            "resolve_tp_plan(model, ...) returned for this same model."
        )
    _check_not_split(modules, plan)
    attention = _split_attention(modules, plan)
    _check_heads(attention, tp_size)
    retie = _check_ties(model, plan)
    for name, style in plan.items():  # one entry per concrete module: no wildcard left for torch
        parallelize_module(modules[name], tp_mesh, style)
    for group in retie:  # every module split the same way: share the first one's split parameter
        (first, first_attr), *others = group
        for module, attr in others:
            setattr(module, attr, getattr(first, first_attr))
    for module in attention.values():
        for attr in _HEAD_ATTRIBUTES:
            count = getattr(module, attr, None)
            if isinstance(count, int) and not isinstance(count, bool) and attr in vars(module):
                setattr(module, attr, count // tp_size)
    return model


# ------------------------------------------------------------------------------ resolving
def _hf_plan_of(model: nn.Module) -> dict[str, Any]:
    plan = _hf_plan(model)
    if not plan:
        raise MisconfigurationError(
            f"tp_plan='auto' reads the tensor-parallel plan a Hugging Face model carries (base_model_tp_plan on "
            f"its config, _tp_plan on its class), but {type(model).__name__} has none. Pass the plan yourself "
            f"with the names of its linear layers, e.g. tp_plan={_PLAN_EXAMPLE} (docs/fsdp/tp-plans.md), or "
            "use ModelParallelStrategy and parallelise the model in configure_model()."
        )
    return plan


def _hf_plan(module: nn.Module) -> dict[str, Any]:
    """The merged plan of every Hugging Face model in ``module`` (see [Note: where a Hugging Face
    model keeps its plan]), keys relative to ``module``."""
    plan: dict[str, Any] = dict(getattr(type(module), "_tp_plan", None) or {})
    if _is_hf_base_model(module):
        plan.update(getattr(module.config, "base_model_tp_plan", None) or {})
        if plan and isinstance(getattr(module, "embed_tokens", None), nn.Embedding):
            plan = {"embed_tokens": "embedding_rowwise", **plan}  # as transformers 5 does
    for name, child in module.named_children():
        plan.update({f"{name}.{key}": style for key, style in _hf_plan(child).items()})
    return plan


def _is_hf_base_model(module: nn.Module) -> bool:
    """A transformers ``PreTrainedModel`` (it has ``config`` and ``base_model_prefix``) that is its own base model."""
    prefix = getattr(type(module), "base_model_prefix", None)
    if not isinstance(prefix, str) or getattr(module, "config", None) is None:
        return False
    base = getattr(module, "base_model", None)
    if isinstance(base, nn.Module):
        return base is module
    return not isinstance(getattr(module, prefix, None), nn.Module)


def _resolve(model: nn.Module, plan: Mapping[str, Any], source: str) -> dict[str, ParallelStyle]:
    names = [name for name, _ in model.named_modules()]
    modules = dict(model.named_modules())
    resolved: dict[str, ParallelStyle] = {}
    chosen: dict[str, tuple[str, Any]] = {}  # module name -> (pattern, style as given)
    for pattern, given in plan.items():
        style = _to_style(pattern, given, source)
        matched = _match(pattern, names)
        if not matched:
            raise MisconfigurationError(_no_match_message(model, pattern, names, source))
        for name in matched:
            if name in chosen and chosen[name][1] is not given and chosen[name][1] != given:
                raise MisconfigurationError(
                    f"{source}: {chosen[name][0]!r} and {pattern!r} both match {name!r} with different styles "
                    f"({chosen[name][1]!r}, {given!r}): remove one, or narrow a pattern."
                )
            chosen[name] = (pattern, given)
            if style is None:  # "replicate": kept whole on every rank
                resolved.pop(name, None)
                continue
            _check_module_type(name, modules[name], given, source)
            resolved[name] = style
    return resolved


def _match(pattern: str, names: Iterable[str]) -> list[str]:
    """The names ``pattern`` matches segment by segment (``*`` never crosses a dot)."""
    parts = pattern.split(".")
    return [
        name
        for name in names
        if len(segments := name.split(".")) == len(parts)
        and all(fnmatch.fnmatchcase(s, p) for s, p in zip(segments, parts, strict=True))
    ]


def _no_match_message(model: nn.Module, pattern: str, names: list[str], source: str) -> str:
    generic = sorted({".".join("*" if s.isdigit() else s for s in n.split(".")) for n in names if n})
    hint = did_you_mean(pattern, generic)
    prefixed = [n for n in generic if n.endswith("." + pattern)]
    if not hint and prefixed:
        hint = (
            f" Keys are relative to the module given ({type(model).__name__}): did you mean {prefixed[0]!r}?"
        )
    return (
        f"{source}: {pattern!r} matches no module of {type(model).__name__}.{hint} Keys are module names as "
        f"model.named_modules() gives them, '*' standing for one dotted segment (e.g. 'model.layers.*.mlp.up_proj'); "
        f"fix the key or remove it."
    )


def _to_style(pattern: str, given: Any, source: str) -> ParallelStyle | None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    if isinstance(given, ParallelStyle):
        return given
    accepted = (
        f"accepted are the strings {', '.join(map(repr, ACCEPTED_STYLES))} or a "
        "torch.distributed.tensor.parallel.ParallelStyle (ColwiseParallel(), RowwiseParallel(), ...)"
    )
    if isinstance(given, str) and given in _REFUSED_STYLES:
        raise MisconfigurationError(
            f"{source}: {pattern!r} has the transformers style {given!r}, which fullshard cannot apply: "
            f"{_REFUSED_STYLES[given]}. Pass tp_plan={{...}} with torch ParallelStyles for those modules "
            "(docs/fsdp/tp-plans.md), or use ModelParallelStrategy and parallelise the model in configure_model()."
        )
    if not isinstance(given, str) or given not in ACCEPTED_STYLES:
        raise MisconfigurationError(
            f"{source}: {pattern!r} has the style {given!r}, which is not one fullshard knows: {accepted}."
            f"{did_you_mean(given, ACCEPTED_STYLES)}"
        )
    styles: dict[str, ParallelStyle | None] = {
        "colwise": ColwiseParallel(),
        "rowwise": RowwiseParallel(),
        "colwise_rep": ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": RowwiseParallel(input_layouts=Replicate()),
        "embedding_colwise": ColwiseParallel(output_layouts=Replicate()),
        "replicate": None,
    }
    styles["colwise_gather_output"] = styles["colwise_rep"]  # transformers 5's name for it
    styles["rowwise_split_input"] = styles["rowwise_rep"]
    return styles[given]


def _check_module_type(name: str, module: nn.Module, given: Any, source: str) -> None:
    """torch's Colwise/RowwiseParallel split ``nn.Linear`` and ``nn.Embedding`` only; say so before sharding."""
    if not isinstance(given, str):
        return  # a ParallelStyle the user built: torch checks what it supports
    wanted = (nn.Embedding,) if given in _EMBEDDING_STYLES else (nn.Linear, nn.Embedding)
    if not isinstance(module, wanted):
        kinds = " or ".join(t.__name__ for t in wanted)
        raise MisconfigurationError(
            f"{source}: {name!r} is a {type(module).__name__}, but the style {given!r} splits {kinds} modules "
            "only. Give it a ParallelStyle written for it, or remove it from the plan."
        )


# ------------------------------------------------------------------------------ applying
def _split_attention(
    modules: Mapping[str, nn.Module], plan: Mapping[str, ParallelStyle]
) -> dict[str, nn.Module]:
    """The parents of modules whose output stays split by head (colwise with a sharded output) that
    know their head counts: attention modules."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    found: dict[str, nn.Module] = {}
    for name, style in plan.items():
        if not isinstance(style, ColwiseParallel):
            continue
        layouts = style.output_layouts  # a one-element tuple (torch keeps the placement per mesh dim)
        if not any(isinstance(p, Shard) for p in (layouts if isinstance(layouts, tuple) else (layouts,))):
            continue
        parent_name = name.rpartition(".")[0]
        parent = modules[parent_name]
        if _head_counts(parent):
            found[parent_name] = parent
    return found


def _head_counts(module: nn.Module) -> dict[str, int]:
    """The head counts an attention module holds or reads from its config; none for a module that
    is no attention (it has neither ``head_dim`` nor a head count of its own, as an MLP holding the
    config)."""
    counts: dict[str, int] = {}
    if not hasattr(module, "head_dim") and not any(attr in vars(module) for attr in _HEAD_ATTRIBUTES):
        return counts
    config = getattr(module, "config", None)
    for owner, prefix in ((config, "config."), (module, "")):
        for attr in _HEAD_ATTRIBUTES:
            value = getattr(owner, attr, None) if owner is not None else None
            if isinstance(value, int) and not isinstance(value, bool):
                counts[prefix + attr] = value
    return counts


def _check_heads(attention: Mapping[str, nn.Module], tp_size: int) -> None:
    for name, module in attention.items():
        counts = _head_counts(module)
        if bad := {attr: n for attr, n in counts.items() if n % tp_size}:
            sizes = sorted(
                {d for d in range(1, max(counts.values()) + 1) if all(n % d == 0 for n in counts.values())}
            )
            raise MisconfigurationError(
                f"Tensor parallelism over {tp_size} processes splits the attention heads of {name!r} "
                f"({type(module).__name__}), but {', '.join(f'{a}={n}' for a, n in bad.items())} does not divide "
                f"by {tp_size}: each process must hold whole heads. Use a tensor_parallel_size that divides "
                f"every head count ({', '.join(map(str, sizes))}), or leave the attention projections out of the plan."
            )


def _check_not_split(modules: Mapping[str, nn.Module], plan: Mapping[str, ParallelStyle]) -> None:
    """A parameter that is a DTensor already was split by an earlier plan or sharded by ``fully_shard``."""
    from torch.distributed.tensor import DTensor

    for name in plan:
        for param_name, param in modules[name].named_parameters():
            if isinstance(param, DTensor):
                raise MisconfigurationError(
                    f"{name + '.' + param_name!r} is split already (a DTensor over {param.device_mesh}): apply "
                    "a tensor-parallel plan once, to the model as built, and before fully_shard (FSDP2 shards "
                    "the tensor-parallel shards further, not the other way round)."
                )


def _check_ties(model: nn.Module, plan: Mapping[str, ParallelStyle]) -> list[list[tuple[nn.Module, str]]]:
    """The tied parameters (one parameter shared by several modules, as tied embeddings) that stay
    tied: those the plan splits in none of their modules, and those it splits the same way in all
    of them (a vocabulary-split embedding and head). ``parallelize_module`` gives each split module
    a new parameter, so the second kind, returned as ``[(module, attribute), ...]`` groups, must be
    tied again after it; any other split of a tied parameter is refused."""
    owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param_name, param in module.named_parameters(recurse=False, remove_duplicate=False):
            owners.setdefault(id(param), []).append((name, module, param_name))
    retie: list[list[tuple[nn.Module, str]]] = []
    for shared in (group for group in owners.values() if len(group) > 1):
        split = [name for name, _, _ in shared if name in plan]
        if not split:
            continue
        dims = {_weight_split_dim(m, plan.get(name), attr) for name, m, attr in shared}
        if len(split) == len(shared) and len(dims) == 1 and None not in dims:
            retie.append([(m, attr) for _, m, attr in shared])
            continue
        tied = " and ".join(repr(f"{name}.{attr}" if name else attr) for name, _, attr in shared)
        raise MisconfigurationError(
            f"{tied} are one tied parameter, and the plan splits {', '.join(map(repr, split))} but not every "
            "module sharing it the same way: torch gives a split module a new parameter, so the tie would "
            "silently break. Split all of them along the same dimension (tied embeddings: the embedding "
            "'embedding_rowwise' and the head 'colwise_gather_output', both by vocabulary), untie them (for "
            "a Hugging Face model, config.tie_word_embeddings=False), or leave them out of the plan."
        )
    return retie


def _weight_split_dim(module: nn.Module, style: ParallelStyle | None, attr: str) -> int | None:
    """The dimension torch's Colwise/RowwiseParallel split ``module.weight`` along; None when unknown."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if attr != "weight" or not isinstance(module, nn.Linear | nn.Embedding):
        return None
    embedding = isinstance(module, nn.Embedding)  # its weight is (vocabulary, dim), a Linear's (out, in)
    if isinstance(style, ColwiseParallel):
        return 1 if embedding else 0
    if isinstance(style, RowwiseParallel):
        return 0 if embedding else 1
    return None

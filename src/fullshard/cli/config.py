"""Objects from configuration data, and Lightning's configuration files read as fullshard's.

Needs nothing beyond fullshard: config-driven code (mmengine-style dicts, a YAML file read by
hand) builds a strategy with :func:`strategy_from_config` and any class with
:func:`instantiate_class`; :class:`~fullshard.cli.LightningCLI` uses the same translation for the
files Lightning's ``--print_config`` wrote.

[Note: Lightning configs]
A YAML file written by Lightning's ``LightningCLI --print_config`` names Lightning's classes
(``lightning.pytorch.callbacks.ModelCheckpoint``) and spells out every argument of Lightning's
classes, including ones fullshard's counterparts do not take (``trainer.profiler: null``,
``trainer.model_registry: null``). :func:`from_lightning`
rewrites such a document once, before it is parsed:

1. ``lightning.pytorch.X.Name`` and ``pytorch_lightning.X.Name`` become the fullshard class of
   the same name (:func:`lightning_class_path`); a name fullshard lacks is an error naming it.
2. An argument that a translated class (or the Trainer) does not take is dropped when its value
   is what Lightning means by "off" or "default" (``null``),
   renamed when fullshard calls it differently (``_RENAMED``), and an error otherwise: the value
   would change what the run does, and fullshard cannot do it.
3. A Trainer argument set to ``null`` where fullshard's Trainer has a non-null default is dropped:
   Lightning's ``null`` there means "the default" (``precision: null`` is ``"32-true"``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from fullshard.errors import MisconfigurationError, did_you_mean

LIGHTNING_PREFIXES = ("lightning.pytorch.", "pytorch_lightning.")

# Lightning's package (the part after the prefix) -> the fullshard module holding the same names.
_PACKAGES = {
    "": "fullshard",
    "core": "fullshard",
    "trainer": "fullshard",
    "callbacks": "fullshard.callbacks",
    "loggers": "fullshard.loggers",
    "strategies": "fullshard.strategies",
    "cli": "fullshard.cli",
}

# (class name, Lightning's argument) -> fullshard's name for it.
# None at present (the loggers take Lightning's arguments under Lightning's names).
_RENAMED: dict[tuple[str, str], str] = {}
_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def lightning_class_path(path: str) -> str:
    """The fullshard class path for a Lightning one (``lightning.pytorch.callbacks.ModelCheckpoint``
    -> ``fullshard.callbacks.ModelCheckpoint``); any other path is returned unchanged.

    Raises:
        ValueError: ``path`` names a Lightning class fullshard has no counterpart of.
    """
    prefix = next((p for p in LIGHTNING_PREFIXES if path.startswith(p)), None)
    if prefix is None:
        return path
    package, _, name = path[len(prefix) :].rpartition(".")
    target = _PACKAGES.get(package.split(".")[0])
    why = ""
    if target is not None and not name.startswith("_"):
        module = importlib.import_module(target)
        try:
            found = getattr(module, name, None)
        except ImportError as missing:  # a Lightning name fullshard lists as not supported, with why
            found, why = None, f" {missing}."
        if isinstance(found, type):
            return f"{target}.{name}"
    where = f"`{target}`" if target else "fullshard"
    offered = _public_classes(target) if target else []
    raise ValueError(
        f"{path!r} names a Lightning class that fullshard has no counterpart of in {where}.{why}"
        f"{did_you_mean(name, offered) if offered else ''} "
        + (f"Classes there: {', '.join(offered)}. " if offered else "")
        + f"fullshard maps lightning.pytorch.<package>.<Name> for the packages "
        f"{', '.join(repr(p) for p in _PACKAGES if p)} (and lightning.pytorch.<Name>) to the fullshard "
        "class of the same name. Use one of those, or the class path of your own class."
    )


def _public_classes(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", dir(module))
    return sorted(n for n in names if not n.startswith("_") and isinstance(getattr(module, n, None), type))


def _parameters(cls: Any) -> dict[str, inspect.Parameter]:
    """Named parameters of ``cls``'s constructor (``**kwargs`` left out)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    return {n: p for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _takes_any_keyword(cls: Any) -> bool:
    try:
        return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return False


def _fit_arguments(
    owner: str, known: Mapping[str, inspect.Parameter], values: Mapping[str, Any], *, open_ended: bool = False
) -> dict[str, Any]:
    """``values`` with the Lightning-only arguments of ``owner`` dropped or renamed (item 2 of
    [Note: Lightning configs]); ``open_ended``: ``owner`` takes ``**kwargs``, which keep the rest."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in known:
            out[key] = value
        elif (owner, key) in _RENAMED:
            out[_RENAMED[owner, key]] = value
        elif value is None:
            continue
        elif open_ended:
            out[key] = value
        else:
            raise ValueError(
                f"{owner} got {key}={value!r}, which fullshard's {owner} does not take."
                f"{did_you_mean(key, list(known))} It takes: {', '.join(known)}."
            )
    return out


def _translate_classes(value: Any) -> Any:
    """Every ``class_path`` in ``value`` (nested anywhere) translated, with its ``init_args``
    fitted to the fullshard class (items 1 and 2 of [Note: Lightning configs])."""
    if isinstance(value, list):
        return [_translate_classes(v) for v in value]
    if not isinstance(value, Mapping):
        return value
    out = {k: _translate_classes(v) for k, v in value.items()}
    path = out.get("class_path")
    if isinstance(path, str) and path.startswith(LIGHTNING_PREFIXES):
        out["class_path"] = lightning_class_path(path)
        init_args = out.get("init_args")
        if isinstance(init_args, Mapping):
            cls = _import(out["class_path"])
            out["init_args"] = _fit_arguments(
                cls.__name__, _parameters(cls), init_args, open_ended=_takes_any_keyword(cls)
            )
    return out


def _fit_trainer_section(trainer_class: Any, section: Mapping[str, Any]) -> dict[str, Any]:
    """Items 2 and 3 of [Note: Lightning configs] for a ``trainer:`` section."""
    from fullshard.trainer import arguments

    known = _parameters(trainer_class)
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key in known:
            default = known[key].default
            if value is None and default is not None and default is not inspect.Parameter.empty:
                continue  # item 3
            out[key] = value
        elif value is None:
            out.update(_fit_arguments("Trainer", known, {key: value}))
        else:
            try:  # the Trainer's own check knows Lightning's options and the value that means "off"
                arguments.reject_unknown({key: value})
            except (MisconfigurationError, TypeError) as err:
                raise ValueError(f"trainer.{key}: {err}") from None
    return out


def from_lightning(
    document: Mapping[str, Any], *, trainer_class: Any = None, subcommand: str | None = None
) -> dict[str, Any]:
    """A configuration document (as Lightning's ``--print_config`` writes it, or fullshard's)
    rewritten for fullshard: see [Note: Lightning configs]. A document of fullshard's own comes
    back unchanged.

    ``document`` is one subcommand's configuration (``trainer:``, ``model:``, ``ckpt_path:``, ...),
    or holds them under ``fit:``/``validate:``/``test:``/``predict:`` keys. ``trainer_class``: the
    class the ``trainer:`` section configures (default: :class:`fullshard.Trainer`).
    ``subcommand``: which subcommand's section ``document`` is (every section is rewritten alike).

    Raises:
        ValueError: the document names a Lightning class or argument fullshard cannot honour.
    """
    if trainer_class is None:
        from fullshard.trainer.trainer import Trainer

        trainer_class = Trainer
    out: dict[str, Any] = _translate_classes(dict(document))
    for name in _SUBCOMMANDS:
        if isinstance(out.get(name), Mapping):
            out[name] = from_lightning(out[name], trainer_class=trainer_class, subcommand=name)
    if isinstance(out.get("trainer"), Mapping):
        out["trainer"] = _fit_trainer_section(trainer_class, out["trainer"])
    return out


# ---------------------------------------------------------------------------- instantiation
def _import(class_path: str) -> Any:
    """The object a dotted path names (Lightning paths translated first)."""
    if not isinstance(class_path, str) or "." not in class_path:
        raise ValueError(
            f"class_path={class_path!r} is not a dotted path: give the module and the name, "
            "e.g. 'fullshard.strategies.FSDPStrategy' or 'torch.optim.AdamW'."
        )
    class_path = lightning_class_path(class_path)
    module_name, _, name = class_path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"class_path={class_path!r}: cannot import module {module_name!r} ({err})."
        ) from None
    try:
        return getattr(module, name)
    except AttributeError:
        public = [n for n in dir(module) if not n.startswith("_")]
        raise ValueError(
            f"class_path={class_path!r}: module {module_name!r} has no {name!r}.{did_you_mean(name, public)}"
        ) from None


def _build_nested(value: Any) -> Any:
    if isinstance(value, list):
        return [_build_nested(v) for v in value]
    if isinstance(value, Mapping) and "class_path" in value:
        return instantiate_class((), value)
    if isinstance(value, Mapping):
        return {k: _build_nested(v) for k, v in value.items()}
    return value


def instantiate_class(args: Any, init: Mapping[str, Any]) -> Any:
    """Build ``init["class_path"](*args, **init["init_args"])``, as Lightning's
    ``lightning.pytorch.cli.instantiate_class`` does (same signature: a module's
    ``configure_optimizers`` written for it ports unchanged).

    ``args``: positional arguments (a tuple, or one value, e.g. ``self.parameters()`` for an
    optimizer). Lightning class paths are translated ([Note: Lightning configs]); a value in
    ``init_args`` that is itself a ``{"class_path": ...}`` mapping is built first.

    Raises:
        ValueError: ``init`` is not a class_path/init_args mapping, or its class cannot be imported.
    """
    if not isinstance(init, Mapping) or "class_path" not in init:
        raise ValueError(
            f"instantiate_class expects a mapping {{'class_path': 'module.Class', 'init_args': {{...}}}}, "
            f"got {init!r}."
        )
    unknown = set(init) - {"class_path", "init_args", "dict_kwargs"}
    if unknown:
        raise ValueError(
            f"instantiate_class got keys {sorted(unknown)} beside class_path; accepted: class_path, init_args, dict_kwargs."
        )
    init = _translate_classes(dict(init))
    cls = _import(init["class_path"])
    kwargs = {**dict(init.get("init_args") or {}), **dict(init.get("dict_kwargs") or {})}
    positional = args if isinstance(args, tuple) else (args,)
    return cls(*positional, **_build_nested(kwargs))


def strategy_from_config(config: Any) -> Any:
    """A :class:`~fullshard.strategies.Strategy` from configuration data, for config-driven code::

        strategy_from_config("fsdp")                                  # a registry name
        strategy_from_config({"class_path": "fullshard.strategies.FSDPStrategy",
                              "init_args": {"auto_wrap_policy": ["torch.nn.TransformerEncoderLayer"],
                                            "sharding_strategy": "SHARD_GRAD_OP"}})
        strategy_from_config({"type": "fsdp", "state_dict_type": "sharded"})   # mmengine style
        strategy_from_config({"type": "FSDPStrategy", "activation_checkpointing_policy": ["Block"]})

    ``type`` is a registry name (``fullshard.strategies.STRATEGY_REGISTRY``: ``"fsdp"``,
    ``"fsdp2"``, ``"ddp"``, ...), a class of :mod:`fullshard.strategies` by name, or a class path;
    the other keys are its constructor's arguments. Policies are given by class (name or path) as
    in the constructors (:mod:`fullshard.policies`). A Strategy instance is returned as it is.

    Raises:
        ValueError: the configuration has none of these forms, or its class is not a Strategy.
        StrategyRegistryError: an unknown registry name (the message lists the registered ones).
    """
    from fullshard import strategies
    from fullshard.strategies import STRATEGY_REGISTRY, Strategy

    if isinstance(config, Strategy):
        return config
    if isinstance(config, str):
        return STRATEGY_REGISTRY.get(config)
    if not isinstance(config, Mapping):
        raise ValueError(
            f"strategy_from_config got {type(config).__name__} ({config!r}); give a registry name such as "
            "'fsdp', a {'class_path': ..., 'init_args': {...}} mapping, or a {'type': ..., **options} mapping."
        )
    if "class_path" in config:
        strategy = instantiate_class((), config)
    elif "type" in config:
        kind, options = config["type"], {k: v for k, v in config.items() if k != "type"}
        options = _build_nested(options)
        if isinstance(kind, str) and kind in STRATEGY_REGISTRY:
            return STRATEGY_REGISTRY.get(kind, **options)
        if isinstance(kind, str) and "." not in kind:
            cls = getattr(strategies, kind, None)
            if not isinstance(cls, type):
                classes = [n for n in strategies.__all__ if n.endswith("Strategy")]
                raise ValueError(
                    f"strategy type {kind!r} is neither a registered name nor a class of fullshard.strategies."
                    f"{did_you_mean(kind, STRATEGY_REGISTRY.available() + classes)} Registered names: "
                    f"{', '.join(STRATEGY_REGISTRY.available())}; classes: {', '.join(classes)}; or give a class path."
                )
        else:
            cls = kind if isinstance(kind, type) else _import(kind)
        strategy = cls(**options)
    else:
        raise ValueError(
            f"strategy_from_config got a mapping with keys {sorted(config)}; it needs 'class_path' "
            "(with 'init_args') or 'type' (with the options beside it)."
        )
    if not isinstance(strategy, Strategy):
        raise ValueError(
            f"strategy_from_config built a {type(strategy).__name__}, which is not a fullshard.strategies.Strategy."
        )
    return strategy

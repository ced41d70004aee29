"""``Module.load_from_checkpoint``: build a module from a checkpoint, without a Trainer.

Works in one process without a process group, for full and sharded checkpoints written by
fullshard and for Lightning ``.ckpt`` files, and behaves as Lightning's ``load_from_checkpoint``
does: the module is created from the saved hyperparameters (keyword arguments override them),
``configure_model()`` and ``on_load_checkpoint(checkpoint)`` run, the weights load, and the module
is moved to the device its weights were loaded on. Like Lightning it is left in training mode:
call ``.eval()`` for inference.

[Note: the model built on the meta device first]
A checkpoint's ``hyper_parameters`` decide how big the module is, and anyone can edit them (the
checksums recomputed): ``{"hidden": 200_000_000}`` built a 3.2 GB layer before the shapes were
compared. So ``cls(**hyperparameters)`` is first built under ``torch.device("meta")`` (no memory,
no time; with a copy of the arguments, its warnings silenced), its state's shapes are compared
with the weights the checkpoint holds as the real load compares them, and a module that does not
fit is refused there (:class:`HyperParametersMismatchError`, naming the hyperparameters). Only a
module that fits is built for real, so ``__init__`` runs twice. Hooks run once, as in Lightning:
``configure_model`` only on the real module, so the layers it builds are checked after they are
built, and when a class overrides it the meta module's names are not compared (it may add or
rename layers), only the shapes of the names both hold. A mismatch is confirmed by the module's
``on_load_checkpoint`` run on the meta module with a copy of the checkpoint, for a hook that
renames or reshapes old weights (so a hook that fixes one runs twice). A module the meta device
cannot build (``__init__`` reads a tensor's value, calls ``.item()``, ...) is built for real
straight away and checked after, as before.
"""

from __future__ import annotations

import copy
import inspect
import reprlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from fullshard.checkpoint.archive import verify_full_file
from fullshard.checkpoint.io import load_checkpoint_file
from fullshard.checkpoint.layout import detect_format
from fullshard.checkpoint.tools import read_sharded
from fullshard.checkpoint.validate import StateDictMismatchError, check_state_dict_matches
from fullshard.errors import CheckpointNotFoundError
from fullshard.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from fullshard.datamodule import DataModule

M = TypeVar("M", bound=nn.Module)
D = TypeVar("D", bound="DataModule")


def _default_map_location(storage: torch.UntypedStorage, location: str) -> Any:
    """Keep each tensor on the device it was saved from, or CPU when that device is not here
    (Lightning's default)."""
    if location.startswith("cuda") and not torch.cuda.is_available():
        return storage.cpu()
    if location.startswith("mps") and not torch.backends.mps.is_available():
        return storage.cpu()
    return None


# load_from_checkpoint's keyword arguments are the module's: no verify=False to offer here
_LOAD_ANYWAY = (
    "To read it regardless, damaged bytes and all, load it into a Trainer with "
    "validate(model, ckpt_path=..., ckpt_verify=False)."
)


def _read_full(path: Path, map_location: Any, trust: bool) -> dict[str, Any]:
    verify_full_file(path, _LOAD_ANYWAY)  # [Note: checksums checked on load] in layout.py
    return load_checkpoint_file(path, map_location=map_location or _default_map_location, trust=trust)


def _read_sharded(path: Path, map_location: Any, trust: bool) -> dict[str, Any]:
    """The non-tensor entries and the model weights of a sharded checkpoint, assembled whole
    (on CPU, then moved to ``map_location``); the optimizer states are not read."""
    if map_location is not None and not isinstance(map_location, str | torch.device):
        raise TypeError(
            f"map_location={map_location!r}: a sharded checkpoint is read onto the CPU and then moved, so "
            "map_location must be a device ('cpu', 'cuda:0', torch.device(...)) or None. To remap devices "
            "with a dict or function, consolidate it first: fullshard checkpoint consolidate PATH OUT.ckpt."
        )
    checkpoint, state = read_sharded(path, verify=True, trust=trust, prefix="model.", hint=_LOAD_ANYWAY)
    weights = state.get("model", {})
    device = torch.device(map_location) if map_location is not None else None
    checkpoint["state_dict"] = {
        k: v.to(device) if device is not None and isinstance(v, torch.Tensor) else v
        for k, v in weights.items()
    }
    return checkpoint


def _init_arguments(cls: type[Any], checkpoint: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``cls.__init__``'s arguments: the saved hyperparameters, overridden by ``kwargs``.

    As in Lightning, saved hyperparameters that ``__init__`` does not take are left out (unless
    it takes ``**kwargs``), and a checkpoint whose hyperparameters were saved as one argument
    (``hparams_name``) passes them as that argument.
    """
    parameters = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    names = [
        n
        for n, p in list(parameters.items())[1:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    unknown = sorted(set(kwargs) - set(names))
    if unknown and not takes_any:
        raise TypeError(
            f"{cls.__name__}.load_from_checkpoint() got {', '.join(unknown)}, which {cls.__name__}.__init__ "
            f"does not take (it takes {', '.join(names) or 'no arguments'}). Pass only arguments of "
            "__init__; they override the hyperparameters saved in the checkpoint."
        )
    saved = dict(checkpoint["hyper_parameters"])
    hparams_name = checkpoint.get("hparams_name")
    if isinstance(hparams_name, str) and hparams_name in names and hparams_name not in kwargs:
        saved = {hparams_name: saved}
    elif not takes_any:
        saved = {k: v for k, v in saved.items() if k in names}
    return {**saved, **kwargs}


class HyperParametersMismatchError(StateDictMismatchError):
    """The module a checkpoint's hyperparameters build does not fit the weights it holds; found on
    the meta device, before the module was built (see [Note: the model built on the meta device
    first])."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.missing, self.unexpected, self.mismatched, self.built_as, self.path))

    def __init__(
        self, missing: list[str], unexpected: list[str], mismatched: list[str], built_as: str, path: str
    ) -> None:
        super().__init__(missing, unexpected, mismatched)
        self.built_as, self.path = built_as, path
        found = [
            f"{what}: {', '.join(keys[:10])}" + (f" (+{len(keys) - 10} more)" if len(keys) > 10 else "")
            for what, keys in (
                ("shape mismatches", mismatched),
                ("missing keys", missing),
                ("unexpected keys", unexpected),
            )
            if keys
        ]
        strict_hint = (
            "Missing and unexpected keys are refused with strict=True only (strict=False loads the keys "
            "both have). "
            if missing or unexpected
            else ""
        )
        self.args = (
            f"load_from_checkpoint({path!r}): the module its hyperparameters build, {built_as}, does not "
            f"fit the weights it holds ({'; '.join(found)}). It was built on the meta device to compare "
            f"the shapes, so nothing was allocated and nothing loaded. {strict_hint}Load a checkpoint of "
            "this architecture, or pass the hyperparameters it was trained with as keyword arguments of "
            "load_from_checkpoint (they override the saved ones).",
        )


def _built_as(cls: type[Any], arguments: dict[str, Any], kwargs: dict[str, Any]) -> str:
    """``Cls(name=value, ...)`` with each value's repr cut short (a checkpoint's values may be huge),
    and which of them the caller gave."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    shown = [f"{name}={short.repr(value)}" for name, value in list(arguments.items())[:20]]
    if len(arguments) > 20:
        shown.append(f"... ({len(arguments) - 20} more)")
    given = [name for name in arguments if name in kwargs]
    source = f"; given as arguments: {', '.join(given)}" if given else ""
    return f"{cls.__name__}({', '.join(shown)}) (from the checkpoint's hyper_parameters{source})"


def _built(cls: type[M], arguments: dict[str, Any]) -> M:
    """``cls(**arguments)`` with ``configure_model()`` run: the module as the checkpoint's
    hyperparameters build it."""
    model = cls(**arguments)
    configure_model = getattr(model, "configure_model", None)
    if callable(configure_model):
        configure_model()
    return model


def _tensor_shapes(model: nn.Module) -> dict[str, torch.Size]:
    return {k: v.shape for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def _builds_more_in_configure_model(model: nn.Module, base: type[nn.Module]) -> bool:
    """Whether ``model`` overrides ``base``'s ``configure_model`` (which builds nothing), where
    layers may be built or renamed."""
    if vars(model).get("configure_model") is not None:
        return True
    own = getattr(type(model), "configure_model", None)
    return own is not None and own is not getattr(base, "configure_model", None)


def _check_on_meta(
    cls: type[Any],
    arguments: dict[str, Any],
    kwargs: dict[str, Any],
    checkpoint: dict[str, Any],
    strict: bool | None,
    path: Path,
    base: type[nn.Module],
) -> None:
    """Refuse a checkpoint whose weights do not fit the module its hyperparameters build, before
    building it (see [Note: the model built on the meta device first])."""
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")  # the real build says it, once
            # a copy: an __init__ that changes its arguments (config.pop(...)) gets them whole twice
            probe = cls(**copy.deepcopy(arguments))
            expected = _tensor_shapes(probe)
    except Exception:
        return  # built for real and checked after, as before
    if strict is None:
        strict = bool(getattr(probe, "strict_loading", True))
    # names count only when __init__ builds the whole module: configure_model may add layers
    strict = strict and not _builds_more_in_configure_model(probe, base)
    state_dict = checkpoint["state_dict"]
    try:
        check_state_dict_matches(expected, state_dict, strict=strict)
        return
    except StateDictMismatchError:
        pass
    # an on_load_checkpoint that renames or reshapes old weights fixes the mismatch on the real load
    on_load_checkpoint = getattr(probe, "on_load_checkpoint", None)
    if callable(on_load_checkpoint):
        trial = {**checkpoint, "state_dict": dict(state_dict)}
        try:
            with warnings.catch_warnings(), torch.device("meta"):
                warnings.simplefilter("ignore")
                on_load_checkpoint(trial)
                expected = _tensor_shapes(probe)
        except Exception:
            return
        state_dict = trial["state_dict"]
    try:
        check_state_dict_matches(expected, state_dict, strict=strict)
    except StateDictMismatchError as err:
        built_as = _built_as(cls, arguments, kwargs)
        raise HyperParametersMismatchError(
            err.missing, err.unexpected, err.mismatched, built_as, str(path)
        ) from None


def load_datamodule_from_checkpoint(
    cls: type[D], checkpoint_path: str | Path, trust_checkpoint: bool = False, **kwargs: Any
) -> D:
    """Create the DataModule ``cls`` as ``cls(**datamodule_hyper_parameters, **kwargs)`` from the
    checkpoint at ``checkpoint_path`` (fullshard's, full or sharded, or Lightning's) and load the
    state its ``state_dict`` saved there, as Lightning's ``LightningDataModule.load_from_checkpoint``.
    The checkpoint is read as for :func:`load_module_from_checkpoint`."""
    path = Path(checkpoint_path)
    if not path.exists():
        raise CheckpointNotFoundError(
            f"{cls.__name__}.load_from_checkpoint(): nothing at {str(path)!r}. Pass the path of a checkpoint "
            "file or directory that Trainer.save_checkpoint() or ModelCheckpoint wrote (or a Lightning .ckpt)."
        )
    read = _read_full if detect_format(path) == "full" else _read_sharded
    checkpoint = read(path, "cpu", trust_checkpoint)
    saved = {
        "hyper_parameters": checkpoint.get("datamodule_hyper_parameters", {}),
        "hparams_name": checkpoint.get("datamodule_hparams_name"),  # given as one config argument
    }
    datamodule = cls(**_init_arguments(cls, saved, kwargs))
    state = checkpoint.get(cls.__qualname__)
    if state is not None:
        datamodule.load_state_dict(state)
    return datamodule


def load_module_from_checkpoint(
    cls: type[M],
    checkpoint_path: str | Path,
    base: type[nn.Module],
    /,
    map_location: Any = None,
    strict: bool | None = None,
    trust_checkpoint: bool = False,
    **kwargs: Any,
) -> M:
    """Create ``cls`` from the checkpoint at ``checkpoint_path`` (see the module docstring).

    Args:
        cls: the module class; created as ``cls(**hyper_parameters, **kwargs)``.
        checkpoint_path: a full checkpoint file, a sharded checkpoint directory, or a Lightning
            ``.ckpt`` file.
        base: the library class ``cls`` derives from, whose ``configure_model`` builds nothing
            (``fullshard.Module`` passes itself: this package sits below it). Positional, so that
            ``kwargs`` may hold any of ``cls.__init__``'s names.
        map_location: as for ``torch.load``; default: the device each tensor was saved from, or
            the CPU when that device is not available. A sharded checkpoint takes a device only.
        strict: the checkpoint's weights and the module's must have exactly the same names (shapes
            must match either way); None (the default): the module's ``strict_loading`` (True
            unless the class sets it), as Lightning.
        trust_checkpoint: unpickle the checkpoint unrestricted, which runs any code its files name
            (only for one from someone you trust). By default it is read with
            ``weights_only=True``: anything but plain data is refused before the module is created.
        kwargs: arguments of ``cls.__init__`` that override the saved hyperparameters.

    Raises:
        CheckpointNotFoundError: nothing at the path, or a directory that holds no checkpoint.
        IncompleteCheckpointError, CorruptCheckpointError: a checkpoint that cannot be trusted.
        UntrustedCheckpointError: (not ``trust_checkpoint``) it holds more than plain data (named).
        StateDictMismatchError: the weights are another model's (all differences listed);
            :class:`HyperParametersMismatchError` (a subclass) when found before the module was
            built, on the meta device, naming the hyperparameters that built it.
        TypeError: ``kwargs`` that ``cls.__init__`` does not take.
    """
    path = Path(checkpoint_path)
    if not path.exists():
        raise CheckpointNotFoundError(
            f"{cls.__name__}.load_from_checkpoint(): nothing at {str(path)!r}. Pass the path of a checkpoint "
            "file or directory that Trainer.save_checkpoint() or ModelCheckpoint wrote (or a Lightning .ckpt)."
        )
    if not isinstance(trust_checkpoint, bool):
        raise TypeError(f"trust_checkpoint={trust_checkpoint!r} is invalid: pass True or False.")
    if detect_format(path) == "full":
        checkpoint = _read_full(path, map_location, trust_checkpoint)
    else:
        checkpoint = _read_sharded(path, map_location, trust_checkpoint)
    checkpoint["hyper_parameters"] = {**checkpoint.get("hyper_parameters", {}), **kwargs}

    arguments = _init_arguments(cls, checkpoint, kwargs)
    _check_on_meta(cls, arguments, kwargs, checkpoint, strict, path, base)
    model = _built(cls, arguments)
    on_load_checkpoint = getattr(model, "on_load_checkpoint", None)
    if callable(on_load_checkpoint):
        on_load_checkpoint(checkpoint)

    if strict is None:
        strict = bool(getattr(model, "strict_loading", True))
    state_dict = checkpoint["state_dict"]
    expected = {k: v.shape for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    check_state_dict_matches(expected, state_dict, strict=strict)
    keys = model.load_state_dict(state_dict, strict=strict)
    if not strict and (keys.missing_keys or keys.unexpected_keys):
        rank_zero_warn(  # every rank loading the same file would say the same
            f"{cls.__name__}.load_from_checkpoint(strict=False) loaded {str(path)!r} partially: "
            f"not in the checkpoint (left as initialised): {keys.missing_keys or 'none'}; in the checkpoint "
            f"but not in the module (ignored): {keys.unexpected_keys or 'none'}.",
            stacklevel=2,
        )
    tensors = (v for v in state_dict.values() if isinstance(v, torch.Tensor))
    first = next(tensors, None)
    return model.to(first.device) if first is not None else model

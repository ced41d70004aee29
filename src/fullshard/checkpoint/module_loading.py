"""``Module.load_from_checkpoint``: build a module from a checkpoint, without a Trainer.

Works in one process without a process group, for full and sharded checkpoints written by
fullshard and for Lightning ``.ckpt`` files, and behaves as Lightning's ``load_from_checkpoint``
does: the module is created from the saved hyperparameters (keyword arguments override them),
``configure_model()`` and ``on_load_checkpoint(checkpoint)`` run, the weights load, and the module
is moved to the device its weights were loaded on. Like Lightning it is left in training mode:
call ``.eval()`` for inference.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from fullshard.checkpoint.archive import verify_full_file
from fullshard.checkpoint.io import load_checkpoint_file
from fullshard.checkpoint.layout import detect_format
from fullshard.checkpoint.tools import read_sharded
from fullshard.checkpoint.validate import check_state_dict_matches
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
        StateDictMismatchError: the weights are another model's (all differences listed).
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

    model = cls(**_init_arguments(cls, checkpoint, kwargs))
    configure_model = getattr(model, "configure_model", None)
    if callable(configure_model):
        configure_model()
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

"""Offline checkpoint tools: consolidate a sharded checkpoint, inspect one, export weights.

These run in one process without a process group, so they work on a laptop with a checkpoint
copied from a cluster. ``torch.distributed.checkpoint`` is imported where it is used, so that
``fullshard.checkpoint.load_exported`` stays cheap to import.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache

from fullshard.checkpoint.archive import verify_full_file
from fullshard.checkpoint.io import (
    _FILE_MODE,
    _TMP_PREFIX,
    TIED_KEY,
    atomic_torch_save,
    load_checkpoint_file,
    load_torch_file,
    restore_tied,
)
from fullshard.checkpoint.layout import (
    META_NAME,
    CommitRecord,
    Files,
    Format,
    check_meta_identity,
    check_sharded_files,
    detect_format,
    recorded_files,
)
from fullshard.checkpoint.ties import checked_ties, find_ties
from fullshard.errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError

HF_WEIGHTS_NAME = "model.safetensors"  # the file Hugging Face's from_pretrained reads in a directory
EXPORT_TIED_KEY = "fullshard.tied_parameters"  # safetensors metadata entry: JSON {alias: canonical}


# what the errors of a damaged input say to read it regardless
NO_VERIFY_HINT = "To read it regardless, damaged bytes and all, pass --no-verify (verify=False)."


def read_sharded(
    path: Path, *, verify: bool, trust: bool, prefix: str | None = None, hint: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``meta.pt`` entries and the tensors (those whose key starts with ``prefix``; all when
    None) of the sharded checkpoint ``path``, assembled whole without a process group, after
    every check of a load: its files (:func:`_committed`; ``verify``: their CRC-32s too, else
    ``hint`` ends the error), the save's identity, its index."""
    record, data, files = _committed(path, verify=verify, hint=NO_VERIFY_HINT if hint is None else hint)
    meta = load_checkpoint_file(data / META_NAME, require_state_dict=False, trust=trust)
    check_meta_identity(meta, record, path)
    state = _read_dcp(data, record, files, prefix, trust)
    if TIED_KEY in meta:  # [Note: a tie is believed only where the checkpoint agrees] in ties.py
        model = state.get("model")
        meta[TIED_KEY] = checked_ties(meta[TIED_KEY], model if isinstance(model, dict) else {}, str(path))
        if isinstance(model, dict):  # [Note: tied parameters stored once] in io.py
            restore_tied(model, meta[TIED_KEY])
    return meta, state


def read_full(path: Path, *, verify: bool, trust: bool, hint: str = NO_VERIFY_HINT) -> dict[str, Any]:
    """The checkpoint file ``path`` read as a load reads it: (``verify``) every archive entry's
    CRC-32 checked first (else ``hint`` ends the error), then unpickled through fullshard's gate
    (``trust``: unrestricted), its record of ties checked against its tensors ([Note: a tie is
    believed only where the checkpoint agrees] in ties.py)."""
    if verify:
        verify_full_file(path, hint)
    checkpoint = load_checkpoint_file(path, trust=trust)
    model = checkpoint["state_dict"]
    if TIED_KEY in checkpoint:
        checkpoint[TIED_KEY] = checked_ties(
            checkpoint[TIED_KEY], model if isinstance(model, dict) else {}, str(path)
        )
    return checkpoint


def _read_dcp(
    data: Path, record: CommitRecord, files: Files, prefix: str | None = None, trust: bool = False
) -> dict[str, Any]:
    """Every tensor of the data directory ``data`` of a sharded checkpoint whose ``files``
    :func:`_committed` checked, assembled whole, as a nested dict; its index checked first
    ([Note: an index is believed only within bounds] in index_checks.py).

    torch offers no public call that loads a DCP checkpoint without a template state dict (its
    ``format_utils.dcp_to_torch_save`` writes straight to a file), so the private empty-template
    planner it uses is called here, in this one place. Each tensor is read once: peak memory is
    the size of the model state, not times the number of ranks that wrote it. ``trust``:
    unpickle the index and non-tensor values unrestricted (see [Note: loading without running
    code] in trust.py).
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from fullshard.checkpoint.dcp_reading import SafeReader, load_planner, untrusted_raised

    reader = SafeReader(data, trust, save_id=record.save_id, recorded=files)
    keys = None
    if prefix is not None:
        keys = {k for k in reader.read_metadata().state_dict_metadata if k.startswith(prefix)}
    state: dict[str, Any] = {}
    with untrusted_raised():
        _load_state_dict(
            state,
            storage_reader=reader,
            planner=load_planner(data, trust, empty=True, keys=keys),
            no_dist=True,
        )
    return state


def _committed(
    path: Path, verify: bool = False, hint: str = NO_VERIFY_HINT
) -> tuple[CommitRecord, Path, Files]:
    """The record, data directory and files (with their recorded sizes and CRC-32s) of a sharded
    checkpoint, every file checked: there, of its size, and (``verify``) of its CRC-32."""
    record = CommitRecord.read(path)
    check_sharded_files(path, record, verify=verify, hint=hint)
    return record, path / record.data, recorded_files(path, record)


def verify(path: str | Path, trust_checkpoint: bool = False) -> Format:
    """Check a checkpoint of either format completely, reading every byte, as a load reads it.
    Returns its format.

    [Note: verify checks what a load checks]
    ``inspect --verify`` calls the readers the loads call, not checks of its own (:func:`read_sharded`,
    what ``load_from_checkpoint``, ``consolidate`` and ``export`` read a sharded checkpoint with;
    :func:`read_full`, ``export``'s reader of a full file, which calls what every load of one calls:
    ``verify_full_file`` or the engine's ``ArchiveCheck``, then ``load_checkpoint_file``), so
    that it reports exactly the problem a load would raise: every CRC-32 first, then the
    unpickling through fullshard's gate, torch's own checks of each tensor's storage record (a
    record claiming 10**12 elements in a few bytes), a sharded checkpoint's records, identity and
    index, and the record of tied parameters. What needs the model (shapes, optimizer counts) is
    left to the load. ``trust_checkpoint``: unpickle unrestricted (see :func:`consolidate`).

    Raises:
        CheckpointError: the subclass a load would raise, naming the problem.
    """
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "full":
        read_full(path, verify=True, trust=trust_checkpoint, hint="")
    else:
        read_sharded(path, verify=True, trust=trust_checkpoint, hint="")
    return fmt


def consolidate(
    sharded: str | Path, out: str | Path, *, verify: bool = True, trust_checkpoint: bool = False
) -> Path:
    """Turn a sharded checkpoint into one full checkpoint file, loadable by every strategy and by
    ``torch.load`` (its ``state_dict`` by the plain ``nn.Module``).

    ``verify``: check every file's CRC-32 against the commit record first, and refuse a damaged
    checkpoint (:class:`CorruptCheckpointError` naming the files) before writing anything.
    ``trust_checkpoint``: unpickle its files unrestricted, which runs any code they name (only for
    a checkpoint from someone you trust); by default anything but plain data raises
    :class:`~fullshard.errors.UntrustedCheckpointError` before anything is written.
    """
    sharded, out = Path(sharded), Path(out)
    if detect_format(sharded) != "sharded":
        raise CheckpointError(
            f"{str(sharded)!r} is a full checkpoint file already; there is nothing to consolidate."
        )
    meta, state = read_sharded(sharded, verify=verify, trust=trust_checkpoint)
    groups = meta.pop("optimizer_param_groups", [])
    optimizers = state.get("optimizers", {})
    checkpoint = {
        **meta,
        "state_dict": state.get("model", {}),
        "optimizer_states": [
            {"state": optimizers.get(str(i), {}), "param_groups": g} for i, g in enumerate(groups)
        ],
    }
    atomic_torch_save(checkpoint, out, events=False)
    return out


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Inspection:
    """What ``fullshard checkpoint inspect`` reports."""

    path: str
    format: str
    complete: bool
    world_size: int | None = None
    strategy: str | None = None
    epoch: int | None = None
    global_step: int | None = None
    fullshard_version: str | None = None
    save_id: str | None = None  # a sharded checkpoint's: its data directory's name
    total_bytes: int = 0
    tensors: list[TensorInfo] = field(default_factory=list)
    tied: dict[str, str] = field(default_factory=dict)  # {alias: canonical}, each tensor stored once
    verified: bool | None = None
    problem: str | None = None


def _tensor_infos(state: Any, prefix: str = "") -> list[TensorInfo]:
    infos: list[TensorInfo] = []
    if isinstance(state, torch.Tensor):
        return [TensorInfo(prefix, tuple(state.shape), str(state.dtype).replace("torch.", ""))]
    if isinstance(state, dict):
        for key, value in state.items():
            infos += _tensor_infos(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(state, list | tuple):
        for i, value in enumerate(state):
            infos += _tensor_infos(value, f"{prefix}.{i}")
    return infos


def inspect(path: str | Path, verify_checksums: bool = False, trust_checkpoint: bool = False) -> Inspection:
    """Describe a checkpoint without a process group. Never raises for a damaged or incomplete
    checkpoint: the problem is reported in :attr:`Inspection.problem`, as it is for one that holds
    more than plain data (:class:`~fullshard.errors.UntrustedCheckpointError`'s message), unless
    ``trust_checkpoint``: unpickle it unrestricted, which runs any code its files name (only for
    a checkpoint from someone you trust)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from fullshard.checkpoint.dcp_reading import read_metadata

    path = Path(path)
    try:
        fmt = detect_format(path)
    except CheckpointError as err:
        return Inspection(str(path), "unknown", complete=False, problem=str(err))
    result = Inspection(str(path), fmt, complete=True)
    try:
        if fmt == "full":
            result.total_bytes = path.stat().st_size
            checkpoint = load_torch_file(path, path, trust=trust_checkpoint, mmap=True)
            meta = checkpoint
            result.tensors = _tensor_infos(
                {
                    "model": checkpoint.get("state_dict", {}),
                    "optimizers": checkpoint.get("optimizer_states", []),
                }
            )
        else:
            record, data, files = _committed(path)
            result.total_bytes = sum(f["size"] for f in files.values())
            meta = load_checkpoint_file(data / META_NAME, require_state_dict=False, trust=trust_checkpoint)
            check_meta_identity(meta, record, path)
            result.save_id = record.data
            metadata = read_metadata(data, trust_checkpoint, save_id=record.save_id, recorded=files)
            result.tensors = [
                TensorInfo(k, tuple(v.size), str(v.properties.dtype).replace("torch.", ""))
                for k, v in sorted(metadata.state_dict_metadata.items())
                if isinstance(v, TensorStorageMetadata)
            ]
        loops = meta.get("loops", {})
        result.world_size, result.strategy = meta.get("world_size"), meta.get("strategy")
        result.epoch, result.global_step = loops.get("epoch"), loops.get("global_step")
        result.fullshard_version = meta.get("fullshard_version")
        stored = {
            t.name.removeprefix("model."): t.shape for t in result.tensors if t.name.startswith("model.")
        }
        result.tied = checked_ties(meta.get(TIED_KEY), stored, str(path))  # shapes: the values are not read
        if verify_checksums:  # [Note: verify checks what a load checks]
            verify(path, trust_checkpoint)
            result.verified = True
    except CheckpointError as err:
        result.complete = not isinstance(err, CorruptCheckpointError) and result.complete
        result.verified = False if verify_checksums else None
        result.problem = str(err)
    except Exception as err:  # an unreadable file of any kind is a damaged checkpoint here
        result.complete = False
        result.problem = f"cannot be read: {type(err).__name__}: {err}"
    return result


# ------------------------------------------------------------------------------------- export
_SAFETENSORS_AVAILABLE = RequirementCache("safetensors")


def _safetensors() -> Any:
    if not _SAFETENSORS_AVAILABLE:
        raise ModuleNotFoundError(
            "Exporting to safetensors needs the optional dependency safetensors: pip install safetensors "
            "(in a fullshard clone: pip install -e '.[safetensors]')."
        )
    import safetensors.torch

    return safetensors.torch


def _model_weights(
    path: Path, verify: bool, trust: bool
) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    """The model tensors of a checkpoint of either format (tied aliases included), and its record
    of ties: None for a checkpoint without one (written by Lightning, or by an older fullshard).
    ``verify``: check the CRC-32s of what is read first; ``trust``: unpickle unrestricted."""
    if detect_format(path) == "full":
        checkpoint = read_full(path, verify=verify, trust=trust)
        weights, recorded = checkpoint["state_dict"], checkpoint.get(TIED_KEY)
    else:
        meta, state = read_sharded(path, verify=verify, trust=trust, prefix="model.")
        recorded, weights = meta.get(TIED_KEY), state.get("model", {})
    restore_tied(weights, recorded)
    tensors = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    for key, tensor in tensors.items():
        _check_dense(path, key, tensor)
    return tensors, recorded


def _check_dense(path: Path, key: str, tensor: torch.Tensor) -> None:
    """An export writes each tensor dense: refuse one with more elements than its storage holds
    (a view with a stride of 0, as ``expand`` makes, claiming (10**12,) over 4 bytes), which
    would allocate what the checkpoint's files never held. torch checks only that a view stays
    inside its storage."""
    dense = tensor.numel() * tensor.element_size()
    held = tensor.untyped_storage().nbytes()
    if dense > held:
        raise CorruptCheckpointError(
            f"The checkpoint {str(path)!r} stores {key!r} as {tuple(tensor.shape)} "
            f"{str(tensor.dtype).removeprefix('torch.')} ({dense} bytes) over {held} bytes of data (a view that "
            "repeats its elements): exporting it would write every element, more than the checkpoint holds. "
            "Nothing was written. A model's parameters are never such views: the checkpoint was damaged or edited."
        )


def _strip_prefix(
    path: Path, weights: dict[str, torch.Tensor], ties: dict[str, str], prefix: str, drop_other_keys: bool
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    outside = [k for k in weights if not k.startswith(prefix)]
    if outside and (len(outside) == len(weights) or not drop_other_keys):
        starts = Counter(k.split(".", 1)[0] + "." if "." in k else k for k in weights)
        present = ", ".join(f"{p!r} ({n} key{'s' if n > 1 else ''})" for p, n in starts.most_common())
        if len(outside) == len(weights):
            raise CheckpointError(
                f"No model key of {str(path)!r} starts with the prefix {prefix!r}; the keys start with "
                f"{present}. Pass the prefix of the module to export (--prefix), e.g. {next(iter(starts))!r}."
            )
        listed = ", ".join(outside[:5]) + (f" (+{len(outside) - 5} more)" if len(outside) > 5 else "")
        raise CheckpointError(
            f"{len(outside)} of the {len(weights)} model keys of {str(path)!r} do not start with the prefix "
            f"{prefix!r}: {listed}; the keys start with {present}. Leave them out of the export with "
            "--drop-other-keys (drop_other_keys=True), or pass a prefix every key has."
        )
    n = len(prefix)
    kept = {k[n:]: v for k, v in weights.items() if k.startswith(prefix)}
    ties = {a[n:]: c[n:] for a, c in ties.items() if a.startswith(prefix) and c.startswith(prefix)}
    return kept, ties


def _export_target(out: Path) -> Path:
    if out.suffix == ".safetensors" and not out.is_dir():
        return out
    if out.exists() and not out.is_dir():
        raise CheckpointError(
            f"Cannot export to {str(out)!r}: it is a file without the .safetensors suffix. Give a file "
            f"path ending in .safetensors, or a directory (which gets {HF_WEIGHTS_NAME})."
        )
    return out / HF_WEIGHTS_NAME


def export_safetensors(
    path: str | Path,
    out: str | Path,
    *,
    prefix: str | None = None,
    keep_tied: bool = False,
    drop_other_keys: bool = False,
    verify: bool = True,
    trust_checkpoint: bool = False,
) -> Path:
    """Write the model weights of a checkpoint (either format) to a ``.safetensors`` file.

    Tied tensors (see [Note: finding ties]) are written once, under the canonical name, as
    Hugging Face's ``save_pretrained`` does (and safetensors requires: it refuses tensors that
    share memory); the file's metadata lists ``{alias: canonical}`` under
    ``"fullshard.tied_parameters"``. A Hugging Face model re-ties on ``from_pretrained``, and
    :func:`load_exported` puts the aliases back for ``load_state_dict(strict=True)``.

    Args:
        path: a full checkpoint file or a sharded checkpoint directory.
        out: a ``.safetensors`` file, or a directory, which gets ``model.safetensors`` (the name
            ``from_pretrained`` reads).
        prefix: stripped from every key (``"model."`` for a network kept as ``self.model``; the
            dot is added if missing). Keys without it raise :class:`CheckpointError`, naming them
            and the prefixes present, unless ``drop_other_keys``.
        keep_tied: write every name of a tied tensor, each as a copy of its own.
        drop_other_keys: leave the keys without ``prefix`` out instead of raising.
        verify: check the checkpoint's CRC-32s first (a full file's archive entries; a sharded
            one's files against its commit record) and refuse a damaged one
            (:class:`CorruptCheckpointError` naming the files) before writing anything.
        trust_checkpoint: unpickle the checkpoint unrestricted, which runs any code its files name
            (only for one from someone you trust); by default anything but plain data raises
            :class:`~fullshard.errors.UntrustedCheckpointError` before anything is written. The
            export itself holds no code: safetensors is the way to hand weights to others.

    Returns:
        The file written (atomically: a failed export leaves no partial file).
    """
    st = _safetensors()
    path = Path(path)
    target = _export_target(Path(out))
    weights, recorded = _model_weights(path, verify, trust_checkpoint)
    ties = find_ties(weights, recorded)
    if prefix:
        prefix = prefix if prefix.endswith(".") else prefix + "."
        weights, ties = _strip_prefix(path, weights, ties, prefix, drop_other_keys)
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for key, tensor in weights.items():
        if key in ties and not keep_tied:
            continue
        tensor = tensor.detach().contiguous()
        if tensor.untyped_storage().data_ptr() in storages:  # safetensors refuses shared memory
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[key] = tensor
    metadata = {"format": "pt", EXPORT_TIED_KEY: json.dumps(ties)}  # "format": HF's loader requires it
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        os.chmod(tmp, _FILE_MODE)
        st.save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def _exported_file(path: str | Path) -> Path:
    path = Path(path)
    file = path / HF_WEIGHTS_NAME if path.is_dir() else path
    if not file.is_file():
        raise CheckpointNotFoundError(
            f"No exported weights at {str(file)!r}. Pass the .safetensors file or the directory that "
            "`fullshard checkpoint export` wrote."
        )
    return file


def exported_ties(path: str | Path) -> dict[str, str]:
    """The ``{alias: canonical}`` record of an exported file (or of the directory holding it)."""
    from safetensors import safe_open

    _safetensors()
    file = _exported_file(path)
    with safe_open(str(file), framework="pt") as f:
        metadata = f.metadata() or {}
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
    return _exported_record(file, metadata, shapes)


def _exported_record(file: Path, metadata: Mapping[str, str], stored: Mapping[str, Any]) -> dict[str, str]:
    """The ties an exported file records, checked as a checkpoint's are ([Note: a tie is believed
    only where the checkpoint agrees] in ties.py)."""
    try:
        recorded = json.loads(metadata.get(EXPORT_TIED_KEY, "{}"))
    except ValueError as err:
        raise CorruptCheckpointError(
            f"The exported file {str(file)!r} records its tied parameters ({EXPORT_TIED_KEY!r}) as no JSON "
            f"({err}). Export the checkpoint again."
        ) from err
    return checked_ties(recorded, stored, str(file))


def load_exported(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The state dict ``fullshard checkpoint export`` wrote to ``path`` (its ``.safetensors`` file,
    or the directory it wrote ``model.safetensors`` into), every tied name included: each alias
    the export left out is its canonical tensor itself. So the model, ties and all, loads it with
    ``model.load_state_dict(load_exported(path), strict=True)``.

    Nothing is unpickled: a safetensors file is raw tensor bytes behind a JSON header, so it
    needs no ``trust_checkpoint``, whoever wrote it.
    """
    from safetensors import safe_open

    _safetensors()
    file = _exported_file(path)
    with safe_open(str(file), framework="pt", device=str(device)) as f:
        metadata = f.metadata() or {}
        state = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118  # safe_open is no dict
    return restore_tied(state, _exported_record(file, metadata, state))

"""Offline checkpoint tools: consolidate a sharded checkpoint, inspect one, export weights.

These run in one process without a process group, so they work on a laptop with a checkpoint
copied from a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from fullshard.checkpoint.io import atomic_torch_save, load_checkpoint_file
from fullshard.checkpoint.layout import META_NAME, CommitRecord, check_sharded_files, detect_format, verify
from fullshard.errors import CheckpointError, CorruptCheckpointError


def _read_dcp(data: Path, prefix: str | None = None) -> dict[str, Any]:
    """Every tensor of a DCP directory, assembled whole, as a nested dict.

    torch offers no public call that loads a DCP checkpoint without a template state dict (its
    ``format_utils.dcp_to_torch_save`` writes straight to a file), so the private empty-template
    planner it uses is called here, in this one place. Each tensor is read once: peak memory is
    the size of the model state, not times the number of ranks that wrote it.
    """
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    keys = None
    if prefix is not None:
        metadata = FileSystemReader(str(data)).read_metadata()
        keys = {k for k in metadata.state_dict_metadata if k.startswith(prefix)}
    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(data)),
        planner=_EmptyStateDictLoadPlanner(keys=keys),
        no_dist=True,
    )
    return state


def _committed(path: Path) -> tuple[CommitRecord, Path]:
    record = CommitRecord.read(path)
    check_sharded_files(path, record, verify=False)
    return record, path / record.data


def consolidate(sharded: str | Path, out: str | Path) -> Path:
    """Turn a sharded checkpoint into one full checkpoint file, loadable by every strategy and by
    ``torch.load`` (its ``state_dict`` by the plain ``nn.Module``)."""
    sharded, out = Path(sharded), Path(out)
    if detect_format(sharded) != "sharded":
        raise CheckpointError(
            f"{str(sharded)!r} is a full checkpoint file already; there is nothing to consolidate."
        )
    _, data = _committed(sharded)
    meta = load_checkpoint_file(data / META_NAME, require_state_dict=False)
    state = _read_dcp(data)
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
    total_bytes: int = 0
    tensors: list[TensorInfo] = field(default_factory=list)
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


def inspect(path: str | Path, verify_checksums: bool = False) -> Inspection:
    """Describe a checkpoint without a process group. Never raises for a damaged or incomplete
    checkpoint: the problem is reported in :attr:`Inspection.problem`."""
    path = Path(path)
    try:
        fmt = detect_format(path)
    except CheckpointError as err:
        return Inspection(str(path), "unknown", complete=False, problem=str(err))
    result = Inspection(str(path), fmt, complete=True)
    try:
        if fmt == "full":
            result.total_bytes = path.stat().st_size
            checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
            meta = checkpoint
            result.tensors = _tensor_infos(
                {
                    "model": checkpoint.get("state_dict", {}),
                    "optimizers": checkpoint.get("optimizer_states", []),
                }
            )
        else:
            record, data = _committed(path)
            result.total_bytes = sum(f["size"] for f in record.files.values())
            meta = load_checkpoint_file(data / META_NAME, require_state_dict=False)
            metadata = FileSystemReader(str(data)).read_metadata()
            result.tensors = [
                TensorInfo(k, tuple(v.size), str(v.properties.dtype).replace("torch.", ""))
                for k, v in sorted(metadata.state_dict_metadata.items())
                if isinstance(v, TensorStorageMetadata)
            ]
        loops = meta.get("loops", {})
        result.world_size, result.strategy = meta.get("world_size"), meta.get("strategy")
        result.epoch, result.global_step = loops.get("epoch"), loops.get("global_step")
        result.fullshard_version = meta.get("fullshard_version")
        if verify_checksums:
            verify(path)
            result.verified = True
    except CheckpointError as err:
        result.complete = not isinstance(err, CorruptCheckpointError) and result.complete
        result.verified = False if verify_checksums else None
        result.problem = str(err)
    except Exception as err:  # an unreadable file of any kind is a damaged checkpoint here
        result.complete = False
        result.problem = f"cannot be read: {type(err).__name__}: {err}"
    return result


def export_safetensors(path: str | Path, out: str | Path) -> Path:
    """Write the model weights of a checkpoint (either format) to a ``.safetensors`` file."""
    from lightning_utilities.core.imports import RequirementCache

    if not RequirementCache("safetensors"):
        raise ModuleNotFoundError(
            "Exporting to safetensors needs the optional dependency: pip install 'fullshard[safetensors]'."
        )
    from safetensors.torch import save_file

    path, out = Path(path), Path(out)
    if detect_format(path) == "full":
        weights = load_checkpoint_file(path)["state_dict"]
    else:
        _, data = _committed(path)
        weights = _read_dcp(data, prefix="model.").get("model", {})
    tensors = {k: v.detach().contiguous().clone() for k, v in weights.items() if isinstance(v, torch.Tensor)}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out))
    return out

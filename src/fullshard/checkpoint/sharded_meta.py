"""Rank 0's first part of loading a sharded checkpoint: its commit record and ``meta.pt`` read
and checked (the files the record lists, the save's identity, the caller's checks, tied
parameters, the saved shapes against the model's) before any rank reads a tensor; the engine
(engine.py) then reads the shards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.optim import Optimizer

from fullshard.checkpoint.dcp_reading import read_metadata
from fullshard.checkpoint.guards import MetaCheck, check_meta
from fullshard.checkpoint.io import TIED_KEY, load_checkpoint_file, restore_tied
from fullshard.checkpoint.layout import (
    META_NAME,
    PARSED_BY_RANK0,
    UNVERIFIED_HINT,
    CommitRecord,
    check_meta_identity,
    damaged_sharded,
    file_problems,
    recorded_files,
)
from fullshard.checkpoint.ties import checked_ties
from fullshard.checkpoint.validate import (
    StateDictMismatchError,
    check_optimizer_shapes,
    sharded_optimizer_tensors,
)
from fullshard.errors import CorruptCheckpointError


def dcp_shapes(path: Path, record: CommitRecord, trust: bool) -> dict[str, torch.Size]:
    """The tensors' full shapes, from the index, checked against the files the rank records list
    ([Note: an index is believed only within bounds] in index_checks.py). A rank record that
    cannot be read is left to :func:`check_shares`, which names every problem of every rank."""
    try:
        recorded: Mapping[str, Mapping[str, int]] | None = recorded_files(path, record)
    except CorruptCheckpointError:
        recorded = None
    metadata = read_metadata(path / record.data, trust, save_id=record.save_id, recorded=recorded)
    return {
        key: item.size
        for key, item in metadata.state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }


def read_sharded_meta(
    path: Path,
    optimizers: Sequence[Optimizer],
    check: MetaCheck | None,
    verify: bool,
    trust: bool,
    strict: bool,
    before_optimizers: MetaCheck | None,
    expected: dict[str, torch.Size],
) -> tuple[CommitRecord, dict[str, Any], set[int], set[str]]:
    """Rank 0's part of a sharded load: the commit record and meta.pt, checked (files, identity,
    ``check``, ties, the shapes against the model's ``expected`` ones); returns them with the
    optimizers that were stepped and the model keys saved."""
    record = CommitRecord.read(path)
    data = path / record.data
    # every file the record lists there, at its size (format 2: the two parsed here; the
    # tensor files are in the rank records, each rank checks its share in check_shares)
    problems = file_problems(data, record.files, verify=False)
    if problems:
        raise damaged_sharded(path, problems)
    if verify:  # the files parsed here, before parsing them
        parsed = {name: record.files[name] for name in PARSED_BY_RANK0 if name in record.files}
        problems = file_problems(data, parsed, verify=True)
        if problems:
            raise damaged_sharded(path, problems, UNVERIFIED_HINT)
    meta = load_checkpoint_file(data / META_NAME, require_state_dict=False, trust=trust)
    check_meta_identity(meta, record, path)
    groups = None if before_optimizers else meta.get("optimizer_param_groups")
    check_meta(meta, path, optimizers, check, groups)
    shapes = dcp_shapes(path, record, trust)
    saved = {k[len("model.") :]: v for k, v in shapes.items() if k.startswith("model.")}
    # an optimizer saved before its first step has no tensors ([Note: unstepped optimizers])
    stepped = {i for i in range(len(optimizers)) if any(k.startswith(f"optimizers.{i}.") for k in shapes)}
    if TIED_KEY in meta:  # [Note: a tie is believed only where the checkpoint agrees] in ties.py:
        tied = checked_ties(meta[TIED_KEY], saved, str(path))  # a stored alias: read from its bytes
        meta[TIED_KEY] = {a: c for a, c in tied.items() if a not in saved}
    restore_tied(saved, meta.get(TIED_KEY))
    # DCP stores only tensors: compare those keys (non-tensor extra state is not sharded)
    missing = sorted(set(expected) - set(saved)) if strict else []
    unexpected = sorted(set(saved) - set(expected)) if strict else []
    mismatched = [
        f"{k} (checkpoint {tuple(saved[k])}, model {tuple(expected[k])})"
        for k in sorted(set(saved) & set(expected))
        if tuple(saved[k]) != tuple(expected[k])
    ]
    if missing or unexpected or mismatched:
        raise StateDictMismatchError(missing, unexpected, mismatched)
    check_optimizer_shapes(str(path), expected, optimizers, sharded_optimizer_tensors(shapes))
    return record, meta, stepped, set(saved)

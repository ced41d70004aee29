"""Saving and loading checkpoints of a :class:`~fullshard.checkpoint.host.CheckpointHost` (a strategy),
in the full or the sharded format. How (full or sharded, in the background) is the caller's to
say with each save, usually a :class:`~fullshard.checkpoint.checkpointer.Checkpointer`'s.

Every function here is collective: each rank of the job calls it with the same arguments.
Decisions that depend on the files (does the checkpoint exist, is it complete, does it fit the
model) are taken on rank 0 and broadcast, so every rank raises the same exception at once
instead of some ranks waiting forever for the others. Work every rank does on its own (writing
its shards, checksumming its share of the files on load) ends with an exchange of what went
wrong, for the same reason (agreement.py).

[Note: a failed save]
A save that fails (disk full, no permission, a state that cannot be pickled) raises one
:class:`~fullshard.errors.CheckpointSaveError` on every rank, naming the path and each rank's
cause, after removing what it wrote: the temporary file of a full save, the uncommitted
``data-<id>`` directory of a sharded one (never one a commit record names). The previous
checkpoint at the path was not touched (see [Note: atomic commit] in io.py, [Note: directory
commit] in layout.py), and the next save to the path starts afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.optim import Optimizer

from fullshard.checkpoint import async_save, staging
from fullshard.checkpoint.agreement import agreed, decide, portable
from fullshard.checkpoint.commit import (
    commit_sharded,
    names_data,
    record_of,
    remove_tree,
    write_bytes,
    write_shards,
)
from fullshard.checkpoint.dcp_reading import SafeReader, load_planner, untrusted_raised
from fullshard.checkpoint.guards import (
    ArchiveCheck,
    Failure,
    MetaCheck,
    after_commit_error,
    check_meta,
    check_param_groups,
    check_shares,
    failures_of,
    nonfinite_parameters,
    refuse_nonfinite,
    save_error,
)
from fullshard.checkpoint.io import (
    TIED_KEY,
    AfterCommitError,
    atomic_torch_save,
    load_checkpoint_file,
    restore_tied,
)
from fullshard.checkpoint.layout import (
    DATA_PREFIX,
    SAVE_KEY,
    CommitRecord,
    detect_format,
)
from fullshard.checkpoint.lightning import _WRAPPER_COMPONENTS, convert_checkpoint, is_lightning_checkpoint
from fullshard.checkpoint.loose_gradients import clear_gradients
from fullshard.checkpoint.progress_checks import with_loop_checks
from fullshard.checkpoint.sharded_meta import read_sharded_meta
from fullshard.checkpoint.validate import (
    check_optimizer_shapes,
    check_state_dict_matches,
    full_optimizer_tensors,
)
from fullshard.errors import CheckpointError

if TYPE_CHECKING:
    from fullshard.checkpoint.host import CheckpointHost


# torch's own deprecation chatter from inside FSDP1's sharded state dict code, nothing users can act on
_TORCH_NOISE = (
    r"Please use DTensor instead and we are deprecating ShardedTensor",
    r"`_get_pg_default_device` will be deprecated",
    r"Multiple backends are registered with this ProcessGroup",
    r"torch.distributed is disabled, unavailable or uninitialized",
)


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in _TORCH_NOISE:
            warnings.filterwarnings("ignore", message=message)
        yield


def tied_parameters(module: nn.Module | None, state: Mapping[str, Any]) -> dict[str, str] | None:
    """``{alias: canonical}`` for each parameter ``module`` holds under more than one name (see
    [Note: tied parameters stored once]), named as in ``state``, the model state the strategy gave.

    None when the module's parameter names are not keys of ``state``: FSDP with
    ``use_orig_params=False`` hides them in flat parameters, so ties cannot be seen, and the
    checkpoint is written as before, every key on its own.
    """
    if module is None:
        return {}
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        name = ".".join(part for part in name.split(".") if part not in _WRAPPER_COMPONENTS)
        if name not in state:
            return None
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied


# --------------------------------------------------------------------------------------- save
def save(
    host: CheckpointHost,
    checkpoint: dict[str, Any],
    path: str | Path,
    optimizers: Sequence[Optimizer],
    *,
    sharded: bool,
    background: async_save.BackgroundSaves | None = None,
) -> async_save.PendingSave | None:
    """Write ``checkpoint`` to ``path``, one file (``sharded=False``) or a directory of shards. Its
    ``"state_dict"`` and ``"optimizer_states"`` are the model's and ``optimizers``' states as the
    host's ``get_state`` gave them (whole tensors for the full format, this rank's shards for the
    sharded one), after the save hooks: what they hold is what is written.

    With ``background`` (sharded only), returns the save being written in the background, for the
    caller to own (:class:`~fullshard.checkpoint.checkpointer.Checkpointer`); it has finished any
    previous one first: one save at a time, one staged copy of the state (see
    [Note: asynchronous commit]). Returns None when the files are committed.
    """
    path = Path(path)
    missing = [key for key in ("state_dict", "optimizer_states") if key not in checkpoint]
    if missing:
        raise CheckpointError(
            f"The checkpoint to {str(path)!r} has no {' or '.join(map(repr, missing))}: a save hook removed it, "
            "or the dict was not built by Trainer.save_checkpoint. Keep the entries (a hook may empty "
            "'state_dict' of what it does not want saved, but not remove it)."
        )
    checkpoint = {
        **checkpoint,
        "optimizer_count": len(checkpoint["optimizer_states"]),
        # checked on load: one optimizer's state does not fit another's (Adam's moments in SGD)
        "optimizer_types": [type(optimizer).__qualname__ for optimizer in optimizers],
    }
    with _quiet_torch():
        if sharded:
            return _save_sharded(host, checkpoint, path, optimizers, background)
        _save_full(host, checkpoint, path, optimizers)
    return None


def _save_full(
    host: CheckpointHost, checkpoint: dict[str, Any], path: Path, optimizers: Sequence[Optimizer]
) -> None:
    if path.is_dir():
        raise CheckpointError(
            f"Cannot write a checkpoint file to {str(path)!r}: a directory (a sharded checkpoint?) is there. "
            "Choose another path, or save with state_dict_type='sharded'."
        )
    model_state, optimizer_states = checkpoint.pop("state_dict"), checkpoint.pop("optimizer_states")
    tied = tied_parameters(host.module, model_state)
    if tied is not None:  # [Note: tied parameters stored once] in io.py
        model_state = {**model_state, **{alias: model_state[c] for alias, c in tied.items()}}
        checkpoint[TIED_KEY] = tied

    def write() -> None:
        refuse_nonfinite(path, nonfinite_parameters(host, model_state))  # whole tensors here
        try:  # [Note: a failed save]: atomic_torch_save removes its temporary file
            atomic_torch_save(
                {**checkpoint, "state_dict": model_state, "optimizer_states": optimizer_states}, path
            )
        except AfterCommitError as err:
            raise after_commit_error(path, err) from err
        except Exception as err:
            raise save_error(path, failures_of(err, 0)) from err

    decide(host, write)


def _save_sharded(
    host: CheckpointHost,
    checkpoint: dict[str, Any],
    path: Path,
    optimizers: Sequence[Optimizer],
    background: async_save.BackgroundSaves | None,
) -> async_save.PendingSave | None:
    # [Note: directory commit] in layout.py; with async_save, [Note: asynchronous commit] in async_save.py
    if path.is_file():
        raise CheckpointError(
            f"Cannot write a sharded checkpoint to {str(path)!r}: a file (a full checkpoint?) is there. Choose "
            "another path, or save with state_dict_type='full'."
        )

    def prepare() -> str:
        name = f"{DATA_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            (path / name).mkdir(parents=True)
        except OSError as err:
            raise save_error(path, failures_of(err, 0)) from err
        return name

    model_state, optimizer_states = checkpoint.pop("state_dict"), checkpoint.pop("optimizer_states")
    data_name = ""  # a background save checks its copy and makes the directory in _stage
    if background is None:
        # each rank checks its shards; before anything is written, every rank learns what all found
        found = host.all_gather_object(nonfinite_parameters(host, model_state))
        refuse_nonfinite(path, sorted({name for names in found for name in names}))
        data_name = decide(host, prepare)
    data = path / data_name
    tied = tied_parameters(host.module, model_state)
    if tied is not None:  # [Note: tied parameters stored once] in io.py: DCP gets each tensor once
        model_state = {k: v for k, v in model_state.items() if k not in tied}
        checkpoint[TIED_KEY] = tied
    # [Note: optimizer param_groups]
    # Hyperparameters go to meta.pt, only tensors to DCP: DCP
    # flattens a nested value or not depending on its content, so a param_groups list could be
    # stored under keys that a reader with differently sharded state does not look for.
    checkpoint["optimizer_param_groups"] = [s["param_groups"] for s in optimizer_states]
    state = {"model": model_state, "optimizers": {str(i): s["state"] for i, s in enumerate(optimizer_states)}}
    record = record_of(host, checkpoint, data_name)
    step, rank, no_dist = record.global_step, host.global_rank, host.world_size == 1
    if background is not None:
        del model_state, optimizer_states  # only the copy goes on: training may change these
        return _save_in_background(host, state, checkpoint, path, record, background)
    failures: list[Failure] = []
    try:
        checkpoint[SAVE_KEY] = {"id": data_name, "step": step}  # [Note: one save, one identity]
        write_shards(state, data, rank, step, None, no_dist)
    except (Exception, CheckpointException) as err:  # DCP's is a BaseException
        failures = failures_of(err, rank)
    # every rank learns whether every rank succeeded (a flag: each rank's checksums are in its
    # record, beside its shard), and only on a failure what failed: none may go on to the commit alone
    if not host.reduce_boolean_decision(not failures, all=True):
        failures = [
            failure for rank_failures in host.all_gather_object(failures) for failure in rank_failures
        ]

        def clean_up() -> None:  # [Note: a failed save]: every rank is done writing into it
            remove_tree(data)
            raise save_error(path, failures)

        decide(host, clean_up)  # the others raise once rank 0 has removed it

    def commit() -> None:
        try:
            commit_sharded(path, record, lambda target: atomic_torch_save(checkpoint, target, events=False))
        except Exception as err:
            if names_data(path, record.data):  # the commit record was replaced: committed
                raise after_commit_error(path, err) from err
            remove_tree(data)
            raise save_error(path, failures_of(err, 0)) from err

    decide(host, commit)
    return None


def _save_in_background(
    host: CheckpointHost,
    state: dict[str, Any],
    checkpoint: dict[str, Any],
    path: Path,
    record: CommitRecord,
    background: async_save.BackgroundSaves,
) -> async_save.PendingSave:
    """A sharded save with ``async_save``: copy ``state`` now ([Note: asynchronous commit] in
    async_save.py), check, write and commit the copy in the background."""
    step, rank, no_dist = record.global_step, host.global_rank, host.world_size == 1
    staged, meta, data_name = _stage(host, state, checkpoint, path, step, background.buffers)
    del state  # only the copy goes on: training may change the state
    record, data = dataclasses.replace(record, data=data_name), path / data_name
    steps = async_save.SaveSteps(
        check=lambda staged: refuse_nonfinite(path, nonfinite_parameters(host, staged["model"])),
        prepare=(lambda: data.mkdir(parents=True)) if host.global_rank == 0 else lambda: None,
        write=lambda staged, group: write_shards(staged, data, rank, step, group, no_dist),
        commit=lambda: commit_sharded(path, record, lambda target: write_bytes(meta, target)),
    )
    return background.start(host, path, record.global_step, staged, steps)


def _stage(
    host: CheckpointHost,
    state: dict[str, Any],
    checkpoint: dict[str, Any],
    path: Path,
    step: int,
    buffers: staging.StagingBuffers,
) -> tuple[Any, bytes, str]:
    """A background save's copy (see [Note: staging off the training thread]), ``meta.pt`` and the
    name of its data directory (rank 0's; its thread makes it), with one collective: a failure on
    any rank raises on every rank."""
    staged, meta, name, problem = None, b"", "", None
    try:
        defer = staging.changed_only_by_steps(host.module)
        staged = staging.stage(state, defer=defer, buffers=buffers)
        if host.global_rank == 0:
            name = f"{DATA_PREFIX}{uuid.uuid4().hex[:12]}"
            meta = async_save.serialize({**checkpoint, SAVE_KEY: {"id": name, "step": step}})
    except CheckpointError as err:  # the state's own types
        problem = portable(err) if host.world_size > 1 else err
    except Exception as err:  # pickling (hyperparameters, callback states), memory
        problem = CheckpointError(
            f"The checkpoint to {str(path)!r} could not be copied for the background save: rank "
            f"{host.global_rank}: {type(err).__name__}: {err}. Nothing was written; the checkpoint previously "
            "at that path, if any, is intact. Every entry but the tensors is pickled: keep hyperparameters and "
            "callback states to plain data (numbers, strings, lists, dicts), and host memory must hold a copy "
            "of this process's shard of the model and optimizer state."
        )
    outcomes = host.all_gather_object((problem, name))
    problems = [p for p, _ in outcomes if p is not None]
    if problems:
        raise problems[0]
    return staged, meta, outcomes[0][1]


# --------------------------------------------------------------------------------------- load
def load(
    host: CheckpointHost,
    path: str | Path,
    optimizers: Sequence[Optimizer] = (),
    *,
    weights_only: bool = False,
    check: MetaCheck | None = None,
    verify: bool = True,
    trust: bool = False,
    strict: bool = True,
    before_optimizers: MetaCheck | None = None,
) -> dict[str, Any]:
    """Load model (and unless ``weights_only``, optimizer) states into place; return the rest.

    Nothing is changed unless the checkpoint is complete, (``verify``) passes its CRC-32 checks
    (see [Note: checksums checked on load] in layout.py), holds nothing but plain data (unless
    ``trust``: see [Note: loading without running code] in trust.py), fits the model and the
    optimizers, and ``check(meta)`` (the host's own checks, e.g. the number of schedulers) passes.
    ``strict=False`` (the module's ``strict_loading``) loads a checkpoint that holds only part of
    the model's state (or more), as ``load_state_dict(strict=False)``: the keys on both sides load,
    the model keeps the rest; shapes are still checked.

    ``before_optimizers(rest)``: called on every rank once the model's state is in place and before
    the optimizers' states are checked against the optimizers and loaded (see [Note: callbacks
    restored before the optimizers]); the optimizers' parameter groups are compared after it.

    The caller has finished any save still being written in the background: the checkpoint to
    load may be that one, and the state loaded into may be the one it is copying.
    """
    path = Path(path)
    fmt = decide(host, lambda: detect_format(path))
    n_optimizers = 0 if weights_only else len(optimizers)
    if not weights_only:  # a resume believes the loop state: [Note: loop counters checked on resume]
        check = with_loop_checks(path, check)
    load = _load_full if fmt == "full" else _load_sharded
    clear_gradients(optimizers[:n_optimizers])  # [Note: gradients cleared before optimizer states load]
    with _quiet_torch():
        return load(host, path, optimizers[:n_optimizers], check, verify, trust, strict, before_optimizers)


# [Note: callbacks restored before the optimizers]
# As in Lightning, the states of the callbacks are restored (and ``on_fit_start`` runs) before the
# optimizers' and schedulers' states are loaded: a callback that changed the optimizer during the
# run (BackboneFinetuning added a parameter group, StochasticWeightAveraging put in its SWALR
# scheduler) rebuilds that change first, so the saved states fit. The engine therefore loads a
# checkpoint in two steps, the model's state, then (after ``before_optimizers``) the optimizers';
# everything else is still checked before anything is loaded.
def _prepare_optimizers(
    before: MetaCheck | None,
    meta: dict[str, Any],
    path: Path,
    optimizers: Sequence[Optimizer],
    groups: Sequence[Sequence[Any]] | None,
) -> None:
    if before is None:
        return
    before(meta)
    clear_gradients(optimizers)  # also those of a backward pass in on_fit_start
    if groups is not None:  # on every rank alike: the same saved groups, the same rebuilt optimizers
        check_param_groups(path, optimizers, groups)


def _load_full(
    host: CheckpointHost,
    path: Path,
    optimizers: Sequence[Optimizer],
    check: MetaCheck | None,
    verify: bool,
    trust: bool,
    strict: bool,
    before_optimizers: MetaCheck | None,
) -> dict[str, Any]:
    tensors: dict[str, Any] = {}
    # on every rank: under FSDP with manual wrap() learning the shapes is collective
    shapes = host.full_shapes()

    def read() -> tuple[dict[str, Any], list[Any] | None]:
        archive = ArchiveCheck(path) if verify else None
        try:
            checkpoint = load_checkpoint_file(path, trust=trust)
        except BaseException:
            if archive is not None:
                archive.finish()  # a damaged entry explains the failure best
            raise
        if archive is not None:
            archive.finish()
        if is_lightning_checkpoint(checkpoint):  # [Note: Lightning checkpoints] in lightning.py
            check_state_dict_matches(shapes, checkpoint["state_dict"], strict)  # before its optimizer states
            checkpoint = convert_checkpoint(
                checkpoint, str(path), module=host.module, optimizers=optimizers, shapes=shapes
            )
        if "optimizer_count" not in checkpoint and "optimizer_states" in checkpoint:
            checkpoint["optimizer_count"] = len(checkpoint["optimizer_states"])
        saved_states = checkpoint.get("optimizer_states") or []
        saved_groups = [s.get("param_groups", []) for s in saved_states if isinstance(s, dict)]
        groups = saved_groups if len(saved_groups) == len(saved_states) else None
        check_meta(checkpoint, path, optimizers, check, None if before_optimizers else groups)
        check_state_dict_matches(shapes, checkpoint["state_dict"], strict)
        if optimizers:  # [Note: optimizer states checked against the parameters] in validate.py
            saved_tensors = full_optimizer_tensors(
                str(path), checkpoint.get("optimizer_states"), len(optimizers)
            )
            check_optimizer_shapes(str(path), shapes, optimizers, saved_tensors)
        if not strict:  # only the keys the model has: the rest has nowhere to go
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in shapes}
        tensors["state_dict"] = checkpoint.pop("state_dict")
        tensors["optimizer_states"] = checkpoint.pop("optimizer_states")
        return checkpoint, groups

    meta, groups = decide(host, read)
    from_rank0 = host.world_size > 1
    if host.global_rank == 0 or not from_rank0:
        model_state, optimizer_states = tensors["state_dict"], tensors["optimizer_states"][: len(optimizers)]
    else:
        model_state, optimizer_states = {}, [{} for _ in optimizers]
    if before_optimizers is None:
        host.set_state(
            model_state, optimizer_states, optimizers, full=True, from_rank0=from_rank0, strict=strict
        )
        return meta
    host.set_state(model_state, [], (), full=True, from_rank0=from_rank0, strict=strict)
    _prepare_optimizers(before_optimizers, meta, path, optimizers, groups)
    host.set_optimizer_states(optimizer_states, optimizers, full=True, from_rank0=from_rank0)
    return meta


def _load_sharded(
    host: CheckpointHost,
    path: Path,
    optimizers: Sequence[Optimizer],
    check: MetaCheck | None,
    verify: bool,
    trust: bool,
    strict: bool,
    before_optimizers: MetaCheck | None,
) -> dict[str, Any]:
    expected = host.full_shapes()  # on every rank, as in _load_full

    record, meta, stepped, saved_keys = decide(
        host,
        lambda: read_sharded_meta(
            path, optimizers, check, verify, trust, strict, before_optimizers, expected
        ),
    )
    check_shares(host, path, record, verify)
    data = path / record.data
    groups = meta.pop("optimizer_param_groups")

    def read_into(state: dict[str, Any]) -> None:
        reader = agreed(host, lambda: SafeReader(data, trust, save_id=record.save_id))
        with untrusted_raised():
            dcp_load(
                state,
                storage_reader=reader,
                planner=load_planner(data, trust),
                no_dist=host.world_size == 1,
            )

    def optimizer_states_read(states: list[dict[str, Any]], read: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"state": read.get(str(i), {}), "param_groups": groups[i]} for i in range(len(states))]

    # in one pass, unless the optimizers' states wait for before_optimizers ([Note: callbacks
    # restored before the optimizers])
    together = before_optimizers is None
    model_state, optimizer_states = host.get_state(optimizers if together else (), full=False, to_load=True)
    # the aliases are not in the DCP files: read the canonical tensors, then hand each alias its
    # canonical one ([Note: tied parameters stored once] in io.py)
    tied = {a: c for a, c in meta.get(TIED_KEY, {}).items() if a in model_state and c in model_state}
    model_state = {k: v for k, v in model_state.items() if k not in tied}
    if not strict:  # read what the checkpoint has; the model keeps the rest
        model_state = {k: v for k, v in model_state.items() if k in saved_keys}
    state: dict[str, Any] = {"model": model_state}
    # no empty "optimizers": DCP's FSDP1 planner would look for it as a key of its own
    if stepped and together:
        state["optimizers"] = {str(i): optimizer_states[i]["state"] for i in sorted(stepped)}
    read_into(state)
    restore_tied(state["model"], tied)
    if together:
        loaded = optimizer_states_read(optimizer_states, state.get("optimizers", {}))
        host.set_state(state["model"], loaded, optimizers, full=False, from_rank0=False, strict=strict)
        return meta
    host.set_state(state["model"], [], (), full=False, from_rank0=False, strict=strict)
    _prepare_optimizers(before_optimizers, meta, path, optimizers, groups)
    optimizer_states = host.get_state(optimizers, full=False, to_load=True)[1]
    wanted = {str(i): optimizer_states[i]["state"] for i in sorted(stepped)}
    if wanted:
        read_into({"optimizers": wanted})
    loaded = optimizer_states_read(optimizer_states, wanted)
    host.set_optimizer_states(loaded, optimizers, full=False, from_rank0=False)
    return meta

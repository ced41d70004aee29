"""What a load checks before it changes anything, and what a save checks before it writes.

- load: the checkpoint's metadata fits the run (:func:`check_meta`: optimizers of the same number,
  classes and parameter groups, not a weights-only checkpoint given to resume training), and its
  bytes are those that were written (:class:`ArchiveCheck`, :func:`check_shares`; see [Note:
  checksums checked on load] in layout.py);
- save: the weights are finite (:func:`nonfinite_parameters`), and a save that fails raises one
  error naming each rank's cause (:func:`save_error`, see [Note: a failed save] in engine.py).

The engine calls these; each raises the error users see, naming the path and the fix.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.optim import Optimizer

from fullshard.checkpoint.archive import PICKLE_ENTRY, archive_entries, entry_problems, full_file_error
from fullshard.checkpoint.io import AfterCommitError
from fullshard.checkpoint.layout import UNVERIFIED_HINT, CommitRecord, damaged_sharded, share_problems
from fullshard.checkpoint.lightning import _WRAPPER_COMPONENTS
from fullshard.errors import (
    CheckpointError,
    CheckpointSaveError,
    CorruptCheckpointError,
    OptimizerGroupsMismatchError,
)

if TYPE_CHECKING:
    from fullshard.checkpoint.host import CheckpointHost

REQUIRED_KEYS = ("lr_schedulers", "loops", "optimizer_count")
MetaCheck = Callable[[dict[str, Any]], None]


# ----------------------------------------------------------------------------------- load
def check_meta(
    meta: dict[str, Any],
    path: Path,
    optimizers: Sequence[Optimizer],
    check: MetaCheck | None,
    param_groups: Sequence[Sequence[Any]] | None,
) -> None:
    """Everything about the checkpoint that must fit before anything is loaded. ``param_groups``:
    the saved optimizers' ``param_groups`` (None when they are not at hand)."""
    missing = [key for key in REQUIRED_KEYS if key not in meta]
    if missing:
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a complete fullshard checkpoint: it lacks {', '.join(missing)}. Resume from "
            "a checkpoint written by Trainer.save_checkpoint() or ModelCheckpoint."
        )
    saved = meta["optimizer_count"]
    if optimizers and saved == 0:
        raise CheckpointError(
            f"The checkpoint {str(path)!r} holds only model weights: no optimizer or scheduler state (it was saved "
            "with save_checkpoint(..., weights_only=True) or ModelCheckpoint(save_weights_only=True)), so training "
            "cannot resume from it. To fine-tune from its weights with fresh optimizers, schedulers and step "
            f"counters, pass fit(..., ckpt_path={str(path)!r}, ckpt_weights_only=True); validate, test and predict "
            "take it as it is."
        )
    if optimizers and saved != len(optimizers):
        raise CheckpointError(
            f"The checkpoint {str(path)!r} holds {saved} optimizer state(s) but configure_optimizers() returned "
            f"{len(optimizers)} optimizer(s). Resume with the optimizer setup the checkpoint was trained with, or "
            f"load only the weights: fit(..., ckpt_path={str(path)!r}, ckpt_weights_only=True) starts fresh "
            "optimizers, Trainer.validate(ckpt_path=...) and Module.load_from_checkpoint() need none."
        )
    _check_optimizer_types(meta.get("optimizer_types"), optimizers, path)
    if param_groups is not None:
        check_param_groups(path, optimizers, param_groups)
    if check is not None:
        check(meta)


def check_param_groups(
    path: Path, optimizers: Sequence[Optimizer], param_groups: Sequence[Sequence[Any]]
) -> None:
    """Each optimizer has as many parameter groups as the checkpoint's state of it."""
    for i, (groups, optimizer) in enumerate(zip(param_groups, optimizers, strict=False)):
        if len(groups) != len(optimizer.param_groups):
            raise OptimizerGroupsMismatchError(
                f"The checkpoint {str(path)!r} holds optimizer {i} ({type(optimizer).__name__}) with "
                f"{len(groups)} parameter group(s), but configure_optimizers() (and the callbacks' on_fit_start) "
                f"built it with {len(optimizer.param_groups)}. Build the optimizer with the groups it was trained "
                f"with, or load only the weights: fit(..., ckpt_path={str(path)!r}, ckpt_weights_only=True)."
            )


def _check_optimizer_types(saved: Any, optimizers: Sequence[Optimizer], path: Path) -> None:
    """Each optimizer is of the class the checkpoint's state was written by (checkpoints written
    before the classes were recorded, and Lightning's, are not checked)."""
    if not isinstance(saved, list) or len(saved) != len(optimizers):
        return
    for i, (name, optimizer) in enumerate(zip(saved, optimizers, strict=True)):
        if name != type(optimizer).__qualname__:
            ours = type(optimizer).__qualname__
            raise CheckpointError(
                f"The checkpoint's optimizer {i} is {name}, the model's (configure_optimizers()) is {ours}: the "
                f"state of {name} does not fit {ours}. Resume with {name}, as the checkpoint was trained, or load only "
                f"the weights and start {ours} afresh: fit(..., ckpt_path={str(path)!r}, ckpt_weights_only=True). "
                "Nothing was loaded."
            )


class ArchiveCheck:
    """The CRC-32 checks of a full checkpoint file, on rank 0 (see [Note: checksums checked on
    load] in layout.py): the pickle entry and the small ones at once, before ``torch.load``
    unpickles anything; the tensor entries in a thread, while ``torch.load`` reads them (zlib
    releases the GIL), so that the check costs little more than the load itself."""

    def __init__(self, path: Path) -> None:
        self.path = path
        entries = archive_entries(path) or []
        first = [e for e in entries if e.name.rsplit("/", 1)[-1] == PICKLE_ENTRY or e.size < 2**16]
        problems = entry_problems(path, first)
        if problems:
            raise full_file_error(path, problems, UNVERIFIED_HINT)
        rest = [e for e in entries if e not in first]
        self._problems: list[str] = []
        self._thread = threading.Thread(
            target=lambda: self._problems.extend(entry_problems(path, rest)),
            name="fullshard-verify",
            daemon=True,
        )
        self._thread.start()

    def finish(self) -> None:
        """Wait for the thread; raise :class:`CorruptCheckpointError` naming the damaged entries."""
        self._thread.join()
        if self._problems:
            raise full_file_error(self.path, self._problems, UNVERIFIED_HINT)


def check_shares(host: CheckpointHost, path: Path, record: CommitRecord, verify: bool) -> None:
    """Each rank checks its share of the tensor files (``verify``: their CRC-32s too; see [Note:
    checksums checked on load] in layout.py); every rank raises if any rank found a problem.
    Collective: one all-reduce of a flag, and an exchange of the problems only when there are some.

    Format 1 records without ``verify`` check nothing here: rank 0 checked every size already.
    """
    if not verify and not record.rank_records:
        return
    mine = share_problems(path, record, host.global_rank, host.world_size, verify)
    if host.reduce_boolean_decision(not mine, all=True):
        return
    found = sorted({problem for problems in host.all_gather_object(mine) for problem in problems})
    raise damaged_sharded(path, found, UNVERIFIED_HINT if verify else "")


# ----------------------------------------------------------------------------------- save
def local_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors this rank holds of a state dict value: a DTensor's or ShardedTensor's local
    shards, a plain tensor itself."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return [value.to_local()]
    if hasattr(value, "local_shards"):  # FSDP1's ShardedTensor
        return [shard.tensor for shard in value.local_shards()]
    return [value] if isinstance(value, torch.Tensor) else []


def nonfinite_parameters(host: CheckpointHost, model_state: Mapping[str, Any]) -> list[str]:
    """The entries of ``model_state`` (this rank's part) that hold NaN or inf, buffers excepted: a
    mask of ``-inf`` is a buffer. One synchronisation per device. Each tensor is read once by
    ``aminmax`` (NaN propagates to both ends, an infinity is one of them), with no temporary the
    size of the tensor: about 10x faster than ``isfinite(x).all()`` on CPU."""
    module = host.module
    buffers = (
        {".".join(p for p in n.split(".") if p not in _WRAPPER_COMPONENTS) for n, _ in module.named_buffers()}
        if module is not None
        else set()
    )
    flags: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, value in model_state.items():
        if name in buffers:
            continue
        for local in local_tensors(value):
            if local.is_floating_point() and local.numel():
                low, high = torch.aminmax(local.detach())
                flags.setdefault(local.device, []).append((name, torch.isfinite(low) & torch.isfinite(high)))
    bad: set[str] = set()
    for items in flags.values():
        finite = torch.stack([flag for _, flag in items]).tolist()
        bad.update(name for (name, _), ok in zip(items, finite, strict=True) if not ok)
    return sorted(bad)


def refuse_nonfinite(path: Path, names: Sequence[str]) -> None:
    """A checkpoint of diverged weights never replaces one of finite weights."""
    if names:
        listed = ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")
        raise CheckpointError(
            f"The model's parameters hold NaN or infinite values ({listed}), so the checkpoint {str(path)!r} was not "
            "written: the checkpoint previously at that path, if any, stays as it was. Training diverged: resume "
            "from the last good checkpoint (with a lower learning rate, or gradient clipping); "
            "Trainer(on_nonfinite_loss='raise'), the default, stops before a non-finite loss reaches the weights. "
            "To keep such weights for debugging, torch.save(model.state_dict(), ...) writes them."
        )


Failure = tuple[str, int | None]  # a rank's cause, said in words, and its errno when an OSError


def failures_of(err: BaseException, rank: int) -> list[Failure]:
    """One cause per rank that failed: DCP gathers its ranks' exceptions into one."""
    if isinstance(err, AfterCommitError):  # of a file inside a data directory no record names yet
        err = err.args[0]
    if isinstance(err, CheckpointException):
        return [
            (f"rank {failed}: {type(exc).__name__}: {exc}", getattr(exc, "errno", None))
            for failed, (exc, _) in sorted(err.failures.items())
        ]
    return [(f"rank {rank}: {type(err).__name__}: {err}", getattr(err, "errno", None))]


def after_commit_error(path: Path, err: BaseException) -> CheckpointError:
    """The error of a save that failed once its checkpoint was committed (it loads)."""
    cause = err.args[0] if isinstance(err, AfterCommitError) else err
    return CheckpointError(
        f"The checkpoint {str(path)!r} was written and committed (it loads), but what follows the commit failed: "
        f"rank 0: {type(cause).__name__}: {cause}. A directory that cannot be flushed may lose the commit in a "
        "power loss: check the file system, and save again to be sure."
    )


def save_error(path: Path, failures: Sequence[Failure]) -> CheckpointSaveError:
    """The one error a failed save raises on every rank (see [Note: a failed save])."""
    causes = "; ".join(dict.fromkeys(cause for cause, _ in failures))
    errno = next((number for _, number in failures if number is not None), None)
    fix = (
        "Free disk space (or fix the permissions, or the path) and save again"
        if errno is not None
        else "Fix the cause (keep hyperparameters and callback states plain data: numbers, strings, lists, "
        "dicts) and save again"
    )
    return CheckpointSaveError(
        f"Could not write the checkpoint {str(path)!r}: {causes}. Nothing was committed: the checkpoint "
        f"previously at that path, if any, is intact and loads, and the partial files were removed. {fix}.",
        errno,
    )

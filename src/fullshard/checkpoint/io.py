"""Writing and reading single-file checkpoints.

[Note: atomic commit]
A checkpoint file becomes visible only when complete: it is written to a temporary file in the
same directory, flushed and fsynced, then renamed over the target with ``os.replace`` (atomic
on POSIX within one filesystem), and the directory is fsynced so the rename survives a power
loss. A save that fails or is killed leaves at most a ``.tmp-*`` file behind, never a damaged
target; the next save into the same directory removes such leftovers.

[Note: early writeback]
The final fsync of a large file waits for every byte to reach the disk, after ``torch.save``
has put them all in the page cache: the two would take turns, and on a disk slower than memory
copies the fsync takes longer than the writing. So once ``_WRITEBACK_BYTES`` are written, a
thread fsyncs the file whenever more has arrived, and the disk works while ``torch.save`` goes
on. The final fsync still comes before the rename and after that thread ended (its error, if
any, fails the save): this only moves work earlier.

[Note: tied parameters stored once]
A parameter that two modules hold (a language model's input embedding and output head) is in
the state dict under both names. A checkpoint records ``{alias: canonical}`` under
:data:`TIED_KEY`, the canonical name being the one the parameter was first registered under
(the name ``named_parameters()`` and the optimizer state use; Hugging Face lists the aliases in
``_tied_weights_keys``), and stores the tensor once:

- full format: both keys stay in ``state_dict``, the alias holding the canonical tensor itself.
  ``torch.save`` writes a storage once however many tensors use it, and the file still loads
  into the plain module with ``strict=True`` (and into Lightning). FSDP's full state dict gathers
  each name into a tensor of its own, so the saver points the alias at the canonical one.
- sharded format: DCP writes every key on its own, so the aliases are left out of the DCP files
  and put back (as the canonical tensor) by every reader: :func:`restore_tied`.

The tie itself lives in the model: loading copies both keys into the one shared ``Parameter``.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
import tempfile
import threading
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch

from fullshard.checkpoint.events import checkpoint_event
from fullshard.checkpoint.trust import allowed_globals, check_structure, refused_names, untrusted_error
from fullshard.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UntrustedCheckpointError,
)

_TMP_PREFIX = ".tmp-"
_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK  # what open() would give; mkstemp's 0600 would hide checkpoints from other users
_WRITEBACK_BYTES = 16 * 2**20  # see [Note: early writeback]
TIED_KEY = "tied_parameters"  # {alias: canonical}, see [Note: tied parameters stored once]


class AfterCommitError(OSError):
    """A save failed after its commit: the new checkpoint is in place (see [Note: a failed save]
    in engine.py). ``args[0]`` is the cause (an ``OSError``, as the directory's fsync raises)."""


def restore_tied(state: dict[str, Any], tied: Mapping[str, str] | None) -> dict[str, Any]:
    """Put back (in place) each alias of ``tied`` that ``state`` lacks, as its canonical tensor
    itself; returns ``state``. See [Note: tied parameters stored once]."""
    for alias, canonical in (tied or {}).items():
        if alias not in state and canonical in state:
            state[alias] = state[canonical]
    return state


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_file_leftovers(directory: Path, target_name: str) -> None:
    """Delete temporary files an interrupted save of ``target_name`` left behind."""
    for leftover in directory.glob(f"{_TMP_PREFIX}{target_name}.*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def atomic_torch_save(obj: Any, path: str | Path, events: bool = True) -> None:
    """``torch.save(obj, path)``, committed atomically (see [Note: atomic commit]).

    ``events``: signal the ``full.*`` save points (see :mod:`fullshard.checkpoint.events`).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"Cannot write a checkpoint file to {str(path)!r}: it is a directory. Give a file path."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_file_leftovers(path.parent, path.name)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            stream = _SaveStream(f, "full.mid_data" if events else None)
            try:
                torch.save(obj, stream)
                f.flush()
            finally:
                stream.close()
            os.fsync(f.fileno())
        if events:
            checkpoint_event("full.before_commit")
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    try:
        _fsync_dir(path.parent)
        if events:
            checkpoint_event("full.after_commit")
    except Exception as err:
        raise AfterCommitError(err) from err


def atomic_write_text(text: str, path: Path, before_rename: str | None = None) -> None:
    """Write a small text file atomically (temporary file, fsync, rename, fsync directory)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            checkpoint_event(before_rename)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


class _SaveStream:
    """A write-only file wrapper for ``torch.save`` that fsyncs in a thread as data arrives (see
    [Note: early writeback]) and signals a checkpoint event, if given, once data started to flow.
    :meth:`close` it before the final fsync."""

    def __init__(self, f: Any, event: str | None) -> None:
        self._f = f
        self._event = event
        self._written = 0
        self._writeback: _Writeback | None = None

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        self._written += n
        if self._event is not None and self._written > 0:
            event, self._event = self._event, None
            checkpoint_event(event)
        if self._writeback is None and self._written >= _WRITEBACK_BYTES:
            self._writeback = _Writeback(self._f.fileno())
        if self._writeback is not None:
            self._writeback.request()
        return int(n)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        """Stop the writeback thread (the file stays open); raise its fsync's error, if any."""
        if self._writeback is not None:
            self._writeback.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class _Writeback:
    """A thread that fsyncs a file descriptor each time it is asked to, until closed."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._asked = threading.Event()
        self._closing = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="fullshard-writeback", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._asked.set()

    def _run(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            if self._closing:
                return
            try:
                os.fsync(self._fd)
            except OSError as err:  # reported once per file: keep it for close(), or it is lost
                self._error = err
                return

    def close(self) -> None:
        self._closing = True
        self._asked.set()
        self._thread.join()
        if self._error is not None:
            raise self._error


def load_torch_file(
    source: str | Path | IO[bytes],
    path: str | Path,
    *,
    trust: bool = False,
    map_location: Any = "cpu",
    mmap: bool = False,
) -> Any:
    """Unpickle a ``torch.save`` file: the one place fullshard calls ``torch.load`` (see [Note:
    loading without running code] in trust.py).

    ``source``: the file, or its bytes; ``path``: the file named in errors. Unless ``trust``,
    with ``weights_only=True`` and fullshard's allowlist (:func:`~fullshard.checkpoint.trust.torch_load_globals`):
    nothing the file names is called unless it is plain data. ``trust``: unpickle it unrestricted,
    which runs whatever code the file names: only for a file from someone you trust.

    Raises:
        UntrustedCheckpointError: (not ``trust``) the file names a function or class to call
            that is not admitted.
        CorruptCheckpointError: (not ``trust``) its pickle is refused for its structure alone
            (a damaged file), or builds what no pickle of plain data can (a list as a dict key);
            (always) what it holds cannot be walked within bounds ([Note: loaded data is walked
            within bounds] in trust.py).
    """
    if trust:
        loaded = torch.load(source, map_location=map_location, mmap=mmap, weights_only=False)
    else:
        loaded = _load_plain(source, path, map_location, mmap)
    check_structure(loaded, path)
    return loaded


def _load_plain(source: str | Path | IO[bytes], path: str | Path, map_location: Any, mmap: bool) -> Any:
    with allowed_globals():
        try:
            return torch.load(source, map_location=map_location, mmap=mmap, weights_only=True)
        except pickle.UnpicklingError as err:
            if not str(err).startswith(_REFUSED):
                raise
            found = refused_names(source, err)
            if found:
                raise untrusted_error(path, found) from err
            # refused for its structure, naming nothing to call: what a damaged pickle looks like
            raise CorruptCheckpointError(
                f"The checkpoint file {str(path)!r} is damaged or not a checkpoint (torch.load(weights_only=True) "
                f"refused its pickle: {_reason(err)}). Resume from an earlier checkpoint instead."
            ) from err
        except (TypeError, AttributeError, RecursionError) as err:
            # what the restricted unpickler's operations raise on a pickle no torch.save writes: a
            # list as a dict key ("unhashable type"), items set on a number, a tuple nested past
            # Python's recursion limit by the pickle's own opcodes
            raise CorruptCheckpointError(
                f"The checkpoint file {str(path)!r} is damaged or not a checkpoint: its pickle builds what no "
                f"pickle of plain data holds ({type(err).__name__}: {err}). Resume from an earlier checkpoint "
                "instead."
            ) from err
        # what torch's restricted unpickler and its tensor rebuilding raise on damaged bytes
        except (EOFError, KeyError, IndexError, ValueError, struct.error) as err:
            raise _not_a_checkpoint(Path(path), err) from err
        except RuntimeError as err:
            if isinstance(err, CheckpointError):
                raise
            raise _not_a_checkpoint(Path(path), err) from err


_REFUSED = "Weights only load failed"  # how torch's message of a weights_only refusal starts


def _reason(err: Exception) -> str:
    """torch's own words for a refusal that names no global (its last paragraph but one)."""
    paragraphs = [p.strip() for p in str(err).split("\n\n") if p.strip()]
    return paragraphs[-2] if len(paragraphs) > 1 else str(err)


def load_checkpoint_file(
    path: str | Path, map_location: Any = "cpu", require_state_dict: bool = True, trust: bool = False
) -> dict[str, Any]:
    """Read a checkpoint file written by :func:`atomic_torch_save` (or by Lightning).

    ``trust``: unpickle it unrestricted (see :func:`load_torch_file`).

    Raises:
        CheckpointNotFoundError: nothing exists at ``path``.
        CorruptCheckpointError: the file is truncated, damaged or not a checkpoint.
        UntrustedCheckpointError: (not ``trust``) it holds objects other than plain data.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(
            f"No checkpoint at {str(path)!r}: the path does not exist. Check the path, or pass "
            "ckpt_path='last' to resume from the newest checkpoint ModelCheckpoint wrote."
        )
    if path.is_dir():
        raise CheckpointNotFoundError(
            f"{str(path)!r} is a directory, not a checkpoint file written by this strategy. "
            "Pass the path of a '.ckpt' file."
        )
    try:
        checkpoint = load_torch_file(path, path, trust=trust, map_location=map_location)
    except (PermissionError, CheckpointError):  # untrusted, or damaged, said already
        raise
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as err:
        raise _not_a_checkpoint(path, err) from err
    except (KeyError, IndexError) as err:  # what torch's weights_only unpickler raises on some garbage
        raise _not_a_checkpoint(path, err) from err
    if not isinstance(checkpoint, dict) or (require_state_dict and "state_dict" not in checkpoint):
        raise CorruptCheckpointError(
            f"{str(path)!r} holds a {type(checkpoint).__name__}, not a fullshard checkpoint (a dict with "
            "'state_dict', 'optimizer_states', 'loops', ...). Save it with Trainer.save_checkpoint()."
        )
    return checkpoint


def _not_a_checkpoint(path: Path, err: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"The checkpoint file {str(path)!r} is damaged or not a checkpoint ({type(err).__name__}: "
        f"{err}). Resume from an earlier checkpoint instead."
    )


# ------------------------------------------------------------------- will a save load untrusted
def not_plain(checkpoint: Mapping[str, Any]) -> list[str]:
    """The entries of ``checkpoint`` (the non-tensor part a save writes) that a load without
    ``trust_checkpoint=True`` would refuse, each as ``"hyper_parameters['data_dir']
    (pathlib.PosixPath)"``; ``hyper_parameters`` and ``callbacks`` are named one level down.

    Exact, not a guess: the entries are pickled as ``torch.save`` does and read back through
    :func:`load_torch_file` (tensors in them replaced by empty ones first, so that a callback
    keeping a copy of the weights costs nothing here). Entries that do not pickle are left to the
    save to report.
    """
    if not _refused(checkpoint):
        return []  # the usual case: one small round trip
    found = []
    for key, value in checkpoint.items():
        if key in ("hyper_parameters", "callbacks") and isinstance(value, Mapping):
            found += [
                f"{key}[{k!r}] ({', '.join(names)})" for k, v in value.items() if (names := _refused(v))
            ]
        elif names := _refused(value):
            found.append(f"{key!r} ({', '.join(names)})")
    return found


def _refused(value: Any) -> list[str]:
    buffer = io.BytesIO()
    try:
        torch.save(_without_tensor_data(value), buffer)
    except Exception:
        return []
    buffer.seek(0)
    try:
        load_torch_file(buffer, "")
    except UntrustedCheckpointError as err:
        return list(err.found)
    except CorruptCheckpointError:
        return ["something torch.load(weights_only=True) cannot read"]
    return []


def _without_tensor_data(value: Any, copies: dict[int, Any] | None = None) -> Any:
    """``value`` with each tensor replaced by an empty one; each container is copied once (by id),
    so that one shared by several entries costs one copy, not one per path to it."""
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return torch.empty(0, dtype=value.dtype)
    if type(value) not in (dict, OrderedDict, list, tuple):  # OrderedDict: what state_dict() returns
        return value
    copies = {} if copies is None else copies
    if id(value) not in copies:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        copied = {k: _without_tensor_data(v, copies) for k, v in items}
        copies[id(value)] = type(value)(copied) if isinstance(value, dict) else type(value)(copied.values())
    return copies[id(value)]


_warned: set[str] = set()


def warn_not_plain(checkpoint: Mapping[str, Any]) -> None:
    """Warn, once per list of entries, when ``checkpoint`` will need ``trust_checkpoint=True``
    to load (see :func:`not_plain`). Call it on one rank."""
    found = not_plain(checkpoint)
    listed = "; ".join(found)
    if not found or listed in _warned:
        return
    _warned.add(listed)
    warnings.warn(
        f"The checkpoint being saved holds objects that are not plain data: {listed}. fullshard loads "
        "checkpoints without running code from them, so loading this one will need trust_checkpoint=True "
        "(docs/checkpoints.md, 'Loading checkpoints you did not write'). Keep hyperparameters and callback "
        "states to plain data (numbers, strings, lists, dicts, tensors): e.g. str(path) for a path, a dict "
        "for a config object.",
        stacklevel=3,
    )

"""What fullshard unpickles from a checkpoint: plain data and the few types it writes itself.

[Note: loading without running code]
Unpickling runs code: a pickle names functions and classes to call, and a file made to attack
whoever opens it names ``os.system``. So no fullshard entry point unpickles a checkpoint file
unrestricted unless the user said, by name, that they trust it (``trust_checkpoint=True``,
``--trust`` on the command line). Every pickle fullshard reads goes through one of two gates:

- files written by ``torch.save`` (full checkpoints, ``meta.pt``, Lightning's ``.ckpt``, the
  non-tensor values DCP stores as bytes): :func:`fullshard.checkpoint.io.load_torch_file`, the
  one call of ``torch.load``, with ``weights_only=True`` (torch's own restricted unpickler:
  tensors, containers, numbers, strings, dtypes, devices, ...) plus :func:`torch_load_globals`;
- DCP's ``.metadata`` index, which DCP itself reads with plain ``pickle.load``:
  :class:`MetadataUnpickler` admits only DCP's metadata classes (:func:`dcp_metadata_globals`),
  and DCP is handed what it unpickled (``dcp_reading.SafeReader``), never the file.

A refused file raises :class:`~fullshard.errors.UntrustedCheckpointError` naming what it holds,
the file and the opt-in; nothing was called. Saving warns (once per content) when a checkpoint
will need the opt-in (:func:`fullshard.checkpoint.io.warn_not_plain`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pathlib
import pickle
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fullshard.errors import CorruptCheckpointError, UntrustedCheckpointError

TRUST_HINT = (
    "Load it only if you trust who wrote it: pass trust_checkpoint=True to the call that loads it "
    "(fit/validate/test/predict, Module.load_from_checkpoint, consolidate, inspect, export_safetensors), "
    "or --trust to `fullshard checkpoint`."
)
_SHARE_HINT = (
    "To hand weights to others, export them: `fullshard checkpoint export` writes safetensors, which hold "
    "no code (docs/checkpoints.md, 'Loading checkpoints you did not write')."
)


@functools.cache
def torch_load_globals() -> tuple[Any, ...]:
    """What ``torch.load(weights_only=True)`` admits beyond torch's own defaults, each entry
    something fullshard itself wrote.

    Only NumPy's legacy random state of checkpoints written before [Note: portable RNG states]
    (checkpoint/manager.py): ``('MT19937', uint32 ndarray, int, int, float)``. An ndarray is
    pickled as ``_reconstruct(ndarray, ...)`` plus its ``dtype`` and raw bytes; torch documents
    these as safe to allowlist. ``_reconstruct`` is admitted under NumPy 1's and NumPy 2's module
    names (a file written under one, read under the other), and of the dtype classes only uint32's
    (an object array, whose items would be further pickles, stays refused).
    """
    import numpy as np

    reconstruct = np.ndarray.__reduce__(np.zeros(0))[0]  # the function ndarrays pickle with
    return (
        (reconstruct, "numpy.core.multiarray._reconstruct"),
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
    )


_admitted = threading.Lock()
_admitting: list[Any] = [0, None]  # how many callers are inside allowed_globals, and its torch context


@contextlib.contextmanager
def allowed_globals() -> Iterator[None]:
    """:func:`torch_load_globals` admitted for ``torch.load(weights_only=True)`` inside.

    torch keeps one process-wide list: the first caller in adds them and the last one out removes
    them (loads in two threads at once must not take them from each other), leaving out those the
    user added already (``torch.serialization.add_safe_globals``), so that leaving does not remove
    theirs. What the user added is admitted too: their own, named trust."""
    with _admitted:
        if _admitting[0] == 0:
            present = set(map(_key, torch.serialization.get_safe_globals()))
            _admitting[1] = torch.serialization.safe_globals(
                [g for g in torch_load_globals() if _key(g) not in present]
            )
            _admitting[1].__enter__()
        _admitting[0] += 1
    try:
        yield
    finally:
        with _admitted:
            _admitting[0] -= 1
            if _admitting[0] == 0:
                _admitting[1].__exit__(None, None, None)


def _key(entry: Any) -> tuple[int, str]:
    if isinstance(entry, tuple):
        return id(entry[0]), entry[1]
    return id(entry), f"{entry.__module__}.{entry.__qualname__}"


@functools.cache
def dcp_metadata_globals() -> Mapping[str, Any]:
    """The globals a DCP ``.metadata`` file of fullshard's references, by the name pickle writes.

    Recorded from real sharded checkpoints of every strategy (FSDP1, FSDP2, DDP, one device) and
    of older fullshard versions: DCP's metadata dataclasses and the enum of memory formats,
    ``_StorageInfo`` (where each item lives in the ``.distcp`` files), ``torch.Size``, every torch
    dtype, ``torch.serialization._get_layout`` (how a ``torch.layout`` pickles: a name looked up
    in a table) and ``pathlib.PosixPath`` (``StorageMeta.checkpoint_id``, the path it was saved
    to). ``BytesStorageMetadata`` indexes non-tensor values, which DCP stores as ``torch.save``
    bytes and fullshard reads through the same gate as any other (``dcp_reading``).
    """
    from torch.distributed.checkpoint import metadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    objects: list[Any] = [
        metadata.Metadata,
        metadata.MetadataIndex,
        metadata.ChunkStorageMetadata,
        metadata.TensorStorageMetadata,
        metadata.BytesStorageMetadata,
        metadata.TensorProperties,
        metadata.StorageMeta,
        metadata._MEM_FORMAT_ENCODING,
        _StorageInfo,
        torch.Size,
        torch.serialization._get_layout,
        pathlib.PosixPath,
    ]  # private names among them: what DCP's pickle names, so they must be named here
    allowed = {f"{o.__module__}.{o.__qualname__}": o for o in objects}
    allowed["pathlib.PosixPath"] = pathlib.PosixPath  # Python 3.13 moved it to pathlib._local
    allowed.update({str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)})  # "torch.float32"
    return allowed


class _Refused(pickle.UnpicklingError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` file admitting only :func:`dcp_metadata_globals`; the first
    other global raises :class:`UntrustedCheckpointError`. Nothing is imported or called by a
    name outside that list (the objects are looked up in it, not imported by the file's names)."""

    def __init__(self, file: Any, path: str | Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        found = dcp_metadata_globals().get(f"{module}.{name}")
        if found is None:
            raise _Refused(f"{module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent id (DCP's index uses none)")

    def load(self) -> Any:
        try:
            loaded = super().load()
        except _Refused as refused:
            raise untrusted_error(self._path, [refused.name], what="index") from None
        except (TypeError, AttributeError, RecursionError) as err:  # as in io.load_torch_file
            raise CorruptCheckpointError(
                f"The checkpoint file {str(self._path)!r} (torch.distributed.checkpoint's index of the tensors) "
                f"is damaged: its pickle builds what no index holds ({type(err).__name__}: {err}). Resume from "
                "an earlier checkpoint instead."
            ) from err
        check_structure(loaded, self._path)
        return loaded


def refused_names(source: Any, err: Exception) -> list[str]:
    """What a file that ``torch.load(weights_only=True)`` refused (``err``) names that is not
    admitted: every global of its pickle, read without running it (torch's static scan), else the
    global or the class torch's message names. Empty when torch refused it for its structure alone
    (what a damaged pickle looks like)."""
    try:
        if not isinstance(source, str | Path):
            source.seek(0)
        found = list(torch.serialization.get_unsafe_globals_in_checkpoint(source))
    except Exception:  # torch's legacy format has no such scan
        found = []
    if not found:
        # a global in a legacy file, or an admitted class given state of a type that is not
        # (the static scan sees globals only: a float64 array's dtype class, say)
        message = str(err)
        found = (
            re.findall(r"GLOBAL (\S+)", message)[:1]
            or re.findall(r"Can only build .* but got <class '([^']+)'>", message)[:1]
        )
    # a damaged byte can make torch read garbage as a global's name, or build onto a number:
    # neither names code, so that refusal is for the structure (a damaged file)
    return [
        name for name in found if name not in _BUILTIN_DATA and all(p.isidentifier() for p in name.split("."))
    ]


_BUILTIN_DATA = frozenset(
    ("int", "float", "complex", "bool", "str", "bytes", "list", "tuple", "dict", "NoneType")
)


def untrusted_error(
    path: str | Path, found: Sequence[str], *, what: str = "file"
) -> UntrustedCheckpointError:
    """The error of a checkpoint file refused by [Note: loading without running code].

    ``found``: what it names that is not admitted (globals, or a class torch would not build);
    ``what``: ``"index"`` for a DCP ``.metadata`` file."""
    names = sorted(set(found))
    listed = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
    holds = f"holds {listed}, which {'is' if len(names) == 1 else 'are'} not plain data"
    if what == "index":
        head = (
            f"The checkpoint file {str(path)!r} (torch.distributed.checkpoint's index of the tensors) {holds}; "
            "that index only ever holds DCP's metadata classes"
        )
    else:
        head = (
            f"The checkpoint file {str(path)!r} {holds} (tensors, numbers, strings, lists, dicts); fullshard's own "
            "entries never need more, so it comes from hyperparameters, callback states or on_save_checkpoint "
            "entries holding other objects, or from a file made to attack whoever opens it"
        )
    return UntrustedCheckpointError(
        f"{head}. Unpickling it could run code the file chooses, so nothing was loaded. {TRUST_HINT} "
        f"{_SHARE_HINT}",
        str(path),
        tuple(names),
    )


# [Note: loaded data is walked within bounds]
# A pickle names each object once and may refer to it again (its memo), so ~2 KB hold lists
# nested 40 deep whose every level holds the level below twice: 2**40 paths through 41 objects.
# Everything that walks loaded data as a tree (printing it, copying it, listing its tensors,
# logging hyperparameters) would run for days, and a list that holds itself would never end. So
# every object fullshard unpickles is measured once, visiting each container once by its id,
# before anything else sees it: how deep it nests, whether a container holds itself, and how
# many objects a walk as a tree would visit beyond those the file holds. Past
# :data:`MAX_DEPTH` levels, or :data:`MAX_SHARED_VISITS` visits more than the objects themselves
# (a real checkpoint shares at most a few containers: a list two hyperparameters name), it is
# refused with :class:`~fullshard.errors.CorruptCheckpointError` naming the entry. The measure
# costs one visit per object, as the unpickling did.
MAX_DEPTH = 100
MAX_SHARED_VISITS = 1_000_000


_LEAVES = frozenset({str, int, float, bool, bytes, type(None), torch.Tensor, torch.nn.Parameter})


Part = tuple[str, Any]  # how an item is reached: ("[]", key or index), ("key", key), (".", field name)


def _children(obj: Any) -> Iterator[tuple[Part, Any]]:
    """The objects ``obj`` holds, each with how it is reached (named only in an error); tensors,
    strings and numbers hold none here. Dict keys are walked too: a tuple key is nested data."""
    if isinstance(obj, torch.Tensor | str | bytes | bytearray | int | float | complex | type(None)):
        return
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(key, tuple | frozenset):
                yield ("key", key), key
            yield ("[]", key), value
    elif isinstance(obj, list | tuple | set | frozenset):
        for i, value in enumerate(obj):
            yield ("[]", i), value
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # DCP's index
        for field in dataclasses.fields(obj):
            yield (".", field.name), getattr(obj, field.name, None)


def _named(parts: Sequence[Part]) -> str:
    """``['hyper_parameters']['deep'][0]...``: the entry that ``parts`` reach, its first levels."""

    def short(key: Any) -> str:
        if isinstance(key, str | int | float | bool | type(None)):
            return repr(key) if len(repr(key)) <= 40 else f"{repr(key)[:37]}..."
        return f"<{type(key).__name__}>"

    shown = [
        f".{key}" if kind == "." else f"[key {short(key)}]" if kind == "key" else f"[{short(key)}]"
        for kind, key in parts[:3]
    ]
    return "".join(shown) + ("..." if len(parts) > 3 else "")


def check_structure(obj: Any, path: str | Path) -> None:
    """Raise :class:`~fullshard.errors.CorruptCheckpointError` unless ``obj`` (what the file at
    ``path`` unpickled to) can be walked as a tree within bounds (see [Note: loaded data is walked
    within bounds]). Each container is visited once; nothing is called on the objects."""
    visits: dict[int, int] = {}  # id -> objects a tree walk of it visits (itself included)
    held = 0  # the objects the walk met, each container's items once: what the file holds
    walked = 1  # the objects a walk as a tree visits, so far
    # each frame: the container, its items still to visit, the visits counted so far, its name
    stack: list[tuple[Any, Iterator[tuple[Part, Any]], list[int], tuple[Part, ...]]] = [
        (obj, _children(obj), [1], ())
    ]
    open_ids = {id(obj)}
    while stack:
        container, children, count, name = stack[-1]
        item = next(children, None)
        if item is None:
            stack.pop()
            open_ids.discard(id(container))
            visits[id(container)] = count[0]
            if stack:
                stack[-1][2][0] += count[0]
            continue
        label, child = item
        held += 1
        if type(child) in _LEAVES:  # the most common item, at the least cost
            count[0] += 1
            walked += 1
            continue
        known = visits.get(id(child))
        if known is not None:  # a container met before: a tree walk visits it again
            count[0] += known
            walked += known
            if walked - held > MAX_SHARED_VISITS:
                raise _structure_error(
                    path,
                    (*name, label),
                    "shares its lists or dicts so that a walk of it as a tree visits more than "
                    f"{MAX_SHARED_VISITS:,} objects beyond the {held:,} it holds",
                )
        elif id(child) in open_ids:
            raise _structure_error(path, (*name, label), "holds itself (a list or dict inside itself)")
        elif next(_children(child), None) is None:
            count[0] += 1
            walked += 1
        elif len(stack) >= MAX_DEPTH:
            raise _structure_error(
                path, (*name, label), f"nests deeper than {MAX_DEPTH} levels of lists, tuples or dicts"
            )
        else:
            stack.append((child, _children(child), [1], (*name, label)))
            open_ids.add(id(child))
            walked += 1


def _structure_error(path: str | Path, name: tuple[Part, ...], what: str) -> CorruptCheckpointError:
    entry = _named(name)
    return CorruptCheckpointError(
        f"The checkpoint file {str(path)!r} is damaged or made to exhaust whoever reads it: its entry "
        f"{entry or '(the whole file)'} {what}. No checkpoint fullshard or Lightning writes holds such data "
        "(hyperparameters and callback states nest a few levels and share few lists or dicts), so nothing "
        "was loaded. Resume from an earlier checkpoint."
    )

"""What a spawned process receives: pickled and checked in the launching process, before any
process starts, so that a payload the new processes cannot use fails at once with the fix.

See [Note: the spawn payload] in :mod:`fullshard.launch.spawn`.
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

from fullshard.errors import MisconfigurationError

__all__ = ["SpawnPayload", "main_is_importable", "pickle_payload", "unpickle_payload"]

NOTEBOOK_ADVICE = (
    "In a notebook, a REPL or `python -c`, use strategy='ddp_notebook' (start_method='fork'; for FSDP,"
    " FSDPStrategy(start_method='fork')), which starts the processes as copies of this one and pickles nothing."
)
_MAX_NAMES = 5  # __main__ objects named in one message


@dataclass(frozen=True)
class SpawnPayload:
    """The call a spawned process makes. ``args`` come first: the pickler walks the fields in
    order, so an unpicklable object is reported by its place in the arguments (the model, the
    data), the first place it is reached, rather than through the Trainer."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    function: Any
    trainer: Any


def main_is_importable() -> bool:
    """Whether processes started with "spawn" or "forkserver" re-create this process's ``__main__``,
    so that the classes and functions defined there exist in them too.

    Mirrors ``multiprocessing.spawn``: a script (``python train.py``) and ``python -m module`` are
    run again in each new process (as ``__mp_main__``); a package's ``__main__.py``, ``python -c``,
    the REPL and notebooks (no file, or IPython's) are not.
    """
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return bool(name != "__main__" and not name.endswith(".__main__"))
    path = getattr(main, "__file__", None)
    if path is None or not os.path.isfile(path):  # `python - < script.py` has "<stdin>"
        return False
    return bool(os.path.splitext(os.path.basename(path))[0] != "ipython")


class _MainRecordingPickler(pickle.Pickler):
    """Pickles as usual and records the classes and functions it pickles by reference to ``__main__``."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.main_objects: dict[int, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        # Called for every object but None, bools, ints, floats, str, bytes and the plain containers.
        if isinstance(obj, type | types.FunctionType) and getattr(obj, "__module__", None) == "__main__":
            self.main_objects[id(obj)] = obj
        return NotImplemented


def pickle_payload(payload: SpawnPayload, start_method: str) -> bytes:
    """``payload`` pickled for processes started with ``start_method`` ("spawn" or "forkserver").

    Plain pickle copies tensors into the bytes. (torch.multiprocessing's reductions would instead
    map the parent's storages into every process, and CPU ranks would then all step the same
    parameters.)

    Raises:
        MisconfigurationError: something in ``payload`` does not pickle, or is a class or function
            defined in a ``__main__`` that the new processes cannot import; no process was started.
    """
    buffer = io.BytesIO()
    pickler = _MainRecordingPickler(buffer)
    try:
        pickler.dump(payload)
    except Exception as error:
        raise _unpicklable_error(payload, error, start_method) from error
    if pickler.main_objects and not main_is_importable():
        raise _main_objects_error(list(pickler.main_objects.values()), start_method)
    return buffer.getvalue()


def unpickle_payload(data: bytes, local_rank: int, start_method: str) -> SpawnPayload:
    """The payload in a spawned process; what could not be rebuilt is explained with the fix."""
    try:
        payload = pickle.loads(data)
    except Exception as error:
        raise MisconfigurationError(
            f"Spawned local rank {local_rank} could not rebuild what the launching process sent it"
            f" ({type(error).__name__}: {error}). With start_method={start_method!r} each new process imports"
            " every class and function the model, the data and the Trainer use, by module and name, so each"
            " must be defined at the top level of an importable module: not in a notebook, a REPL or"
            " `python -c`, and not under `if __name__ == '__main__':`. Move it into a .py module (or to the"
            f" top level of your script) and import it from there. {NOTEBOOK_ADVICE}"
        ) from error
    if not isinstance(payload, SpawnPayload):
        raise TypeError(f"spawned local rank {local_rank} received a {type(payload).__name__}, not a payload")
    return payload


def _describe(obj: Any) -> str:
    kind = "class" if isinstance(obj, type) else "function"
    return f"{obj.__qualname__} ({kind})"


def _main_objects_error(objects: list[Any], start_method: str) -> MisconfigurationError:
    names = ", ".join(_describe(obj) for obj in objects[:_MAX_NAMES])
    if len(objects) > _MAX_NAMES:
        names += f" and {len(objects) - _MAX_NAMES} more"
    return MisconfigurationError(
        f"start_method={start_method!r} starts fresh Python processes, which must import every class and"
        f" function the model, the data and the Trainer use; {names} {'is' if len(objects) == 1 else 'are'}"
        " defined in the __main__ module of this session (a notebook, a REPL, `python -c` or a package's"
        " __main__.py), which those processes cannot import. No process was started. Move"
        f" {'it' if len(objects) == 1 else 'them'} into a .py module and import from there, or run a script"
        f" with strategy='ddp'. {NOTEBOOK_ADVICE}"
    )


def _unpicklable_error(payload: SpawnPayload, error: Exception, start_method: str) -> MisconfigurationError:
    where = _locate_unpicklable(payload)
    found = f" (found at {where})" if where else ""
    return MisconfigurationError(
        f"start_method={start_method!r} sends each new process what it needs (the model, the data, the"
        f" Trainer) by pickling it, and something there does not pickle{found}: {type(error).__name__}:"
        f" {error}. No process was started. Lambdas, functions and classes defined inside functions,"
        " generators, open files, locks and threads cannot be pickled: define functions and classes at the"
        " top level of a module (`def` instead of `lambda`, e.g. for a DataLoader's collate_fn) and create"
        f" generators and file handles where they are used (in the dataset's __iter__). {NOTEBOOK_ADVICE}"
    )


# ---------------------------------------------------------------------------------------------
# Where in the payload pickling failed


class _Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return len(data)


def _skip(*args: Any) -> None:
    """Stands in for tensors while locating a failure: their data does not matter there."""


def _locate_unpicklable(payload: SpawnPayload) -> str:
    """The path from the payload to the first object that does not pickle, e.g.
    ``args[2] (_DataSources) .loaders['train'] (DataLoader) .collate_fn (function)``; "" if not found.

    Python's C pickler does not say where it failed. Only the pure-Python one (``pickle._Pickler``,
    private to the standard library) lets a subclass follow the nesting, so it is used here, on
    the error path only, once the C pickler has failed.
    """
    tracer = _TracingPickler(_Discard())
    try:
        tracer.dump(payload)
    except Exception:
        return _path(tracer.failed_at or [])
    return ""


class _TracingPickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.stack: list[Any] = []
        self.failed_at: list[Any] | None = None

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        self.stack.append(obj)
        try:
            super().save(obj, save_persistent_id)  # type: ignore[misc]
        except Exception:
            if self.failed_at is None:  # the innermost save sees the exception first
                self.failed_at = list(self.stack)
            raise
        finally:
            self.stack.pop()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor | torch.UntypedStorage | torch.TypedStorage):
            return (_skip, ())
        return NotImplemented


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _path(stack: list[Any]) -> str:
    parts: list[str] = []
    for parent, child in itertools.pairwise(stack):
        if isinstance(parent, dict):
            key = next((k for k, v in parent.items() if v is child), None)
            if isinstance(key, str) and key.isidentifier():
                parts.append(f".{key}")
            elif key is not None:
                parts.append(f"[{key!r}]")
        elif isinstance(parent, list | tuple):
            index = next((i for i, v in enumerate(parent) if v is child), None)
            if index is not None:
                parts.append(f"[{index}]")
        if not isinstance(child, _CONTAINERS) and parts:
            parts.append(f" ({type(child).__qualname__}) ")
    return "".join(parts).strip().lstrip(".")

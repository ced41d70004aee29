"""Lightning's module paths as fullshard modules, made on first import from the tables of
:mod:`fullshard.lightning_paths`.

[Note: Lightning's module paths]
A script imports from ``lightning.pytorch.callbacks.finetuning`` or ``lightning.pytorch.core``;
after its import switch it imports ``fullshard.callbacks.finetuning`` and ``fullshard.core``.
Most such paths are no fullshard source file: :class:`LightningPathFinder`, which ``import
fullshard`` appends to ``sys.meta_path`` (so real modules are always found first), makes a
module for each path of ``ALIASES`` whose names resolve on first access (PEP 562 module
``__getattr__``), importing the fullshard module that holds the object only then. A path listed
in ``NOT_SUPPORTED`` raises ``ModuleNotFoundError`` saying why and what to do; a name listed
there raises :class:`NotInFullshardError`, an ``ImportError``, the same way. It is not an
``AttributeError`` as PEP 562 suggests, because ``from m import name`` replaces an
AttributeError with a bare "cannot import name" and the reason would be lost (and the two
cannot be one class: their layouts conflict); so ``hasattr`` raises for such a name. Real
fullshard modules at a Lightning path (``fullshard.strategies``) get the missing names through
:func:`lightning_names`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


def _tables() -> Any:
    """The tables, imported on first need (not at ``import fullshard``)."""
    from fullshard import lightning_paths

    return lightning_paths


_ROOT = "fullshard"
_LIGHTNING_ROOTS = ("lightning.pytorch", "pytorch_lightning")


class NotInFullshardError(ImportError):
    """A name of a Lightning module that fullshard does not have; the message says why and what
    to do ([Note: Lightning's module paths])."""


def fullshard_path(lightning_module: str) -> str:
    """The fullshard module a Lightning module path maps to: ``lightning.pytorch.X`` and
    ``pytorch_lightning.X`` are both ``fullshard.X``."""
    for root in _LIGHTNING_ROOTS:
        if lightning_module == root:
            return _ROOT
        if lightning_module.startswith(root + "."):
            return f"{_ROOT}.{lightning_module[len(root) + 1 :]}"
    raise ValueError(
        f"fullshard_path({lightning_module!r}): not a Lightning module path; "
        f"give one under {' or '.join(_LIGHTNING_ROOTS)}"
    )


def _relative(fullname: str) -> str | None:
    if fullname == _ROOT:
        return ""
    return fullname[len(_ROOT) + 1 :] if fullname.startswith(_ROOT + ".") else None


def _why(relative: str, name: str | None = None) -> str | None:
    key = relative if name is None else f"{relative}:{name}"
    reason: str | None = _tables().NOT_SUPPORTED.get(key)
    return reason


def resolve(relative: str, name: str) -> Any:
    """The object Lightning's ``lightning.pytorch.<relative>.<name>`` is in fullshard; raises
    :class:`NotInFullshardError` with the reason for one fullshard has not, AttributeError for
    a name Lightning has not either."""
    target = _tables().ALIASES.get(relative, {}).get(name)
    module_name = f"{_ROOT}.{relative}" if relative else _ROOT
    if target is None:
        why = _why(relative, name)
        if why is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        lightning = f"lightning.pytorch.{relative}" if relative else "lightning.pytorch"
        raise NotInFullshardError(
            f"{module_name}.{name} (Lightning's {lightning}.{name}) is not in fullshard: {why}",
            name=module_name,
        )
    holder, _, attribute = target.partition(":")
    module = importlib.import_module(holder)
    return getattr(module, attribute) if attribute else module


def lightning_names(module_name: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a real fullshard module at a Lightning path: the names the
    tables give that path, resolved on first use."""
    relative = _relative(module_name)
    if relative is None:
        raise ValueError(f"lightning_names({module_name!r}): not a fullshard module")

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # the import system's probes (`__path__` on every from-import)
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = resolve(relative, name)
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__


class LightningPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``fullshard.<path>`` for the Lightning paths the tables name (after every other
    finder: a real module always wins); see [Note: Lightning's module paths]."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        relative = _relative(fullname)
        if not relative:
            return None
        why = _why(relative)
        if why is not None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (Lightning's lightning.pytorch.{relative}): {why}",
                name=fullname,
            )
        tables = _tables()
        if relative not in tables.ALIASES:
            return None
        is_package = any(
            other.startswith(relative + ".") for other in (*tables.ALIASES, *tables.NOT_SUPPORTED)
        )
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        relative = _relative(module.__name__) or ""  # find_spec only answers for fullshard's paths
        module.__doc__ = (
            f"Lightning's lightning.pytorch.{relative} under fullshard: its names resolve to "
            "fullshard's objects on first use (fullshard.lightning_paths)."
        )
        module.__all__ = sorted(_tables().ALIASES[relative])  # type: ignore[attr-defined]
        module.__getattr__ = lightning_names(module.__name__)  # type: ignore[method-assign]
        names = module.__all__  # type: ignore[attr-defined]
        module.__dir__ = lambda: sorted({*vars(module), *names})  # type: ignore[method-assign]  # tab completion


def install() -> None:
    """Append the finder to ``sys.meta_path`` once (``import fullshard`` calls this)."""
    if not any(isinstance(finder, LightningPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(LightningPathFinder())

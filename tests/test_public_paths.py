"""One import path per public name: a fullshard object is exported (listed in ``__all__``) by at
most one public module besides the module that defines it, e.g. ``fullshard.callbacks`` for
``ModelCheckpoint`` (defined in ``fullshard.trainer.callbacks.model_checkpoint``), never also
``fullshard.trainer.callbacks``. Lightning's other paths to the same objects are rows of the alias
table (fullshard.lightning_paths), resolved lazily, not second exports. The top-level package is
the one exception: ``import fullshard as L`` gives ``L.Trainer``, ``L.LightningModule``,
``L.ModelCheckpoint``, ... as the short form (docs/callbacks.md)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import fullshard

SRC = Path(fullshard.__file__).parent


def _public_modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(fullshard.__path__, "fullshard.")]
    public = [n for n in names if not any(part.startswith("_") for part in n.split("."))]
    return [importlib.import_module(n) for n in public]


def _second_exports(modules: list[ModuleType]) -> dict[str, list[str]]:
    """Objects listed in the ``__all__`` of two or more modules other than their own."""
    exporters: dict[int, dict[str, str]] = defaultdict(dict)  # object -> module -> the name there
    objects = {}
    for module in modules:
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            # fullshard's own classes and functions; one module may give one an older name too
            # (fullshard.planner's Plan for MemoryPlan): still one path
            if obj.__module__.startswith("fullshard.") and obj.__module__ != module.__name__:
                exporters[id(obj)].setdefault(module.__name__, f"{module.__name__}.{name}")
                objects[id(obj)] = obj
    return {
        f"{objects[key].__module__}.{objects[key].__qualname__}": sorted(paths.values())
        for key, paths in exporters.items()
        if len(paths) > 1
    }


def test_each_public_name_has_one_import_path() -> None:
    modules = [m for m in _public_modules() if m.__name__ != "fullshard"]
    assert len(modules) > 100  # the walk found the package
    assert _second_exports(modules) == {}


def test_a_second_export_is_seen() -> None:
    import fullshard.callbacks
    import fullshard.utilities

    second = ModuleType("fullshard.trainer.callbacks")
    second.ModelCheckpoint = fullshard.callbacks.ModelCheckpoint  # type: ignore[attr-defined]
    second.__all__ = ["ModelCheckpoint"]  # type: ignore[attr-defined]
    found = _second_exports([fullshard.callbacks, fullshard.utilities, second])
    assert found == {
        "fullshard.trainer.callbacks.model_checkpoint.ModelCheckpoint": [
            "fullshard.callbacks.ModelCheckpoint",
            "fullshard.trainer.callbacks.ModelCheckpoint",
        ]
    }


def test_a_package_without_all_binds_no_names() -> None:
    """A package ``__init__`` that lists no ``__all__`` imports nothing from other modules: its
    names would be a second, unlisted path (``from fullshard.trainer.loggers import CSVLogger``)."""
    binding = {}
    for init in sorted(SRC.rglob("__init__.py")):
        tree = ast.parse(init.read_text())
        listed = any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
            for node in tree.body
        )
        imported = [
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fullshard")
            for alias in node.names
        ]
        if not listed and imported:
            binding[str(init.relative_to(SRC))] = imported
    assert binding == {}

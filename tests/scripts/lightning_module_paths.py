"""Lightning's public module paths and the names a script imports from each: run with a Python
that has lightning==2.6.6, it prints them as JSON (tests/fixtures/lightning_2.6.6_module_paths.json
holds the recording; tests/test_module_paths.py checks that fullshard has each path, or that
docs/lightning.md, "Module paths", says why not).

/tmp/lvenv/bin/python tests/scripts/lightning_module_paths.py > tests/fixtures/lightning_2.6.6_module_paths.json

A module is public when no part of its dotted path starts with ``_``; its path is recorded
relative to ``lightning.pytorch`` (``""`` for the package itself, ``callbacks.finetuning``).
Its public names are its ``__all__`` where it has one, else what its source binds at top level
(classes, functions, assignments such as ``STEP_OUTPUT = ...``), what a package's ``__init__``
imports from its own submodules, and what the module re-exports (an import Lightning marks as
unused on purpose with ``# noqa: F401``), less loggers, warning caches and type variables.
The source is read, not imported, so a module whose optional dependency is missing
(``serve`` needs ``requests``) is recorded too.
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
import warnings
from pathlib import Path
from typing import Any, TypeVar

import lightning.pytorch

ROOT = Path(lightning.pytorch.__file__).parent


def _paths() -> dict[str, Path]:
    found = {}
    for source in sorted(ROOT.rglob("*.py")):
        parts = list(source.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        elif not (source.parent / "__init__.py").exists():
            continue
        if any(part.startswith("_") for part in parts) or not all(
            (ROOT.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(len(parts))
        ):
            continue
        found[".".join(parts)] = source
    return found


def _is_main_guard(node: ast.If) -> bool:
    return "__main__" in ast.unparse(node.test)


def _bound(source: Path, package: str | None) -> tuple[list[str], list[str] | None]:
    """(names the source binds or re-exports at top level, its literal ``__all__`` or None)."""
    text = source.read_text()
    lines = text.splitlines()
    names: list[str] = []
    declared: list[str] | None = None

    def visit(body: list[ast.stmt]) -> None:
        nonlocal declared
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.append(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        if target.id == "__all__":
                            declared = list(ast.literal_eval(node.value))  # type: ignore[arg-type]
                        names.append(target.id)
            elif isinstance(node, ast.ImportFrom) and node.module:
                own = package is not None and node.module.startswith(package + ".")
                waived = "noqa: F401" in lines[node.lineno - 1]
                if own or waived:
                    names.extend(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.If) and not _is_main_guard(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)

    visit(ast.parse(text).body)
    return names, declared


def _internal(value: Any) -> bool:
    from lightning.fabric.utilities.rank_zero import WarningCache

    return isinstance(value, logging.Logger | WarningCache | TypeVar)


def public_names(path: str, source: Path) -> list[str]:
    dotted = "lightning.pytorch" + (f".{path}" if path else "")
    names, declared = _bound(source, dotted if source.name == "__init__.py" else None)
    try:
        module: Any = importlib.import_module(dotted)
    except ImportError:  # an optional dependency is missing: judge by the source alone
        module = None
    if declared is not None:
        names = declared
    public = []
    for name in dict.fromkeys(names):
        if name.startswith("_"):
            continue
        if module is not None and (not hasattr(module, name) or _internal(getattr(module, name))):
            continue
        public.append(name)
    return sorted(public)


def main() -> None:
    warnings.simplefilter("ignore")
    recorded = {path: public_names(path, source) for path, source in sorted(_paths().items())}
    print(json.dumps(recorded, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()

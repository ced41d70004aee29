"""docs/design.md's layers hold: the import contracts in pyproject.toml (``[tool.importlinter]``)
are kept by the source, as ``lint-imports`` checks them (and CI runs it, .ci/run); and the
contracts are not empty words: an import that runs up the layers breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with this repository's contracts over the package under ``src``."""
    executable = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports"
    )
    if executable is None:
        pytest.fail(
            "lint-imports is missing: install the test extra (pip install -e '.[test]'), which has import-linter."
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [executable, "--no-cache"],  # the contracts: pyproject.toml in cwd
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_source_keeps_every_import_contract() -> None:
    result = _lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and " 0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # a strategy that reached up to the Trainer (through a function, too: it still runs)
        (
            "strategies/registry.py",
            "def _up():\n    from fullshard.trainer import trainer\n",
            "A strategy knows nothing of loops or callbacks",
        ),
        # the Trainer naming an FSDP strategy instead of asking the Strategy contract
        (
            "trainer/summary.py",
            "from fullshard.strategies.sharded import ShardedStrategy\n",
            "The Trainer knows nothing of FSDP",
        ),
        # checkpoint/ importing the Trainer's callbacks
        ("checkpoint/layout.py", "import fullshard.trainer.callbacks.base\n", "Data flows one way"),
    ],
)
def test_an_import_up_the_layers_breaks_a_contract(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    copy = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "fullshard", copy / "fullshard", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = copy / "fullshard" / module
    path.write_text(path.read_text() + "\n\n" + line)
    result = _lint_imports(copy)
    assert result.returncode != 0, result.stdout
    assert broken in result.stdout and "BROKEN" in result.stdout, result.stdout
    assert module.replace("/", ".").removesuffix(".py") in result.stdout, result.stdout


# What the Trainer asks a strategy is a member of the Strategy contract (shards_parameters,
# one_process_per_device, ...): no module of these packages names a concrete strategy class. The
# forbidden contract above sees imports of modules only; `from fullshard.strategies import
# DDPStrategy` imports the package, so this check reads the names.
_HOST_PACKAGES = ("trainer", "tuner", "profilers", "callbacks", "loggers", "plugins", "serve")


def _concrete_strategy_names() -> set[str]:
    import fullshard.strategies as strategies

    return {
        name
        for name in strategies.__all__
        if isinstance(getattr(strategies, name), type)
        and issubclass(getattr(strategies, name), strategies.Strategy)
        and getattr(strategies, name) is not strategies.Strategy
    }


def _strategy_classes_named(source: str) -> list[tuple[int, str]]:
    import ast

    concrete = _concrete_strategy_names()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in concrete:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in concrete:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name in concrete]
    return found


def test_the_trainer_names_no_strategy_class() -> None:
    assert {
        "DDPStrategy",
        "SingleDeviceStrategy",
        "ParallelStrategy",
        "FSDP2Strategy",
    } <= _concrete_strategy_names()
    named = {}
    for package in _HOST_PACKAGES:
        for path in sorted((ROOT / "src" / "fullshard" / package).rglob("*.py")):
            found = _strategy_classes_named(path.read_text())
            if found:
                named[str(path.relative_to(ROOT))] = found
    assert named == {}, f"ask the Strategy contract (fullshard/strategies/strategy.py) instead: {named}"


def test_naming_a_strategy_class_is_seen() -> None:
    source = (
        "from fullshard.strategies import STRATEGY_REGISTRY, DDPStrategy\n"
        "import fullshard.strategies as s\n"
        "def f(x):\n    return isinstance(x, s.FSDP2Strategy) or STRATEGY_REGISTRY\n"
    )
    assert sorted(_strategy_classes_named(source)) == [(1, "DDPStrategy"), (4, "FSDP2Strategy")]

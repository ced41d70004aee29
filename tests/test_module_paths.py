"""Every public module path of Lightning 2.6.6 is a fullshard module exporting the names a script
imports from it, or docs/lightning.md ("Module paths") says why not ([Note: Lightning's module
paths] in src/fullshard/lightning_aliases.py)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fullshard
from fullshard.lightning_aliases import NotInFullshardError, fullshard_path
from fullshard.lightning_paths import ALIASES, NOT_SUPPORTED

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "lightning_2.6.6_module_paths.json"
SCRIPT = HERE / "scripts" / "lightning_module_paths.py"
DOC = HERE.parent / "docs" / "lightning.md"
RECORDED: dict[str, list[str]] = json.loads(FIXTURE.read_text())
# Names Lightning has at a path that the recording's rule leaves out: what its examples import
# (`from lightning.pytorch import cli_lightning_logo`).
_SUBPACKAGES = [
    "callbacks",
    "core",
    "loggers",
    "plugins",
    "profilers",
    "strategies",
    "trainer",
    "tuner",
    "utilities",
]
EXTRA = {"": ["cli_lightning_logo", *_SUBPACKAGES]}  # `import lightning.pytorch as L; L.callbacks...`


def _documented() -> dict[str, str]:
    """``path`` or ``path:name`` -> reason, from the table of docs/lightning.md's "Module paths"."""
    section = DOC.read_text().split("\n## Module paths\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        match = re.fullmatch(r"\| `([^`]*)` \| (.*) \|", line)
        assert match, f"a row of docs/lightning.md's module paths table is not `path` | reason: {line}"
        assert match[1] not in rows, f"docs/lightning.md: {match[1]} has two rows"
        rows[match[1]] = match[2]
    return rows


def _ancestors(path: str) -> list[str]:
    """``path`` and the paths of its packages: ``a.b.c``, ``a.b``, ``a``."""
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _module_name(path: str) -> str:
    return fullshard_path(f"lightning.pytorch.{path}" if path else "lightning.pytorch")


def test_the_recorded_module_paths_are_lightnings() -> None:
    from lckpt_models import lightning_python

    python = lightning_python()
    result = subprocess.run([python, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == RECORDED, (
        f"Lightning's modules changed: {python} {SCRIPT} > {FIXTURE}"
    )
    assert len(RECORDED) == 165


def test_the_docs_list_the_tables_reasons() -> None:
    assert _documented() == NOT_SUPPORTED, (
        "docs/lightning.md's 'Module paths' table and fullshard.lightning_paths.NOT_SUPPORTED differ: "
        f"{sorted(set(_documented().items()) ^ set(NOT_SUPPORTED.items()))}"
    )


def test_the_table_names_only_what_lightning_has() -> None:
    known = {f"{path}:{name}" for path, names in {**RECORDED, **EXTRA}.items() for name in names}
    stale = [key for key in NOT_SUPPORTED if key not in RECORDED and key not in known]
    stale += [f"{path}:{name}" for path, names in ALIASES.items() for name in names]
    stale = [key for key in stale if key not in known and key not in RECORDED]
    assert not stale, f"fullshard.lightning_paths names what Lightning 2.6.6 has not: {stale}"


def test_every_lightning_module_path_is_in_fullshard_or_accounted_for() -> None:
    documented = _documented()
    problems: list[str] = []
    for path, names in RECORDED.items():
        dotted = _module_name(path)
        if path in documented:
            # a child of a path fullshard has not is refused with its parent's reason
            reasons = [documented[p] for p in _ancestors(path) if p in documented]
            try:
                importlib.import_module(dotted)
                problems.append(f"{dotted} imports, but docs/lightning.md lists it as not supported")
            except ModuleNotFoundError as error:
                if not any(reason in str(error) for reason in reasons):
                    problems.append(f"{dotted}: the error does not give the reason: {error}")
            continue
        try:
            module = importlib.import_module(dotted)
        except ImportError as error:
            problems.append(f"{dotted}: {error}")
            continue
        for name in [*names, *EXTRA.get(path, [])]:
            key = f"{path}:{name}"
            try:
                getattr(module, name)
            except NotInFullshardError as error:
                if key not in documented:
                    problems.append(f"{dotted}.{name} is refused but not listed: {error}")
                elif documented[key] not in str(error):
                    problems.append(f"{dotted}.{name}: the error does not give the reason: {error}")
                continue
            except (AttributeError, ImportError) as error:
                problems.append(f"{dotted}.{name}: {type(error).__name__}: {error}")
                continue
            if key in documented:
                problems.append(f"{dotted}.{name} exists, but docs/lightning.md lists it as not supported")
    assert not problems, f"{len(problems)} Lightning module paths or names:\n" + "\n".join(problems)


def test_import_fullshard_makes_no_alias_module() -> None:
    """The aliases cost nothing at ``import fullshard``: no module of the table, nor what its
    names live in only for Lightning's sake, is imported until a script asks."""
    code = (
        "import fullshard, json, sys\n"
        "from fullshard.lightning_aliases import LightningPathFinder as F\n"
        "def made(): return sorted(n for n, m in list(sys.modules.items()) if isinstance(getattr(getattr(m, '__spec__', None), 'loader', None), F))\n"
        "before = (sorted(sys.modules), made())\n"
        "import fullshard.core, fullshard.callbacks.finetuning\n"
        "print(json.dumps([*before, made()]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, made_at_import, made_later = json.loads(run.stdout)
    assert made_at_import == []
    assert made_later == ["fullshard.callbacks.finetuning", "fullshard.core"]  # the check sees them
    holders = {"fullshard.cli", "fullshard.cli.logo", "fullshard.demos", "fullshard.utilities.types"}
    assert not set(loaded) & holders, sorted(set(loaded) & holders)


def test_names_resolve_to_fullshards_objects() -> None:
    from fullshard.callbacks.finetuning import BackboneFinetuning
    from fullshard.core import LightningModule
    from fullshard.utilities.exceptions import MisconfigurationException

    from fullshard.trainer import Trainer

    assert LightningModule is fullshard.LightningModule and Trainer is fullshard.Trainer
    assert BackboneFinetuning is fullshard.callbacks.BackboneFinetuning
    assert MisconfigurationException is fullshard.errors.MisconfigurationError
    from fullshard.utilities.seed import isolate_rng

    with isolate_rng():
        drawn = torch.rand(3)
    assert torch.equal(torch.rand(3), drawn)  # the generator was put back
    sys.modules.pop("fullshard.core.datamodule", None)
    fresh = importlib.import_module("fullshard.core.datamodule")
    assert "LightningDataModule" in dir(fresh) and "LightningDataModule" not in vars(
        fresh
    )  # before first use


def test_what_fullshard_has_not_says_why_and_what_to_do() -> None:
    with pytest.raises(
        ImportError, match=r"DeepSpeedStrategy\).*DeepSpeed is not among fullshard's strategies.*fsdp"
    ):
        from fullshard.strategies import DeepSpeedStrategy  # noqa: F401
    with pytest.raises(
        ModuleNotFoundError, match=r"lightning\.pytorch\.plugins\.precision\.double\): .*no float64"
    ):
        importlib.import_module("fullshard.plugins.precision.double")
    with pytest.raises(ModuleNotFoundError, match=r"lightning.pytorch.accelerators\).*accelerator='cpu'"):
        importlib.import_module("fullshard.accelerators.cuda")
    with pytest.raises(AttributeError, match=r"module 'fullshard\.core' has no attribute 'Nothing'"):
        importlib.import_module("fullshard.core").Nothing  # noqa: B018
    assert not hasattr(fullshard.strategies, "Nothing")


def test_pytorch_lightning_paths_map_the_same() -> None:
    for path in RECORDED:
        tail = f".{path}" if path else ""
        assert fullshard_path(f"pytorch_lightning{tail}") == fullshard_path(f"lightning.pytorch{tail}")
    assert fullshard_path("pytorch_lightning.callbacks.finetuning") == "fullshard.callbacks.finetuning"
    assert fullshard_path("lightning.pytorch") == "fullshard"
    with pytest.raises(ValueError, match=r"'torch.nn'\): not a Lightning module path; give one under"):
        fullshard_path("torch.nn")

"""docs/lightning.md stays true: its table is read and every row checked against fullshard and
against the porting scripts (tests/porting/), and its hook-order block against the recordings.
Its "Lightning's public surface" table, with the first, must account for every public name of
Lightning 2.6.6 (the last part of this file; see test_every_name_of_lightnings_surface_is_accounted_for).

The second column of the table names the feature in fullshard, one or more code spans, each in
one of these forms (NAME: an identifier; V: a Python literal):

    fullshard.a.b                     an importable name
    Trainer(NAME=) / Trainer(NAME=V)  a Trainer argument
    Trainer.M(NAME=) / (NAME=V)       an argument of a Trainer method (``fit``, ``test``, ...)
    Trainer.NAME                      a Trainer attribute or method
    LightningModule.NAME              a module hook, step or attribute
    LightningModule.log(NAME=)        an argument of ``self.log``
    Callback.NAME                     a callback hook
    LightningDataModule.NAME          a DataModule hook or attribute
    callbacks.C(NAME=) / loggers.C(NAME=) / callbacks.C.NAME
    seed_everything(NAME=)
    lr_scheduler["KEY"]               a key of the scheduler config of ``configure_optimizers``
    —                                 nothing (only in "not supported" rows)

A "ported" row must name something fullshard has (the argument, attribute or hook exists) and
that the porting scripts exercise (the script passes that argument or uses that attribute; a
hook is one Lightning called in the recordings, so tests/test_porting.py compares fullshard's
calls with it). A "differs" row must name something fullshard has. A "not supported" row names
a hook fullshard has no method for, does not call, and warns about, or a Trainer argument it
refuses.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import quiet_trainer
from fullshard.errors import MisconfigurationError

sys.path.insert(0, str(Path(__file__).parent / "porting"))
from hooks import CALLBACK_HOOKS, DATAMODULE_HOOKS, MODULE_HOOKS, NOT_CALLED_BY_FULLSHARD, STEP_METHODS
from order import documented_order
from runner import EXPECTED, HERE, SCRIPTS

DOC = Path(__file__).parents[1] / "docs" / "lightning.md"
STATUSES = ("ported", "differs:", "not supported:")


# ------------------------------------------------------------------------------ the table
def _rows() -> list[tuple[str, list[str], str]]:
    """(Lightning feature, fullshard ids, status) of each row of the "What ports" table."""
    text = DOC.read_text()
    section = text.split("## What ports", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| Lightning |", "| ---")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, f"a row of docs/lightning.md does not have 3 cells: {line}"
        ids = re.findall(r"`([^`]+)`", cells[1]) if cells[1] != "—" else []
        rows.append((cells[0], ids, cells[2]))
    return rows


ROWS = _rows()


def _ids(status: str) -> Iterator[tuple[str, str]]:
    for feature, ids, row_status in ROWS:
        if row_status.startswith(status):
            for ident in ids:
                yield feature, ident


# -------------------------------------------------------------------- what the scripts use
class _Usage:
    """What the porting scripts do, read from their syntax trees and from the recordings."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.attributes: set[str] = set()
        self.imported: set[str] = set()
        self.dict_keys: set[str] = set()
        for script in SCRIPTS:
            for node in ast.walk(ast.parse((HERE / f"{script}.py").read_text())):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    self.calls.append((name, {k.arg: _literal(k.value) for k in node.keywords if k.arg}))
                elif isinstance(node, ast.Attribute):
                    self.attributes.add(node.attr)
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    self.imported.update(a.asname or a.name for a in node.names)
                    if isinstance(node, ast.ImportFrom) and node.module:
                        self.imported.update(node.module.split("."))
                    self.imported.update(p for a in node.names for p in a.name.split("."))
                elif isinstance(node, ast.Dict):
                    self.dict_keys.update(
                        k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    )
        self.recorded: set[tuple[str, str]] = set()
        for path in EXPECTED.glob("*.json"):
            for rank in json.loads(path.read_text())["ranks"]:
                for event in rank["events"]:
                    who, _, rest = event.partition(" ")
                    self.recorded.add((who, rest.split("(")[0]))

    def called(self, callee: str | tuple[str, ...], keyword: str, value: Any = None) -> bool:
        names = (callee,) if isinstance(callee, str) else callee
        return any(
            name in names and keyword in kwargs and (value is None or kwargs[keyword] == value)
            for name, kwargs in self.calls
        )


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return Ellipsis  # not a literal: "some value"


@cache
def _usage() -> _Usage:
    return _Usage()


@cache
def _trainer_attributes() -> frozenset[str]:
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    return frozenset(dir(trainer))


def _parameters(function: Any) -> set[str]:
    """Explicit parameters (not ``**kwargs``) of ``function``."""
    return {
        name
        for name, p in inspect.signature(function).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


def _instance_or_class(cls: type) -> Any:
    try:
        return cls()
    except TypeError:
        return cls


_FORMS: list[tuple[str, str]] = [
    ("trainer_arg", r"Trainer\((\w+)=(.*)\)"),
    ("trainer_method_arg", r"Trainer\.(\w+)\((\w+)=(.*)\)"),
    ("trainer_attr", r"Trainer\.(\w+)"),
    ("log_arg", r"LightningModule\.log\((\w+)=\)"),
    ("module", r"LightningModule\.(\w+)"),
    ("callback", r"Callback\.(\w+)"),
    ("datamodule", r"LightningDataModule\.(\w+)"),
    ("class_arg", r"(callbacks|loggers)\.(\w+)\((\w+)=\)"),
    ("class_attr", r"(callbacks|loggers)\.(\w+)\.(\w+)"),
    ("seed_arg", r"seed_everything\((\w+)=\)"),
    ("scheduler_key", r'lr_scheduler\["(\w+)"\]'),
    ("import", r"fullshard(?:\.\w+)*"),
]


def _parse(ident: str) -> tuple[str, tuple[str, ...]]:
    for kind, pattern in _FORMS:
        match = re.fullmatch(pattern, ident)
        if match:
            return kind, match.groups() if kind != "import" else (ident,)
    raise AssertionError(
        f"docs/lightning.md: {ident!r} is in none of the forms this test knows (see its docstring)"
    )


def _resolve(dotted: str) -> Any:
    """The object ``fullshard.a.b`` names (importing submodules on the way), or None."""
    first, *rest = dotted.split(".")
    obj: Any = importlib.import_module(first)
    for part in rest:
        try:  # a Lightning name fullshard has not raises ImportError ([Note: Lightning's module paths])
            if not hasattr(obj, part) and inspect.ismodule(obj):
                importlib.import_module(f"{obj.__name__}.{part}")
            obj = getattr(obj, part, None)
        except ImportError:
            return None
        if obj is None:
            return None
    return obj


def _exists(ident: str) -> str | None:
    """None when fullshard has what ``ident`` names; otherwise why not."""
    kind, parts = _parse(ident)
    if kind == "trainer_arg":
        ok = parts[0] in _parameters(fullshard.Trainer.__init__)
    elif kind == "trainer_method_arg":
        method = getattr(fullshard.Trainer, parts[0], None)
        ok = method is not None and parts[1] in _parameters(method)
    elif kind == "trainer_attr":
        ok = parts[0] in _trainer_attributes()
    elif kind == "log_arg":
        ok = parts[0] in _parameters(fullshard.LightningModule.log)
    elif kind == "module":
        ok = parts[0] in dir(fullshard.LightningModule)
    elif kind == "callback":
        ok = parts[0] in dir(importlib.import_module("fullshard.callbacks").Callback)
    elif kind == "datamodule":
        ok = parts[0] in dir(fullshard.LightningDataModule)
    elif kind in ("class_arg", "class_attr"):
        cls = getattr(importlib.import_module(f"fullshard.{parts[0]}"), parts[1], None)
        if cls is None:
            ok = False
        elif kind == "class_arg":
            ok = parts[2] in _parameters(cls.__init__)
        else:
            ok = parts[2] in dir(_instance_or_class(cls))
    elif kind == "seed_arg":
        ok = parts[0] in _parameters(fullshard.seed_everything)
    elif kind == "scheduler_key":
        ok = True  # a key of a returned dict: only behaviour can show it, tests/test_porting.py does
    else:
        ok = _resolve(ident) is not None
    return None if ok else f"fullshard has no {ident}"


def _exercised(ident: str) -> str | None:
    """None when a porting script exercises what ``ident`` names; otherwise why not."""
    use = _usage()
    kind, parts = _parse(ident)
    hooks = {**MODULE_HOOKS, **STEP_METHODS}
    if kind == "trainer_arg":
        ok = use.called("Trainer", parts[0])
    elif kind == "trainer_method_arg":
        value = ast.literal_eval(parts[2]) if parts[2] else None
        ok = use.called(parts[0], parts[1], value)
    elif kind == "trainer_attr":
        ok = parts[0] in use.attributes
    elif kind == "log_arg":
        ok = use.called(("log", "log_dict"), parts[0])
    elif kind == "module":
        ok = ("M", parts[0]) in use.recorded if parts[0] in hooks else parts[0] in use.attributes
    elif kind == "callback":
        ok = ("C", parts[0]) in use.recorded
    elif kind == "datamodule":
        ok = (
            ("D", parts[0]) in use.recorded
            if parts[0] in {**DATAMODULE_HOOKS, **STEP_METHODS}
            else parts[0] in use.attributes
        )
    elif kind == "class_arg":
        ok = use.called(parts[1], parts[2])
    elif kind == "class_attr":
        ok = parts[2] in use.attributes
    elif kind == "seed_arg":
        ok = use.called("seed_everything", parts[0])
    elif kind == "scheduler_key":
        ok = parts[0] in use.dict_keys
    else:
        last = parts[0].split(".")[-1]
        ok = last in use.imported or last in use.attributes
    return None if ok else f"no porting script exercises {ident}"


# ---------------------------------------------------------------------------------- tests
def test_every_row_has_a_known_status_and_a_name() -> None:
    assert len(ROWS) >= 60
    for feature, ids, status in ROWS:
        assert status.startswith(STATUSES), f"{feature}: status {status!r} is not one of {STATUSES}"
        assert ids or status.startswith("not supported:"), (
            f"{feature}: only 'not supported' rows may name nothing"
        )


def test_ported_rows_exist_in_fullshard_and_are_exercised_by_the_porting_scripts() -> None:
    problems = [
        f"{feature}: {why}"
        for feature, ident in _ids("ported")
        for why in (_exists(ident), _exercised(ident))
        if why
    ]
    assert not problems, "rows marked ported that are not:\n" + "\n".join(problems)


def test_differs_rows_exist_in_fullshard() -> None:
    problems = [f"{feature}: {why}" for feature, ident in _ids("differs:") if (why := _exists(ident))]
    assert not problems, "\n".join(problems)


def test_ported_hooks_are_compared_not_normalised_away() -> None:
    ported = {parts[0] for _, ident in _ids("ported") for kind, parts in [_parse(ident)] if kind == "module"}
    assert not ported & set(NOT_CALLED_BY_FULLSHARD), (
        "hooks marked ported but dropped by tests/porting/hooks.py"
    )


def _unsupported_module_names() -> set[str]:
    names = set()
    for feature, ident in _ids("not supported:"):
        kind, parts = _parse(ident)
        assert kind in ("module", "datamodule", "trainer_arg"), (
            f"{feature}: a 'not supported' row names a LightningModule/LightningDataModule member, a Trainer "
            f"argument, or —; got {ident}"
        )
        if kind == "module":
            names.add(parts[0])
    return names


def test_not_supported_rows_are_absent_from_fullshard() -> None:
    problems = []
    for feature, ident in _ids("not supported:"):
        kind, parts = _parse(ident)
        if kind == "module" and parts[0] in dir(fullshard.LightningModule):
            problems.append(
                f"{feature}: fullshard.LightningModule has {parts[0]}: mark the row ported (and drop it from NOT_CALLED_BY_FULLSHARD)"
            )
        if kind == "datamodule" and parts[0] in dir(fullshard.LightningDataModule):
            problems.append(f"{feature}: fullshard.LightningDataModule has {parts[0]}")
        if kind == "trainer_arg":
            if parts[0] in _parameters(fullshard.Trainer.__init__):
                problems.append(f"{feature}: Trainer takes {parts[0]}=")
            with pytest.raises(MisconfigurationError, match=parts[0]):
                fullshard.Trainer(
                    accelerator="cpu", devices=1, logger=False, **{parts[0]: ast.literal_eval(parts[1])}
                )
    assert not problems, "\n".join(problems)


def test_hooks_not_called_by_fullshard_are_the_tables_not_supported_hooks() -> None:
    unsupported = _unsupported_module_names() & set(MODULE_HOOKS)
    assert unsupported == set(NOT_CALLED_BY_FULLSHARD), (
        "tests/porting/hooks.py NOT_CALLED_BY_FULLSHARD and the 'not supported' hook rows of docs/lightning.md differ: "
        f"{sorted(unsupported ^ set(NOT_CALLED_BY_FULLSHARD))}"
    )


def test_every_lightning_hook_has_a_row() -> None:
    named = {ident for _, ids, _ in ROWS for ident in ids}
    missing = [
        f"LightningModule.{h}"
        for h in {**MODULE_HOOKS, **STEP_METHODS}
        if f"LightningModule.{h}" not in named
    ]
    missing += [f"Callback.{h}" for h in CALLBACK_HOOKS if f"Callback.{h}" not in named]
    missing += [
        f"LightningDataModule.{h}" for h in DATAMODULE_HOOKS if f"LightningDataModule.{h}" not in named
    ]
    assert not missing, f"hooks without a row in docs/lightning.md: {missing}"


def test_a_module_defining_an_unsupported_hook_is_warned(tmp_path: Path) -> None:
    """A Lightning hook silently not called is the worst gap; fullshard must say so (docs/design.md,
    "Where users' code meets fullshard")."""
    names = sorted(_unsupported_module_names())

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("fullshard must not call this hook")

    class Regressor(fullshard.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    Lightningish = type("Lightningish", (Regressor,), {name: hook for name in names})
    data = DataLoader(TensorDataset(torch.randn(4, 2), torch.randn(4, 1)), batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(tmp_path, max_steps=1).fit(Lightningish(), data)
    messages = " ".join(str(w.message) for w in caught)
    silent = [name for name in names if f"{name}(" not in messages and f".{name} " not in messages]
    assert not silent, f"fullshard does not warn about these hooks, which it does not call: {silent}"


def test_hook_order_block_is_the_recorded_order() -> None:
    text = DOC.read_text()
    block = text.split("<!-- hook-order:start -->\n```text\n", 1)[1].split("```\n<!-- hook-order:end -->", 1)[
        0
    ]
    assert block == documented_order(), (
        "the hook order in docs/lightning.md is not the recorded one; paste `python tests/porting/order.py` into it"
    )


# -------------------------------------------------------- Lightning's whole public surface
SURFACE_FIXTURE = Path(__file__).parent / "fixtures" / "lightning_2.6.6_surface.json"
SURFACE_SCRIPT = Path(__file__).parent / "scripts" / "lightning_surface.py"
SURFACE_STATUSES = ("ported", "differs:", "not supported:", "in progress:")
# Written by other engineers now (issue 30): until each exists, its row may say "in progress";
# the test reports them, and fails for one that exists but is not marked ported or differs.
IN_PROGRESS_ALLOWED = {
    *(
        f"callbacks.{name}"
        for name in (
            "BackboneFinetuning", "BaseFinetuning", "GradientAccumulationScheduler", "StochasticWeightAveraging",
            "WeightAveraging", "EMAWeightAveraging", "ModelSummary", "RichModelSummary", "RichProgressBar",
            "ThroughputMonitor", "OnExceptionCheckpoint", "LearningRateFinder", "BatchSizeFinder",
            "DeviceStatsMonitor", "SpikeDetection", "LambdaCallback", "ModelPruning",
        )
    ),
    "loggers.WandbLogger", "loggers.MLFlowLogger", "loggers.CometLogger",
    "Tuner.lr_find", "Tuner.scale_batch_size", "Trainer.progress_bar_callback",
}  # fmt: skip
_SURFACE_FORMS = (
    ("top", r"L\.(\w+)"),
    ("package", r"(callbacks|loggers|profilers|utilities)\.(\w+)"),
    ("tuner", r"Tuner\.(\w+)"),
    ("argument", r"(\w+)\((\w+)=\)"),
    ("member", r"(\w+)\.(\w+)"),
)
_STRATEGY_NAMES = ("SingleDeviceStrategy", "DDPStrategy", "FSDPStrategy", "ModelParallelStrategy")


def _surface_rows() -> list[tuple[list[str], str]]:
    """(Lightning names, status) of each row of the "Lightning's public surface" table."""
    section = DOC.read_text().split("## Lightning's public surface", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| Lightning |", "| ---")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 2, f"a row of docs/lightning.md's surface table does not have 2 cells: {line}"
        rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1]))
    return rows


def _keys_of_what_ports_table() -> dict[str, str]:
    """The surface names the "What ports" table accounts for, with the row's status."""
    accounted = {}
    for _, ids, status in ROWS:
        for ident in ids:
            key = _surface_key(ident)
            if key is not None:
                accounted.setdefault(key, status)
    return accounted


def _surface_key(ident: str) -> str | None:
    """The surface name a "What ports" identifier names (None for forms the surface has not)."""
    kind, parts = _parse(ident)
    if kind in ("trainer_arg",):
        return f"Trainer({parts[0]}=)"
    if kind in ("trainer_method_arg",):
        return f"Trainer.{parts[0]}"
    if kind == "trainer_attr":
        return f"Trainer.{parts[0]}"
    if kind == "log_arg":
        return "LightningModule.log"
    if kind in ("module", "callback", "datamodule"):
        cls = {"module": "LightningModule", "callback": "Callback", "datamodule": "LightningDataModule"}[kind]
        return f"{cls}.{parts[0]}"
    if kind in ("class_arg", "class_attr"):
        return f"{parts[0]}.{parts[1]}"
    if kind == "seed_arg":
        return "L.seed_everything"
    if kind == "import":
        dotted = parts[0].split(".")
        if len(dotted) == 2:
            return f"L.{dotted[1]}"
        if len(dotted) == 3 and dotted[1] in ("callbacks", "loggers", "profilers", "utilities"):
            return f"{dotted[1]}.{dotted[2]}"
    return None


def _fullshard_has(key: str) -> bool:
    """Whether fullshard has what the Lightning surface name ``key`` maps to: ``L.x`` ->
    ``fullshard.x``; ``callbacks.X`` -> ``fullshard.callbacks.X`` (and loggers, profilers,
    utilities); ``Tuner.x`` -> ``fullshard.tuner.Tuner.x``; ``C(a=)`` -> a named parameter of
    fullshard's ``C.__init__``; ``C.x`` -> a member of fullshard's ``C`` (a Trainer instance's for
    the Trainer); ``Strategy.x`` -> a member of each of fullshard's four strategies."""
    kind, groups = _surface_form(key)
    if kind == "top":
        return _resolve(f"fullshard.{groups[0]}") is not None
    if kind == "package":
        return _resolve(f"fullshard.{groups[0]}.{groups[1]}") is not None
    if kind == "tuner":
        return _resolve(f"fullshard.tuner.Tuner.{groups[0]}") is not None
    classes = _surface_classes(groups[0])
    if kind == "argument":
        return all(groups[1] in _parameters(cls.__init__) for cls in classes)
    if groups[0] == "Trainer":
        return groups[1] in _trainer_attributes()
    return all(groups[1] in dir(_instance_or_class(cls)) for cls in classes)  # instance attributes too


def _surface_form(key: str) -> tuple[str, tuple[str, ...]]:
    for kind, pattern in _SURFACE_FORMS:
        match = re.fullmatch(pattern, key)
        if match:
            return kind, match.groups()
    raise AssertionError(f"{key!r} is in none of the surface forms (tests/scripts/lightning_surface.py)")


def _surface_classes(name: str) -> list[type]:
    strategies = importlib.import_module("fullshard.strategies")
    if name == "Strategy":
        return [getattr(strategies, s) for s in _STRATEGY_NAMES]
    if name in _STRATEGY_NAMES:
        return [getattr(strategies, name)]
    return [{"Callback": fullshard.Callback}.get(name) or getattr(fullshard, name)]


def _surface_accounting() -> dict[str, str]:
    """Every surface name docs/lightning.md accounts for, with its status (the surface table's
    rows first, then the "What ports" table's)."""
    accounted: dict[str, str] = {}
    for keys, status in _surface_rows():
        for key in keys:
            assert key not in accounted, f"docs/lightning.md: {key} has two rows in the surface table"
            accounted[key] = status
    for key, status in _keys_of_what_ports_table().items():
        accounted.setdefault(key, status)
    return accounted


def test_the_recorded_surface_is_lightnings() -> None:
    """tests/fixtures/lightning_2.6.6_surface.json is what Lightning 2.6.6 has (read in its own
    environment); rerun the script to record it again."""
    from lckpt_models import lightning_python

    python = lightning_python()
    result = subprocess.run([python, str(SURFACE_SCRIPT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(SURFACE_FIXTURE.read_text()), (
        f"Lightning's surface changed: {python} {SURFACE_SCRIPT} > {SURFACE_FIXTURE}"
    )


def test_every_name_of_lightnings_surface_is_accounted_for() -> None:
    surface = json.loads(SURFACE_FIXTURE.read_text())
    accounted = _surface_accounting()
    missing = [key for key in surface if key not in accounted]
    assert not missing, (
        f"{len(missing)} names of Lightning's public surface have no row in docs/lightning.md "
        f'("Lightning\'s public surface"): {missing}'
    )
    stale = [key for keys, _ in _surface_rows() for key in keys if key not in surface]
    assert not stale, f"rows of the surface table name what Lightning 2.6.6 does not have: {stale}"
    problems = []
    for key in surface:
        status = accounted[key]
        if not status.startswith(SURFACE_STATUSES):
            problems.append(f"{key}: status {status!r} is not one of {SURFACE_STATUSES}")
        elif status.startswith(("ported", "differs:")) and not _fullshard_has(key):
            problems.append(f"{key} is marked {status.split(':')[0]}, but fullshard has no such name there")
        elif status.startswith("not supported:") and _fullshard_has(key):
            problems.append(f"{key} is marked not supported, but fullshard has it: say what it does")
        elif status.startswith("in progress:"):
            if key not in IN_PROGRESS_ALLOWED:
                problems.append(f"{key}: only the names being written now may be 'in progress'")
            elif _fullshard_has(key):
                problems.append(f"{key} exists now: mark it ported (or differs)")
    assert not problems, "\n".join(problems)
    counts = {s.rstrip(":"): sum(accounted[k].startswith(s) for k in surface) for s in SURFACE_STATUSES}
    in_progress = sorted(k for k in surface if accounted[k].startswith("in progress:"))
    print(f"Lightning 2.6.6's surface, {len(surface)} names: {counts}; in progress: {in_progress}")

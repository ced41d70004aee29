"""Recording for the porting scripts: hooks called (in order, per rank), metrics at fixed points,
named values and the scripts' own checks, written as JSON per rank.

A script puts the mixins first among its bases, so the rest of the class reads as a user wrote it::

    class Model(RecordModuleHooks, L.LightningModule): ...
    class Recorder(RecordCallbackHooks, Callback): ...
    class Data(RecordDataModuleHooks, L.LightningDataModule): ...

Each mixin defines every hook of its kind (``hooks.py``) to record the call and then run the
framework's own hook; hooks and step methods that the script itself defines are wrapped when the
class is created, so they are recorded even when they do not call ``super()``. ``run(main)``
parses ``--strategy`` and ``--out DIR``, runs ``main`` and writes ``DIR/rank<N>.json`` (also when
``main`` raises: the record then ends with the error).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hooks import (
    CALLBACK_HOOKS,
    CALLBACK_NO_TRAINER,
    DATAMODULE_HOOKS,
    MODULE_HOOKS,
    NOT_CALLED_BY_FULLSHARD,
    STEP_METHODS,
)

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
_BATCH_START = {
    "on_train_batch_start",
    "on_validation_batch_start",
    "on_test_batch_start",
    "on_predict_batch_start",
}


class _Record:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.states: list[str] = []
        self.metrics: list[dict[str, Any]] = []
        self.values: dict[str, Any] = {}
        self.checks: list[list[Any]] = []
        self.error: str | None = None
        self.rank: int | None = None


RECORD = _Record()
_ACTIVE: list[str] = []  # hooks being run by a wrapped override (their super() call is not recorded again)


# ------------------------------------------------------------------------------ conversions
def plain(value: Any) -> Any:
    """``value`` as JSON data: tensors become floats (or lists), mappings dicts, etc."""
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return float(value) if value.numel() == 1 else value.tolist()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return f"<{type(value).__name__}>"


# How a batch is told apart in the events (``x0=``): by the first number of its first tensor (the
# porting scripts' recordings), or, with "sum", by that tensor's sum, which also tells apart two
# batches that share only their first sample (the differential harness, tests/differential/run.py)
FINGERPRINT = "first"


def _fingerprint(batch: Any) -> float | None:
    """The first number (or with FINGERPRINT "sum", the sum) of the first tensor of a batch:
    tells which samples a rank got."""
    import torch

    if isinstance(batch, torch.Tensor):
        if not batch.numel():
            return None
        return round(float(batch.double().sum() if FINGERPRINT == "sum" else batch.flatten()[0]), 4)
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            found = _fingerprint(item)
            if found is not None:
                return found
    return None


def _outputs(outputs: Any) -> str:
    if isinstance(outputs, Mapping):
        return "dict[" + ",".join(sorted(map(str, outputs))) + "]"
    return "None" if outputs is None else type(outputs).__name__


def _summary(hook: str, bound: dict[str, Any]) -> dict[str, Any]:
    """The arguments worth comparing: stage, batch index, which samples, what a step returned."""
    out: dict[str, Any] = {}
    if "stage" in bound:
        stage = bound["stage"]
        out["stage"] = str(getattr(stage, "value", stage))  # Lightning passes a str enum (TrainerFn)
    if "batch_idx" in bound:
        out["batch_idx"] = int(bound["batch_idx"])
    if hook in _BATCH_START and "batch" in bound:
        out["x0"] = _fingerprint(bound["batch"])
    if hook.endswith("_batch_end") and "outputs" in bound:
        out["outputs"] = _outputs(bound["outputs"])
    if hook == "load_state_dict" and "state_dict" in bound:
        out["state"] = json.dumps(plain(bound["state_dict"]), sort_keys=True)
    if hook == "on_exception" and "exception" in bound:
        out["exception"] = type(bound["exception"]).__name__
    if hook == "lr_scheduler_step" and "metric" in bound:
        out["metric"] = "None" if bound["metric"] is None else "given"
    if hook == "configure_gradient_clipping":
        out["clip"] = bound.get("gradient_clip_val")
    return out


def _state(trainer: Any) -> str:
    try:
        return f"e{int(trainer.current_epoch)} s{int(trainer.global_step)}"
    except Exception:
        return "-"


def _record_call(
    who: str, hook: str, trainer: Any, params: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    bound = dict(zip(params, args, strict=False))
    bound.update(kwargs)
    summary = _summary(hook, bound)
    text = f"{who} {hook}"
    if summary:
        text += "(" + ", ".join(f"{k}={v}" for k, v in summary.items()) + ")"
    RECORD.events.append(text)
    RECORD.states.append(_state(trainer) if trainer is not None else "-")
    if trainer is not None and RECORD.rank is None:
        with contextlib.suppress(Exception):
            RECORD.rank = int(trainer.global_rank)


# --------------------------------------------------------------------------------- mixins
def _callback_trainer(args: tuple[Any, ...]) -> Any:
    return args[0] if args else None


def _fallback(hook: str, args: tuple[Any, ...]) -> Any:
    if hook in ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"):
        return args[0]
    if hook in ("configure_callbacks",):
        return []
    if hook == "state_dict":
        return {}
    return None


def _install_defaults(
    mixin: type, who: str, hooks: dict[str, tuple[str, ...]], with_trainer_args: bool
) -> None:
    for name, params in hooks.items():
        if FRAMEWORK == "fullshard" and who == "M" and name in NOT_CALLED_BY_FULLSHARD:
            continue  # see [Note: hooks fullshard does not call] in hooks.py

        def default(
            self: Any, *args: Any, __name: str = name, __params: tuple[str, ...] = params, **kwargs: Any
        ) -> Any:
            takes_trainer = with_trainer_args and __name not in CALLBACK_NO_TRAINER
            if not (_ACTIVE and _ACTIVE[-1] == __name):
                trainer = _callback_trainer(args) if takes_trainer else _owner_trainer(self)
                _record_call(who, __name, trainer, __params, args[2:] if takes_trainer else args, kwargs)
            parent = getattr(super(mixin, self), __name, None)
            if parent is None:
                return _fallback(__name, args)
            return parent(*args, **kwargs)

        default.__name__ = default.__qualname__ = name
        setattr(mixin, name, default)


def _owner_trainer(obj: Any) -> Any:
    """The Trainer attached to a module or datamodule, without tripping a property that raises."""
    found = vars(obj).get("_trainer")
    if found is None:
        found = vars(obj).get("trainer")
    return found


def _wrap_defined(cls: type, who: str, hooks: dict[str, tuple[str, ...]], with_trainer_args: bool) -> None:
    for name, params in hooks.items():
        fn = cls.__dict__.get(name)
        if not callable(fn) or getattr(fn, "_recorded", False):
            continue

        @functools.wraps(fn)
        def wrapper(
            self: Any,
            *args: Any,
            __fn: Any = fn,
            __name: str = name,
            __params: tuple[str, ...] = params,
            **kwargs: Any,
        ) -> Any:
            takes_trainer = with_trainer_args and __name not in CALLBACK_NO_TRAINER
            trainer = _callback_trainer(args) if takes_trainer else _owner_trainer(self)
            _record_call(who, __name, trainer, __params, args[2:] if takes_trainer else args, kwargs)
            _ACTIVE.append(__name)
            try:
                return __fn(self, *args, **kwargs)
            finally:
                _ACTIVE.pop()

        wrapper._recorded = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)


class RecordModuleHooks:
    """First base of a LightningModule: records every module hook and the step methods ("M")."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _wrap_defined(cls, "M", {**MODULE_HOOKS, **STEP_METHODS}, with_trainer_args=False)


class RecordCallbackHooks:
    """First base of a Callback: records every callback hook ("C")."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _wrap_defined(cls, "C", CALLBACK_HOOKS, with_trainer_args=True)


class RecordDataModuleHooks:
    """First base of a LightningDataModule: records its hooks and dataloader methods ("D")."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataloaders = {k: v for k, v in STEP_METHODS.items() if k.endswith("_dataloader")}
        _wrap_defined(cls, "D", {**DATAMODULE_HOOKS, **dataloaders}, with_trainer_args=False)


_install_defaults(RecordModuleHooks, "M", MODULE_HOOKS, with_trainer_args=False)
_install_defaults(RecordCallbackHooks, "C", CALLBACK_HOOKS, with_trainer_args=True)
_install_defaults(RecordDataModuleHooks, "D", DATAMODULE_HOOKS, with_trainer_args=False)


# ------------------------------------------------------------------------- script helpers
def mark(text: str) -> None:
    """A marker in the event list (``S fit``, ``S test``...), so a diff shows which call it is in."""
    RECORD.events.append(f"S {text}")
    RECORD.states.append("-")


def _read(trainer: Any, name: str) -> Any:
    try:
        return plain(dict(getattr(trainer, name)))
    except Exception as error:  # a missing attribute is recorded, not fatal: the run goes on
        return f"<{type(error).__name__}: {error}>"


def snapshot(point: str, trainer: Any) -> None:
    """Record ``callback_metrics``, ``logged_metrics`` and ``progress_bar_metrics`` at ``point``."""
    RECORD.metrics.append(
        {
            "point": f"{point} {_state(trainer)}",
            "callback_metrics": _read(trainer, "callback_metrics"),
            "logged_metrics": _read(trainer, "logged_metrics"),
            "progress_bar_metrics": _read(trainer, "progress_bar_metrics"),
        }
    )


def value(name: str, data: Any) -> None:
    """Record a named value (compared with Lightning's; floats within a tolerance)."""
    RECORD.values[name] = plain(data)


def check(name: str, ok: bool, detail: Any = "") -> bool:
    """A check the script makes, like a user's assert, recorded instead of raised."""
    RECORD.checks.append([name, bool(ok), str(detail)])
    return bool(ok)


def close(a: Any, b: Any, tol: float = 1e-5) -> bool:
    """``a`` and ``b`` (numbers or tensors) agree within ``tol`` (absolute and relative)."""
    import torch

    a_t, b_t = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return a_t.shape == b_t.shape and bool(torch.allclose(a_t, b_t, rtol=tol, atol=tol))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--out", required=True, type=Path)
    return parser.parse_args()


def run(main: Callable[[argparse.Namespace], Any]) -> None:
    """Run ``main(args)`` and write this rank's record, whatever happens."""
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        main(args)
    except BaseException:
        RECORD.error = traceback.format_exc()
        raise
    finally:
        _write(args.out)


def _write(out: Path) -> None:
    rank = RECORD.rank
    if rank is None:
        rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    data = {
        "rank": rank,
        "events": RECORD.events,
        "states": RECORD.states,
        "metrics": RECORD.metrics,
        "values": RECORD.values,
        "checks": RECORD.checks,
        "error": RECORD.error,
    }
    path = out / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)

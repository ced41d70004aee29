"""The twin-script side of the Lightning comparison tests (tests/compare.py runs them).

A twin script (``tests/twins/<topic>.py``) holds cases: functions named ``case_<name>(tmp)``
that build a Trainer, run something and return what they observed as JSON-able data. The same
script runs under Lightning 2.6.6 and under fullshard; it reaches the framework only through
:func:`imp`, so both runs execute the same code::

    L = imp()                                   # lightning.pytorch / fullshard
    TQDMProgressBar = imp("callbacks").TQDMProgressBar

Run one by hand::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/progress_loggers.py --out /tmp/l.json
    TWIN_FRAMEWORK=fullshard python tests/twins/progress_loggers.py --out /tmp/f.json --only case_x

A case that raises records ``{"raised": <type name>, "stage": <case's own note>}`` (see
:func:`raised`); every case runs in a fresh temporary directory that is also the working directory.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

FRAMEWORK = os.environ.get("TWIN_FRAMEWORK", "fullshard")
if FRAMEWORK not in ("lightning", "fullshard"):
    raise SystemExit(f"TWIN_FRAMEWORK={FRAMEWORK!r}: use 'lightning' or 'fullshard'")
PREFIX = "lightning.pytorch" if FRAMEWORK == "lightning" else "fullshard"


def imp(path: str = "") -> ModuleType:
    """The framework's module at ``path`` (``"callbacks"`` -> ``lightning.pytorch.callbacks`` or
    ``fullshard.callbacks``); ``""`` is the package itself."""
    return importlib.import_module(PREFIX + ("." + path if path else ""))


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: tensors as floats or lists, floats rounded to 6 significant digits,
    paths as strings, everything else by ``repr``."""
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return jsonable(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return repr(value)


@contextmanager
def caught_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning raised inside, recorded (none is filtered out as already shown)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


def warned(seen: list[warnings.WarningMessage], *needles: str) -> list[bool]:
    """For each needle, whether one of the warnings' messages contains it (case-insensitive)."""
    texts = [str(w.message).lower() for w in seen]
    return [any(n.lower() in t for t in texts) for n in needles]


def raised(fn: Callable[[], Any]) -> dict[str, Any]:
    """Call ``fn``; what it raised as ``{"raised": type name}`` (``None`` if nothing), and its
    return value under ``"returned"`` when it returned."""
    try:
        out = fn()
    except BaseException as err:  # SystemExit and KeyboardInterrupt are observations too
        return {"raised": type(err).__name__}
    return {"raised": None, "returned": jsonable(out)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    module = sys.modules["__main__"]
    cases = {n: f for n, f in vars(module).items() if n.startswith("case_") and callable(f)}
    results: dict[str, Any] = {}
    start = os.getcwd()
    for name, fn in cases.items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            try:
                results[name] = jsonable(fn(Path(tmp)))
            except BaseException as err:  # a case's failure is its result
                results[name] = {"case failed": type(err).__name__, "error": str(err)[:500]}
                traceback.print_exc()
            finally:
                os.chdir(start)
    Path(args.out).write_text(json.dumps(results, indent=1, sort_keys=True))

"""Twin script: Trainer arguments Lightning 2.6.6 refuses when the Trainer is built, refused by
fullshard at the same point, with an exception the same ``except`` clause catches and a message
that names the same things, and nothing written to disk (issue 37). Run by
tests/test_bad_arguments.py under both frameworks::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/bad_arguments.py --out /tmp/l.json

Each input is caught as a Lightning user would catch it: ``except TypeError``, ``except
ValueError`` or ``except MisconfigurationException`` (fullshard's ``MisconfigurationError`` and
``MisconfigurationTypeError``), whichever Lightning's error is. Where Lightning's error is an
accident of its code (``'<=' not supported between instances of 'int' and 'str'``) only the type is
compared; fullshard's message says what to pass. The inputs Lightning accepts and fullshard
refuses (``min_epochs`` above ``max_epochs``, a string for a bool option, a file as
``default_root_dir``) are fullshard's own, tested in tests/test_errors.py.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from twin import imp, main

L = imp()
warnings.filterwarnings("ignore")


def refused(catch: str, words: tuple[str, ...], **kwargs: Any) -> dict[str, Any]:
    """``Trainer(**kwargs)``: whether ``except <catch>`` catches what it raises, which of
    ``words`` its message holds (case-insensitive), and what the working directory holds after."""
    try:
        L.Trainer(**kwargs)
    except Exception as err:  # which clause catches it is the observation
        caught = {
            "TypeError": isinstance(err, TypeError),
            "ValueError": isinstance(err, ValueError),
            "Misconfiguration": type(err).__name__.startswith("Misconfiguration"),
        }[catch]
        text = str(err).lower()
        return {"caught": caught, "words": {w: w.lower() in text for w in words}, "written": os.listdir(".")}
    return {"caught": None, "written": os.listdir(".")}


def case_devices_on_cpu(tmp: Path) -> dict[str, Any]:
    """A list of indices (repeated, negative, empty, as a string), 0, a negative count or a float:
    on CPU ``devices`` is a count of processes."""
    out = {
        repr(given): refused("TypeError", ("devices", "int > 0"), accelerator="cpu", devices=given)
        for given in ([0, 0], [0, 1], [-1], (0,), "0,1", "1,", -2, 1.5)
    }
    for given in ([], 0):
        out[repr(given)] = refused(
            "Misconfiguration", (f"devices={given!r}",), accelerator="cpu", devices=given
        )
    return out


def case_epoch_and_step_limits(tmp: Path) -> dict[str, Any]:
    return {
        "max_epochs=-2": refused("Misconfiguration", ("max_epochs", "-2", "-1"), max_epochs=-2),
        "max_steps=-2": refused("Misconfiguration", ("max_steps", "-2", "-1"), max_steps=-2),
    }


def case_validation_schedule(tmp: Path) -> dict[str, Any]:
    out = {
        f"val_check_interval={v!r}": refused(
            "Misconfiguration", ("val_check_interval", repr(v)), val_check_interval=v
        )
        for v in (-0.5, 1.5)
    }
    out["check_val_every_n_epoch=1.5"] = refused(
        "Misconfiguration", ("check_val_every_n_epoch", "1.5"), check_val_every_n_epoch=1.5
    )
    return out


def case_batch_limits(tmp: Path) -> dict[str, Any]:
    out = {
        f"{name}={v!r}": refused("Misconfiguration", (name, repr(v)), **{name: v})
        for name in (
            "limit_train_batches",
            "limit_val_batches",
            "limit_test_batches",
            "limit_predict_batches",
        )
        for v in (-1, 1.5)
    }
    out["limit_train_batches='1'"] = refused("TypeError", (), limit_train_batches="1")
    out["overfit_batches=-1"] = refused("Misconfiguration", ("overfit_batches", "-1"), overfit_batches=-1)
    out["overfit_batches='1'"] = refused("TypeError", (), overfit_batches="1")
    return out


def case_gradient_clipping(tmp: Path) -> dict[str, Any]:
    return {
        "gradient_clip_val='1'": refused("TypeError", ("gradient_clip_val",), gradient_clip_val="1"),
        "gradient_clip_algorithm='l2'": refused(
            "Misconfiguration",
            ("gradient_clip_algorithm", "l2", "norm", "value"),
            gradient_clip_algorithm="l2",
        ),
        "gradient_clip_algorithm=''": refused(
            "Misconfiguration", ("gradient_clip_algorithm", "norm", "value"), gradient_clip_algorithm=""
        ),
    }


def case_fast_dev_run(tmp: Path) -> dict[str, Any]:
    return {
        "-1": refused("Misconfiguration", ("fast_dev_run", "-1"), fast_dev_run=-1),
        "'no'": refused("ValueError", (), fast_dev_run="no"),
    }


def case_reload_dataloaders(tmp: Path) -> dict[str, Any]:
    name = "reload_dataloaders_every_n_epochs"
    return {repr(v): refused("Misconfiguration", (name,), **{name: v}) for v in (-1, "1")}


def case_nodes_and_precision(tmp: Path) -> dict[str, Any]:
    return {
        "num_nodes=0": refused("ValueError", ("num_nodes",), num_nodes=0),
        "num_nodes='2'": refused("ValueError", ("num_nodes",), num_nodes="2"),
        "precision='fp16'": refused("ValueError", ("fp16",), precision="fp16"),
    }


def case_time_and_profiler(tmp: Path) -> dict[str, Any]:
    return {
        "max_time": refused("Misconfiguration", ("xx", "DD:HH:MM:SS"), max_time="xx"),
        "profiler": refused("Misconfiguration", ("profiler", "simple", "advanced", "pytorch"), profiler="xx"),
    }


def case_plugins_of_another_type(tmp: Path) -> dict[str, Any]:
    return {
        repr(type(given).__name__) + str(i): refused("Misconfiguration", ("plugin",), plugins=given)
        for i, given in enumerate((object(), [object()], "x"))
    }


def case_callbacks_not_a_list(tmp: Path) -> dict[str, Any]:
    return {"object()": refused("TypeError", ("object",), callbacks=object())}


def case_default_root_dir_not_a_path(tmp: Path) -> dict[str, Any]:
    return {"3": refused("TypeError", ("int",), default_root_dir=3)}


if __name__ == "__main__":
    main()

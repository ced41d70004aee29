"""Every bad input gives a specific exception whose message says what was given and how to fix it."""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import fullshard
from conftest import SCRIPTS, quiet_trainer
from fullshard.checkpoint.validate import StateDictMismatchError
from fullshard.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MisconfigurationError,
    MisconfigurationTypeError,
)
from fullshard.precision import parse_precision
from fullshard.strategies import DDPStrategy

sys.path.insert(0, str(SCRIPTS))
from train_mlp import MLP, make_data


def _trainer(tmp_path: Path, **kwargs: Any) -> fullshard.Trainer:
    return quiet_trainer(tmp_path, **kwargs)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "fp16"}, r"Precision 'fp16' is not supported\. Valid values: '32-true', '16-mixed'"),
        (
            {"precision": 64},
            r"Precision 64 is not supported\. fullshard does not train in float64 \(Lightning's '64-true'\)\. "
            r"Valid values: .*'bf16-true', and Lightning's aliases 32 / '32' for '32-true', 16 / '16' for "
            r"'16-mixed', 'bf16' for 'bf16-mixed'",
        ),
        ({"precision": "64"}, r"Precision '64' is not supported\. fullshard does not train in float64"),
        ({"precision": "bf16-mix"}, r"Precision 'bf16-mix' is not supported\. Did you mean 'bf16-mixed'\?"),
        ({"precision": True}, r"Precision True is not supported\. Valid values"),
        ({"accelerator": "tpu"}, r"accelerator='tpu' is not supported\. Use one of 'auto', 'cpu', 'cuda'"),
        (
            {"accelerator": "cpy"},
            r"accelerator='cpy' is not supported\. Did you mean 'cpu'\? Use one of 'auto'",
        ),
        ({"devices": 0}, r"devices=0 is invalid; use 'auto', an int > 0"),
        ({"devices": "two"}, r"devices='two' is not understood"),
        ({"devices": -1}, r"devices=-1 means 'all GPUs' and needs accelerator='cuda'"),
        (
            {"devices": 2, "strategy": "single_device"},
            r"strategy='single_device' runs one process, but 2 devices",
        ),
        ({"strategy": 3}, r"strategy must be a name or a fullshard\.strategies\.Strategy instance, got int"),
        ({"num_nodes": 0}, r"num_nodes=0 is invalid: use an int >= 1"),
        ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches=0 is invalid"),
        ({"max_steps": -5}, r"max_steps=-5 is invalid: use -1 \(no limit\)"),
        ({"max_epochs": 1.5}, r"max_epochs=1\.5 is invalid"),
        (
            {"limit_train_batches": 1.5},
            r"limit_train_batches=1\.5 is a float above 1\.0.*limit_train_batches=1",
        ),
        ({"limit_val_batches": -1}, r"limit_val_batches=-1 is invalid"),
        ({"val_check_interval": 2.5}, r"val_check_interval=2\.5 is a float above 1\.0"),
        ({"val_check_interval": 0}, r"val_check_interval=0 is invalid"),
        ({"gradient_clip_val": -1.0}, r"gradient_clip_val=-1\.0 is invalid"),
        (
            {"gradient_clip_algorithm": "l2"},
            r"gradient_clip_algorithm='l2' is invalid: use 'norm' or 'value'",
        ),
        ({"callbacks": [object()]}, r"callbacks must be fullshard Callback instances, got object"),
        ({"logger": [object()]}, r"logger must be a fullshard Logger .* got object"),
    ],
)
def test_bad_trainer_arguments(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        _trainer(tmp_path, **kwargs)


def test_cuda_requested_without_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(
        MisconfigurationError, match=r"accelerator='cuda' was requested but torch sees no CUDA device"
    ):
        _trainer(tmp_path, accelerator="cuda")


def test_bad_strategy_arguments() -> None:
    with pytest.raises(
        MisconfigurationError, match=r"process_group_backend='glue' is not a torch\.distributed backend"
    ):
        DDPStrategy(process_group_backend="glue")
    with pytest.raises(
        MisconfigurationError,
        match=r"start_method='threads' is not supported. Use one of 'popen', 'spawn', 'fork'",
    ):
        DDPStrategy(start_method="threads")
    with pytest.raises(MisconfigurationError, match=r"timeout must be a datetime\.timedelta, got int"):
        DDPStrategy(timeout=30)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "canonical"),
    [(32, "32-true"), ("32", "32-true"), (16, "16-mixed"), ("16", "16-mixed"), ("bf16", "bf16-mixed")],
)
def test_lightning_precision_aliases(tmp_path: Path, given: Any, canonical: str) -> None:
    """Lightning 2.x's aliases (its _PRECISION_INPUT) mean the setting it maps them to; like Lightning,
    the ones that hide "mixed" (16, "16", "bf16") warn."""
    assert parse_precision(given) == canonical and parse_precision(canonical) == canonical
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(tmp_path, precision=given)
    assert trainer.precision == canonical and trainer.strategy.precision.precision == canonical
    notes = [str(w.message) for w in caught if "alias" in str(w.message)]
    if given in (32, "32"):
        assert notes == []
    else:
        assert notes == [
            f"precision={given!r} is an alias kept for Lightning's older spelling; it means "
            f"precision={canonical!r} (float32 weights, half-precision autocast). Pass {canonical!r} to say "
            "so and silence this warning."
        ]


def test_fit_with_wrong_model_or_data(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=1)
    with pytest.raises(MisconfigurationError, match=r"Trainer expects a fullshard\.Module, got Linear"):
        trainer.fit(torch.nn.Linear(2, 2), DataLoader(make_data()))  # type: ignore[arg-type]
    with pytest.raises(
        MisconfigurationError,
        match=r"train_dataloaders must be a torch\.utils\.data\.DataLoader, a CombinedLoader, or a dict, list "
        r"or tuple of dataloaders; got list\. Wrap your dataset",
    ):
        trainer.fit(MLP(), [1, 2, 3])


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        ("adam", r"configure_optimizers\(\) returned str holding str; return an optimizer"),
        ([], r"configure_optimizers\(\) returned an empty list"),
        ("bad_interval", r"lr_scheduler 'interval' is 'batch'; use 'step'"),
        ("bad_config", r"An lr_scheduler config must be a dict with a 'scheduler'"),
        ("bad_frequency", r"lr_scheduler 'frequency' must be an int >= 1, got 0"),
    ],
)
def test_bad_configure_optimizers(tmp_path: Path, returned: Any, match: str) -> None:
    class Bad(MLP):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.StepLR(opt, 1)
            return (
                {
                    "bad_interval": {
                        "optimizer": opt,
                        "lr_scheduler": {"scheduler": sched, "interval": "batch"},
                    },
                    "bad_config": {"optimizer": opt, "lr_scheduler": {"sched": sched}},
                    "bad_frequency": {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "frequency": 0}},
                }.get(returned, returned)
                if isinstance(returned, str)
                else returned
            )

    with pytest.raises(MisconfigurationError, match=match):
        _trainer(tmp_path, max_steps=1).fit(Bad(), DataLoader(make_data()))


def test_missing_hooks_and_bad_step_output(tmp_path: Path) -> None:
    class NoStep(fullshard.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    # found before any process starts (a multi-process fit would start none)
    with pytest.raises(
        MisconfigurationError, match=r"Trainer.fit\(\) needs NoStep.training_step\(batch, batch_idx\)"
    ):
        _trainer(tmp_path, max_steps=1).fit(NoStep(), DataLoader(make_data()))

    class BadOutput(MLP):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return 1.0

    with pytest.raises(MisconfigurationError, match=r"training_step returned float; return the loss tensor"):
        _trainer(tmp_path, max_steps=1).fit(BadOutput(), DataLoader(make_data()))

    with pytest.raises(RuntimeError, match=r"MLP is not attached to a Trainer"):
        _ = MLP().trainer


def test_bad_log_calls(tmp_path: Path) -> None:
    class BadLog(MLP):
        def __init__(self, value: Any, **kwargs: Any) -> None:
            super().__init__()
            self.value, self.kwargs = value, kwargs

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("bad", self.value, **self.kwargs)
            return super().training_step(batch, batch_idx)

    cases = [
        (BadLog(torch.ones(3)), ValueError, r"log\('bad'\) got a tensor of shape \(3,\); only scalars"),
        (BadLog("x"), TypeError, r"log\('bad'\) got a str; log a number"),
        (
            BadLog(1.0, reduce_fx="median"),
            MisconfigurationError,
            r"reduce_fx='median'\): reduce_fx must be min, max, mean or sum \(a name, or torch.min, torch.max, "
            r"torch.mean, torch.sum\). For another reduction, log a torchmetrics.Metric",
        ),
        (
            BadLog(1.0, reduce_fx=torch.median),
            MisconfigurationError,
            r"reduce_fx=<built-in method median.*: reduce_fx must be min, max, mean or sum",
        ),
        (
            BadLog(1.0, on_step=False),
            MisconfigurationError,
            r"on_step=False and on_epoch=False records nothing \(here on_epoch defaults to False, as in "
            r"Lightning\): set on_step=True or on_epoch=True",
        ),
        (
            BadLog(1.0, on_step=False, on_epoch=False),
            ValueError,
            r"on_step=False and on_epoch=False records nothing",
        ),
    ]
    for model, error, match in cases:
        with pytest.raises(error, match=match):
            _trainer(tmp_path, max_steps=1).fit(model, DataLoader(make_data()))


def test_model_checkpoint_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError, match=r"ModelCheckpoint\(mode='best'\) is invalid: use 'min' or 'max'"
    ):
        fullshard.ModelCheckpoint(mode="best")
    with pytest.raises(MisconfigurationError, match=r"ModelCheckpoint\(save_top_k=-2\) is invalid"):
        fullshard.ModelCheckpoint(save_top_k=-2)
    with pytest.raises(MisconfigurationError, match=r"ModelCheckpoint\(every_n_epochs=-1\) is invalid"):
        fullshard.ModelCheckpoint(every_n_epochs=-1)
    # A monitor that is not logged yet is waited for, as in Lightning; the errors for a monitor
    # still missing after validation ran, and for bad filename templates, are in test_callbacks.py.


def _saved_checkpoint(tmp_path: Path, model: MLP | None = None) -> Path:
    trainer = _trainer(tmp_path, max_steps=2)
    trainer.fit(model or MLP(), DataLoader(make_data(), batch_size=16))
    path = tmp_path / "good.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_missing_and_damaged_checkpoints(tmp_path: Path) -> None:
    loader = DataLoader(make_data(), batch_size=16)
    with pytest.raises(
        CheckpointNotFoundError, match=r"No checkpoint at '.*nope\.ckpt': the path does not exist"
    ):
        _trainer(tmp_path, max_steps=3).fit(MLP(), loader, ckpt_path=tmp_path / "nope.ckpt")
    with pytest.raises(
        CheckpointNotFoundError, match=r"is a directory that holds no checkpoint \(it is empty\)"
    ):
        _trainer(tmp_path, max_steps=3).fit(MLP(), loader, ckpt_path=tmp_path)
    good = _saved_checkpoint(tmp_path)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CorruptCheckpointError, match=r"truncated\.ckpt' is damaged or not a checkpoint"):
        _trainer(tmp_path, max_steps=3).fit(MLP(), loader, ckpt_path=truncated)
    not_ckpt = tmp_path / "notes.txt"
    not_ckpt.write_text("hello")
    with pytest.raises(CorruptCheckpointError, match=r"notes\.txt' is damaged or not a checkpoint"):
        _trainer(tmp_path, max_steps=3).fit(MLP(), loader, ckpt_path=not_ckpt)
    plain = tmp_path / "weights.pt"
    torch.save(MLP().state_dict(), plain)
    with pytest.raises(CorruptCheckpointError, match=r"holds a OrderedDict, not a fullshard checkpoint"):
        _trainer(tmp_path, max_steps=3).fit(MLP(), loader, ckpt_path=plain)
    partial = tmp_path / "partial.ckpt"
    torch.save({"state_dict": {}}, partial)
    with pytest.raises(
        CorruptCheckpointError,
        match=r"not a complete fullshard checkpoint: it lacks lr_schedulers, loops, optimizer_count",
    ):
        _trainer(tmp_path, max_steps=3).fit(MLP(), loader, ckpt_path=partial)


def test_checkpoint_of_another_model_leaves_model_unchanged(tmp_path: Path) -> None:
    good = _saved_checkpoint(tmp_path)
    wider = MLP(hidden=16)
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(
        StateDictMismatchError,
        match=r"shape mismatches: net\.0\.weight \(checkpoint \(32, 8\), model \(16, 8\)\)",
    ):
        _trainer(tmp_path, max_steps=3).fit(wider, DataLoader(make_data(), batch_size=16), ckpt_path=good)
    assert all(torch.equal(before[k], v) for k, v in wider.state_dict().items())

    class Renamed(MLP):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(1, 1)

    with pytest.raises(StateDictMismatchError, match=r"missing keys: head\.bias, head\.weight"):
        _trainer(tmp_path, max_steps=3).fit(Renamed(), DataLoader(make_data(), batch_size=16), ckpt_path=good)


def test_checkpoint_with_other_number_of_optimizers(tmp_path: Path) -> None:
    good = _saved_checkpoint(tmp_path)

    class TwoOptimizers(MLP):
        def configure_optimizers(self) -> Any:
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[3].parameters(), lr=0.1),
            ]

    with pytest.raises(
        CheckpointError, match=r"holds 1 optimizer state\(s\) but configure_optimizers\(\) returned 2"
    ):
        _trainer(tmp_path, max_steps=3).fit(
            TwoOptimizers(), DataLoader(make_data(), batch_size=16), ckpt_path=good
        )


def test_save_checkpoint_before_fit(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"save_checkpoint\(\) needs a model that was set up"):
        _trainer(tmp_path).save_checkpoint(tmp_path / "x.ckpt")


def test_missing_optional_packages_say_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint works however fullshard was installed: the package itself, or the extra from a clone."""
    from fullshard import loggers
    from fullshard.checkpoint import tools

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(
        ModuleNotFoundError,
        match=r"TensorBoardLogger needs the `tensorboard` package, which is not installed\. Install it with "
        r'`pip install "fullshard\[tensorboard\]"` \(in a fullshard clone: `pip install -e "\.\[tensorboard\]"`\)',
    ):
        loggers.TensorBoardLogger(tmp_path)
    monkeypatch.setattr(tools, "_SAFETENSORS_AVAILABLE", False)
    with pytest.raises(
        ModuleNotFoundError,
        match=r"safetensors: pip install safetensors \(in a fullshard clone: pip install -e '\.\[safetensors\]'\)",
    ):
        tools._safetensors()


# ------------------------------------------------- arguments that make no sense (issue 37)
# Each is refused when the Trainer is built: before a process starts or a file is written. Those
# Lightning refuses too are compared with it in tests/test_bad_arguments.py.
_FLAG_NAMES = (
    "enable_checkpointing", "enable_progress_bar", "enable_model_summary", "benchmark", "barebones",
    "inference_mode", "detect_anomaly", "sync_batchnorm", "requeue_on_preemption", "enable_autolog_hparams",
)  # fmt: skip
_OPTIONAL_FLAGS = ("enable_checkpointing", "enable_progress_bar", "enable_model_summary", "benchmark")


def _refused(root: Path, error: type[Exception], match: str, **kwargs: Any) -> Exception:
    """``Trainer(**kwargs)`` (with the default logger and checkpointing, in ``root``) raises
    ``error`` matching ``match``, and ``root`` holds afterwards what it held before."""
    before = sorted(os.listdir(root))
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with pytest.raises(error, match=match) as info:
            fullshard.Trainer(**{"accelerator": "cpu", "enable_progress_bar": False, **kwargs})
    finally:
        os.chdir(cwd)
    assert sorted(os.listdir(root)) == before
    return info.value


@pytest.mark.parametrize(
    ("devices", "count"), [([0, 0], 2), ([0, 1], 2), ([-1], 1), ((0,), 1), ("0,1", 2), ([], 1)]
)
def test_a_list_of_devices_on_cpu_is_refused(tmp_path: Path, devices: Any, count: int) -> None:
    """On CPU ``devices`` counts processes: a list (``[0, 0]`` started two processes on one
    "device") is a TypeError, as Lightning's."""
    shown = re.escape(repr([0, 1] if devices == "0,1" else devices))
    _refused(
        tmp_path,
        MisconfigurationTypeError,
        rf"devices={shown} is a list of device indices, which only GPUs have: on CPU, devices is the number of "
        rf"processes, an int > 0\. Pass devices={count} to start {count} process\(es\), or accelerator='cuda'",
        devices=devices,
    )


@pytest.mark.parametrize(
    ("devices", "error", "match"),
    [
        ([0, 0], MisconfigurationError, r"devices=\[0, 0\] names GPU 0 more than once; each process needs a GPU of "
         r"its own .* Pass distinct indices, e\.g\. devices=\[0\]"),
        ([1, 0, 1], MisconfigurationError, r"names GPU 1 more than once.* devices=\[0, 1\]"),
        ([0, -1], MisconfigurationError, r"devices=\[0, -1\] holds -1; GPU indices are ints >= 0 \(devices=-1 alone"),
        (["0"], MisconfigurationTypeError, r"devices=\['0'\] holds '0' \(str\); GPU indices are ints >= 0"),
        ([True], MisconfigurationTypeError, r"devices=\[True\] holds True \(bool\)"),
        ([], MisconfigurationError, r"devices=\[\] is invalid: it names no GPU"),
        (0, MisconfigurationTypeError, r"devices=0 is invalid; use 'auto', an int > 0"),
        (1.0, MisconfigurationTypeError, r"devices=1\.0 is not understood \(float\)"),
    ],
)  # fmt: skip
def test_gpu_indices_are_distinct_and_not_negative(
    monkeypatch: pytest.MonkeyPatch, devices: Any, error: type[Exception], match: str
) -> None:
    """Two processes on one GPU, as Lightning refuses ("Device ID's (GPU) must be unique"); checked
    with two GPUs made visible to the parser (no GPU is used)."""
    from fullshard.launch import LocalEnvironment
    from fullshard.trainer.devices import resolve_devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(error, match=match):
        resolve_devices(devices, "cuda", LocalEnvironment(), 1)
    # Lightning's string form of a list of GPUs
    assert resolve_devices("0,1", "cuda", LocalEnvironment(), 1) == [
        torch.device("cuda", 0),
        torch.device("cuda", 1),
    ]
    assert resolve_devices("1,", "cuda", LocalEnvironment(), 1) == [torch.device("cuda", 1)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_epochs": 5, "max_epochs": 2}, r"min_epochs=5 is above max_epochs=2: training stops after 2 epochs, so "
         r"min_epochs could never be reached\. Lower min_epochs to 2 or less, or raise max_epochs \(-1: no limit\)"),
        ({"min_steps": 5, "max_steps": 2}, r"min_steps=5 is above max_steps=2: training stops after 2 steps.*Lower "
         r"min_steps to 2 or less"),
        ({"min_epochs": 1, "max_epochs": 0}, r"min_epochs=1 is above max_epochs=0"),
    ],
)  # fmt: skip
def test_a_minimum_above_its_maximum_is_refused(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    """Lightning runs ``max_epochs`` and ignores ``min_epochs`` silently."""
    _refused(tmp_path, MisconfigurationError, match, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_epochs": 2, "max_epochs": 2},
        {"min_epochs": 5, "max_epochs": -1},
        {"min_steps": 5},  # max_steps=-1: no limit
        {"min_steps": 3, "max_steps": 3},
        {"min_epochs": 5, "max_steps": 2},  # which limit ends training depends on the data
    ],
)
def test_a_minimum_within_its_maximum_is_accepted(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    trainer = _trainer(tmp_path, **kwargs)
    assert (trainer.min_epochs, trainer.min_steps) == (kwargs.get("min_epochs"), kwargs.get("min_steps"))


@pytest.mark.parametrize("name", _FLAG_NAMES)
@pytest.mark.parametrize(
    ("given", "meant"), [("no", "False"), ("False", "False"), ("yes", "True"), ("1", "True")]
)
def test_a_string_for_a_bool_option_is_refused(tmp_path: Path, name: str, given: str, meant: str) -> None:
    """``enable_checkpointing="no"`` used to turn checkpointing on (a non-empty string is true)."""
    optional = r" \(or None, the default\)" if name in _OPTIONAL_FLAGS else ""
    _refused(
        tmp_path,
        MisconfigurationTypeError,
        rf"{name}='{given}' is invalid: use True or False{optional}\. A string is not read as a bool \(any "
        rf"non-empty one, '{given}' too, would count as True\): pass {name}={meant}\.",
        **{name: given},
    )


@pytest.mark.parametrize("name", _FLAG_NAMES)
def test_a_number_or_none_for_a_bool_option_is_refused(tmp_path: Path, name: str) -> None:
    _refused(tmp_path, MisconfigurationTypeError, rf"{name}=1 is invalid: use True or False.*Pass {name}=True or "
             rf"{name}=False\.", **{name: 1})  # fmt: skip
    if name not in _OPTIONAL_FLAGS:  # None is the default ("decide") of the others only
        _refused(
            tmp_path,
            MisconfigurationTypeError,
            rf"{name}=None is invalid: use True or False\.",
            **{name: None},
        )


def test_callbacks_and_loggers_from_a_generator_are_read_once(tmp_path: Path) -> None:
    """Checking them early must not use up a one-shot iterator."""
    timer = fullshard.callbacks.Timer()
    csv = fullshard.loggers.CSVLogger(tmp_path)
    trainer = _trainer(tmp_path, callbacks=(cb for cb in [timer]), logger=(lg for lg in [csv]))
    assert timer in trainer.callbacks and trainer.loggers == [csv]
    _refused(tmp_path, MisconfigurationTypeError, r"got object at callbacks\[0\]", callbacks=iter([object()]))


@pytest.mark.parametrize(
    ("callbacks", "match"),
    [
        (object(), r"callbacks must be a fullshard Callback or a list of them, got object \(<object object at .*\)\. "
         r"Pass callbacks=\[\.\.\.\] with fullshard\.callbacks instances"),
        ("x", r"callbacks must be a fullshard Callback or a list of them, got str \('x'\)"),
        ({"a": fullshard.Callback()}, r"callbacks must be a fullshard Callback or a list of them, got dict"),
        ([fullshard.Callback(), object()], r"callbacks must be fullshard Callback instances, got object at "
         r"callbacks\[1\] \(<object object at .*\)\. Subclass fullshard\.Callback .*or take it out of the list"),
        ((fullshard.Callback(), 3), r"got int at callbacks\[1\] \(3\)"),
    ],
)  # fmt: skip
def test_callbacks_of_another_type_name_the_item(tmp_path: Path, callbacks: Any, match: str) -> None:
    """``callbacks=object()`` used to fail with ``'object' object is not iterable``."""
    _refused(tmp_path, MisconfigurationTypeError, match, callbacks=callbacks)


@pytest.mark.parametrize(
    ("logger", "match"),
    [
        ("no", r"logger='no' is invalid: use a fullshard Logger \(CSVLogger, TensorBoardLogger, \.\.\.\), a list of "
         r"them, True or None \(the default logger\) or False \(none\)\. A string is not read as a bool\."),
        (object(), r"logger must be a fullshard Logger .* got object \(<object object at .*\), which has no "
         r"log_metrics or log_hyperparams"),
        (3, r"logger must be a fullshard Logger .* got int \(3\)"),
        ([None], r"got NoneType at logger\[0\] \(None\)"),
    ],
)  # fmt: skip
def test_loggers_of_another_type_name_the_item(tmp_path: Path, logger: Any, match: str) -> None:
    _refused(tmp_path, MisconfigurationTypeError, match, logger=logger)
    csv = fullshard.loggers.CSVLogger(tmp_path / "logs")
    _refused(tmp_path, MisconfigurationTypeError, r"got object at logger\[1\]", logger=[csv, object()])


def test_plugins_of_another_type_are_refused(tmp_path: Path) -> None:
    for given in (object(), [object()], "x"):
        _refused(tmp_path, MisconfigurationError, r"Trainer\(plugins=\[.*\]\): fullshard takes only the plugins it "
                 r"has a setting for", plugins=given)  # fmt: skip


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_file_as_a_directory_is_refused(tmp_path: Path, under: str) -> None:
    """A file where the logs or checkpoints go used to fail at the first save, after training ran."""
    (tmp_path / "afile").write_text("mine")
    given = os.path.join("afile", under) if under else "afile"
    found = re.escape(str(tmp_path / "afile"))
    for key, kwargs in {
        r"Trainer\(default_root_dir=\)": {"default_root_dir": given},
        r"ModelCheckpoint\(dirpath=\)": {
            "callbacks": [fullshard.callbacks.ModelCheckpoint(dirpath=tmp_path / given)]
        },
        r"OnExceptionCheckpoint\(dirpath=\)": {
            "callbacks": [fullshard.callbacks.OnExceptionCheckpoint(dirpath=tmp_path / given)],
        },
        r"CSVLogger\(save_dir=\)": {"logger": fullshard.loggers.CSVLogger(tmp_path / given)},
        r"TensorBoardLogger\(save_dir=\)": {
            "logger": [fullshard.loggers.TensorBoardLogger(tmp_path / given)]
        },
    }.items():
        _refused(
            tmp_path,
            MisconfigurationError,
            rf"{key} got '.*{re.escape(given)}.*', but '{found}' is a file, not a directory: the first log or "
            r"checkpoint written there would fail, after training ran\. Pass a directory",
            **kwargs,
        )
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_logger_named_after_a_file_is_refused(tmp_path: Path) -> None:
    """``save_dir/name`` is where a CSV or TensorBoard logger writes its versions."""
    (tmp_path / "runs").write_text("")
    _refused(tmp_path, MisconfigurationError, r"CSVLogger\(save_dir=\) got '.*runs', but '.*runs' is a file",
             logger=fullshard.loggers.CSVLogger(tmp_path, name="runs"))  # fmt: skip


@pytest.mark.parametrize("given", [3, b"dir", ["a"]])
def test_a_default_root_dir_that_is_no_path_is_refused(tmp_path: Path, given: Any) -> None:
    _refused(tmp_path, MisconfigurationTypeError, rf"Trainer\(default_root_dir=\) got {re.escape(repr(given))} "
             rf"\({type(given).__name__}\): use a directory path, a str or a pathlib\.Path\.", default_root_dir=given)  # fmt: skip


def test_a_new_directory_and_a_url_are_accepted(tmp_path: Path) -> None:
    """A path not made yet is made at the first save; a URL is left to whoever writes it."""
    for root in (tmp_path / "new" / "deeper", "s3://bucket/runs"):
        trainer = _trainer(tmp_path, default_root_dir=root)
        assert trainer.default_root_dir == str(root)
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_epochs": True}, MisconfigurationTypeError, r"max_epochs=True is invalid: use -1 \(no limit\) or an int "
         r">= 0 \(got bool\)"),
        ({"max_steps": 2.0}, MisconfigurationTypeError, r"max_steps=2\.0 is invalid: .*\(got float\)"),
        ({"min_epochs": True}, MisconfigurationTypeError, r"min_epochs=True is invalid: use None or an int >= 0"),
        ({"check_val_every_n_epoch": 0}, MisconfigurationError, r"check_val_every_n_epoch=0 is invalid: use None or "
         r"an int >= 1\.$"),
        ({"num_sanity_val_steps": -2}, MisconfigurationError, r"num_sanity_val_steps=-2 is invalid: use an int >= 0, "
         r"or -1 for the whole validation set\.$"),
        ({"num_sanity_val_steps": 1.5}, MisconfigurationTypeError, r"num_sanity_val_steps=1\.5 is invalid.*got float"),
        ({"log_every_n_steps": -1}, MisconfigurationError, r"log_every_n_steps=-1 is invalid: use an int >= 1\.$"),
        ({"accumulate_grad_batches": True}, MisconfigurationTypeError, r"accumulate_grad_batches=True is invalid"),
        ({"val_check_interval": True}, MisconfigurationTypeError, r"val_check_interval=True is invalid.*got bool"),
        ({"val_check_interval": math.nan}, MisconfigurationError, r"val_check_interval=nan is invalid: use a fraction"),
        ({"gradient_clip_val": math.nan}, MisconfigurationError, r"gradient_clip_val=nan is invalid: use a number > 0"),
        ({"limit_val_batches": math.nan}, MisconfigurationError, r"limit_val_batches=nan is invalid: use a fraction"),
        ({"limit_test_batches": True}, MisconfigurationTypeError, r"limit_test_batches=True is invalid.*got bool"),
        ({"overfit_batches": "1"}, MisconfigurationTypeError, r"overfit_batches='1' is invalid.*got str"),
        ({"fast_dev_run": 1.5}, MisconfigurationTypeError, r"fast_dev_run=1\.5 is invalid: use True \(one batch\), "
         r"False, or a number of batches >= 0 \(got float\)"),
        ({"reload_dataloaders_every_n_epochs": "1"}, MisconfigurationTypeError, r"reload_dataloaders_every_n_epochs="
         r"'1' is invalid: use an int >= 0 \(0: never rebuild the dataloaders\) \(got str\)"),
    ],
)  # fmt: skip
def test_numbers_of_the_wrong_type_or_range_are_refused(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    _refused(tmp_path, error, match, **kwargs)


def test_gradient_clip_algorithm_in_any_case(tmp_path: Path) -> None:
    """As Lightning: ``"Value"`` is ``"value"``; an empty string or a number is refused."""
    from fullshard.utilities import GradClipAlgorithmType

    for given, meant in (
        ("Value", "value"),
        ("NORM", "norm"),
        (GradClipAlgorithmType.VALUE, "value"),
        (None, "norm"),
    ):
        assert _trainer(tmp_path, gradient_clip_algorithm=given).gradient_clip_algorithm == meant
    _refused(tmp_path, MisconfigurationError, r"gradient_clip_algorithm='' is invalid: use 'norm' or 'value'\.$",
             gradient_clip_algorithm="")  # fmt: skip
    _refused(tmp_path, MisconfigurationTypeError, r"gradient_clip_algorithm=3 is invalid: use 'norm' or 'value' "
             r"\(got int\)\.$", gradient_clip_algorithm=3)  # fmt: skip


def test_a_checkpoint_callback_of_the_module_is_checked_too(tmp_path: Path) -> None:
    """``configure_callbacks()`` returning a ModelCheckpoint whose dirpath is a file: refused when
    the call starts, before the first step."""
    (tmp_path / "afile").write_text("")

    class Model(MLP):
        def configure_callbacks(self) -> Any:
            return fullshard.callbacks.ModelCheckpoint(dirpath=tmp_path / "afile")

    trainer = _trainer(
        tmp_path, max_steps=1, callbacks=[fullshard.callbacks.ModelCheckpoint(dirpath=tmp_path / "c")]
    )
    with pytest.raises(
        MisconfigurationError, match=r"ModelCheckpoint\(dirpath=\) got '.*afile', but .* is a file"
    ):
        trainer.fit(Model(), DataLoader(make_data(8), batch_size=4))
    assert trainer.global_step == 0 and sorted(os.listdir(tmp_path)) == ["afile"]


def test_barebones_takes_log_every_n_steps_0(tmp_path: Path) -> None:
    """Lightning's barebones check accepts ``log_every_n_steps=0`` (its "off" value)."""
    trainer = fullshard.Trainer(
        barebones=True, log_every_n_steps=0, accelerator="cpu", default_root_dir=tmp_path
    )
    assert trainer.barebones and trainer.loggers == []

"""Progress bars, the model summary and loggers, as a Lightning user sees them (issue 36).

Run by tests/test_bars_loggers.py; by hand::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/bars_loggers.py --out /tmp/l.json
    TWIN_FRAMEWORK=fullshard python tests/twins/bars_loggers.py --out /tmp/f.json --only case_tqdm_bar

The Lightning environment has neither ``rich`` nor ``tensorboard``; the cases that depend on them
hide them (``sys.modules[name] = None``) so that both runs see the same packages. What fullshard
does with them installed is pinned in tests/test_bars_loggers.py against Lightning's rule.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twin import caught_warnings, imp, main, raised, warned

L = imp()
callbacks = imp("callbacks")
loggers = imp("loggers")


def _model_class() -> Any:
    import torch

    class Model(L.LightningModule):
        def __init__(self, example: bool = False) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 3)
            self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(3, 1))
            if example:
                self.example_input_array = torch.zeros(2, 4)

        def forward(self, x: Any) -> Any:
            return self.head(self.layer(x))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self(batch[0]).pow(2).mean()
            self.log("loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("val_loss", self(batch[0]).pow(2).mean(), prog_bar=True)

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", self(batch[0]).pow(2).mean())

        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            return self(batch[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model


def _loader(n: int) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(2 * n, 4)), batch_size=2)


def _trainer(tmp: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        default_root_dir=tmp,
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    options.update(kwargs)
    return L.Trainer(**options)


@contextlib.contextmanager
def _output() -> Iterator[io.StringIO]:
    """stdout and stderr together, as a terminal shows them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        yield out


@contextlib.contextmanager
def _hidden(*names: str) -> Iterator[None]:
    """The packages ``names`` made unimportable (as if not installed) inside."""
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for n, module in saved.items():
            if module is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = module


def _screen(text: str) -> list[str]:
    """What a terminal shows after ``text``: ``\\n`` goes down a line, ``\\r`` to its start,
    ``ESC[A`` up a line; other characters overwrite."""
    rows: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(text):
        if text.startswith("\x1b[A", i):
            row, i = max(row - 1, 0), i + 3
            continue
        ch = text[i]
        i += 1
        if ch == "\n":
            row, col = row + 1, 0
        elif ch == "\r":
            col = 0
        else:
            while len(rows) <= row:
                rows.append([])
            line = rows[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = ch
            col += 1
    return ["".join(r).rstrip() for r in rows]


def _bars(text: str) -> list[Any]:
    """Each non-blank line left on screen as [line number, description, count, postfix names],
    the names in the order the bar shows them."""
    shown = []
    for number, line in enumerate(_screen(text)):
        if "it/s" not in line:  # not a bar (blank, or a printed table)
            continue
        count = re.search(r"(\d+)/(\d+)", line)
        postfix = line[line.rfind("[") :] if "[" in line else ""
        shown.append(
            [
                number,
                line.split(":")[0].strip(),
                count.group(0) if count else None,
                re.findall(r"(\w+)=", postfix),
            ]
        )
    return shown


# ------------------------------------------------------------------ progress bars


def case_tqdm_bar(tmp: Path) -> Any:
    """TQDMProgressBar's arguments: what stays on screen after fit, and the enabled flags."""
    Model = _model_class()
    seen = {}
    for label, kwargs in {
        "default": {},
        "hidden": {"refresh_rate": 0},
        "leave": {"leave": True},
        "position": {"process_position": 1},
        "every_2": {"refresh_rate": 2},
        "steps_left": {},  # max_epochs=-1, max_steps=4: the second epoch's bar counts the 1 step left
    }.items():
        bar = callbacks.TQDMProgressBar(**kwargs)
        limits = {"max_epochs": -1, "max_steps": 4} if label == "steps_left" else {}
        trainer = _trainer(tmp / label, callbacks=[bar], logger=loggers.CSVLogger(tmp / label), **limits)
        with _output() as out, caught_warnings():
            trainer.fit(Model(), _loader(3), _loader(2))
        seen[label] = {
            "bars": _bars(out.getvalue()),
            "drawn": "Epoch" in out.getvalue(),
            "flags": [bar.is_enabled, bar.is_disabled, bar.refresh_rate, bar.process_position],
            "is_the_trainers": trainer.progress_bar_callback is bar,
        }
    return seen


def case_tqdm_eval_bars(tmp: Path) -> Any:
    """The bars of validate (two loaders), test and predict (two loaders)."""
    model = _model_class()()
    seen = {}
    for position in (0, 1):
        trainer = _trainer(
            tmp, callbacks=[callbacks.TQDMProgressBar(process_position=position)], logger=False
        )
        runs = {
            "validate": lambda trainer=trainer: trainer.validate(
                model, [_loader(2), _loader(1)], verbose=False
            ),
            "test": lambda trainer=trainer: trainer.test(model, _loader(2), verbose=False),
            "predict": lambda trainer=trainer: trainer.predict(model, [_loader(1), _loader(3)]),
        }
        for stage, run in runs.items():
            with _output() as out, caught_warnings():
                run()
            seen[f"{stage}_{position}"] = _bars(out.getvalue())
    return seen


def case_bar_enable_disable(tmp: Path) -> Any:
    """disable()/enable() on the bars, and a bar made with refresh_rate=0 staying hidden."""
    flags = []
    for bar in (callbacks.TQDMProgressBar(), callbacks.TQDMProgressBar(refresh_rate=0)):
        row = [bar.is_enabled, bar.is_disabled]
        bar.disable()
        row += [bar.is_enabled, bar.is_disabled]
        bar.enable()
        row += [bar.is_enabled, bar.is_disabled]
        flags.append(row)
    bar = callbacks.TQDMProgressBar()
    bar.disable()
    with _output() as out:
        _trainer(tmp, callbacks=[bar], logger=False, max_epochs=1).fit(_model_class()(), _loader(2))
    return {
        "flags": flags,
        "drawn_after_disable": "Epoch" in out.getvalue(),
        "base": raised(lambda: callbacks.ProgressBar().disable()),
    }


def case_get_metrics(tmp: Path) -> Any:
    """ProgressBar.get_metrics: v_num from the loggers' versions, then the prog_bar metrics."""
    Model = _model_class()

    class Record(callbacks.Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            metrics = trainer.progress_bar_callback.get_metrics(trainer, pl_module)
            self.seen = {k: (v if k == "v_num" else type(v).__name__) for k, v in metrics.items()}

    class Clash(Model):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("v_num", 7.0, prog_bar=True)
            return super().training_step(batch, batch_idx)

    seen = {}
    for label, logger in {
        "csv": loggers.CSVLogger(tmp),
        "string_version": loggers.CSVLogger(tmp, version="run_abcdef"),
        "two": [loggers.CSVLogger(tmp, name="a", version=3), loggers.CSVLogger(tmp, name="b", version="x")],
        "same_two": [
            loggers.CSVLogger(tmp, name="a", version=3),
            loggers.CSVLogger(tmp, name="b", version=3),
        ],
        "none": False,
        "clash": loggers.CSVLogger(tmp, name="clash"),
    }.items():
        record = Record()
        with caught_warnings() as w, _output():
            model = Clash() if label == "clash" else Model()
            _trainer(tmp, callbacks=[record, callbacks.TQDMProgressBar()], logger=logger, max_epochs=1).fit(
                model, _loader(2)
            )
        seen[label] = {"metrics": record.seen, "warned_clash": warned(w, "v_num")}
    return seen


def case_default_callbacks_without_rich(tmp: Path) -> Any:
    """Without rich: the default bar and model summary are the tqdm bar and ModelSummary."""
    with _hidden("rich"):
        kinds = {
            "default": L.Trainer(default_root_dir=tmp, logger=False),
            "no_summary": L.Trainer(default_root_dir=tmp, logger=False, enable_model_summary=False),
            "no_bar": L.Trainer(default_root_dir=tmp, logger=False, enable_progress_bar=False),
            "own_summary": L.Trainer(
                default_root_dir=tmp, logger=False, callbacks=[callbacks.ModelSummary(max_depth=2)]
            ),
            "timer": L.Trainer(default_root_dir=tmp, logger=False, max_time={"minutes": 1}),
        }
        return {k: [type(cb).__name__ for cb in t.callbacks] for k, t in kinds.items()}


def case_progress_bar_misconfiguration(tmp: Path) -> Any:
    """Two bars, or a bar with enable_progress_bar=False, are refused when the Trainer is made."""

    def made(**kwargs: Any) -> bool:
        try:
            L.Trainer(default_root_dir=tmp, logger=False, **kwargs)
        except Exception:  # Lightning's MisconfigurationException, fullshard's MisconfigurationError
            return False
        return True

    return {
        "two": made(callbacks=[callbacks.TQDMProgressBar(), callbacks.TQDMProgressBar()]),
        "disabled_with_bar": made(callbacks=[callbacks.TQDMProgressBar()], enable_progress_bar=False),
        "one": made(callbacks=[callbacks.TQDMProgressBar()]),
        "barebones_with_bar": made(callbacks=[callbacks.TQDMProgressBar()], barebones=True),
    }


def case_summarize_override(tmp: Path) -> Any:
    """A ModelSummary subclass overriding the static summarize gets Lightning's columns and totals."""
    seen = []

    class Summary(callbacks.ModelSummary):
        @staticmethod
        def summarize(
            summary_data,
            total_parameters,
            trainable_parameters,
            model_size,
            total_training_modes,
            **summarize_kwargs,
        ):  # type: ignore[no-untyped-def]
            seen.append(
                {
                    "columns": summary_data,
                    "totals": [
                        total_parameters,
                        trainable_parameters,
                        round(model_size, 6),
                        total_training_modes,
                    ],
                    "kwargs": summarize_kwargs,
                }
            )

    import torch

    class WithOwnParameter(_model_class()):  # a parameter of no layer: Lightning's "other params" row
        def __init__(self, example: bool = False) -> None:
            super().__init__(example)
            self.scale = torch.nn.Parameter(torch.ones(5))

    Model = WithOwnParameter
    for example, depth in ((True, 1), (False, 1), (True, -1)):
        trainer = _trainer(
            tmp,
            callbacks=[Summary(max_depth=depth, extra=1)],
            logger=False,
            max_steps=1,
            enable_progress_bar=False,
        )
        trainer.fit(Model(example), _loader(2))
    return seen


# ------------------------------------------------------------------ loggers


def case_default_logger_without_tensorboard(tmp: Path) -> Any:
    """Without tensorboard the default logger is a CSVLogger in lightning_logs/, with a warning."""
    with _hidden("tensorboard", "tensorboardX"), caught_warnings() as w:
        trainer = _trainer(tmp, enable_progress_bar=False, max_epochs=1)
    with _output():
        trainer.fit(_model_class()(), _loader(2))
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    return {
        "logger": type(trainer.logger).__name__,
        "log_dir": os.path.relpath(trainer.log_dir, tmp),
        "warned": any(
            "csvlogger" in str(x.message).lower() and "tensorboard" in str(x.message).lower() for x in w
        ),
        "files": files,
    }


def case_duck_typed_logger(tmp: Path) -> Any:
    """A logger that is not a Logger subclass is accepted and called."""
    calls: list[str] = []

    class Duck:
        save_dir = str(tmp)
        log_dir = str(tmp / "elsewhere")  # trainer.log_dir is save_dir all the same
        name = "duck"
        version = 5

        def log_metrics(self, metrics: Any, step: Any = None) -> None:
            calls.append("log_metrics:" + ",".join(sorted(metrics)))

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            calls.append("log_hyperparams")

        def log_graph(self, model: Any, input_array: Any = None) -> None:
            calls.append("log_graph")

        def save(self) -> None:
            calls.append("save")

        def finalize(self, status: str) -> None:
            calls.append("finalize:" + status)

        def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
            pass  # not recorded: fullshard never calls it (docs/loggers.md, "Differences from Lightning")

    trainer = _trainer(
        tmp,
        logger=Duck(),
        enable_checkpointing=True,
        max_epochs=1,
        enable_progress_bar=False,
        log_every_n_steps=1,
    )
    trainer.fit(_model_class()(), _loader(2))
    ckpts = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*.ckpt"))
    return {
        "calls": sorted(set(calls)),
        "logger": type(trainer.logger).__name__,
        "checkpoints": ckpts,
        "log_dir": os.path.relpath(trainer.log_dir, tmp),
    }


def case_subclass_name_and_version(tmp: Path) -> Any:
    """log_dir follows a subclass's name/version properties."""

    class Named(loggers.CSVLogger):
        @property
        def name(self) -> str:
            return "custom"

        @property
        def version(self) -> str:
            return "v7"

    logger = Named(tmp)
    out = {"log_dir": os.path.relpath(logger.log_dir, tmp), "root_dir": os.path.relpath(logger.root_dir, tmp)}
    with _output():
        _trainer(tmp, logger=logger, max_epochs=1).fit(_model_class()(), _loader(2))
    out["metrics_files"] = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("metrics.csv"))
    return out


def case_pickle_after_logging(tmp: Path) -> Any:
    """A logger that has logged pickles, and the copy logs on."""
    logger = loggers.CSVLogger(tmp, name="p")
    logger.log_metrics({"a": 1.0}, step=0)
    _ = logger.experiment
    copy = raised(lambda: pickle.loads(pickle.dumps(logger)))
    restored = pickle.loads(pickle.dumps(logger))
    restored.log_metrics({"b": 2.0}, step=1)
    restored.save()
    header = (tmp / "p" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    return {
        "raised": copy["raised"],
        "log_dir": os.path.relpath(restored.log_dir, tmp),
        "columns": sorted(header.split(",")),
    }


def case_csv_warns_on_a_used_folder(tmp: Path) -> Any:
    """CSVLogger warns when the version folder it writes to already holds files."""
    seen = {}
    for label, prepare in (("empty", False), ("used", True)):
        root = tmp / label
        if prepare:
            (root / "lightning_logs" / "version_0").mkdir(parents=True)
            (root / "lightning_logs" / "version_0" / "other.txt").write_text("x")
        logger = loggers.CSVLogger(root, version=0)
        with caught_warnings() as w:
            logger.log_metrics({"a": 1.0}, step=0)
            logger.save()
        seen[label] = warned(w, "exists and is not empty")
    # a run's own checkpoints in its folder are no reason to warn (epoch 0's checkpoint lands
    # there before the first metrics, logged at step 3)
    with caught_warnings() as w, _output():
        trainer = _trainer(
            tmp / "run", logger=loggers.CSVLogger(tmp / "run"), enable_checkpointing=True, log_every_n_steps=3
        )
        trainer.fit(_model_class()(), _loader(2))
    seen["metrics_written"] = (tmp / "run" / "lightning_logs" / "version_0" / "metrics.csv").is_file()
    seen["own_checkpoints"] = warned(w, "exists and is not empty")
    return seen


if __name__ == "__main__":
    main()

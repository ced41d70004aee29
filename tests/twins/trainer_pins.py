"""Twin script: Trainer and module behaviours that Lightning's own tests pin (issue 36).

``self.log(reduce_fx=torch.max)`` and the other reductions, the ``"step"`` key, step values
logged in validation/test, ``save_hyperparameters(logger=False)`` and its dict/Namespace forms,
validation switched off (``val_dataloaders=[]``, ``validation_step = None``), ``trainer.state``
through each call, ``weights_only=`` on the entry points, Ctrl+C during ``fit``, and the
``ModelCheckpoint`` checks. Run by tests/test_trainer_pins.py under both frameworks::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/trainer_pins.py --out /tmp/l.json
"""

from __future__ import annotations

import warnings
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from twin import imp, jsonable, main, raised

L = imp()
callbacks = imp("callbacks")
loggers = imp("loggers")
warnings.filterwarnings("ignore")


def data(n: int = 8, batch_size: int = 2) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size)


class Recorder(loggers.Logger):
    """A logger that keeps what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Any] = []
        self.hparams: list[Any] = []
        self.statuses: list[str] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: Any, step: Any = None) -> None:
        self.rows.append([step, {k: float(v) for k, v in sorted(metrics.items())}])

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.hparams.append(dict(vars(params) if isinstance(params, Namespace) else params))

    def finalize(self, status: str) -> None:
        self.statuses.append(status)


class Base(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self.loss(batch))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(tmp: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def metrics(t: Any) -> dict[str, Any]:
    return {"callback": jsonable(dict(t.callback_metrics)), "logged": jsonable(dict(t.logged_metrics))}


def misconfigured(fn: Any) -> dict[str, Any]:
    """What ``fn`` raised: whether it is the framework's configuration error (Lightning's
    ``MisconfigurationException``, fullshard's ``MisconfigurationError``) and words of its message."""
    try:
        fn()
    except Exception as err:  # the type is the observation
        text = str(err)
        return {
            "misconfiguration": type(err).__name__.startswith("Misconfiguration"),
            "message": text,
        }
    return {"misconfiguration": None}


# ------------------------------------------------------------------------------------- logging
class Reductions(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        value = torch.tensor(float(batch_idx + 1))
        self.log("t_max", value, on_epoch=True, reduce_fx=torch.max)
        self.log("t_min", value, on_epoch=True, reduce_fx=torch.min)
        self.log("t_sum", value, on_epoch=True, reduce_fx=torch.sum)
        self.log("t_mean", value, on_epoch=True, reduce_fx=torch.mean)
        self.log("t_bmax", value, on_step=False, on_epoch=True, reduce_fx=max)
        self.log("t_upper", value, on_step=False, on_epoch=True, reduce_fx="MAX")
        self.log("t_avg", value, on_step=False, on_epoch=True, reduce_fx="avg")
        return self.loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("v_sum", float(batch_idx + 1), reduce_fx=torch.sum)
        self.log("v_min", float(batch_idx + 1), reduce_fx=min)


def case_reduce_fx_callables(tmp: Path) -> Any:
    t = trainer(tmp, num_sanity_val_steps=0)
    t.fit(Reductions(), data(), data())
    out = metrics(t)
    out["validate"] = t.validate(Reductions(), data(), verbose=False)
    return out


class BadReduction(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("bad", 1.0, reduce_fx=torch.median)
        return self.loss(batch)


def case_reduce_fx_refused(tmp: Path) -> Any:
    out = misconfigured(lambda: trainer(tmp).fit(BadReduction(), data()))
    message = out.pop("message", "")
    out["names_reduce_fx"] = "reduce_fx" in message
    out["names_accepted"] = all(w in message for w in ("min", "max", "mean", "sum"))
    return out


class StepKey(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log_dict({"step": float(100 + 10 * self.global_step), "train_loss": loss})
        return loss

    def on_validation_epoch_end(self) -> None:
        self.log("step", float(1000 + self.current_epoch))


def case_step_key_sets_logger_step(tmp: Path) -> Any:
    recorder = Recorder()
    t = trainer(tmp, logger=recorder, log_every_n_steps=1, max_epochs=2, num_sanity_val_steps=0)
    t.fit(StepKey(), data(), data(4))
    return {"rows": recorder.rows, **metrics(t)}


class LogStepOnly(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        self.log("plain_step", float(7 + self.global_step))
        return loss

    def on_train_epoch_end(self) -> None:
        self.log("step", 50.0)


def case_step_logged_in_epoch_end(tmp: Path) -> Any:
    recorder = Recorder()
    t = trainer(tmp, logger=recorder, log_every_n_steps=2, num_sanity_val_steps=0, limit_val_batches=0)
    t.fit(LogStepOnly(), data())
    return {"rows": recorder.rows, **metrics(t)}


class EvalOnStep(Base):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("v", float(batch_idx + 1), on_step=True)
        self.log("v_plain", float(batch_idx + 1))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("t", float(2 * batch_idx), on_step=True, reduce_fx="sum")


def case_eval_on_step_gives_epoch_value(tmp: Path) -> Any:
    recorder = Recorder()
    t = trainer(tmp, logger=recorder)
    validated = t.validate(EvalOnStep(), data(), verbose=False)
    after_validate = metrics(t)
    tested = t.test(EvalOnStep(), data(), verbose=False)
    in_fit = Recorder()  # two validations in fit: the step count goes on; the sanity run logs nothing
    trainer(tmp, logger=in_fit, max_epochs=2, limit_train_batches=1, limit_val_batches=2).fit(
        EvalOnStep(), data(), data()
    )
    return {
        "validate": validated,
        "after_validate": after_validate,
        "test": tested,
        "after_test": metrics(t),
        "rows": recorder.rows,
        "rows_in_fit": in_fit.rows,
    }


class StepFalse(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("x", 1.0, on_step=False)
        return self.loss(batch)


def case_training_on_step_false_alone(tmp: Path) -> Any:
    out = misconfigured(lambda: trainer(tmp).fit(StepFalse(), data()))
    return {"misconfiguration": out["misconfiguration"]}


# ----------------------------------------------------------------------------- hyperparameters
class NotLogged(Base):
    def __init__(self, lr: float = 0.1, width: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)


class FromDict(Base):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters(config)


class FromNamespace(Base):
    def __init__(self, hparams: Namespace) -> None:
        super().__init__()
        self.save_hyperparameters(hparams)


class NamespaceKept(Base):
    def __init__(self, hparams: Namespace, depth: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()


def case_hparams_not_sent_to_loggers(tmp: Path) -> Any:
    recorder = Recorder()
    t = trainer(tmp, logger=recorder, limit_val_batches=0)
    t.fit(NotLogged(lr=0.5), data())
    t.save_checkpoint(tmp / "m.ckpt")
    loaded = NotLogged.load_from_checkpoint(tmp / "m.ckpt")
    return {
        "sent": recorder.hparams,
        "hparams": dict(t.lightning_module.hparams),
        "loaded": dict(loaded.hparams),
    }


def case_hparams_logged_by_default(tmp: Path) -> Any:
    class Logged(Base):
        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()

    recorder = Recorder()
    trainer(tmp, logger=recorder, limit_val_batches=0).fit(Logged(lr=0.25), data())
    return {"sent": recorder.hparams}


def case_hparams_from_dict_and_namespace(tmp: Path) -> Any:
    recorder = Recorder()
    out: dict[str, Any] = {}
    for name, model in (
        ("dict", FromDict({"lr": 0.5, "layers": 3})),
        ("namespace", FromNamespace(Namespace(lr=0.25, name="n"))),
    ):
        t = trainer(tmp, logger=recorder, limit_val_batches=0, max_steps=1)
        t.fit(model, data())
        path = tmp / f"{name}.ckpt"
        t.save_checkpoint(path)
        loaded = type(model).load_from_checkpoint(path)
        out[name] = {
            "hparams": dict(model.hparams),
            "attr": model.hparams.lr,
            "initial": dict(model.hparams_initial),
            "loaded": dict(loaded.hparams),
        }
    out["sent"] = recorder.hparams
    kept = NamespaceKept(Namespace(lr=0.1))
    out["whole_namespace"] = {"keys": sorted(kept.hparams), "lr": kept.hparams["hparams"].lr}
    empty = FromDict({})
    out["empty"] = dict(empty.hparams)
    recorder = Recorder()
    trainer(tmp, logger=recorder, limit_val_batches=0, max_steps=1).fit(empty, data())
    out["empty_sent"] = recorder.hparams
    return out


# ------------------------------------------------------------------------- validation switched off
class HookNames(L.Callback):
    """The names of the hooks called, in order, each once."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def _saw(self, name: str) -> None:
        if name not in self.called:
            self.called.append(name)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._saw("setup")

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_sanity_check_start")

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_sanity_check_end")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_validation_start")

    def on_validation_batch_end(self, *args: Any) -> None:
        self._saw("on_validation_batch_end")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_validation_end")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_start")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_end")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._saw("teardown")


def case_validation_skipped(tmp: Path) -> Any:
    out = {}
    hooks = HookNames()
    t = trainer(tmp, callbacks=[hooks])
    t.fit(Base(), data(), val_dataloaders=[])
    out["empty_list"] = {"hooks": hooks.called, "metrics": sorted(t.callback_metrics)}
    hooks = HookNames()
    model = Base()
    model.validation_step = None
    t = trainer(tmp, callbacks=[hooks])
    t.fit(model, data(), data())
    out["step_none"] = {"hooks": hooks.called, "metrics": sorted(t.callback_metrics)}
    out["validate_empty"] = trainer(tmp).validate(Base(), [], verbose=False)
    out["test_empty"] = trainer(tmp).test(Base(), [], verbose=False)
    return out


class AsksForLoaders(Base):
    """Records which dataloader methods the Trainer calls, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def train_dataloader(self) -> DataLoader:
        self.asked.append("train")
        return data()

    def val_dataloader(self) -> DataLoader:
        self.asked.append("val")
        return data()

    def test_dataloader(self) -> DataLoader:
        self.asked.append("test")
        return data()


def case_zero_limit_asks_for_no_loader(tmp: Path) -> Any:
    out = {}
    for limit in (0, 0.0, 1):
        hooks, model = HookNames(), AsksForLoaders()
        t = trainer(tmp, callbacks=[hooks], limit_val_batches=limit)
        t.fit(model)
        out[f"fit limit_val_batches={limit!r}"] = {"asked": model.asked, "hooks": hooks.called}

    class NoValidationLoader(AsksForLoaders):
        val_dataloader = None  # Lightning's is_overridden: an attribute set to None is not defined

    model = NoValidationLoader()
    trainer(tmp).fit(model)
    out["val_dataloader = None in the class"] = model.asked
    model = AsksForLoaders()
    out["test limit_test_batches=0"] = [
        trainer(tmp, limit_test_batches=0).test(model, verbose=False),
        model.asked,
    ]
    return out


# ----------------------------------------------------------------------------------- trainer.state
def describe(state: Any) -> list[Any]:
    return [
        None if state.fn is None else state.fn.value,
        state.status.value,
        None if state.stage is None else state.stage.value,
    ]


class StateRecorder(L.Callback):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def _saw(self, name: str, trainer: Any) -> None:
        self.seen.append([name, *describe(trainer.state)])

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._saw("setup", trainer)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_fit_start", trainer)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_sanity_check_start", trainer)

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_sanity_check_end", trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_start", trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self._saw("on_train_batch_start", trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_validation_start", trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_validation_end", trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_epoch_end", trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_end", trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_fit_end", trainer)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_test_start", trainer)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_predict_start", trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._saw(f"on_exception {type(exception).__name__}", trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._saw("teardown", trainer)


def case_state_through_each_call(tmp: Path) -> Any:
    states = imp("trainer.states")
    recorder = StateRecorder()
    t = trainer(tmp, callbacks=[recorder], limit_train_batches=2, limit_val_batches=1)
    out: dict[str, Any] = {"init": describe(t.state), "finished_at_init": t.state.finished}
    model = Base()
    t.fit(model, data(), data())
    out["after_fit"] = [*describe(t.state), t.state.finished, t.state.stopped]
    out["enum_checks"] = [
        t.state.fn == states.TrainerFn.FITTING,
        t.state.fn == "FIT",
        t.state.status == "finished",
        isinstance(t.state.fn, str),
        states.RunningStage.SANITY_CHECKING.evaluating,
        states.RunningStage.TRAINING.evaluating,
        states.RunningStage.SANITY_CHECKING.dataloader_prefix,
        states.TrainerStatus.INTERRUPTED.stopped,
        sorted(m.value for m in states.TrainerFn),
        sorted(m.value for m in states.RunningStage),
        sorted(m.value for m in states.TrainerStatus),
    ]
    t.validate(model, data(), verbose=False)
    out["after_validate"] = describe(t.state)
    t.test(model, data(), verbose=False)
    out["after_test"] = describe(t.state)
    t.predict(model, data())
    out["after_predict"] = describe(t.state)
    out["hooks"] = recorder.seen
    return out


class Fails(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 1:
            raise RuntimeError("boom")
        return self.loss(batch)


def case_state_after_an_exception(tmp: Path) -> Any:
    recorder = StateRecorder()
    logger = Recorder()
    t = trainer(tmp, callbacks=[recorder], logger=logger, limit_val_batches=0)
    out: dict[str, Any] = {"raised": None}
    try:
        t.fit(Fails(), data())
    except RuntimeError as err:
        out["raised"] = str(err)
    out["state"] = [*describe(t.state), t.state.finished, t.state.stopped, t.interrupted]
    out["hooks"] = recorder.seen[-3:]  # no teardown after a failure
    out["finalized"] = logger.statuses
    return out


# ------------------------------------------------------------------------------------ interrupts
class CtrlC(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 2:
            raise KeyboardInterrupt
        return self.loss(batch)


def case_keyboard_interrupt(tmp: Path) -> Any:
    recorder = StateRecorder()
    logger = Recorder()
    checkpoint = callbacks.ModelCheckpoint(dirpath=tmp / "ckpts", save_on_exception=True)
    t = trainer(
        tmp,
        callbacks=[recorder, checkpoint],
        logger=logger,
        limit_val_batches=0,
        max_epochs=3,
        enable_checkpointing=True,
    )
    out: dict[str, Any] = {}
    try:
        t.fit(CtrlC(), data())
        out["caller_saw"] = None
    except SystemExit as err:
        out["caller_saw"] = ["SystemExit", err.code, type(err.__context__).__name__]
    except BaseException as err:
        out["caller_saw"] = [type(err).__name__]
    out["state"] = [*describe(t.state), t.interrupted, t.global_step]
    out["hooks"] = [h[0] for h in recorder.seen if h[0] not in ("setup", "on_fit_start")]
    out["finalized"] = logger.statuses
    out["files"] = sorted(p.name for p in (tmp / "ckpts").iterdir()) if (tmp / "ckpts").exists() else []
    return out


# ---------------------------------------------------------------------------------- checkpoints
class FailsAtStart(Base):
    def on_train_start(self) -> None:
        raise RuntimeError("before the first step")


def case_save_on_exception_before_first_step(tmp: Path) -> Any:
    checkpoint = callbacks.ModelCheckpoint(dirpath=tmp / "ckpts", save_on_exception=True)
    t = trainer(tmp, callbacks=[checkpoint], limit_val_batches=0, enable_checkpointing=True)
    return {
        "fit": raised(lambda: t.fit(FailsAtStart(), data())),
        "files": sorted(p.name for p in (tmp / "ckpts").iterdir()) if (tmp / "ckpts").exists() else [],
        "global_step": t.global_step,
    }


def case_checkpoint_configurations_refused(tmp: Path) -> Any:
    refused = misconfigured(
        lambda: trainer(tmp, enable_checkpointing=False, callbacks=[callbacks.ModelCheckpoint()])
    )
    message = refused.pop("message", "")
    refused["says"] = ["enable_checkpointing=False" in message, "ModelCheckpoint" in message]
    top_k = misconfigured(lambda: callbacks.ModelCheckpoint(monitor=None, save_top_k=2))
    message = top_k.pop("message", "")
    top_k["says"] = ["save_top_k=2" in message, "monitor=None" in message]
    allowed = [
        misconfigured(lambda k=k: callbacks.ModelCheckpoint(monitor=None, save_top_k=k))["misconfiguration"]
        for k in (-1, 0, 1)
    ]
    return {"enable_checkpointing": refused, "top_k": top_k, "allowed": allowed}


# --------------------------------------------------------------------------------- weights_only
class ExtraEntry(Base):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["note"] = Namespace(kind="not plain data")


def case_weights_only_keyword(tmp: Path) -> Any:
    model = Base()
    t = trainer(tmp, limit_val_batches=0)
    t.fit(model, data())
    t.save_checkpoint(tmp / "plain.ckpt")
    out: dict[str, Any] = {}
    for flag in (True, False):
        t = trainer(tmp, limit_val_batches=0, max_epochs=2)
        t.fit(Base(), data(), ckpt_path=tmp / "plain.ckpt", weights_only=flag)
        out[f"fit_{flag}"] = t.global_step
        out[f"validate_{flag}"] = trainer(tmp).validate(
            Base(), data(), ckpt_path=tmp / "plain.ckpt", weights_only=flag, verbose=False
        )
        out[f"test_{flag}"] = trainer(tmp).test(Base(), data(), tmp / "plain.ckpt", False, None, flag)
        predictions = trainer(tmp).predict(Base(), data(), ckpt_path=tmp / "plain.ckpt", weights_only=flag)
        out[f"predict_{flag}"] = jsonable(predictions[0])
    t = trainer(tmp, limit_val_batches=0)
    t.fit(ExtraEntry(), data())
    t.save_checkpoint(tmp / "extra.ckpt")
    for flag in (True, False):
        try:
            trainer(tmp).validate(
                ExtraEntry(), data(), ckpt_path=tmp / "extra.ckpt", weights_only=flag, verbose=False
            )
            out[f"extra_{flag}"] = "loaded"
        except Exception:  # the type differs: torch's UnpicklingError, fullshard's UntrustedCheckpointError
            out[f"extra_{flag}"] = "refused"
    return out


if __name__ == "__main__":
    main()

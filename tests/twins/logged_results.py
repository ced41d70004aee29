"""Twin script: what ``validate``/``test`` return, the rows ``CSVLogger`` writes and what
``callback_metrics``/``logged_metrics`` hold after a call failed (issue 38, the differential
harness's findings). Run by tests/test_logged_results.py under both frameworks::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/logged_results.py --out /tmp/l.json
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from twin import imp, jsonable, main

L = imp()
callbacks = imp("callbacks")
loggers = imp("loggers")
warnings.filterwarnings("ignore")


def data(n: int = 6, batch_size: int = 2, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size)


class Rows(loggers.Logger):
    """A logger that keeps what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Any] = []

    @property
    def name(self) -> str:
        return "rows"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: Any, step: Any = None) -> None:
        self.rows.append([step, {k: round(float(v), 5) for k, v in sorted(metrics.items())}])

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class Base(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, on_epoch=True)
        return loss

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


def csv_rows(path: Path) -> dict[str, Any]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [{k: (round(float(v), 5) if v else None) for k, v in row.items()} for row in reader]
        return {"header": reader.fieldnames, "rows": rows}


# ------------------------------------------------------------------------ validate/test results
class Evaluated(Base):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss = self.loss(batch)
        self.log("val_seen", loss)
        self.log("val_hidden", loss, logger=False, prog_bar=True)
        self.log("val_both", loss, on_step=True, on_epoch=True)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss = self.loss(batch)
        self.log("test_hidden", loss, logger=False)
        self.log("test_stepped", loss, on_step=True, on_epoch=False)
        self.log("test_seen", loss, on_epoch=True)

    def on_test_epoch_end(self) -> None:
        self.log("test_end", 1.0)
        self.log("test_end_hidden", 2.0, logger=False)


def case_results_hold_what_went_to_the_loggers(tmp: Path) -> Any:
    """``logger=False`` values and step-only values are left out of the returned dicts."""
    t = trainer(tmp)
    model = Evaluated()
    return {
        "validate": jsonable(t.validate(model, data(), verbose=False)),
        "validate_metrics": metrics(t),
        "test_one": jsonable(t.test(model, data(), verbose=False)),
        "test_two": jsonable(t.test(model, [data(), data(4, seed=1)], verbose=False)),
        "test_metrics": metrics(t),
    }


# -------------------------------------------------------------------------------- CSVLogger rows
class EpochLogs(Base):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def on_validation_epoch_end(self) -> None:
        self.log("val_mark", float(self.current_epoch))

    def on_train_epoch_end(self) -> None:
        self.log("epoch_mark", float(self.current_epoch) + 0.5)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def case_csv_rows_of_a_fit(tmp: Path) -> Any:
    """A row per call: the validation row and the training epoch's row of the same step apart,
    the learning rate rows, the columns sorted."""
    logger = loggers.CSVLogger(tmp / "logs")
    rows = Rows()
    t = trainer(
        tmp,
        max_epochs=2,
        logger=[logger, rows],
        log_every_n_steps=2,
        num_sanity_val_steps=0,
        callbacks=[callbacks.LearningRateMonitor()],
    )
    t.fit(EpochLogs(), data(), data(4))
    t.test(Evaluated(), [data(), data(4, seed=1)], verbose=False)
    return {"csv": csv_rows(Path(logger.log_dir) / "metrics.csv"), "rows": rows.rows}


class SkipsEveryBatch(EpochLogs):
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        return -1


def case_epoch_row_without_a_step(tmp: Path) -> Any:
    """An epoch that takes no step logs its row at step -1."""
    rows = Rows()
    t = trainer(tmp, max_epochs=2, logger=rows, limit_val_batches=0)
    t.fit(SkipsEveryBatch(), data())
    return rows.rows


# ------------------------------------------------------------------ metrics after a failed call
class FailsInStep(Base):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        if batch_idx == 1:
            raise RuntimeError("fails in its second step")
        return loss


class FailsAfterEpochEnd(EpochLogs):
    pass


def case_metrics_after_a_failed_call(tmp: Path) -> Any:
    """What a failing batch or epoch end logged is gone, unless a callback read it."""
    out: dict[str, Any] = {}
    t = trainer(tmp, logger=Rows(), limit_val_batches=0)
    try:
        t.fit(FailsInStep(), data())
    except RuntimeError:
        out["in_step"] = metrics(t)
    # EarlyStopping reads callback_metrics (after the module's on_train_epoch_end) and raises
    stop = callbacks.EarlyStopping(monitor="missing")
    t = trainer(tmp, logger=Rows(), limit_val_batches=0, callbacks=[stop])
    try:
        t.fit(FailsAfterEpochEnd(), data())
    except RuntimeError:
        out["epoch_end"] = metrics(t)
    return out


class Plateau(EpochLogs):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "missing"}}


def case_plateau_without_its_metric_logs_no_epoch_row(tmp: Path) -> Any:
    """The epoch schedulers step before the epoch's row goes to the loggers."""
    rows = Rows()
    t = trainer(tmp, logger=rows, limit_val_batches=0, log_every_n_steps=1)
    raised = None
    try:
        t.fit(Plateau(), data())
    except Exception as err:  # the type is the observation
        raised = type(err).__name__.startswith("Misconfiguration")
    return {"misconfiguration": raised, "rows": rows.rows, **metrics(t)}


def case_fraction_below_one_batch(tmp: Path) -> Any:
    """A limit_*_batches fraction that rounds down to no batch is refused."""
    out = {}
    for option in ("limit_train_batches", "limit_val_batches"):
        t = trainer(tmp, **{option: 0.2})
        try:
            t.fit(EpochLogs(), data(), data(4))
            out[option] = None
        except Exception as err:  # the type is the observation
            out[option] = type(err).__name__.startswith("Misconfiguration")
    return out


if __name__ == "__main__":
    main()

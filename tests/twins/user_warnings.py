"""Warnings a Lightning user sees, by gist, category and count (issue 38): each case counts the
warnings whose message holds a phrase both frameworks' messages share (they word them apart).

TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/user_warnings.py --out /tmp/l.json
TWIN_FRAMEWORK=fullshard python tests/twins/user_warnings.py --out /tmp/f.json --only case_x
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from twin import caught_warnings, imp, main

L = imp()
loggers = imp("loggers")


def _data(n: int = 12) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4
    )


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def _count(seen: list[warnings.WarningMessage], *needles: str, without: str = "@") -> list[Any]:
    """The categories of the warnings holding every needle (and not ``without``), in order."""
    return [
        w.category.__name__
        for w in seen
        if all(n.lower() in str(w.message).lower() for n in needles) and without not in str(w.message)
    ]


def case_fewer_batches_than_the_logging_interval(tmp: Path) -> Any:
    out = {}
    runs = {
        "one epoch": dict(max_epochs=1),
        "reloaded each epoch": dict(max_epochs=3, reload_dataloaders_every_n_epochs=1),
        "max_steps under the interval": dict(max_steps=2, log_every_n_steps=3),
        "no logger": dict(max_epochs=1, logger=False),
        "accumulating": dict(max_epochs=1, accumulate_grad_batches=3, log_every_n_steps=4),
    }
    for name, kwargs in runs.items():
        with caught_warnings() as seen:
            _trainer(tmp / name, **{"logger": loggers.CSVLogger(tmp / name), **kwargs}).fit(Net(), _data())
        out[name] = _count(seen, "log_every_n_steps=")
    return out


def case_logging_to_no_logger(tmp: Path) -> Any:
    class Logs(Net):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("explicit", loss, logger=True)
            self.log_dict({"a": loss, "b": loss}, logger=True)
            self.log("quiet", loss, logger=False)
            return loss

    out = {}
    for name, logger in (("no logger", False), ("a logger", None)):
        kwargs = {} if logger is False else {"logger": loggers.CSVLogger(tmp)}
        with caught_warnings() as seen:
            _trainer(tmp, max_epochs=1, **kwargs).fit(Logs(), _data())
        out[name] = _count(seen, "logger=True", "no logger configured")
    return out


def case_predict_step_returning_none(tmp: Path) -> Any:
    class Silent(Net):
        def predict_step(self, batch: Any, batch_idx: int) -> None:
            return None

    trainer = _trainer(tmp)
    with caught_warnings() as seen:
        first = trainer.predict(Silent(), _data())
        trainer.predict(Silent(), _data())
    return {"predictions": first, "warned": _count(seen, "returned None")}


def case_empty_dataloaders(tmp: Path) -> Any:
    empty = DataLoader(TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1)), batch_size=4)
    out = {}
    with caught_warnings() as seen:
        trainer = _trainer(tmp, max_epochs=1)
        trainer.fit(Net(), empty)
    # Lightning says it twice, the second time of its wrapper (a CombinedLoader): accepted in
    # docs/lightning.md's harness table; the loader's own warning is compared
    out["empty training loader"] = _count(seen, "dataloader", "zero", without="CombinedLoader")
    out["steps"] = trainer.global_step
    with caught_warnings() as seen:
        _trainer(tmp, max_epochs=1, limit_train_batches=0).fit(Net(), empty)
    out["limit_train_batches=0"] = _count(seen, "dataloader", "zero")
    with caught_warnings() as seen:
        _trainer(tmp).validate(Net(), empty)
    out["empty validation loader"] = _count(seen, "dataloader", "zero")
    return out


def case_scheduler_keys_under_manual_optimization(tmp: Path) -> Any:
    class Manual(Net):
        def __init__(self, config: Any) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.config = config

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            opt = self.optimizers()
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            return loss

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.StepLR(opt, 1)
            return self.config(opt, sched)

    configs = {
        "strict given": lambda o, s: {"optimizer": o, "lr_scheduler": {"scheduler": s, "strict": True}},
        "monitor given": lambda o, s: {"optimizer": o, "lr_scheduler": {"scheduler": s, "monitor": "loss"}},
        "monitor beside": lambda o, s: {"optimizer": o, "lr_scheduler": s, "monitor": "loss"},
        "none": lambda o, s: {"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "step"}},
    }
    out = {}
    for name, config in configs.items():
        with caught_warnings() as seen:
            _trainer(tmp, max_steps=1).fit(Manual(config), _data())
        out[name] = _count(seen, "manual optimization")
    return out


def case_module_batch_hook_beside_a_datamodule(tmp: Path) -> Any:
    class Hooked(Net):
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return batch

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> Any:
            return _data()

    with caught_warnings() as seen:
        _trainer(tmp, max_epochs=1).fit(Hooked(), datamodule=Data())
        _trainer(tmp, max_epochs=1).fit(Hooked(), datamodule=Data())  # said once per process
        _trainer(tmp, max_epochs=1).fit(Hooked(), _data())  # no DataModule: nothing to say
    return _count(seen, "overridden `on_before_batch_transfer` in", "LightningModule")


if __name__ == "__main__":
    main()

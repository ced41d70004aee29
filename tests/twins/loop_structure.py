"""Twin script: the structure of ``fit``'s loops, as the differential harness found it differs
(issue 38): no ``teardown`` hooks after a call that raised, no ``on_train_start``/epochs/
``on_train_end`` when there is nothing to train (nor a request of the training loader with
``limit_train_batches=0``), ``check_val_every_n_epoch=None`` with the default
``val_check_interval``, the refusals of a ``val_check_interval`` above the epoch's batches and of a
fraction too small for one batch, ``min_steps`` alone asking for a whole epoch before a stop, the
last batch of an iterable ending an accumulation window, an epoch the module ends with -1 being
finished for a resume, and a reloaded shuffling loader's order. Run by
tests/test_loop_structure.py under both frameworks::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/loop_structure.py --out /tmp/l.json
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from twin import imp, main

L = imp()
callbacks = imp("callbacks")
warnings.filterwarnings("ignore")


def data(n: int = 8, batch_size: int = 2, shuffle: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size, shuffle=shuffle)


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 4, generator=g)

    def __iter__(self) -> Any:
        return iter((x, x.sum(0, keepdim=True)) for x in self.x)


class Seen(L.Callback):
    """Records the hooks that mark the loops' structure, with the step they came at."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def _saw(self, name: str, trainer: Any) -> None:
        self.seen.append([name, trainer.global_step])

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._saw("setup", trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._saw("teardown", trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_start", trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_end", trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_epoch_start", trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_train_epoch_end", trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_validation_start", trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._saw("on_exception", trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._saw("on_fit_end", trainer)


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.calls: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls.append(["train", batch_idx, round(float(batch[0][0, 0]), 4)])
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def teardown(self, stage: str) -> None:
        self.calls.append(["teardown", stage])

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(["step", self.trainer.global_step])
        super().optimizer_step(*args, **kwargs)


def trainer(tmp: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "default_root_dir": tmp, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
        "enable_model_summary": False, "accelerator": "cpu", "devices": 1, "num_sanity_val_steps": 0,
    }  # fmt: skip
    options.update(kwargs)
    return L.Trainer(**options)


def error(fn: Any) -> Any:
    """What ``fn`` raised: its type (by the name a ported script catches it with), and the
    settings its message names."""
    try:
        fn()
    except Exception as err:  # the error is the observation
        name = {"MisconfigurationError": "MisconfigurationException"}.get(
            type(err).__name__, type(err).__name__
        )
        words = ("val_check_interval", "limit_train_batches", "limit_val_batches")
        return [name, [w for w in words if w in str(err)]]
    return None


class Fails(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        raise RuntimeError("boom")


def case_no_teardown_after_a_failure(tmp: Path) -> Any:
    seen, model = Seen(), Fails()
    t = trainer(tmp, callbacks=[seen], max_epochs=1)
    out: Any = {"fit": error(lambda: t.fit(model, data()))}
    out["hooks"], out["module"] = seen.seen, model.calls
    return out


class Data(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def train_dataloader(self) -> DataLoader:
        self.asked.append("train")
        return data()

    def val_dataloader(self) -> DataLoader:
        self.asked.append("val")
        return data()


def case_nothing_to_train(tmp: Path) -> Any:
    out = {}
    for name, options, loader in (
        ("limit_0", {"limit_train_batches": 0}, None),
        ("empty", {}, data(0)),
    ):
        seen, model, datamodule = Seen(), Net(), Data()
        t = trainer(tmp, callbacks=[seen], max_epochs=2, **options)
        if loader is None:
            t.fit(model, datamodule=datamodule)
        else:
            t.fit(model, loader)
        out[name] = [seen.seen, datamodule.asked, model.calls]
    # resumed at max_epochs already: nothing left to train either
    first = trainer(tmp, max_epochs=1)
    first.fit(Net(), data())
    first.save_checkpoint(tmp / "done.ckpt")
    seen = Seen()
    trainer(tmp, callbacks=[seen], max_epochs=1).fit(Net(), data(), ckpt_path=tmp / "done.ckpt")
    out["resumed_done"] = seen.seen
    return out


def case_validation_schedules(tmp: Path) -> Any:
    out: dict[str, Any] = {}
    seen = Seen()
    trainer(tmp, callbacks=[seen], max_epochs=2, check_val_every_n_epoch=None).fit(Net(), data(), data(4))
    out["epoch_none_default_interval"] = [s for s in seen.seen if s[0] == "on_validation_start"]
    out["interval_above_batches"] = error(
        lambda: trainer(tmp, max_epochs=1, val_check_interval=5).fit(Net(), data(), data(4))
    )
    out["interval_above_batches_no_validation_step"] = error(
        lambda: trainer(tmp, max_epochs=1, val_check_interval=5).fit(NoValidation(), data())
    )
    out["interval_above_batches_limit_val_0"] = error(
        lambda: trainer(tmp, max_epochs=1, val_check_interval=5, limit_val_batches=0).fit(
            Net(), data(), data(4)
        )
    )
    out["fraction_below_one_batch"] = error(
        lambda: trainer(tmp, max_epochs=1, limit_train_batches=0.1).fit(Net(), data())
    )
    return out


class NoValidation(Net):
    validation_step = None  # type: ignore[assignment]


class StopsAtValidation(Net):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.trainer.should_stop = True


def case_min_steps_alone_asks_for_an_epoch(tmp: Path) -> Any:
    model = StopsAtValidation()
    t = trainer(tmp, max_epochs=3, val_check_interval=2, min_steps=1)
    t.fit(model, data(), data(2))
    return [t.global_step, t.current_epoch]


def case_iterable_last_batch_ends_the_window(tmp: Path) -> Any:
    model = Net()
    t = trainer(tmp, max_epochs=1, accumulate_grad_batches=3)
    t.fit(model, DataLoader(Stream(10), batch_size=2))
    return [t.global_step, [c for c in model.calls if c[0] == "step"]]


class SkipsRest(Net):
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        return -1 if batch_idx == 2 else None


def case_an_epoch_ended_with_minus_one_resumes_at_the_next(tmp: Path) -> Any:
    first = trainer(tmp, max_epochs=2)
    first.fit(SkipsRest(), data())
    first.save_checkpoint(tmp / "cut.ckpt")
    seen, model = Seen(), SkipsRest()
    more = trainer(tmp, callbacks=[seen], max_epochs=3)
    more.fit(model, data(), ckpt_path=tmp / "cut.ckpt")
    return [first.current_epoch, more.global_step, more.current_epoch, seen.seen, model.calls]


def case_a_reloaded_shuffling_loader_draws_as_lightning(tmp: Path) -> Any:
    L.seed_everything(3)
    model = Net()
    trainer(tmp, max_epochs=3, reload_dataloaders_every_n_epochs=1).fit(model, data(shuffle=True))
    return [c for c in model.calls if c[0] == "train"]


if __name__ == "__main__":
    main()

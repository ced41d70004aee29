"""When the Trainer steps learning-rate schedulers, as Lightning 2.6.6 does it: a "step"
scheduler's frequency counts batches in the epoch (from 1), at accumulation boundaries; an
"epoch" one steps at the epoch's last batch, not when ``max_steps`` cuts the epoch short;
``on_train_batch_start`` returning -1 makes that batch the epoch's last (the schedulers due then
step); a ``ReduceLROnPlateau`` whose metric is missing raises (strict) or warns and skips.
What a checkpoint records of such epochs: after -1 the epoch is finished (a resumed run goes on
with the next one), after ``max_steps`` its top-level ``"epoch"`` is ``current_epoch``.

TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/scheduler_stepping.py --out /tmp/l.json
TWIN_FRAMEWORK=fullshard python tests/twins/scheduler_stepping.py --out /tmp/f.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from twin import caught_warnings, imp, main

L = imp()
MisconfigurationException = imp("utilities.exceptions").MisconfigurationException


def trainer(**kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        max_epochs=2,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def samples(n: int) -> TensorDataset:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


def data(batches: int) -> DataLoader:
    return DataLoader(samples(batches * 2), batch_size=2)


class Stream(IterableDataset):
    """Batches of unknown number: the loop learns the last one by fetching ahead."""

    def __init__(self, n: int) -> None:
        self.data = samples(n)

    def __iter__(self) -> Any:
        return iter(self.data)


class Net(L.LightningModule):
    """Records (epoch, batch_idx, global_step, the scheduler's name, metric given) at each
    ``lr_scheduler_step``. ``schedulers``: (kind, interval, frequency) per scheduler, kind
    "step" (StepLR) or "plateau" (ReduceLROnPlateau on ``monitor``)."""

    def __init__(
        self,
        schedulers: list[tuple[str, str, int]],
        stop_at: int | None = None,
        monitor: str = "val_loss",
        strict: bool = True,
    ) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.layer = torch.nn.Linear(3, 1)
        self.schedulers = schedulers
        self.stop_at = stop_at
        self.monitor = monitor
        self.strict = strict
        self.batch = -1
        self.calls: list[Any] = []
        self.trained: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.batch = batch_idx
        self.trained.append([self.current_epoch, batch_idx])
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        self.batch = batch_idx
        return -1 if batch_idx == self.stop_at else None

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        self.calls.append(
            [
                self.current_epoch,
                self.batch,
                self.trainer.global_step,
                type(scheduler).__name__,
                metric is not None,
            ]
        )
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        configs = []
        for kind, interval, frequency in self.schedulers:
            if kind == "plateau":
                scheduler: Any = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
                configs.append(
                    {
                        "scheduler": scheduler,
                        "interval": interval,
                        "frequency": frequency,
                        "monitor": self.monitor,
                        "strict": self.strict,
                    }
                )
            else:
                scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
                configs.append({"scheduler": scheduler, "interval": interval, "frequency": frequency})
        return [optimizer], configs


class ClipsItself(Net):
    """The same through an overridden ``configure_gradient_clipping`` (the closure path)."""

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")


def fit(t: Any, *args: Any) -> dict[str, Any]:
    """Whether ``t.fit(*args)`` raised Lightning's MisconfigurationException (fullshard's
    MisconfigurationError under its alias), or None."""
    try:
        t.fit(*args)
    except MisconfigurationException as err:
        return {"raised": "MisconfigurationException", "names monitor": "absent" in str(err)}
    return {"raised": None}


def observe(model: Net, t: Any) -> dict[str, Any]:
    return {"calls": model.calls, "global_step": t.global_step, "epoch": t.current_epoch}


def _before_optimizer(seen: list[Any]) -> int:
    return sum("before `optimizer.step()`" in str(w.message) for w in seen)


def case_step_frequency_counts_batches_in_epoch(tmp: Path) -> Any:
    model = Net([("step", "step", 2), ("step", "epoch", 1)])
    t = trainer()
    t.fit(model, data(5))
    return observe(model, t)


def case_step_frequency_with_accumulation(tmp: Path) -> Any:
    # 7 batches, windows of 2: boundaries at batches 1, 3, 5 and the last (6)
    model = Net([("step", "step", 2), ("step", "step", 3)])
    t = trainer(accumulate_grad_batches=2)
    t.fit(model, data(7))
    return observe(model, t)


def case_step_frequency_with_clipping_hook(tmp: Path) -> Any:
    model = ClipsItself([("step", "step", 2)])
    t = trainer(accumulate_grad_batches=3, gradient_clip_val=0.5)
    t.fit(model, data(7))
    return observe(model, t)


def case_epoch_cut_by_hook(tmp: Path) -> Any:
    # -1 at the first batch: the schedulers due step before any optimizer did (torch warns)
    model = Net(
        [("step", "step", 1), ("step", "epoch", 1), ("plateau", "epoch", 1)], stop_at=0, monitor="absent"
    )
    with caught_warnings() as seen:
        t = trainer(max_epochs=1)
        result = fit(t, model, data(4))
    return {**observe(model, t), **result, "warned before optimizer": _before_optimizer(seen)}


def case_epoch_cut_by_hook_later(tmp: Path) -> Any:
    model = Net([("step", "step", 2), ("step", "epoch", 1), ("plateau", "step", 2)], stop_at=1)
    t = trainer(max_epochs=3)
    result = fit(t, model, data(4), data(2))
    return {**observe(model, t), **result}


def case_epoch_cut_by_max_steps(tmp: Path) -> Any:
    model = Net([("step", "epoch", 1), ("plateau", "epoch", 1)], monitor="train_loss")
    t = trainer(max_steps=3, max_epochs=-1)
    t.fit(model, data(4))
    return observe(model, t)


def case_iterable_last_batch_steps(tmp: Path) -> Any:
    # 5 batches of unknown number, windows of 2: the last batch (4) ends a window
    model = Net([("step", "step", 1), ("step", "epoch", 1)])
    t = trainer(accumulate_grad_batches=2)
    t.fit(model, DataLoader(Stream(10), batch_size=2))
    return observe(model, t)


def case_plateau_metric_missing_strict(tmp: Path) -> Any:
    model = Net([("plateau", "epoch", 1)], monitor="absent")
    t = trainer()
    result = fit(t, model, data(3))
    return {**result, **observe(model, t)}


def case_plateau_metric_missing_not_strict(tmp: Path) -> Any:
    model = Net([("plateau", "step", 1)], monitor="absent", strict=False)
    with caught_warnings() as seen:
        t = trainer(max_epochs=1)
        result = fit(t, model, data(3))
    runtime = [w for w in seen if "absent" in str(w.message)]
    return {
        **result,
        **observe(model, t),
        "warnings": len(runtime),
        "categories": sorted({w.category.__name__ for w in runtime}),
    }


def _saved(path: str) -> list[Any]:
    checkpoint = torch.load(path, weights_only=False)
    return [checkpoint["epoch"], checkpoint["global_step"]]


def case_resume_after_epoch_ended_by_hook(tmp: Path) -> Any:
    model = Net([("step", "epoch", 1)], stop_at=2)
    t = trainer()
    t.fit(model, data(4))
    t.save_checkpoint("after.ckpt")
    resumed = Net([("step", "epoch", 1)], stop_at=2)
    more = trainer(max_epochs=3)
    more.fit(resumed, data(4), ckpt_path="after.ckpt")
    return {
        "saved": _saved("after.ckpt"),
        "first": observe(model, t),
        "resumed": {**observe(resumed, more), "trained": resumed.trained},
    }


def case_checkpoint_epoch_after_max_steps(tmp: Path) -> Any:
    # the cut epoch is what fullshard resumes from (docs/lightning.md, "Resuming is exact");
    # the top-level "epoch" is current_epoch, as Lightning writes it
    model = Net([])
    t = trainer(
        max_steps=1,
        enable_checkpointing=True,
        callbacks=[imp("callbacks").ModelCheckpoint(dirpath="ckpts", save_last=True, save_top_k=0)],
    )
    t.fit(model, data(3))
    t.save_checkpoint("after.ckpt")
    return {"saved": _saved("after.ckpt"), "last": _saved("ckpts/last.ckpt"), "epoch": t.current_epoch}


if __name__ == "__main__":
    main()

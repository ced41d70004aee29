"""Data loading as Lightning's: the training sampler's order, fetching a batch ahead, CombinedLoader.

TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/data_loading.py --out /tmp/l.json
TWIN_FRAMEWORK=fullshard python tests/twins/data_loading.py --out /tmp/f.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from twin import imp, main, raised

L = imp()


class Indices(Dataset[torch.Tensor]):
    """Sample ``i`` is ``i``: a batch says which samples it holds."""

    def __init__(self, length: int, offset: int = 0) -> None:
        self.length, self.offset = length, offset

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(float(i + self.offset))


class Counter:
    value = 0


class ReadsCounter(IterableDataset[torch.Tensor]):
    """An iterable dataset (no length) whose items read a counter the steps change, as a replay
    buffer filled by the training step: the values show when each item was drawn."""

    def __init__(self, counter: Counter, items: int) -> None:
        self.counter, self.items = counter, items

    def __iter__(self) -> Any:
        for _ in range(self.items):
            yield torch.tensor(float(self.counter.value))


def trainer(**kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return L.Trainer(**options)


class Recorder(L.LightningModule):
    """Records what each step saw: (epoch, batch_idx, batch values)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[str, list[Any]] = {"train": [], "val": [], "predict": []}

    def _loss(self, batch: Any) -> torch.Tensor:
        flat = [t for t in (batch.values() if isinstance(batch, dict) else [batch]) if t is not None]
        return sum(self.layer(t.float().view(-1, 1)).mean() for t in flat)  # type: ignore[return-value]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen["train"].append([self.current_epoch, batch_idx, batch])
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen["val"].append([self.current_epoch, batch_idx, batch])

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen["predict"].append([batch_idx, batch])
        return batch

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


# ------------------------------------------------------------------------ the training sampler
def case_sampler_ddp_unshuffled_loader(tmp: Path) -> Any:
    """Under DDP (one device) Lightning's sampler shuffles a ``shuffle=False`` training loader,
    with the seed of seed_everything, each epoch anew; the validation loader keeps its order."""
    L.seed_everything(3)
    model = Recorder()
    t = trainer(strategy="ddp", max_epochs=2)
    t.fit(model, DataLoader(Indices(10), batch_size=3), DataLoader(Indices(4, 100), batch_size=2))
    return model.seen


def case_sampler_single_device_unshuffled_loader(tmp: Path) -> Any:
    """On one device without a distributed strategy no sampler is added: the loader's order."""
    L.seed_everything(3)
    model = Recorder()
    trainer(max_epochs=2).fit(model, DataLoader(Indices(7), batch_size=3))
    return model.seen


# ------------------------------------------------------------------ fetching a batch ahead
class CounterModel(Recorder):
    """Every hook and step moves the counter the iterable datasets read."""

    def __init__(self, counter: Counter) -> None:
        super().__init__()
        self.counter = counter
        self.last: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.last.append(self.trainer.is_last_batch)
        self.counter.value += 1
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.counter.value += 1
        super().validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        self.counter.value += 1
        return super().predict_step(batch, batch_idx)

    def on_train_start(self) -> None:
        self.counter.value += 100

    def on_train_epoch_start(self) -> None:
        self.counter.value += 1000

    def on_validation_start(self) -> None:
        self.counter.value += 10000

    def on_predict_start(self) -> None:
        self.counter.value += 10000


def case_fetch_ahead_iterable(tmp: Path) -> Any:
    """Lightning draws an unsized loader's first batch before ``on_train_start`` and each next one
    before the step of the current one: the values the steps see show that order; the last batch
    is known (``is_last_batch``), so validation runs at the end of each epoch."""
    counter = Counter()
    model = CounterModel(counter)
    data = ReadsCounter(counter, 4)
    t = trainer(max_epochs=2)
    t.fit(model, DataLoader(data, batch_size=None), DataLoader(ReadsCounter(counter, 3), batch_size=None))
    t.predict(model, DataLoader(ReadsCounter(counter, 3), batch_size=None))
    return {"seen": model.seen, "is_last_batch": model.last, "counter": counter.value}


def case_fetch_ahead_iterable_with_limit(tmp: Path) -> Any:
    """With an integer ``limit_train_batches`` the number of batches is known: no batch is
    fetched ahead (Lightning's rule)."""
    counter = Counter()
    model = CounterModel(counter)
    t = trainer(max_epochs=2, limit_train_batches=3)
    t.fit(model, DataLoader(ReadsCounter(counter, 5), batch_size=None))
    return {"seen": model.seen, "is_last_batch": model.last, "counter": counter.value}


# ------------------------------------------------------------------------------ CombinedLoader
def loaders(*lengths: int, batch_size: int = 2) -> list[DataLoader[torch.Tensor]]:
    """Loaders over ``Indices`` of ``lengths``, told apart by their offsets (0, 100, 200, ...)."""
    return [DataLoader(Indices(n, 100 * i), batch_size=batch_size) for i, n in enumerate(lengths)]


def case_combined_loader_alone(tmp: Path) -> Any:
    """Iterated by hand: the batches, ``batch_idx``, ``dataloader_idx`` and ``len`` of each mode,
    with and without limits, over a dict and a nested structure; an unknown mode is refused."""
    CombinedLoader = imp("utilities").CombinedLoader
    out: dict[str, Any] = {}
    for mode in ("min_size", "max_size_cycle", "max_size", "sequential"):
        a, b = loaders(5, 9)
        for limits in (None, [2, 3]):
            combined = CombinedLoader({"a": a, "b": b}, mode)
            if limits is not None:
                combined.limits = limits
            seen = list(iter(combined))
            out[f"{mode}/{limits}"] = {"seen": seen, "len": len(combined)}
        nested = CombinedLoader({"x": [a, b], "y": (b,)}, mode)
        out[f"{mode}/nested"] = {"seen": list(iter(nested)), "len": len(nested)}
        out[f"{mode}/sampler"] = type(nested.sampler["x"][1]).__name__
    out["bad mode"] = raised(lambda: CombinedLoader([], "longest"))
    return out


class Combined(Recorder):
    """Logs a value of each step's batch, takes ``dataloader_idx`` in evaluation."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        flat = batch.values() if isinstance(batch, dict) else batch
        self.log("first", sum(float(t[0]) for t in flat if t is not None), on_epoch=True)
        return super().training_step(batch if isinstance(batch, dict) else dict(enumerate(batch)), batch_idx)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen["val"].append([self.current_epoch, batch_idx, dataloader_idx, batch])
        flat = batch.values() if isinstance(batch, dict) else [batch]
        self.log("v", sum(float(t.view(-1)[0]) for t in flat))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        self.seen["predict"].append([batch_idx, dataloader_idx, batch])
        return batch


def case_combined_training(tmp: Path) -> Any:
    """``fit`` over a dict of loaders (``max_size_cycle``), and over a CombinedLoader of each
    other mode, with limits: the batches each step got, the batch counts, the logged values;
    ``sequential`` is refused."""
    CombinedLoader = imp("utilities").CombinedLoader
    out: dict[str, Any] = {}
    for name, train, limit in (
        ("dict", lambda: dict(zip("ab", loaders(4, 9), strict=True)), 1.0),
        ("list limited", lambda: loaders(4, 9, 3), 3),
        ("min_size", lambda: CombinedLoader(loaders(4, 9), "min_size"), 1.0),
        ("max_size", lambda: CombinedLoader(dict(zip("ab", loaders(4, 9), strict=True)), "max_size"), 0.5),
    ):
        model = Combined()
        t = trainer(max_epochs=2, limit_train_batches=limit)
        t.fit(model, train())
        out[name] = {
            "seen": model.seen["train"],
            "batches": t.num_training_batches,
            "metrics": dict(t.callback_metrics),
            "train_dataloader": type(t.train_dataloader).__name__,
        }
    t = trainer(max_epochs=1)
    out["sequential"] = raised(lambda: t.fit(Combined(), CombinedLoader(loaders(4, 9), "sequential")))
    return out


def case_combined_evaluation(tmp: Path) -> Any:
    """``validate`` with a sequential CombinedLoader (``dataloader_idx``) and a ``min_size`` one
    (combined batches), ``predict`` with a sequential one; other modes are refused in ``predict``."""
    CombinedLoader = imp("utilities").CombinedLoader
    model = Combined()
    t = trainer(limit_val_batches=2)
    sequential = t.validate(model, CombinedLoader(loaders(3, 5), "sequential"), verbose=False)
    counts = t.num_val_batches
    together = t.validate(
        model, CombinedLoader(dict(zip("ab", loaders(3, 5), strict=True)), "min_size"), verbose=False
    )
    predictions = t.predict(model, CombinedLoader(loaders(3, 2), "sequential"))
    refused = raised(lambda: t.predict(model, CombinedLoader(loaders(3, 2), "max_size")))
    return {
        "seen": model.seen,
        "results": [sequential, together],
        "num_val_batches": counts,
        "predictions": predictions,
        "refused": refused,
    }


if __name__ == "__main__":
    main()

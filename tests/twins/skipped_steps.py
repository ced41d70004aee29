"""A ``training_step`` that returns None, as Lightning 2.6.6 counts it: the batch adds no
gradient, the optimizer step of its accumulation window still runs and counts (``global_step``,
step-interval schedulers, ``max_steps``), ``on_train_batch_end`` gets ``{}``, a warning once.

TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/skipped_steps.py --out /tmp/l.json
TWIN_FRAMEWORK=fullshard python tests/twins/skipped_steps.py --out /tmp/f.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from twin import caught_warnings, imp, main

L = imp()


def trainer(**kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def data(n: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n * 2, 3, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)


class Skipping(L.LightningModule):
    """Returns None at the batches in ``none_at``; records what each step and hook sees."""

    def __init__(self, none_at: tuple[int, ...], dict_output: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.layer = torch.nn.Linear(3, 1)
        self.none_at = none_at
        self.dict_output = dict_output
        self.seen: list[Any] = []
        self.ends: list[Any] = []
        self.calls = {"on_before_zero_grad": 0, "on_before_optimizer_step": 0}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        scheduler = self.lr_schedulers()
        self.seen.append(
            [
                batch_idx,
                self.trainer.global_step,
                scheduler.last_epoch,
                self.optimizers().param_groups[0]["lr"],
            ]
        )
        if batch_idx in self.none_at:
            return None
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x).float(), y)
        return {"loss": loss, "extra": batch_idx} if self.dict_output else loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ends.append(sorted(outputs) if isinstance(outputs, dict) else repr(outputs))

    def on_before_zero_grad(self, optimizer: Any) -> None:
        self.calls["on_before_zero_grad"] += 1

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.calls["on_before_optimizer_step"] += 1

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class SkippingWithHook(Skipping):
    """The same, through an overridden ``optimizer_step`` (the closure path)."""

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        self.calls.setdefault("optimizer_step", 0)
        self.calls["optimizer_step"] += 1
        optimizer.step(closure=optimizer_closure)


def observe(model: Skipping, t: Any) -> dict[str, Any]:
    return {
        "global_step": t.global_step,
        "seen": model.seen,
        "batch ends": model.ends,
        "calls": model.calls,
        "weights": [p.detach().float() for p in model.layer.parameters()],
    }


def _warnings_about_none(seen: list[Any]) -> int:
    texts = [str(w.message).lower() for w in seen]
    return sum("training_step" in t and "returned" in t and "none" in t for t in texts)


# kept first: the warning is given once per process (Lightning's warning cache)
def case_warning_once(tmp: Path) -> Any:
    counts = []
    for _ in range(2):
        with caught_warnings() as seen:
            trainer().fit(Skipping(none_at=(1, 3)), data(4))
        counts.append(_warnings_about_none(seen))
    return counts


def case_none_accumulate_1(tmp: Path) -> Any:
    model = Skipping(none_at=(1, 3, 5), dict_output=True)
    t = trainer(gradient_clip_val=0.05)
    t.fit(model, data(6))
    return observe(model, t)


def case_none_accumulate_2(tmp: Path) -> Any:
    # window [0,1]: None last; [2,3]: None first; [4,5]: None both; [6,7]: no None
    model = Skipping(none_at=(1, 2, 4, 5))
    t = trainer(accumulate_grad_batches=2, gradient_clip_val=0.05)
    t.fit(model, data(8))
    return observe(model, t)


def case_none_accumulate_3_uneven(tmp: Path) -> Any:
    model = Skipping(none_at=(3, 4, 6))  # the last window (6) is cut short, all None
    t = trainer(accumulate_grad_batches=3)
    t.fit(model, data(7))
    return observe(model, t)


def case_max_steps_counts_none(tmp: Path) -> Any:
    model = Skipping(none_at=(0, 2))
    t = trainer(max_steps=3, max_epochs=-1)
    t.fit(model, data(8))
    return observe(model, t)


def case_bf16_mixed(tmp: Path) -> Any:
    model = Skipping(none_at=(0, 3))
    t = trainer(precision="bf16-mixed", gradient_clip_val=0.05)
    t.fit(model, data(5))
    return observe(model, t)


def case_optimizer_step_hook(tmp: Path) -> Any:
    model = SkippingWithHook(none_at=(1, 2, 4, 5))
    t = trainer(accumulate_grad_batches=2, gradient_clip_val=0.05)
    t.fit(model, data(8))
    return observe(model, t)


if __name__ == "__main__":
    main()

"""Resuming after a callback changed the optimizer, and the checks made when resuming, under
Lightning 2.6.6 and fullshard (tests/test_resume_callbacks.py compares them).

Run one framework by hand::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/resume_callbacks.py --out /tmp/l.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from twin import caught_warnings, imp, main, raised, warned

L = imp()
callbacks = imp("callbacks")


class Net(L.LightningModule):
    """A backbone with batch norm and a head; SGD with momentum over the trainable parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.head(self.backbone(x)), y)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(32, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=8)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)


class Plain(Net):
    """No batch norm (SWA would add an epoch for it under Lightning)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))


def trainer(tmp: Path, cbs: list[Any], **kwargs: Any) -> Any:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
        callbacks=cbs,
        **kwargs,
    )


def sums(model: nn.Module) -> dict[str, float]:
    return {k: float(v.double().sum()) for k, v in model.state_dict().items()}


def fit_straight_and_resumed(
    tmp: Path, make: Any, callback: Any, first: dict[str, Any], second: dict[str, Any]
) -> dict[str, Any]:
    L.seed_everything(0)
    straight = make()
    t = trainer(tmp / "straight", [callback()], **second)
    t.fit(straight)
    L.seed_everything(0)
    half = make()
    t = trainer(tmp / "half", [callback()], **first)
    t.fit(half)
    t.save_checkpoint(tmp / "mid.ckpt")
    resumed = make()
    t = trainer(tmp / "resumed", [callback()], **second)
    out = raised(lambda: t.fit(resumed, ckpt_path=tmp / "mid.ckpt"))
    groups = [{"n": len(g["params"]), "lr": g["lr"]} for g in t.optimizers[0].param_groups]
    a, b = sums(straight), sums(resumed)
    return {
        "fit": out,
        "resumed": b,
        "groups": groups,
        "global_step": t.global_step,
        "same_as_straight": all(abs(a[k] - b[k]) < 1e-5 for k in a),
    }


def case_resume_after_backbone_unfrozen(tmp: Path) -> Any:
    def callback() -> Any:
        return callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda e: 1.5)

    return fit_straight_and_resumed(tmp, Net, callback, {"max_epochs": 2}, {"max_epochs": 4})


def case_resume_after_swa_started(tmp: Path) -> Any:
    def callback() -> Any:
        return callbacks.StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=2)

    # stopped by max_steps (not max_epochs: SWA would end and put the average into the model)
    return fit_straight_and_resumed(
        tmp, Plain, callback, {"max_epochs": 5, "max_steps": 12}, {"max_epochs": 5}
    )


class Sched(Plain):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]


def case_resume_after_swa_replaced_a_scheduler(tmp: Path) -> Any:
    def callback() -> Any:
        return callbacks.StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=2)

    return fit_straight_and_resumed(
        tmp, Sched, callback, {"max_epochs": 5, "max_steps": 12}, {"max_epochs": 5}
    )


def case_resume_with_max_epochs_below_the_checkpoints(tmp: Path) -> Any:
    L.seed_everything(0)
    t = trainer(tmp, [], max_epochs=3)
    t.fit(Net())
    t.save_checkpoint(tmp / "end.ckpt")
    out = {}
    for max_epochs in (1, 2, 3, 4):
        t = trainer(tmp / str(max_epochs), [], max_epochs=max_epochs)
        try:
            t.fit(Net(), ckpt_path=tmp / "end.ckpt")
            seen = None
        except Exception as err:  # Lightning's MisconfigurationException is fullshard's MisconfigurationError
            name = type(err).__name__
            seen = {
                "misconfiguration": name.startswith("Misconfiguration"),
                "gist": ["current_epoch=3" in str(err), f"max_epochs={max_epochs}" in str(err)],
            }
        # (the step a failed resume leaves differs: Lightning has restored its counters by then)
        out[max_epochs] = {"raised": seen} if seen else {"raised": None, "global_step": t.global_step}
    return out


class Counter(L.Callback):
    """A callback with a state of its own."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches = state_dict["batches"]


def case_resume_without_a_callback_the_checkpoint_holds(tmp: Path) -> Any:
    L.seed_everything(0)
    t = trainer(tmp, [Counter()], max_epochs=2)
    t.fit(Net())
    t.save_checkpoint(tmp / "mid.ckpt")
    needle = "callbacks used to create the checkpoint need to be"
    out = {}
    for name, counter in (("without", None), ("with", Counter())):
        t = trainer(tmp / name, [counter] if counter else [], max_epochs=3)
        with caught_warnings() as seen:
            t.fit(Net(), ckpt_path=tmp / "mid.ckpt")
        out[name] = warned(seen, needle) + ([counter.batches] if counter else [])
    return out


if __name__ == "__main__":
    main()

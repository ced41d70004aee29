"""One model through several Trainers, as a notebook runs it: fit, then a new Trainer resumes it
from a checkpoint (``fit(model, ckpt_path=...)``), validates it or fits it again; a model that
ran backward passes outside the loops (the user's, a callback's in ``on_fit_start``) resumed;
what each step's loss was and which gradients the loops start with. Adam keeps a per-parameter
state, so a resume that lost it shows in the losses.

TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/model_reuse.py --out /tmp/l.json
TWIN_FRAMEWORK=fullshard python tests/twins/model_reuse.py --out /tmp/f.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from twin import imp, main, raised

L = imp()


def trainer(epochs: int, **kwargs: Any) -> Any:
    """A Trainer that runs to the end of epoch ``epochs`` (2 steps an epoch): a checkpoint saved at
    its end resumes in the next epoch (a mid-epoch one would resume differently in Lightning,
    docs/lightning.md: "Resuming is exact")."""
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def loader() -> DataLoader[Any]:
    """Two batches an epoch: the first Trainer's checkpoint is at an epoch's end."""
    return DataLoader(
        TensorDataset(torch.randn(8, 4, generator=torch.Generator().manual_seed(3))), batch_size=4
    )


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.1)


class GradientsAtStart(L.Callback):
    """Whether each parameter holds a gradient when training starts (after the checkpoint loaded)."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.seen = [p.grad is not None for p in pl_module.parameters()]


def fitted() -> tuple[Tiny, Path]:
    """A model fit for an epoch by a first Trainer, and the checkpoint it saved."""
    L.seed_everything(0)
    model = Tiny()
    first = trainer(1)
    first.fit(model, loader())
    first.save_checkpoint("first.ckpt")
    model.losses.clear()
    return model, Path("first.ckpt")


def case_resume_in_a_new_trainer(tmp: Path) -> dict[str, Any]:
    model, ckpt = fitted()
    gradients = GradientsAtStart()
    second = trainer(2, callbacks=[gradients])
    outcome = raised(lambda: second.fit(model, loader(), ckpt_path=ckpt))
    return {
        **outcome,
        "global_step": second.global_step,
        "losses": model.losses,  # Adam's state resumed: an uninterrupted run's third and fourth
        "gradients at train start": gradients.seen,
    }


def case_validate_fit_again_then_resume(tmp: Path) -> dict[str, Any]:
    model, ckpt = fitted()
    metrics = trainer(2).validate(model, loader(), verbose=False)
    gradients_after_validate = [p.grad is not None for p in model.parameters()]
    again = trainer(1)
    again.fit(model, loader())  # no checkpoint: the weights go on from where they are
    after_again = list(model.losses)
    model.losses.clear()
    third = trainer(2)
    outcome = raised(lambda: third.fit(model, loader(), ckpt_path=ckpt))
    return {
        **outcome,
        "validated": metrics,
        "gradients after validate": gradients_after_validate,
        "steps": [again.global_step, third.global_step],
        "losses": [after_again, model.losses],
    }


class ProbeAtFitStart(L.Callback):
    """A backward pass in ``on_fit_start`` (a gradient-norm probe, say), after the resumed
    callbacks' states and before the optimizers' (Lightning's order)."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module.layer(torch.ones(1, 4)).sum().backward()


def case_resume_after_backward_passes_outside_the_loops(tmp: Path) -> dict[str, Any]:
    _, ckpt = fitted()
    model = Tiny()
    model.layer(torch.ones(1, 4)).sum().backward()  # a notebook's check of the model
    gradients = GradientsAtStart()
    second = trainer(2, callbacks=[ProbeAtFitStart(), gradients])
    outcome = raised(lambda: second.fit(model, loader(), ckpt_path=ckpt))
    return {**outcome, "losses": model.losses, "gradients at train start": gradients.seen}


if __name__ == "__main__":
    main()

"""A GAN trained with manual optimization on 2 CPU processes; used by tests/test_manual_optimization.py.

python tests/scripts/manual_opt_job.py --out DIR --strategy ddp

Runs, in one job: the whole training (2 epochs); then the first epoch, a checkpoint, and a
resumed fit to the end; then the training with manual gradient accumulation (a step every 2
batches, the other batches inside ``no_backward_sync``; not with FSDP1); under FSDP, a fit whose root unit holds
parameters, which is refused. Rank 0 writes ``OUT/result.json``:
the final weights of each run (as lists), its global steps, and whether the optimizers' states
were in the checkpoint. The test compares them with one process of plain PyTorch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.errors import MisconfigurationError
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy

CLIP, LR_G, LR_D = 0.05, 0.05, 0.1


class Generator(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))


class Discriminator(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))


def noise(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(3.0 * x.flip(-1))


def losses(gan: Any, real: torch.Tensor) -> tuple[torch.Tensor, Any]:
    fake = gan.generator(noise(real))
    return F.softplus(-gan.discriminator(fake)).mean(), fake


def d_loss(gan: Any, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    return (F.softplus(-gan.discriminator(real)) + F.softplus(gan.discriminator(fake.detach()))).mean()


class GAN(fullshard.LightningModule):
    def __init__(self, accumulate: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.accumulate = accumulate
        self.generator = Generator()
        self.discriminator = Discriminator()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        stepping = (batch_idx + 1) % self.accumulate == 0
        with opt_g.toggle_model(sync_grad=stepping):
            g_loss, fake = losses(self, real)
            self.manual_backward(g_loss / self.accumulate)
        if stepping:
            self.clip_gradients(opt_g, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
            opt_g.step()
            opt_g.zero_grad()
        with opt_d.toggle_model(sync_grad=stepping):
            loss = d_loss(self, real, fake)
            self.manual_backward(loss / self.accumulate)
        if stepping:
            opt_d.step()
            opt_d.zero_grad()
        return loss

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.Adam(self.generator.parameters(), lr=LR_G),
            torch.optim.SGD(self.discriminator.parameters(), lr=LR_D, momentum=0.9),
        ]


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(64, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0]))


def make_strategy(name: str) -> Any:
    if name == "ddp":
        return DDPStrategy(find_unused_parameters=True)
    units = {Generator, Discriminator}
    return FSDPStrategy(auto_wrap_policy=units) if name == "fsdp" else FSDP2Strategy(auto_wrap_policy=units)


def fit(
    strategy: str, out: Path, epochs: int, accumulate: int = 1, ckpt: Path | None = None
) -> fullshard.Trainer:
    fullshard.seed_everything(11)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=make_strategy(strategy),
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )
    trainer.fit(GAN(accumulate), DataLoader(make_data(), batch_size=8, shuffle=True), ckpt_path=ckpt)
    return trainer


def weights(trainer: fullshard.Trainer) -> dict[str, list[Any]]:
    state = trainer.strategy.module_state_dict()
    return {k: v.tolist() for k, v in state.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--strategy", required=True, choices=("ddp", "fsdp", "fsdp2"))
    args = p.parse_args()
    result: dict[str, Any] = {}
    whole = fit(args.strategy, args.out, 2)
    result["whole"], result["whole_step"] = weights(whole), whole.global_step
    first = fit(args.strategy, args.out, 1)
    first.save_checkpoint(args.out / "epoch1.ckpt")
    resumed = fit(args.strategy, args.out, 2, ckpt=args.out / "epoch1.ckpt")
    result["resumed"], result["resumed_step"] = weights(resumed), resumed.global_step
    if args.strategy != "fsdp":  # FSDP1 cannot accumulate inside the step: docs/manual-optimization.md
        accumulated = fit(args.strategy, args.out, 2, accumulate=2)
        result["accumulated"], result["accumulated_step"] = weights(accumulated), accumulated.global_step
    if args.strategy != "ddp":  # the root unit holding parameters: refused when fit starts
        cls = FSDPStrategy if args.strategy == "fsdp" else FSDP2Strategy
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=cls(),
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        try:
            trainer.fit(GAN(), DataLoader(make_data(), batch_size=8))
        except MisconfigurationError as error:
            result["refused"] = str(error)
    if whole.is_global_zero:
        saved = torch.load(args.out / "epoch1.ckpt", map_location="cpu", weights_only=False)
        result["optimizer_states"] = len(saved["optimizer_states"])
        (args.out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

"""Porting script: a GAN trained with manual optimization, two optimizers and two schedulers.

Covers: ``self.automatic_optimization = False``, ``self.optimizers()`` (two wrapped optimizers),
``self.lr_schedulers()`` stepped by the module (the Trainer does not step them under manual
optimization), ``toggle_optimizer`` / ``untoggle_optimizer``, ``manual_backward`` (two
backward passes in one training step), ``clip_gradients``, ``global_step`` counting every
optimizer step, ``training_step`` returning a loss (``on_train_batch_end`` gets ``{"loss"}``),
``strategy="ddp_find_unused_parameters_true"`` (with ``--strategy ddp``: the discriminator's
parameters take no part in the generator's backward) and ``FSDPStrategy(auto_wrap_policy=...)``
(with ``--strategy fsdp``: under manual optimization every parameter must be in a nested unit,
see docs/manual-optimization.md). Checked against the same training in one
plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/gan_manual.py --strategy fsdp --out /tmp/p7
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import global_batches, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import FSDPStrategy
else:
    import fullshard as L
    from fullshard.callbacks import Callback
    from fullshard.strategies import FSDPStrategy

SEED, EPOCHS, BATCH, N, CLIP, LR_G, LR_D, GAMMA = 11, 2, 8, 64, 0.05, 0.05, 0.1, 0.5


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(N, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0]))


def noise(x: torch.Tensor) -> torch.Tensor:
    """The generator's input for a batch of real samples: a fixed function of them, so that the
    one-process reference gives every sample the same noise."""
    return torch.sin(3.0 * x.flip(-1))


def generator_loss(d: nn.Module, fake: torch.Tensor) -> torch.Tensor:
    return F.softplus(-d(fake)).mean()


def discriminator_loss(d: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    return (F.softplus(-d(real)) + F.softplus(d(fake.detach()))).mean()


class GAN(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        self.toggle_optimizer(opt_g)
        fake = self.generator(noise(real))
        g_loss = generator_loss(self.discriminator, fake)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        self.clip_gradients(opt_g, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        d_loss = discriminator_loss(self.discriminator, real, fake)
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)
        return d_loss

    def on_train_epoch_end(self):
        for scheduler in self.lr_schedulers():
            scheduler.step()

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=LR_G)
        opt_d = torch.optim.SGD(self.discriminator.parameters(), lr=LR_D, momentum=0.9)
        sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=1, gamma=GAMMA)
        sched_d = torch.optim.lr_scheduler.StepLR(opt_d, step_size=1, gamma=GAMMA)
        return [opt_g, opt_d], [sched_g, sched_d]


class Recorder(RecordCallbackHooks, Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        snapshot("on_train_epoch_end", trainer)
        value(f"lrs_epoch{trainer.current_epoch}", [o.param_groups[0]["lr"] for o in trainer.optimizers])


def reference(data: TensorDataset, world_size: int) -> tuple[dict, list[float]]:
    """One process, the union of the ranks' batches, the same two steps per batch."""
    torch.manual_seed(SEED)
    model = GAN()
    opt_g = torch.optim.Adam(model.generator.parameters(), lr=LR_G)
    opt_d = torch.optim.SGD(model.discriminator.parameters(), lr=LR_D, momentum=0.9)
    sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=1, gamma=GAMMA)
    sched_d = torch.optim.lr_scheduler.StepLR(opt_d, step_size=1, gamma=GAMMA)
    (x,) = data.tensors
    norms = []
    for epoch in range(EPOCHS):
        for idx in global_batches(len(data), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch):
            real = x[idx]
            fake = model.generator(noise(real))
            opt_g.zero_grad()
            generator_loss(model.discriminator, fake).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.generator.parameters(), CLIP)))
            opt_g.step()
            opt_d.zero_grad()
            discriminator_loss(model.discriminator, real, fake).backward()
            opt_d.step()
        sched_g.step()
        sched_d.step()
    return model.state_dict(), norms


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    data = make_data()
    model = GAN()
    if args.strategy == "ddp":  # the discriminator takes no part in the generator's backward
        strategy = "ddp_find_unused_parameters_true"
    elif args.strategy == "fsdp":  # the generator and the discriminator each an FSDP unit
        strategy = FSDPStrategy(auto_wrap_policy={nn.Sequential})
    else:
        strategy = args.strategy
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        precision="32-true",
        max_epochs=EPOCHS,
        log_every_n_steps=1,
        logger=False,
        callbacks=[Recorder()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    mark("fit")
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True))
    mark("after fit")
    snapshot("after fit", trainer)
    steps = 2 * EPOCHS * (N // (2 * BATCH))
    value("global_step", trainer.global_step)
    check("global_step counts both optimizers' steps", trainer.global_step == steps, trainer.global_step)
    lrs = [o.param_groups[0]["lr"] for o in trainer.optimizers]
    expected_lrs = [LR_G * GAMMA**EPOCHS, LR_D * GAMMA**EPOCHS]
    check("the module stepped its schedulers once per epoch", close(lrs, expected_lrs), (lrs, expected_lrs))
    trainer.save_checkpoint(root / "final.ckpt")

    if trainer.global_rank == 0:
        weights, norms = reference(data, trainer.world_size)
        check("the generator's gradients were clipped (norm above the limit)", min(norms) > CLIP, norms)
        saved = torch.load(root / "final.ckpt", map_location="cpu", weights_only=False)
        check("final weights equal one-process training", *state_close(saved["state_dict"], weights))
        check(
            "the checkpoint holds both optimizers' states",
            len(saved["optimizer_states"]) == 2,
            len(saved["optimizer_states"]),
        )


if __name__ == "__main__":
    run(main)

"""LoRA under ``strategy="fsdp"`` (FSDP1): a frozen base and a trained low-rank adapter in one
FSDP unit, saved sharded by 2 processes and resumed, by the same or another number of processes.

python tests/scripts/lora_fsdp1_job.py --out DIR --phase straight --devices 2
python tests/scripts/lora_fsdp1_job.py --out DIR --phase resume --devices 3 --strategy fsdp
python tests/scripts/lora_fsdp1_job.py --out DIR --phase resume --devices 1 --strategy auto

``straight``: 6 steps (2 epochs of 3 batches) under fsdp, saving a sharded checkpoint at the
end of the first epoch (``DIR/epoch0.ckpt``). ``resume``: a fresh model (another seed) resumes
from it and trains to step 6, under ``--strategy`` (fsdp, fsdp2, or auto with one process). Rank 0 writes ``DIR/<phase>-<strategy>-<devices>.pt``: the
parameters and the optimizer state (whole tensors) after the first epoch (``"epoch0"``; for a
resumed run: as loaded) and at the end (``"end"``).

The base is much larger than the adapter, so the adapter lies in the last rank's flat shard only:
the other ranks' optimizers hold no state of their own. Every process trains on the same batches
(no distributed sampler), so the averaged gradient, and so the run, does not depend on the number
of processes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import FSDP2Strategy, FSDPStrategy

DIM = 16


class Adapted(nn.Module):
    """A frozen base layer plus a trained rank-4 adapter (a LoRA layer), one FSDP unit."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(DIM, DIM)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(DIM, 4, bias=False)
        self.lora_b = nn.Linear(4, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x))


class LoRAModule(fullshard.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.Sequential(Adapted(), nn.Tanh(), Adapted())
        self.head = nn.Linear(DIM, 1)
        self.head.requires_grad_(False)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.head(self.layers(x)).squeeze(-1), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=0.02)


def snapshot(trainer: Any) -> dict[str, Any]:
    """The parameters and the optimizer's per-parameter state, whole tensors (collective)."""
    params, optimizers = trainer.strategy.get_state(trainer.optimizers, full=True)
    state = optimizers[0]["state"]
    return {
        "params": {k: v.detach().cpu().clone() for k, v in params.items()},
        "optimizer": {
            k: {s: torch.as_tensor(v).detach().cpu().clone() for s, v in d.items()} for k, d in state.items()
        },
    }


class Snapshots(fullshard.Callback):
    def __init__(self, save_to: Path | None) -> None:
        self.save_to = save_to
        self.taken: dict[str, Any] = {}

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if trainer.global_step:  # resumed: the state as loaded
            self.taken["epoch0"] = snapshot(trainer)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if trainer.current_epoch == 0 and self.save_to is not None:
            self.taken["epoch0"] = snapshot(trainer)
            trainer.save_checkpoint(self.save_to)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self.taken["end"] = snapshot(trainer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", choices=["straight", "resume"], required=True)
    parser.add_argument("--strategy", default="fsdp")
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    out = Path(args.out)
    ckpt = out / "epoch0.ckpt"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, DIM, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(-1).tanh()), batch_size=8)

    classes = {"fsdp": FSDPStrategy, "fsdp2": FSDP2Strategy}
    strategy = (
        classes[args.strategy](auto_wrap_policy={Adapted}, state_dict_type="sharded")
        if args.strategy in classes
        else args.strategy  # "auto" with one process
    )
    snapshots = Snapshots(ckpt if args.phase == "straight" else None)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        max_steps=6,
        use_distributed_sampler=False,
        callbacks=[snapshots],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )
    straight = args.phase == "straight"
    trainer.fit(LoRAModule(seed=1 if straight else 2), data, ckpt_path=None if straight else ckpt)
    if trainer.is_global_zero:
        torch.save(
            {"global_step": trainer.global_step, **snapshots.taken},
            out / f"{args.phase}-{args.strategy}-{args.devices}.pt",
        )


if __name__ == "__main__":
    main()

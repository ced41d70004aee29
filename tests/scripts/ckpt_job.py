"""Train, save and resume with any strategy and checkpoint format; used by the checkpoint tests.

python tests/scripts/ckpt_job.py --out DIR --strategy fsdp --devices 2 --format sharded --save CKPT
python tests/scripts/ckpt_job.py --out DIR --strategy fsdp --devices 3 --resume CKPT --max-steps 0
python tests/scripts/ckpt_job.py --devices 2 --scenarios RUNS.json

``--scenarios``: a JSON list of argument lists, each run as above one after the other in the
same processes (one launch and process group for several runs; every run's --devices must be the
job's), so that a test needing several runs of one world size pays the start-up once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.checkpoint.events import set_event_hook
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy, SingleDeviceStrategy

DIM = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.relu(self.fc(x)))


class Net(fullshard.Module):
    def __init__(self, n_blocks: int = 3, optimizers: int = 1, width: int = DIM) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(n_blocks)))
        self.head = nn.Linear(width, 1)
        self.n_optimizers = optimizers
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.head(self.blocks(x)).squeeze(-1), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> Any:
        if self.n_optimizers == 2:
            return [
                torch.optim.AdamW(self.blocks.parameters(), lr=0.01),
                torch.optim.SGD(self.head.parameters(), lr=0.01),
            ]
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_data(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, DIM, generator=g)
    return TensorDataset(x, x.mean(-1) + 0.1 * torch.randn(n, generator=g))


def make_strategy(name: str, fmt: str) -> Any:
    if name == "fsdp":
        return FSDPStrategy(auto_wrap_policy={Block}, state_dict_type=fmt)
    if name == "fsdp2":
        return FSDP2Strategy(auto_wrap_policy={Block}, state_dict_type=fmt)
    if name == "ddp":
        return DDPStrategy(state_dict_type=fmt)
    return SingleDeviceStrategy(state_dict_type=fmt)


def install_fault(spec: str) -> None:
    """``RANK:POINT``: SIGKILL this process when rank RANK reaches save point POINT."""
    rank, point = spec.split(":", 1)

    def hook(reached: str) -> None:
        if reached == point and os.environ.get("LOCAL_RANK", "0") == rank:
            os.kill(os.getpid(), signal.SIGKILL)

    set_event_hook(hook)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--scenarios", default=None, help="a JSON file: a list of argument lists, run in turn")
    p.add_argument("--out", required=False)
    p.add_argument("--strategy", default="fsdp")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--format", default="full")
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--save", default=None)
    p.add_argument("--save-every", type=int, default=0, help="ModelCheckpoint every N steps into --out/ckpts")
    p.add_argument("--keep", type=int, default=1, help="ModelCheckpoint(save_top_k=...)")
    p.add_argument("--resume", default=None)
    p.add_argument("--fault", default=None, help="RANK:POINT to SIGKILL at")
    p.add_argument("--optimizers", type=int, default=1)
    p.add_argument("--width", type=int, default=DIM)
    p.add_argument("--validate", action="store_true", help="validate(ckpt_path=--resume) instead of fit")
    args = p.parse_args(argv)
    if args.scenarios is None and args.out is None:
        p.error("--out is required")
    return args


def main() -> None:
    args = parse()
    if args.scenarios is None:
        run(args)
        return
    for argv in json.loads(Path(args.scenarios).read_text()):
        scenario = parse(argv)
        assert scenario.devices == args.devices, "every scenario of a job runs on the job's processes"
        run(scenario)


def run(args: argparse.Namespace) -> None:
    if args.fault:
        install_fault(args.fault)
    fullshard.seed_everything(11)
    model = Net(optimizers=args.optimizers)
    if args.width != DIM:
        model.head = nn.Linear(args.width, 1)
    callbacks = []
    if args.save_every:
        callbacks.append(
            fullshard.ModelCheckpoint(
                dirpath=Path(args.out) / "ckpts",
                every_n_train_steps=args.save_every,
                save_top_k=args.keep,
                save_last=True,
            )
        )
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=make_strategy(args.strategy, args.format),
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        callbacks=callbacks,
        default_root_dir=args.out,
    )
    loader = DataLoader(make_data(), batch_size=8, shuffle=True)
    out = Path(args.out)
    if args.validate:
        trainer.validate(model, loader, ckpt_path=args.resume)
    else:
        trainer.fit(model, loader, ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=True)
    rank = trainer.global_rank
    out.mkdir(parents=True, exist_ok=True)
    (out / f"losses_rank{rank}.json").write_text(json.dumps(model.losses))
    if trainer.is_global_zero:
        torch.save(
            {
                "model": model_state,
                "optimizers": optimizer_states,
                "global_step": trainer.global_step,
                "epoch": trainer.current_epoch,
            },
            out / "final.pt",
        )


if __name__ == "__main__":
    main()

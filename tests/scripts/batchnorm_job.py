"""A small convolutional model with BatchNorm trained under precision="bf16-mixed", on one
process without FSDP (the reference) or on 2 processes under FSDP2 and FSDP1 (issue 40: the
FSDP2 run used to fail with "expected scalar type BFloat16 but found Float").

python tests/scripts/batchnorm_job.py --out DIR --devices 2 --run fsdp2 --run fsdp2-root --run fsdp --run fsdp-root
python tests/scripts/batchnorm_job.py --out DIR --devices 1 --run single

Every process trains on the same 3 batches (no distributed sampler), so the averaged gradient
and the BatchNorm statistics are those of one process on those batches, and the runs compare
with the single-process reference. Rank 0 writes ``DIR/<run>.pt``: the full parameters and
buffers at the end, and the dtypes each BatchNorm's weight and input had in its forward.
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


class ConvBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.bn(self.conv(x)))


class Net(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.blocks = nn.Sequential(ConvBlock(8), ConvBlock(8))
        self.head = nn.Linear(8, 4)
        self.seen: dict[str, list[str]] = {}
        for name, module in self.named_modules():
            if isinstance(module, nn.BatchNorm2d):
                module.register_forward_pre_hook(self._record(name))

    def _record(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            self.seen[name] = [str(module.weight.dtype), str(args[0].dtype)]

        return hook

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = self.blocks(F.relu(self.bn(self.stem(x))))
        return F.cross_entropy(self.head(x.mean((2, 3))), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def strategy_of(run: str) -> Any:
    if run == "single":
        return "auto"
    if run.endswith("-root"):  # no auto-wrap policy: the root is the only block unit
        return (FSDP2Strategy if run == "fsdp2-root" else FSDPStrategy)()
    return (FSDP2Strategy if run == "fsdp2" else FSDPStrategy)(auto_wrap_policy={ConvBlock})


def train(run: str, devices: int, out: Path) -> None:
    model = Net()
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(12, 3, 8, 8, generator=g), torch.randint(0, 4, (12,), generator=g))
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy_of(run),
        precision="bf16-mixed",
        max_epochs=1,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
    )
    trainer.fit(model, DataLoader(data, batch_size=4))
    params, _ = trainer.strategy.get_state([], full=True)
    if trainer.is_global_zero:
        state = {k: v.detach().float().clone() for k, v in params.items()}
        torch.save({"state": state, "seen": model.seen}, out / f"{run}.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--run", action="append", required=True)
    args = parser.parse_args()
    for run in args.run:
        train(run, args.devices, Path(args.out))


if __name__ == "__main__":
    main()

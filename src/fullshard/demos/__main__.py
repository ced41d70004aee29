"""The demo training job: a small Transformer language model on bytes of Python's own sources.

Run it (2 CPU processes with FSDP by default; the wrap plan is printed when training starts)::

    python -m fullshard.demos
    python -m fullshard.demos --devices 4 --max-steps 200 --activation-checkpointing
    python -m fullshard.demos --strategy ddp
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import fullshard
from fullshard.demos import StdlibText, Transformer
from fullshard.strategies import FSDPStrategy


class LanguageModel(fullshard.Module):
    """Next-byte prediction with the demo Transformer."""

    def __init__(self, vocab_size: int, ninp: int, nhead: int, nhid: int, nlayers: int, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model: Transformer | None = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        hp = self.hparams
        self.model = Transformer(
            hp["vocab_size"], hp["ninp"], hp["nhead"], hp["nhid"], hp["nlayers"], dropout=0.1
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.model is not None
        inputs, target = batch
        loss = F.nll_loss(self.model(inputs, target), target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        assert self.model is not None
        inputs, target = batch
        loss = F.nll_loss(self.model(inputs, target), target.view(-1))
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])


def main(argv: list[str] | None = None) -> None:
    """Train the demo model and print the loss before and after."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", type=int, default=2, help="processes to train with (default 2)")
    parser.add_argument("--accelerator", default="cpu", help="'cpu' (default), 'cuda' or 'auto'")
    parser.add_argument(
        "--strategy",
        default="fsdp",
        help="'fsdp' (default: auto-wraps the Transformer layers) or a registered name",
    )
    parser.add_argument("--sharding-strategy", default="FULL_SHARD", help="for --strategy fsdp")
    parser.add_argument("--activation-checkpointing", action="store_true", help="for --strategy fsdp")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--root-dir", default="fullshard_demo")
    args = parser.parse_args(argv)

    fullshard.seed_everything(42)
    data = StdlibText(block_size=args.block_size, max_bytes=2 * 2**20)
    n_val = max(len(data) // 50, args.batch_size)
    train_set, val_set = torch.utils.data.random_split(
        data, [len(data) - n_val, n_val], generator=torch.Generator().manual_seed(0)
    )
    model = LanguageModel(data.vocab_size, args.width, 4, 2 * args.width, args.layers, lr=3e-3)
    strategy: str | FSDPStrategy = args.strategy
    if args.strategy == "fsdp":
        layers = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}
        strategy = FSDPStrategy(
            auto_wrap_policy=layers,
            activation_checkpointing_policy=layers if args.activation_checkpointing else None,
            sharding_strategy=args.sharding_strategy,
        )
    trainer = fullshard.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=args.max_steps,
        val_check_interval=max(args.max_steps // 3, 1),
        limit_val_batches=8,
        log_every_n_steps=10,
        default_root_dir=args.root_dir,
    )
    trainer.fit(
        model,
        DataLoader(train_set, batch_size=args.batch_size, shuffle=True),
        DataLoader(val_set, batch_size=args.batch_size),
    )
    metrics = trainer.callback_metrics
    trainer.print(
        f"done: {trainer.global_step} steps on {trainer.world_size} process(es); "
        f"last train_loss {float(metrics['train_loss']):.3f}, val_loss {float(metrics['val_loss']):.3f} "
        f"(a uniform guess over 256 bytes scores {torch.log(torch.tensor(256.0)):.3f})"
    )


if __name__ == "__main__":
    main()

"""Train a small model with FSDP (or FSDP2) on several "nodes" of this machine, save a sharded
checkpoint, or resume from one; used by tests/test_multinode.py.

Two torchrun agents on loopback, 2 nodes x 2 processes, HYBRID_SHARD (replicate across nodes,
shard within):

    torchrun --nnodes=2 --node-rank=0 --master-addr=127.0.0.1 --master-port=PORT --nproc-per-node=2 \\
        tests/scripts/multinode_job.py --out DIR --nodes 2 --devices 2 --sharding HYBRID_SHARD --save CKPT
    (the same with --node-rank=1)

Resume at one node of 3 processes:

    torchrun --standalone --nproc-per-node=3 tests/scripts/multinode_job.py --out DIR --nodes 1 \\
        --devices 3 --sharding FULL_SHARD --resume CKPT

Every rank writes ``<tag>-rank<r>.json`` (its ranks, how much of the model it holds, and a
checksum of that shard); rank 0 writes ``<tag>-start.pt`` (the full parameters when training
starts, after a resume) and ``<tag>-final.pt``.
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
from fullshard.strategies import FSDP2Strategy, FSDPStrategy

DIM = 8


class Net(fullshard.Module):
    def __init__(self, out: Path, tag: str) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM), nn.ReLU())
        self.head = nn.Linear(DIM, 1)
        self.out, self.tag = out, tag

    def on_train_start(self) -> None:
        params = self.trainer.strategy.module_state_dict()  # collective
        if self.global_rank == 0:
            torch.save(params, self.out / f"{self.tag}-start.pt")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.head(self.blocks(x)).squeeze(-1), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def local_shard(module: nn.Module) -> tuple[int, float]:
    """How many parameter elements this rank holds, and their sum (equal on replicas)."""
    numel, total = 0, 0.0
    for p in module.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p  # FSDP2: DTensor shards
        numel += local.numel()
        total += float(local.detach().double().sum())
    return numel, total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="run")
    p.add_argument("--nodes", default="1", help="Trainer(num_nodes=...): an int or 'auto'")
    p.add_argument("--devices", default="auto")
    p.add_argument("--fsdp2", action="store_true")
    p.add_argument("--sharding", default="FULL_SHARD")
    p.add_argument("--mesh", default=None, help="device_mesh as 'replicas,shard_size'")
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--save", default=None)
    p.add_argument("--resume", default=None)
    args = p.parse_args()
    out = Path(args.out)
    fullshard.seed_everything(3)
    mesh = (int(args.mesh.split(",")[0]), int(args.mesh.split(",")[1])) if args.mesh else None
    strategy_class = FSDP2Strategy if args.fsdp2 else FSDPStrategy
    strategy = strategy_class(sharding_strategy=args.sharding, device_mesh=mesh, state_dict_type="sharded")
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices if args.devices == "auto" else int(args.devices),
        num_nodes=args.nodes if args.nodes == "auto" else int(args.nodes),
        strategy=strategy,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )
    g = torch.Generator().manual_seed(5)
    x = torch.randn(96, DIM, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1).cos()), batch_size=4, shuffle=True)
    model = Net(out, args.tag)
    trainer.fit(model, loader, ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    assert trainer.strategy.module is not None
    numel, checksum = local_shard(trainer.strategy.module)
    info = {
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "environment": type(trainer.strategy.cluster_environment).__name__,
        "shard_size": strategy.shard_size,
        "global_step": trainer.global_step,
        "local_numel": numel,
        "local_checksum": checksum,
    }
    (out / f"{args.tag}-rank{trainer.global_rank}.json").write_text(json.dumps(info))
    params = trainer.strategy.module_state_dict()
    if trainer.global_rank == 0:
        torch.save(params, out / f"{args.tag}-final.pt")


if __name__ == "__main__":
    main()

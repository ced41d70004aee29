"""Train a small block model with FSDPStrategy (or FSDP2Strategy with --fsdp2); used by the
multi-process FSDP tests.

python tests/scripts/train_fsdp.py --out DIR --devices 2 --sharding FULL_SHARD --wrap classes [--fsdp2]
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy, wrap
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import FSDP2Strategy, FSDPStrategy

DIM = 16


class Block(nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.fc(x)))


class BlockModel(fullshard.Module):
    def __init__(self, n_blocks: int = 4, manual_wrap: bool = False, lr: float = 0.01) -> None:
        super().__init__()
        self.n_blocks, self.manual_wrap, self.lr = n_blocks, manual_wrap, lr
        self.blocks: nn.Sequential | None = None
        self.head: nn.Linear | None = None
        self.losses: list[float] = []
        self.grad_norms: list[float] = []

    def configure_model(self) -> None:
        if self.blocks is not None:
            return
        blocks = [Block() for _ in range(self.n_blocks)]
        if self.manual_wrap:
            blocks = [wrap(b) for b in blocks]
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.blocks is not None and self.head is not None
        return self.head(self.blocks(x)).squeeze(-1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x).float(), y)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x).float(), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        decay = [p for n, p in self.named_parameters() if n.endswith("weight")]
        no_decay = [p for n, p in self.named_parameters() if not n.endswith("weight")]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=self.lr
        )


def make_data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(99)
    x = torch.randn(n, DIM, generator=g)
    return TensorDataset(x, x.sum(-1) * 0.1 + 0.05 * torch.randn(n, generator=g))


def actual_units(wrapped: Any) -> list[str]:
    """Names of the FSDP units torch created (FSDP1 wrappers or FSDP2 modules), with wrapper
    segments removed."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    names = []
    for name, module in wrapped.named_modules():
        if isinstance(module, FullyShardedDataParallel | FSDPModule):
            parts = [
                p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")
            ]
            names.append(".".join(parts))
    return names


def policy(kind: str) -> Any:
    return {
        "none": None,
        "classes": {Block},
        "names": ["Block"],
        "callable": functools.partial(size_based_auto_wrap_policy, min_num_params=100),
        "torch": ModuleWrapPolicy({Block}),
    }[kind]


def run_options() -> argparse.ArgumentParser:
    """Options of one training run (several runs can share one job, see ``--run``)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--fsdp2", action="store_true", help="FSDP2Strategy instead of FSDPStrategy")
    p.add_argument("--sharding", default="FULL_SHARD")
    p.add_argument("--wrap", default="classes")
    p.add_argument("--ac", default="none")
    p.add_argument("--offload", action="store_true")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--empty-init", action="store_true")
    p.add_argument("--manual-wrap", action="store_true")
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--mesh", default=None, help="R,S for HYBRID_SHARD")
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--registry-name", default=None)
    p.add_argument("--bad-optimizer", action="store_true", help="build the optimizer before fit")
    p.add_argument(
        "--freeze", action="store_true", help="freeze blocks.0.fc (its unit keeps a trainable norm)"
    )
    return p


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    p.add_argument("--out", required=True)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--run", action="append", default=[], help="NAME:OPTIONS, one training run (repeatable)")
    job, rest = p.parse_known_args()
    runs = [(spec.split(":", 1)[0], shlex.split(spec.split(":", 1)[1])) for spec in job.run] or [(".", rest)]
    for name, options in runs:
        train(run_options().parse_args(options), job, Path(job.out) / name)


def train(args: argparse.Namespace, job: argparse.Namespace, out: Path) -> None:
    """One run: seed, build, fit, validate, and (rank 0) write params.pt and result.json to ``out``."""
    fullshard.seed_everything(5)
    if args.registry_name:
        strategy: Any = args.registry_name
    else:
        strategy = (FSDP2Strategy if args.fsdp2 else FSDPStrategy)(
            auto_wrap_policy=policy(args.wrap),
            activation_checkpointing_policy=policy(args.ac),
            sharding_strategy=int(args.sharding) if args.sharding.isdigit() else args.sharding,
            cpu_offload=args.offload,
            empty_init=args.empty_init,
            device_mesh=tuple(int(v) for v in args.mesh.split(",")) if args.mesh else None,
        )
    model = BlockModel(manual_wrap=args.manual_wrap)
    if args.bad_optimizer:
        stale = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        model.configure_optimizers = lambda: stale  # type: ignore[method-assign]
    if not args.empty_init and not args.manual_wrap:
        model.configure_model()  # eager: built in the constructor's place, same RNG draws as the reference
    if args.freeze:
        assert model.blocks is not None
        model.blocks[0].fc.requires_grad_(False)
    norms: list[float] = []

    trainer = fullshard.Trainer(
        accelerator=job.accelerator,
        devices=job.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=args.max_steps,
        gradient_clip_val=args.clip,
        accumulate_grad_batches=args.accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
        # the single-process reference (tests/fsdp_reference.py) reads the data in order: keep
        # the loader's order rather than Lightning's shuffled training sampler
        use_distributed_sampler="keep_shuffle",
    )
    if args.clip is not None:
        original = trainer.strategy.clip_gradients_norm

        def recording(optimizer: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
            norm = original(optimizer, max_norm, norm_type)
            norms.append(float(norm))
            return norm

        trainer.strategy.clip_gradients_norm = recording  # type: ignore[method-assign]
    trainer.fit(model, DataLoader(make_data(), batch_size=args.batch_size))
    val_loss = trainer.validate(model, DataLoader(make_data(), batch_size=args.batch_size))[0]["val_loss"]
    state = trainer.strategy.module_state_dict()  # collective: every rank gathers
    out.mkdir(parents=True, exist_ok=True)
    if trainer.is_global_zero:
        torch.save({k: v.detach().float().cpu().clone() for k, v in state.items()}, out / "params.pt")
        plan = trainer.strategy.wrap_plan
        (out / "result.json").write_text(
            json.dumps(
                {
                    "losses": model.losses,
                    "val_loss": val_loss,
                    "norms": norms,
                    "global_step": trainer.global_step,
                    "units": [[u.name, u.numel] for u in plan.units] if plan else None,
                    "actual_units": actual_units(trainer.strategy.model),
                    "checkpointed": plan.checkpointed if plan else None,
                    "strategy": type(trainer.strategy).__name__,
                    "offload": trainer.strategy.offloads_params,  # type: ignore[attr-defined]
                }
            )
        )


if __name__ == "__main__":
    main()

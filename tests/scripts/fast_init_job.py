"""Build tests/hf_patterns.py's model with FSDP, eagerly and with empty_init, and record what came out.

python tests/scripts/fast_init_job.py --out DIR --policy blocks [--scaled-init]

Per mode (eager first, then empty_init) rank 0 writes to DIR/<mode>/: ``init.pt`` (the full
initial state), ``result.json`` (whether the embeddings are still tied on every rank, the plan's
notes, losses) and ``logits.pt`` (predictions after loading DIR/eager/trained.ckpt, which the
eager run writes after a few steps).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fullshard
from fullshard.strategies import FSDPStrategy
from hf_patterns import Block, LMModule, token_data

POLICIES: dict[str, Any] = {
    "blocks": {Block},
    "blocks+embedding": {Block, nn.Embedding},  # splits the tied embeddings unless kept together
    "none": None,
}


def tied_on_this_rank(module: nn.Module) -> bool:
    embed = next(m for m in module.modules() if isinstance(m, nn.Embedding))
    head = next(
        m for m in module.modules() if isinstance(m, nn.Linear) and m.out_features == embed.num_embeddings
    )
    return head.weight is embed.weight


def trainer(out: Path, strategy: Any, max_steps: int) -> fullshard.Trainer:
    return fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )


def run(mode: str, args: argparse.Namespace) -> None:
    out = Path(args.out) / mode
    fullshard.seed_everything(0)
    strategy = FSDPStrategy(auto_wrap_policy=POLICIES[args.policy], empty_init=mode == "empty")
    module = LMModule(scaled_init=args.scaled_init)
    data = DataLoader(token_data(), batch_size=4)
    setup = trainer(out, strategy, max_steps=0)
    setup.fit(module, data)  # builds and shards, trains nothing
    init = setup.strategy.module_state_dict()
    ties = setup.strategy.all_gather_object(tied_on_this_rank(setup.strategy.model))
    plan = setup.strategy.wrap_plan
    training = trainer(out, setup.strategy, max_steps=3)
    training.fit(module, data)
    ckpt = Path(args.out) / "eager" / "trained.ckpt"
    if mode == "eager":
        training.save_checkpoint(ckpt)
    logits = training.predict(module, DataLoader(token_data(8), batch_size=4), ckpt_path=ckpt)
    if training.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in init.items()}, out / "init.pt")
        torch.save(torch.cat(logits), out / "logits.pt")  # type: ignore[arg-type]
        result = {
            "tied": ties,
            "notes": plan.notes if plan else [],
            "units": [u.name for u in plan.units] if plan else [],
        }
        (out / "result.json").write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--policy", default="blocks", choices=sorted(POLICIES))
    p.add_argument("--scaled-init", action="store_true")
    p.add_argument("--modes", default="eager,empty")
    args = p.parse_args()
    for mode in args.modes.split(","):
        run(mode, args)


if __name__ == "__main__":
    main()

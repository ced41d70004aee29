"""Train a small block model eagerly and with ``compile=``, in one job; used by tests/test_compile.py.

python tests/scripts/compile_job.py --out DIR --devices 2 --suite multi
python tests/scripts/compile_job.py --out DIR --devices 1 --suite single

Each run writes ``DIR/<run>/result.json`` (losses, compiled graphs after each step) and
``params.pt`` (final full state dict) from rank 0; some runs save or load a full checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp.wrap import wrap
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy, SingleDeviceStrategy

DIM = 16
STEPS = 4
AOT = {"backend": "aot_eager"}  # the same dynamo graphs as inductor's, without the C++ build


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.fc(x)))


class BlockModel(fullshard.Module):
    def __init__(self, manual_wrap: bool = False, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(blocks)))
        self.head = nn.Linear(DIM, 1)
        self.manual_wrap = manual_wrap
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.manual_wrap:  # FSDP units made by hand: the same weights, wrapped here
            self.blocks = nn.Sequential(*(wrap(block) for block in self.blocks))
            self.manual_wrap = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class GraphCounter(fullshard.Callback):
    """Dynamo's count of compiled graphs after every training batch (see test_no_recompiles)."""

    def __init__(self) -> None:
        self.graphs: list[int] = []

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.graphs.append(unique_graphs())


def unique_graphs() -> int:
    from torch._dynamo.utils import counters  # private, but the count every dynamo test reads

    return int(counters["stats"]["unique_graphs"])


def make_data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(99)
    x = torch.randn(n, DIM, generator=g)
    return TensorDataset(x, x.sum(-1) * 0.1 + 0.05 * torch.randn(n, generator=g))


def strategy_for(run: dict[str, Any]) -> Any:
    if run.get("strategy") == "ddp":
        return DDPStrategy()
    if run.get("strategy") == "single":
        return SingleDeviceStrategy()
    return (FSDP2Strategy if run.get("strategy") == "fsdp2" else FSDPStrategy)(
        auto_wrap_policy=None if run.get("whole") or run.get("manual") else {Block},
        activation_checkpointing_policy={Block} if run.get("ac") else None,
        compile=run.get("strategy_compile"),
        sharding_strategy=run.get("sharding", "FULL_SHARD"),
    )


# name -> Trainer(compile=...), FSDPStrategy(compile=...) and the rest of the run's settings
SUITES: dict[str, dict[str, dict[str, Any]]] = {
    "multi": {  # two processes: FSDP (1 and 2) with a unit per Block, and DDP
        "eager": {"save": "eager.ckpt"},
        "compiled": {"compile": AOT, "save": "compiled.ckpt"},
        "compiled_ac": {"strategy_compile": AOT, "ac": True},
        "whole": {"compile": AOT, "whole": True},
        "bf16_eager": {"precision": "bf16-mixed"},
        "bf16": {"compile": AOT, "precision": "bf16-mixed"},
        "eager_loads_compiled": {"load": "compiled.ckpt"},
        "compiled_loads_eager": {"compile": AOT, "load": "eager.ckpt"},
        # a short last batch recompiles mid-epoch, with the last step's gradients in place
        "ragged_eager": {"samples": 60, "steps": -1},
        "ragged": {"compile": AOT, "samples": 60, "steps": -1},
        "accumulate_eager": {"accumulate": 2},
        "accumulate": {"compile": AOT, "accumulate": 2},
        "manual": {"compile": AOT, "manual": True},  # units from wrap() in configure_model
        "shard_grad_op": {"compile": AOT, "sharding": "SHARD_GRAD_OP"},  # units stay gathered after forward
        "ddp_eager": {"strategy": "ddp"},
        "ddp": {"strategy": "ddp", "compile": AOT},
        "fsdp2_eager": {"strategy": "fsdp2"},
        "fsdp2": {"strategy": "fsdp2", "compile": AOT},  # each fully_shard unit compiled in place
    },
    # one Block: every inductor kernel is built by a C++ compile (seconds each, cold), and more
    # Blocks only add kernels of the same kinds
    "single": {
        "eager": {"strategy": "single", "blocks": 1, "save": "eager.ckpt"},
        "compiled": {"strategy": "single", "blocks": 1, "compile": True, "save": "compiled.ckpt"},  # inductor
        "eager_loads_compiled": {"strategy": "single", "blocks": 1, "load": "compiled.ckpt"},
        "compiled_loads_eager": {"strategy": "single", "blocks": 1, "compile": AOT, "load": "eager.ckpt"},
    },
}


def train(name: str, run: dict[str, Any], devices: int, root: Path) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # each run compiles afresh (and stays within dynamo's recompile limit)
    counters.clear()
    fullshard.seed_everything(5)
    model = BlockModel(manual_wrap=run.get("manual", False), blocks=run.get("blocks", 3))
    counter = GraphCounter()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy_for(run),
        compile=run.get("compile"),
        precision=run.get("precision", "32-true"),
        max_steps=run.get("steps", STEPS),
        max_epochs=1,
        accumulate_grad_batches=run.get("accumulate", 1),
        num_sanity_val_steps=0,
        callbacks=[counter],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    loader = DataLoader(make_data(run.get("samples", 64)), batch_size=8)
    if "load" in run:  # weights only, then the weights as loaded
        trainer.validate(model, loader, ckpt_path=root / run["load"], verbose=False)
    else:
        trainer.fit(model, loader)
        graphs_after_fit = unique_graphs()
        trainer.validate(model, loader, verbose=False)  # compiles its own no-grad graph once
    if "save" in run:
        trainer.save_checkpoint(root / run["save"])
    state = trainer.strategy.module_state_dict()  # collective
    if trainer.is_global_zero:
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().float().clone() for k, v in state.items()}, out / "params.pt")
        result = {"losses": model.losses, "graphs": counter.graphs, "graphs_after_validate": unique_graphs()}
        if "load" not in run:
            result["graphs_after_fit"] = graphs_after_fit
        (out / "result.json").write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    args = p.parse_args()
    for name, run in SUITES[args.suite].items():
        train(name, run, args.devices, Path(args.out))


if __name__ == "__main__":
    main()

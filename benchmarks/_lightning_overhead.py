"""benchmarks/.venv-lightning/bin/python benchmarks/_lightning_overhead.py --steps 300 --batch-size 64 --hidden 512 --out /tmp/result.json --root /tmp/run

The Lightning row of ``benchmarks/overhead.py``, which runs this file with the interpreter of
``benchmarks/.venv-lightning`` (see its docstring for how to create it).

Not a benchmark of its own: no ``--write-docs``; its figures are a row of overhead.py's table in
docs/benchmarks.md ("Trainer overhead"). The command above is one run by hand. It trains the
same workload as the other rows (model, data and timing come from ``overhead.py``) with
``lightning.pytorch.Trainer(strategy="ddp", devices=2)``, whose launcher runs this command
again for rank 1.
"""

from __future__ import annotations

import argparse
from typing import Any

import overhead  # this directory is on sys.path; importing it loads only the standard library


def build_parser() -> argparse.ArgumentParser:
    return overhead.worker_parser("benchmarks/.venv-lightning/bin/python benchmarks/_lightning_overhead.py")


def main(argv: list[str] | None = None) -> None:
    clock = overhead.StepClock()
    args = build_parser().parse_args(argv)

    import lightning
    import torch
    import torch.nn.functional as F
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader

    clock.event("imports")
    work = overhead.workload_from(args)

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = overhead.build_net(work)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            clock.mark()
            inputs, labels = batch
            return F.cross_entropy(self.net(inputs), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=work.lr)

    model = Model()
    loader = DataLoader(overhead.make_dataset(work), batch_size=work.batch_size, shuffle=True)
    trainer = Trainer(
        accelerator="cpu",
        devices=overhead.WORLD_SIZE,
        strategy="ddp",
        max_steps=work.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=args.root,
    )
    clock.event("fit")
    trainer.fit(model, loader)
    clock.write(args.out, trainer.global_rank, versions={"lightning": lightning.__version__})
    # Wait for rank 1, as the other rows do: its CPU time then counts as this run's, not as
    # other work on the machine, and no process outlives the run.
    for process in getattr(trainer.strategy.launcher, "procs", []):
        process.wait()


if __name__ == "__main__":
    main()

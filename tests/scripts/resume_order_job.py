"""Train on a dataset of indices and write which indices each rank trained on, batch by batch;
used by tests/test_resume_world_size.py to check resuming at another number of processes.

python tests/scripts/resume_order_job.py --out DIR --devices 2 --max-steps 3 --save CKPT --shuffle
python tests/scripts/resume_order_job.py --out DIR --devices 3 --max-steps 9 --resume CKPT --shuffle
python tests/scripts/resume_order_job.py --devices 2 --scenarios RUNS.json  # argument lists, in turn
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import fullshard

LENGTH = 50  # not a multiple of 2 or 3 processes times the batch: the epoch ends in padding
SHORT = 18  # --combined: the second loader's length (it starts over within an epoch)
BATCH = 4
SEED = 5


class Indices(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``i`` is ``(i, features of i)``: the batch says which samples were trained on."""

    def __init__(self, length: int = LENGTH) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.tensor([i / LENGTH, 1.0])


class Recorder(fullshard.Module):
    def __init__(self, momentum: float = 0.9) -> None:
        super().__init__()
        self.momentum = momentum
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[list[Any]] = []  # [epoch, batch_idx, is_last_batch, indices]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        parts = batch if isinstance(batch, dict) else {"": batch}  # --combined: {"long": .., "short": ..}
        indices = {name: index.tolist() for name, (index, _) in parts.items()}
        seen = indices if isinstance(batch, dict) else indices[""]
        self.seen.append([self.current_epoch, batch_idx, self.trainer.is_last_batch, seen])
        return sum(self.layer(x).pow(2).mean() for _, x in parts.values())  # type: ignore[return-value]

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(
            self.parameters(), lr=0.01, momentum=self.momentum
        )  # 0: no per-parameter state


def train(
    out: Path,
    *,
    devices: int = 1,
    strategy: str = "auto",
    max_steps: int,
    shuffle: bool = False,
    drop_last: bool = False,
    resume: str | None = None,
    save: str | None = None,
    save_every: int = 0,
    sampler: Any = None,
    seed: int = SEED,
    momentum: float = 0.9,
    lightning_sampler: bool = False,
    combined: bool = False,
) -> tuple[fullshard.Trainer, Recorder]:
    """Fit ``Recorder`` and write ``seen_rank{r}.json`` into ``out``."""
    fullshard.seed_everything(seed)
    callbacks = []
    if save_every:
        callbacks.append(
            fullshard.ModelCheckpoint(dirpath=out / "ckpts", every_n_train_steps=save_every, save_top_k=-1)
        )
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=max_steps,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
        # an unshuffled run keeps the loader's order (Lightning's sampler would shuffle it): both
        # kinds of order are resumed, one by each sampler setting
        # (lightning_sampler: an unshuffled loader under the default sampler, which shuffles it)
        use_distributed_sampler=True if shuffle or lightning_sampler else "keep_shuffle",
    )
    model = Recorder(momentum)
    loader = DataLoader(
        Indices(), batch_size=BATCH, shuffle=shuffle and sampler is None, drop_last=drop_last, sampler=sampler
    )
    if combined:  # read together with a shorter loader, which starts over (max_size_cycle)
        short = DataLoader(Indices(SHORT), batch_size=BATCH, shuffle=shuffle, drop_last=drop_last)
        loader = {"long": loader, "short": short}  # type: ignore[assignment]
    trainer.fit(model, loader, ckpt_path=resume)
    if save is not None:
        trainer.save_checkpoint(save)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"seen_rank{trainer.global_rank}.json").write_text(json.dumps(model.seen))
    return trainer, model


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--scenarios", default=None, help="a JSON file: a list of argument lists, run in turn")
    p.add_argument("--out")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument(
        "--lightning-sampler",
        action="store_true",
        help="a shuffle=False loader, shuffled by the default sampler",
    )
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--combined", action="store_true", help="a dict of two loaders of different lengths")
    p.add_argument("--resume", default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--save-every", type=int, default=0, help="ModelCheckpoint every N steps into --out/ckpts")
    p.add_argument("--momentum", type=float, default=0.9, help="0: plain SGD, an optimizer without state")
    args = p.parse_args(argv)
    if args.scenarios is None and (args.out is None or args.max_steps is None):
        p.error("--out and --max-steps are required")
    return args


def main() -> None:
    """One run, or with ``--scenarios`` several in turn in this job's processes (one start-up for
    all; each scenario's --devices must be the job's)."""
    args = parse()
    scenarios = [args]
    if args.scenarios is not None:
        scenarios = [parse(argv) for argv in json.loads(Path(args.scenarios).read_text())]
    for run in scenarios:
        assert run.devices == args.devices, "every scenario of a job runs on the job's processes"
        train(
            Path(run.out),
            devices=run.devices,
            strategy=run.strategy,
            max_steps=run.max_steps,
            shuffle=run.shuffle,
            drop_last=run.drop_last,
            resume=run.resume,
            save=run.save,
            save_every=run.save_every,
            momentum=run.momentum,
            lightning_sampler=run.lightning_sampler,
            combined=run.combined,
        )


if __name__ == "__main__":
    main()

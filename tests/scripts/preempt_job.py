"""Train with a preemption signal sent to one rank mid-training, then resume; used by
tests/test_preemption.py.

python tests/scripts/preempt_job.py --out DIR --strategy fsdp --format sharded --signal-rank 1 --signal-step 4
python tests/scripts/preempt_job.py --out DIR --strategy fsdp --format sharded --resume
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

import fullshard
import fullshard.trainer.preemption as preemption

sys.path.insert(0, str(Path(__file__).parent))
from ckpt_job import Net, make_data, make_strategy


class Recorder(fullshard.Callback):
    """Sends SIGTERM to this process at the given step (and, with ``twice``, again while the
    preemption checkpoint is being saved)."""

    def __init__(self, out: Path, model: Net, signal_rank: int, signal_step: int, twice: bool) -> None:
        self.out, self.model = out, model
        self.signal_rank, self.signal_step, self.twice = signal_rank, signal_step, twice

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        time.sleep(0.01)  # steps of a few ms: let the other rank's poller see the request in time
        # with every step skipped (--skip) the step never moves: signal_step counts batches then
        position = batch_idx + 1 if getattr(self.model, "skips", False) else trainer.global_step
        if trainer.global_rank == self.signal_rank and position == self.signal_step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        if self.twice and trainer.global_rank == self.signal_rank:
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal while the checkpoint is saved


class Skipping(Net):
    """A model none of whose optimizer steps runs."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.skips = True

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        return None if self.how == "return-none" else loss * float("nan")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default="fsdp")
    p.add_argument("--format", default="full")
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--signal-rank", type=int, default=-1)
    p.add_argument("--signal-step", type=int, default=-1)
    p.add_argument("--twice", action="store_true", help="signal again while the checkpoint is saved")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--tag", default="", help="suffix of the losses files")
    p.add_argument(
        "--skip",
        choices=["none", "return-none", "nonfinite"],
        default="none",
        help="skip every optimizer step: training_step returns None, or a NaN loss with on_nonfinite_loss='skip'",
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    requeued = out / "requeued.txt"
    preemption.requeue_job = lambda job_id: requeued.write_text(job_id)  # the SLURM seam
    preemption.POLL_S = 0.02
    fullshard.seed_everything(11)
    model = Skipping(args.skip) if args.skip != "none" else Net()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=make_strategy(args.strategy, args.format),
        max_steps=args.max_steps,
        max_epochs=3 if args.skip != "none" else None,
        on_nonfinite_loss="skip" if args.skip == "nonfinite" else "raise",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            fullshard.ModelCheckpoint(dirpath=out / "ckpts", save_top_k=0),
            Recorder(out, model, args.signal_rank, args.signal_step, args.twice),
        ],
        default_root_dir=out,
    )
    loader = torch.utils.data.DataLoader(make_data(), batch_size=8, shuffle=True)
    try:
        trainer.fit(model, loader, ckpt_path="last" if args.resume else None)
    finally:  # also when preempted: the losses up to the saved step
        (out / f"losses{args.tag}_rank{trainer.global_rank}.json").write_text(json.dumps(model.losses))
    model_state, _ = trainer.strategy.get_state(trainer.optimizers, full=True)
    if trainer.is_global_zero:
        torch.save({"model": model_state, "global_step": trainer.global_step}, out / "final.pt")


if __name__ == "__main__":
    main()

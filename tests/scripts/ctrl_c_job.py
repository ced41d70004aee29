"""Ctrl+C during fit, in a script that does not catch it (tests/test_trainer_pins.py): the process
ends with status 1 and no traceback, as under Lightning, after the shutdown put SIGINT back.

python tests/scripts/ctrl_c_job.py
"""

from __future__ import annotations

import atexit
import signal
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard


class CtrlC(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 1:
            raise KeyboardInterrupt
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@atexit.register
def _report() -> None:
    handler = signal.getsignal(signal.SIGINT)
    print(f"exiting; SIGINT handler is the default: {handler is signal.default_int_handler}")


if __name__ == "__main__":
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(CtrlC(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2))
    print("fit returned")  # never: Ctrl+C ends the script

"""strategy="ddp_spawn" with a module class that the spawned processes cannot find: it is defined
under ``if __name__ == "__main__":``, which they do not run. The class passes the launching
process's checks (a script's ``__main__`` is re-created in each new process), so only the
processes themselves can notice. The module carries a payload far larger than a pipe holds: the
job must still end within seconds with the processes' explanation (tests/test_launch.py).

Run it as:

    python tests/scripts/launch_spawn_guard.py
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard

if __name__ == "__main__":

    class Hidden(fullshard.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.notes = list(range(300_000))  # pickles to about 1.5 MB

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Hidden(), DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4))

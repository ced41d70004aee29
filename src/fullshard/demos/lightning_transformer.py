"""``LightningTransformer``: Lightning's demo module (``lightning.pytorch.demos``), the
:class:`~fullshard.demos.transformer.Transformer` trained on
:class:`~fullshard.demos.wikitext.WikiText2` with SGD."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from fullshard.demos.transformer import Transformer
from fullshard.demos.wikitext import WikiText2
from fullshard.module import LightningModule


class LightningTransformer(LightningModule):
    def __init__(self, vocab_size: int = 33278) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(inputs, target)
        return out

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        return F.nll_loss(self(inputs, target), target.view(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        return DataLoader(WikiText2())

"""Lightning's small test models and datasets (``lightning.pytorch.demos.boring_classes``):
random inputs of width 32, a linear layer, a loss that moves the weights. For bug reports and
quick checks of a Trainer option."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from fullshard.datamodule import LightningDataModule
from fullshard.module import LightningModule


class RandomDictDataset(Dataset[dict[str, torch.Tensor]]):
    """``length`` random vectors of width ``size`` as ``{"a": x, "b": x + 2}``."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        a = self.data[index]
        return {"a": a, "b": a + 2}

    def __len__(self) -> int:
        return self.len


class RandomDataset(Dataset[torch.Tensor]):
    """``length`` random vectors of width ``size``, drawn once."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class RandomIterableDataset(IterableDataset[torch.Tensor]):
    """``count`` fresh random vectors of width ``size`` per iteration, without a length."""

    def __init__(self, size: int, count: int) -> None:
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.count):
            yield torch.randn(self.size)


class RandomIterableDatasetWithLen(RandomIterableDataset):
    """:class:`RandomIterableDataset` with a length."""

    def __len__(self) -> int:
        return self.count


class BoringModel(LightningModule):
    """A linear layer 32 -> 2 trained towards ones with SGD and a StepLR; subclass it and
    override what a check needs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(x)
        return out

    def loss(self, preds: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return F.mse_loss(preds, torch.ones_like(preds) if labels is None else labels)

    def step(self, batch: Any) -> torch.Tensor:
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, 64))

    def predict_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, 64))


class ManualOptimBoringModel(BoringModel):
    """:class:`BoringModel` with manual optimisation."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        optimizer = self.optimizers()
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class _RandomLoaders(LightningDataModule):
    """One loader per stage over the ``random_<stage>`` dataset ``setup`` made."""

    random_train: Dataset[Any]
    random_val: Dataset[Any]
    random_test: Dataset[Any]
    random_predict: Dataset[Any]

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.random_predict)


class BoringDataModule(_RandomLoaders):
    """256 random vectors of width 32, split in four blocks of 64 for fit, validate, test and
    predict."""

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = Subset(self.random_full, indices=range(64))
        if stage in ("fit", "validate"):
            self.random_val = Subset(self.random_full, indices=range(64, 64 * 2))
        if stage == "test":
            self.random_test = Subset(self.random_full, indices=range(64 * 2, 64 * 3))
        if stage == "predict":
            self.random_predict = Subset(self.random_full, indices=range(64 * 3, 64 * 4))


class BoringDataModuleNoLen(_RandomLoaders):
    """Random vectors of width 32 from iterable datasets without a length."""

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = RandomIterableDataset(32, 512)
        if stage in ("fit", "validate"):
            self.random_val = RandomIterableDataset(32, 128)
        if stage == "test":
            self.random_test = RandomIterableDataset(32, 256)
        if stage == "predict":
            self.random_predict = RandomIterableDataset(32, 64)


class IterableBoringDataModule(LightningDataModule):
    """Two loaders per stage, one over a sized dataset and one over an iterable one (width 4)."""

    def setup(self, stage: str) -> None:
        sizes = {"fit": 16, "validate": 32, "test": 64, "predict": 128}
        if stage == "fit":
            self.train_datasets = self._pair(sizes["fit"])
        if stage in ("fit", "validate"):
            self.val_datasets = self._pair(sizes["validate"])
        if stage == "test":
            self.test_datasets = self._pair(sizes["test"])
        if stage == "predict":
            self.predict_datasets = self._pair(sizes["predict"])

    @staticmethod
    def _pair(length: int) -> list[Dataset[Any]]:
        return [RandomDataset(4, length), RandomIterableDataset(4, length)]

    def train_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.train_datasets]

    def val_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.val_datasets]

    def test_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.test_datasets]

    def predict_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.predict_datasets]


class DemoModel(LightningModule):
    """A linear layer 32 -> ``out_dim`` with a ReLU, its outputs' sum as the loss, Adam."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02) -> None:
        super().__init__()
        self.l1 = nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_nb: int) -> Any:
        return self(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """The MNIST convolutional classifier of PyTorch's examples: (N, 1, 28, 28) images to
    log-probabilities over 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.fc2(self.dropout2(F.relu(self.fc1(x))))
        return F.log_softmax(x, dim=1)

"""Lightning's MNIST demo data (``lightning.pytorch.demos.mnist_datamodule``), read from a local
copy; fullshard downloads nothing.

``MNIST(root, train=...)`` reads Lightning's processed files, ``root/MNIST/complete/training.pt``
and ``test.pt`` (each ``(images uint8 (N, 28, 28), labels int64 (N,))``, as Lightning's hosted
copy has them). Where they are missing it builds synthetic digits instead: 60,000 training and
10,000 test images of the same shapes and dtypes, each class a fixed pattern plus noise (so a
classifier can learn them), with one warning saying so.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, random_split

from fullshard.datamodule import LightningDataModule

_DATASETS_PATH = "./data"
_SIZES = {True: 60_000, False: 10_000}
_warned: set[str] = set()


def synthetic_digits(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` 28x28 ``uint8`` images and their ``int64`` labels 0-9: a fixed random pattern
    per class (the same for every seed) with per-image noise."""
    patterns = torch.rand(10, 28, 28, generator=torch.Generator().manual_seed(1234)) * 200
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=generator)
    noise = torch.randn(count, 28, 28, generator=generator) * 40
    images = (patterns[labels] + noise).clamp(0, 255).to(torch.uint8)
    return images, labels


class _MNISTFiles(Dataset[tuple[torch.Tensor, int]]):
    """MNIST from Lightning's processed files, or synthetic digits (see the module's note)."""

    def __init__(
        self,
        root: str,
        train: bool = True,
        normalize: tuple[float, float] | None = (0.1307, 0.3081),
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.root = root
        self.train = train
        self.normalize = normalize
        path = os.path.join(root, "MNIST", "complete", "training.pt" if train else "test.pt")
        if os.path.isfile(path):
            self.data, self.targets = torch.load(path, weights_only=True)
            return
        if path not in _warned:
            _warned.add(path)
            warnings.warn(
                f"MNIST: there is no {path} and fullshard downloads nothing; using synthetic digits of "
                "the same shapes and dtypes. For the real images, put Lightning's processed MNIST "
                f"files (training.pt, test.pt) in {os.path.dirname(path)}.",
                UserWarning,
                stacklevel=3,
            )
        self.data, self.targets = synthetic_digits(_SIZES[train], seed=0 if train else 1)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        image = self.data[idx].float().unsqueeze(0)
        if self.normalize is not None and len(self.normalize) == 2:
            mean, std = self.normalize
            image = image.sub(mean).div(std)
        return image, int(self.targets[idx])

    def __len__(self) -> int:
        return len(self.data)


def MNIST(*args: Any, **kwargs: Any) -> Dataset[tuple[torch.Tensor, int]]:  # Lightning's name
    """MNIST as ``(image float (1, 28, 28), label int)`` items: ``MNIST(root, train=True,
    normalize=(0.1307, 0.3081), download=True)``. ``download`` and other keywords (``transform``)
    are accepted and ignored, as by Lightning's own copy."""
    kwargs.pop("download", None)
    return _MNISTFiles(*args, **kwargs)


class MNISTDataModule(LightningDataModule):
    """MNIST's training images split into training and validation (``val_split`` images, split
    with seed 42), and its test images; batches of ``batch_size``."""

    name = "mnist"

    def __init__(
        self,
        data_dir: str = _DATASETS_PATH,
        val_split: int = 5000,
        num_workers: int = 16,
        normalize: bool = False,
        seed: int = 42,
        batch_size: int = 32,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.val_split = val_split
        self.num_workers = num_workers
        self.normalize = normalize
        self.seed = seed
        self.batch_size = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def prepare_data(self) -> None:
        MNIST(self.data_dir, train=True, download=True)
        MNIST(self.data_dir, train=False, download=True)

    def setup(self, stage: str) -> None:
        dataset = MNIST(self.data_dir, train=True, download=False)
        length = len(dataset)  # type: ignore[arg-type]
        self.dataset_train, self.dataset_val = random_split(
            dataset, [length - self.val_split, self.val_split], generator=torch.Generator().manual_seed(42)
        )

    def _loader(self, dataset: Dataset[Any], shuffle: bool) -> DataLoader[Any]:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            drop_last=True,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.dataset_train, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.dataset_val, shuffle=False)

    def test_dataloader(self) -> DataLoader[Any]:
        return self._loader(MNIST(self.data_dir, train=False, download=False), shuffle=False)

"""``fullshard.DataModule``: the data of a project in one class, as Lightning's ``LightningDataModule``."""

from __future__ import annotations

import copy
import functools
import inspect
from types import FrameType
from typing import TYPE_CHECKING, Any

from fullshard import hyperparameters
from fullshard.batch_transfer import move_data_to_device
from fullshard.module import AttributeDict

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from typing_extensions import Self

    from fullshard.trainer.trainer import Trainer


class DataModule:
    """Groups the dataloaders of a project and the steps that prepare them.

    The Trainer calls, in this order: :meth:`prepare_data` (once per machine, on local rank 0,
    before the others go on: download or tokenize here, without setting state), :meth:`setup`
    (on every process, with the stage: ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``),
    then the ``*_dataloader`` methods the stage needs, and :meth:`teardown` at the end.
    Pass it as ``trainer.fit(model, datamodule=dm)`` (or in place of the training dataloaders).
    """

    #: A name for the data (Lightning's attribute; fullshard does not read it).
    name: str | None = None
    #: The checkpoint entries of a DataModule's hyperparameters, as Lightning names them.
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self._hparams = AttributeDict()
        self._hparams_initial: dict[str, Any] = {}

    @property
    def hparams(self) -> AttributeDict:
        """Values recorded by :meth:`save_hyperparameters`."""
        return self._hparams

    def remove_ignored_hparams(self, ignore_list: list[str]) -> None:
        """Drop the hyperparameters named in ``ignore_list`` from :attr:`hparams` (a subclass
        dropping what its base class's ``save_hyperparameters`` recorded), as Lightning's."""
        for key in ignore_list:
            self._hparams.pop(key, None)

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of :attr:`hparams` as :meth:`save_hyperparameters` recorded them."""
        return AttributeDict(copy.deepcopy(self._hparams_initial))

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | Path, trust_checkpoint: bool = False, **kwargs: Any
    ) -> Self:
        """Build the DataModule from a checkpoint: ``cls(**hparams, **kwargs)`` with the
        hyperparameters :meth:`save_hyperparameters` recorded (``kwargs`` override them), then
        :meth:`load_state_dict` with the state :meth:`state_dict` saved, as Lightning's. Read
        with ``weights_only=True`` unless ``trust_checkpoint`` (see ``Module.load_from_checkpoint``)."""
        from fullshard.checkpoint.module_loading import load_datamodule_from_checkpoint

        return load_datamodule_from_checkpoint(cls, checkpoint_path, trust_checkpoint, **kwargs)

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Any = None,
        val_dataset: Any = None,
        test_dataset: Any = None,
        predict_dataset: Any = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> DataModule:
        """A DataModule whose ``*_dataloader`` methods wrap the given datasets (each a dataset,
        or a list or dict of them for several loaders) in ``DataLoader(batch_size=,
        num_workers=)``; the training loader shuffles. ``datamodule_kwargs`` go to ``cls()``."""
        from torch.utils.data import DataLoader, IterableDataset

        def loaders(datasets: Any, shuffle: bool) -> Any:
            def one(dataset: Any) -> DataLoader[Any]:
                iterable = isinstance(dataset, IterableDataset)
                return DataLoader(
                    dataset, batch_size=batch_size, shuffle=shuffle and not iterable, num_workers=num_workers
                )

            if isinstance(datasets, dict):
                return {key: one(d) for key, d in datasets.items()}
            if isinstance(datasets, list | tuple):
                return [one(d) for d in datasets]
            return one(datasets)

        datamodule = cls(**datamodule_kwargs)
        given = {"train": train_dataset, "val": val_dataset, "test": test_dataset, "predict": predict_dataset}
        for kind, datasets in given.items():
            if datasets is not None:
                setattr(
                    datamodule, f"{kind}_dataloader", functools.partial(loaders, datasets, kind == "train")
                )
        return datamodule

    def save_hyperparameters(
        self,
        *args: Any,
        ignore: str | list[str] | None = None,
        frame: FrameType | None = None,
        logger: bool = True,
        **values: Any,
    ) -> None:
        """Record the arguments of the calling ``__init__`` (or ``args`` naming some, or one
        dict/``Namespace``/``DictConfig``, or ``values``), as :meth:`fullshard.Module.save_hyperparameters`."""
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        recorded = hyperparameters.record(self, frame, args, ignore, values, logger)
        if recorded is None:
            return
        self._hparams.update(recorded)
        self._hparams_initial = copy.deepcopy(dict(self._hparams))

    def prepare_data(self) -> None:
        """Download or preprocess once per machine (local rank 0 only). Do not set state here."""

    def setup(self, stage: str) -> None:
        """Build datasets on every process; ``stage`` is the Trainer call being made."""

    def teardown(self, stage: str) -> None:
        """Release what :meth:`setup` built."""

    def on_exception(self, exception: BaseException) -> None:
        """Called on the process whose ``fit``/``validate``/``test``/``predict`` raised ``exception``,
        after the callbacks' ``on_exception`` and before ``teardown``: clean up what the data holds."""

    def train_dataloader(self) -> Any:
        """The training dataloader (``fit``)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define train_dataloader(), which fit() needs. Override it and "
            "return a DataLoader."
        )

    def val_dataloader(self) -> Any:
        """The validation dataloader (``fit`` and ``validate``); optional for ``fit``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define val_dataloader(), which validate() needs. Override it "
            "and return a DataLoader."
        )

    def test_dataloader(self) -> Any:
        """The test dataloader (``test``)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define test_dataloader(), which test() needs. Override it and "
            "return a DataLoader."
        )

    def predict_dataloader(self) -> Any:
        """The prediction dataloader (``predict``)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define predict_dataloader(), which predict() needs. Override "
            "it and return a DataLoader."
        )

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """As :meth:`fullshard.Module.on_before_batch_transfer`; overriding it here takes
        precedence over the module's (Lightning's rule)."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """As :meth:`fullshard.Module.transfer_batch_to_device`; takes precedence over the module's."""
        return move_data_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """As :meth:`fullshard.Module.on_after_batch_transfer`; takes precedence over the module's."""
        return batch

    def state_dict(self) -> dict[str, Any]:
        """State to store in checkpoints (empty by default)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


LightningDataModule = DataModule
"""Lightning's name for :class:`DataModule`."""

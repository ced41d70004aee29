"""The Trainer's data setup: preparing each stage's loaders, batch counts, when to validate."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from lightning_utilities.core.rank_zero import rank_zero_warn

from fullshard.errors import MisconfigurationError, RankDivergenceError
from fullshard.module import Module
from fullshard.seed import current_seed
from fullshard.trainer.data import PreparedLoader, limit_batches, prepare_dataloader
from fullshard.trainer.preflight import DataSources, overrides

if TYPE_CHECKING:
    from fullshard.strategies import Strategy


class DataSetup:
    """Mixed into :class:`~fullshard.Trainer`: the attributes it reads are the Trainer's."""

    _strategy: Strategy
    use_distributed_sampler: bool
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    num_training_batches: int | float
    _val_batches: int | float
    _test_batches: int | float
    _predict_batches: int | float
    num_sanity_val_steps: int
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    current_epoch: int
    is_last_batch: bool
    _total_batch_idx: int
    _raw_train_loader: Any
    _train_loader: PreparedLoader | None
    _val_loader: PreparedLoader | None
    _test_loader: PreparedLoader | None
    _predict_loader: PreparedLoader | None
    _val_check_batch: int | float

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per run, one entry per dataloader (Lightning's form); kept after the call."""
        return [] if self._val_loader is None else [self._val_batches]

    @property
    def num_test_batches(self) -> list[int | float]:
        """Test batches per run, one entry per dataloader; kept after the call."""
        return [] if self._test_loader is None else [self._test_batches]

    @property
    def num_predict_batches(self) -> list[int | float]:
        """Prediction batches per run, one entry per dataloader; kept after the call."""
        return [] if self._predict_loader is None else [self._predict_batches]

    def _prepare(self, loader: Any, kind: str, limit: int | float) -> tuple[PreparedLoader, int | float]:
        prepared = prepare_dataloader(
            loader,
            shuffle_default=kind == "train",
            seed=current_seed(),
            name=f"The {kind} dataloader",
            distributed=self.use_distributed_sampler,
            **self._strategy.distributed_sampler_kwargs,
        )
        available = len(prepared) if prepared.has_len() else math.inf
        return prepared, limit_batches(limit, available, f"limit_{kind}_batches")

    def _setup_train_loader(self, loader: Any) -> None:
        self._train_loader, self.num_training_batches = self._prepare(loader, "train", self.limit_train_batches)

    def _setup_fit_train_data(self, model: Module, sources: DataSources) -> None:
        """The training loader of ``fit`` (asked for after the sanity validation, as in Lightning)."""
        if self._train_loader is None:  # estimated_stepping_batches may have built it already
            self._setup_train_loader(sources.get("train", model))
        if self.num_training_batches == 0:
            rank_zero_warn("The training dataloader yields no batches (or limit_train_batches=0): nothing to train.")
        self._check_same_batch_count(self.num_training_batches, "training")

    def _setup_val_data(self, model: Module, sources: DataSources) -> None:
        self._val_loader, self._val_batches = None, 0
        if overrides(model, Module, "validation_step"):
            loader = sources.get("val", model)
            if loader is not None:
                self._val_loader, self._val_batches = self._prepare(loader, "val", self.limit_val_batches)

    def _setup_data(self, stage: str, model: Module, sources: DataSources) -> None:
        """The loaders of ``validate``, ``test`` or ``predict`` (``fit`` sets its own up as it goes)."""
        self._val_check_batch = 0
        if stage == "validate":
            self._setup_val_data(model, sources)
        elif stage == "test":
            self._test_loader, self._test_batches = self._prepare(sources.get("test", model), "test", self.limit_test_batches)
        elif stage == "predict":
            self._predict_loader, self._predict_batches = self._prepare(sources.get("predict", model), "predict", self.limit_predict_batches)

    def _check_same_batch_count(self, count: int | float, what: str) -> None:
        """Every rank must run as many batches, or the ones that finish first leave the others
        waiting in a collective; a map-style loader's count is known now, so compare it once."""
        if self._strategy.world_size == 1:
            return
        counts = self._strategy.all_gather_object(count)
        if len(set(counts)) > 1:
            listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
            raise RankDivergenceError(
                f"The processes have different numbers of {what} batches per epoch ({listed}), so the ones "
                "that finish first would wait for the others forever. Give every process the same number "
                "of batches: use the Trainer's distributed sampler (use_distributed_sampler=True, the "
                "default) or make your own sampler split the data evenly."
            )

    def _compute_val_check_batch(self) -> int | float:
        if self._val_loader is None or self._val_batches == 0:
            return 0
        interval = self.val_check_interval
        if isinstance(interval, int):
            if (
                self.check_val_every_n_epoch is not None
                and not math.isinf(self.num_training_batches)
                and interval > self.num_training_batches
            ):
                raise MisconfigurationError(
                    f"val_check_interval={interval} is more than the {self.num_training_batches} training batches "
                    "of an epoch. Pass a smaller number, or check_val_every_n_epoch=None to count batches "
                    "across epochs."
                )
            return interval
        if math.isinf(self.num_training_batches):
            if interval == 1.0:
                return math.inf  # validated at the end of each epoch
            raise MisconfigurationError(
                "val_check_interval is a fraction, but the training dataloader has no length. Pass a number "
                "of batches instead, e.g. val_check_interval=1000."
            )
        return max(1, int(self.num_training_batches * interval))

    def _sanity_wanted(self, model: Module, sources: DataSources) -> bool:
        """Whether fit starts with a sanity validation (known before any loader is built)."""
        return (
            self.num_sanity_val_steps != 0
            and overrides(model, Module, "validation_step")
            and sources.has("val", model)
        )

    def _sanity_batches(self) -> int | float:
        if self._val_loader is None or self.num_sanity_val_steps == 0:
            return 0
        if self.num_sanity_val_steps == -1:
            return self._val_batches
        return min(self.num_sanity_val_steps, self._val_batches)

"""Preparing a stage's loader and counting its batches; when validation runs during training.

Free functions over the Trainer's public settings; the loops own what they return.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torch.utils.data import DistributedSampler, RandomSampler

from fullshard.errors import MisconfigurationError, RankDivergenceError
from fullshard.rank_zero import PossibleUserWarning, rank_zero_warn
from fullshard.seed import current_seed
from fullshard.trainer.combined_loader import CombinedLoader, PreparedCombined, as_combined, combined_length
from fullshard.trainer.data import PreparedLoader, limit_batches, prepare_dataloader
from fullshard.trainer.states import TrainerFn

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.strategies import Strategy
    from fullshard.trainer.loops.fit_loop import FitLoop
    from fullshard.trainer.preflight import DataSources
    from fullshard.trainer.trainer import Trainer

_LIMIT = {"train": "limit_train_batches", "val": "limit_val_batches", "test": "limit_test_batches",
          "predict": "limit_predict_batches"}  # fmt: skip


def prepare(
    trainer: Trainer, loader: Any, kind: str, *, inner: bool = False
) -> tuple[PreparedLoader | PreparedCombined, int | float]:
    """``loader`` as the loops use it (``kind``: train, val, test or predict), and its batches per
    run after the Trainer's ``limit_<kind>_batches``. A :class:`CombinedLoader` (for training
    also a dict, list or tuple of loaders) has each of its loaders prepared so; its batches per
    run are those of its mode over the loaders' limited counts, as Lightning counts them (its
    loaders, ``inner``, keep the seeded order: [Note: resuming combined loaders])."""
    combined = as_combined(loader, "max_size_cycle") if kind == "train" else None
    if combined is None and isinstance(loader, CombinedLoader):
        combined = loader
    if combined is not None:
        parts = [prepare(trainer, part, kind, inner=True) for part in combined.flattened]
        batches = combined_length(combined.mode, [limit for _, limit in parts])
        return PreparedCombined(combined, [p for p, _ in parts]), batches  # type: ignore[misc]
    shuffle = None
    if trainer.overfit_batches and kind in ("train", "val"):
        shuffle = _overfit_shuffle(loader, kind, bool(trainer.use_distributed_sampler))
    elif kind == "train" and _shuffles_training_data(trainer):
        shuffle = True
    prepared = prepare_dataloader(
        loader,
        shuffle_default=kind == "train",
        seed=current_seed(),
        name=f"The {kind} dataloader",
        distributed=bool(trainer.use_distributed_sampler),
        shuffle=shuffle,
        # on one device without a distributed strategy, a shuffling loader's RandomSampler order,
        # drawn from the global generator ([Note: the training sampler's order] in data.py)
        draws_order=not inner and not trainer.strategy.one_process_per_device,
        **trainer.strategy.distributed_sampler_kwargs,
    )
    _warn_padded_evaluation(trainer, prepared, kind)
    available = len(prepared) if prepared.has_len() else math.inf
    name, limit = _LIMIT[kind], getattr(trainer, _LIMIT[kind])
    if available == 0 and limit != 0:  # Lightning's check, on each loader it builds
        rank_zero_warn(
            f"The {kind} dataloader has length zero ({type(loader).__name__} of no batches): nothing of it "
            "runs. Make sure this is intended (an empty dataset? drop_last=True with fewer samples than "
            "batch_size?).",
            stacklevel=1,
        )
    batches = limit_batches(limit, available, name)
    if (
        batches == 0 < available < math.inf and isinstance(limit, float) and limit > 0
    ):  # as Lightning: too small a fraction
        raise MisconfigurationError(
            f"{name}={limit} of the {kind} dataloader's {available} batch(es) is less than one batch "
            f"({limit} * {available} < 1), so nothing would run. Pass at least {name}={1 / available} (or a "
            f"number of batches, e.g. {name}=1), or {name}=0 to skip it."
        )
    return prepared, batches


def _warn_padded_evaluation(trainer: Trainer, prepared: PreparedLoader, kind: str) -> None:
    """``trainer.validate``/``test`` on several processes: the split sampler repeats samples to
    give every process as many batches, so some are evaluated twice (Lightning warns too)."""
    sampler = getattr(prepared.loader, "sampler", None)
    entry = trainer.state.fn
    if (
        isinstance(sampler, DistributedSampler)
        and sampler.num_replicas > 1
        and entry in (TrainerFn.VALIDATING, TrainerFn.TESTING)
    ):
        rank_zero_warn(
            f"trainer.{entry.value}() on {sampler.num_replicas} processes splits the {kind} dataloader with a "
            "DistributedSampler, which repeats samples so that every process gets as many batches: some "
            f"are evaluated twice. Run trainer.{entry.value}() with Trainer(devices=1, num_nodes=1) to "
            "evaluate each sample exactly once.",
            category=PossibleUserWarning,
            stacklevel=1,
        )


def _shuffles_training_data(trainer: Trainer) -> bool:
    """Lightning's rule: under a distributed strategy (DDP, FSDP, model parallel; also on one
    device) the sampler it adds shuffles the training data, even from a loader built with
    ``shuffle=False``; ``use_distributed_sampler="keep_shuffle"`` keeps the loader's order. See
    [Note: the training sampler's order] in fullshard.trainer.data."""
    return trainer.use_distributed_sampler is True and trainer.strategy.one_process_per_device


def _overfit_shuffle(loader: Any, kind: str, distributed: bool) -> bool | None:
    """Under ``overfit_batches`` the same batches come every epoch, as in Lightning: a shuffling
    loader is made sequential, with Lightning's warning (False), else left as it is (None)."""
    if not isinstance(getattr(loader, "sampler", None), RandomSampler):
        return None
    if not distributed:
        rank_zero_warn(
            f"You requested to overfit but the {kind} dataloader shuffles, and with use_distributed_sampler=False "
            "the Trainer uses it as given: pass shuffle=False to it to see the same batches every epoch."
        )
        return None
    rank_zero_warn(
        f"You requested to overfit but enabled {kind} dataloader shuffling. We are turning off the {kind} "
        "dataloader shuffling for you."
    )
    return False


def check_same_batch_count(strategy: Strategy, count: int | float, what: str) -> None:
    """Every rank must run as many batches, or the ones that finish first leave the others
    waiting in a collective; a map-style loader's count is known now, so compare it once."""
    if strategy.world_size == 1:
        return
    counts = strategy.all_gather_object(count)
    if len(set(counts)) > 1:
        listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
        raise RankDivergenceError(
            f"The processes have different numbers of {what} batches per epoch ({listed}), so the ones "
            "that finish first would wait for the others forever. Give every process the same number "
            "of batches: use the Trainer's distributed sampler (use_distributed_sampler=True, the "
            "default) or make your own sampler split the data evenly."
        )


def check_interval_fits(trainer: Trainer, train_batches: int | float) -> None:
    """Refuse an int ``val_check_interval`` above the training batches of an epoch (validation
    would never run), as Lightning does when it builds the training loader: a ``ValueError``,
    also when the run has no validation, unless ``limit_val_batches=0`` turns it off."""
    interval = trainer.val_check_interval
    if (
        isinstance(interval, int)
        and trainer.check_val_every_n_epoch is not None
        and trainer.limit_val_batches > 0
        and interval > train_batches  # never for a loader without a length (inf)
    ):
        raise ValueError(
            f"val_check_interval={interval} is more than the {train_batches} training batches of an "
            "epoch. Pass a smaller number, check_val_every_n_epoch=None to count batches across "
            "epochs, or limit_val_batches=0 to turn validation off."
        )


def val_check_batch(trainer: Trainer, val_batches: int | float, train_batches: int | float) -> int | float:
    """Validate after every this many training batches (inf: at the end of each epoch; 0: never).
    A fraction other than 1.0 with a training loader of no length is refused even where nothing
    validates, as Lightning refuses it when it sets the training loader up."""
    interval = trainer.val_check_interval
    if not isinstance(interval, int) and math.isinf(train_batches) and interval != 1.0:
        raise MisconfigurationError(
            "val_check_interval is a fraction, but the training dataloader has no length. Pass a number "
            "of batches instead, e.g. val_check_interval=1000."
        )
    if val_batches == 0:
        return 0
    if isinstance(interval, int):
        return interval
    if math.isinf(train_batches):
        return math.inf  # validated at the end of each epoch
    return max(1, int(train_batches * interval))


class ReloadSchedule:
    """``reload_dataloaders_every_n_epochs``: when a fit rebuilds its loaders, by Lightning's rule
    (``epoch - epoch of the last build >= n``): the training loader at the start of an epoch, the
    validation loader when a validation run starts. Counted from ``current_epoch`` when the fit
    built its loaders (a resumed fit builds them when it starts, before it moves past an epoch
    its checkpoint ended), as Lightning counts."""

    def __init__(
        self, every: int = 0, epoch: int = 0, module: Module | None = None, sources: DataSources | None = None
    ) -> None:
        self.every = every
        self.train_epoch = epoch  # the epoch of the last build
        self.val_epoch = epoch
        self.module, self.sources = module, sources

    def before_epoch(self, loop: FitLoop) -> bool:
        """Rebuild the training loader from its source (``train_dataloader()``, the DataModule's,
        or the loader given to ``fit``) when due, keeping the run's data seed. Returns whether
        it did."""
        epoch = loop.progress.epoch
        if not self.every or epoch - self.train_epoch < self.every or loop.train_loader is None:
            return False
        assert self.module is not None and self.sources is not None  # given with every > 0
        seed = loop.train_loader.seed
        loop.train_loader = None
        loop.setup_train_loader(self.sources.get("train", self.module))
        rebuilt = loop.train_loader
        assert rebuilt is not None  # set by setup_train_loader
        rebuilt.reseed(seed)
        check_same_batch_count(loop.trainer.strategy, loop.num_training_batches, "training")
        loop.warn_if_few_batches()
        if loop.num_training_batches:
            check_interval_fits(loop.trainer, loop.num_training_batches)
        self.train_epoch = epoch
        self._update_val_check(loop)
        return True

    def before_validation(self, loop: FitLoop) -> None:
        """Rebuild the validation loader when due."""
        epoch, validate = loop.progress.epoch, loop.validate_loop
        if not self.every or epoch - self.val_epoch < self.every or validate.loader is None:
            return
        assert self.module is not None and self.sources is not None  # given with every > 0
        validate.setup_data(self.module, self.sources)
        self.val_epoch = epoch
        self._update_val_check(loop)

    @staticmethod
    def _update_val_check(loop: FitLoop) -> None:
        validate = loop.validate_loop
        loop.val_check_batch = val_check_batch(
            loop.trainer,
            validate.num_batches if validate.loader is not None else 0,
            loop.num_training_batches,
        )

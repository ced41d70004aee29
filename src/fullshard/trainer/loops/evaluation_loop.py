"""The evaluation loops: validation (also the sanity run before training), test and predict.

Each run calls, as Lightning does: the module's ``on_<stage>_model_eval`` (default: ``eval()``),
``on_<stage>_start``, ``on_<stage>_epoch_start``; then for each dataloader in turn, per batch
``on_<stage>_batch_start``, the step, ``on_<stage>_batch_end``, and that dataloader's
epoch-level metrics are reduced; then ``on_<stage>_epoch_end`` runs (what it logs is an epoch
value, shared by all the dataloaders' results), the epoch's metrics go to the loggers in one
row, ``on_<stage>_end`` runs (where ``ModelCheckpoint`` and ``EarlyStopping`` act on validation
metrics), and the module's mode is put back (``on_<stage>_model_train`` when overridden).

[Note: several evaluation dataloaders]
A list, tuple or dict of dataloaders is run one after the other (Lightning's "sequential"
``CombinedLoader``), each from batch index 0 and each capped by ``limit_<stage>_batches`` (and
``num_sanity_val_steps``) on its own. Only then do the step and the batch hooks get a
``dataloader_idx`` argument, and what is logged in a step gets the name suffix
``/dataloader_idx_<i>`` (unless ``add_dataloader_idx=False``); ``validate``/``test`` return one
dict per dataloader, and ``predict`` a list of predictions per dataloader.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any

import torch

from fullshard.launch import stuck_ranks
from fullshard.module import Module
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer import data_setup
from fullshard.trainer.combined_loader import PreparedCombined
from fullshard.trainer.data import PreparedLoader
from fullshard.trainer.loggers.dispatch import send_to_loggers
from fullshard.trainer.loops.fetcher import Fetcher
from fullshard.trainer.loops.prediction_indices import BatchIndexRecorder, prediction_writers
from fullshard.trainer.preflight import overrides
from fullshard.trainer.states import RunningStage

if TYPE_CHECKING:
    from fullshard.trainer.callbacks.prediction_writer import BasePredictionWriter
    from fullshard.trainer.hooks import Hooks
    from fullshard.trainer.metrics import MetricsCollector
    from fullshard.trainer.preflight import DataSources
    from fullshard.trainer.trainer import Trainer

_HOOK_STAGE = {"validate": "validation", "test": "test", "predict": "predict"}
_DATA_KIND = {"validate": "val", "test": "test", "predict": "predict"}


class EvaluationLoop:
    """One pass over the data of ``stage`` (``"validate"``, ``"test"`` or ``"predict"``); owns
    that stage's loaders and batch counts, which stay readable after the call."""

    def __init__(self, trainer: Trainer, metrics: MetricsCollector, stage: str) -> None:
        self.trainer = trainer
        self.metrics = metrics
        self.stage = stage
        self.loaders: list[PreparedLoader | PreparedCombined] = []
        self.max_batches: list[int | float] = []
        self.current_batch_indices: list[int] = []
        """The dataset indices of the batch being predicted (for a ``BasePredictionWriter``)."""
        self._predictions: list[list[Any]] = []
        self._epoch_batch_indices: list[list[list[int]]] = []
        # per dataloader, the batches run since its loader was built (the sanity run's aside): the
        # step loggers get for what a step logged, as Lightning counts
        self._logged_batches: list[int] = []
        self._said_none = False  # whether predict_step's None was warned about (once per Trainer)

    @property
    def loader(self) -> PreparedLoader | PreparedCombined | None:
        """The first dataloader (None when the stage has none)."""
        return self.loaders[0] if self.loaders else None

    @property
    def num_batches(self) -> int | float:
        """Batches of one run over all the dataloaders."""
        return sum(self.max_batches)

    @property
    def batches_per_loader(self) -> list[int | float]:
        """Batches per run, one entry per dataloader (Lightning's form)."""
        return list(self.max_batches)

    @property
    def predictions(self) -> list[Any]:
        """The predictions of the last ``predict`` run: a list per dataloader when there are
        several, else the one list (empty when they were not kept)."""
        if not self._predictions:
            return []
        return self._predictions[0] if len(self._predictions) == 1 else self._predictions

    @property
    def epoch_batch_indices(self) -> list[list[list[int]]]:
        """The dataset indices of each batch of the run: one list per dataloader, also when there
        is one (unlike :attr:`predictions`), as Lightning's."""
        return self._epoch_batch_indices

    def setup_data(self, module: Module, sources: DataSources) -> None:
        """Build this stage's loaders (validation only when the module has a ``validation_step``).
        With ``limit_val_batches=0`` (``limit_test_batches=0`` for test) the loaders are not asked
        for at all, as in Lightning: a ``val_dataloader()`` drawing random numbers never runs."""
        self.loaders, self.max_batches = [], []
        kind = _DATA_KIND[self.stage]
        self._logged_batches = []
        if self.stage == "validate" and not overrides(module, Module, "validation_step"):
            return
        limit = {"validate": self.trainer.limit_val_batches, "test": self.trainer.limit_test_batches}
        if limit.get(self.stage) == 0:
            return
        for loader in sources.get_all(kind, module):
            prepared, batches = data_setup.prepare(self.trainer, loader, kind)
            if (
                isinstance(prepared, PreparedLoader)
                and self.stage == "predict"
                and prediction_writers(self.trainer.callbacks)
            ):
                prepared = BatchIndexRecorder.wrap(prepared)
            self.loaders.append(prepared)
            self.max_batches.append(batches)
            self._logged_batches.append(0)

    @property
    def sanity_batches_per_loader(self) -> list[int | float]:
        """Batches of the sanity run before training, one entry per dataloader."""
        wanted = self.trainer.num_sanity_val_steps
        return [n if wanted == -1 else min(wanted, n) for n in self.max_batches]

    def sanity_batches(self) -> int | float:
        """The per-dataloader cap of the sanity run before training (0: no sanity run)."""
        return max(self.sanity_batches_per_loader, default=0)

    @torch.no_grad()
    def run(
        self, hooks: Hooks, num_batches: int | float | None = None, keep_predictions: bool = False
    ) -> list[dict[str, float]]:
        """Run the stage over each dataloader, at most ``num_batches`` batches of each (default:
        all of this run's); returns the epoch-level metrics, one dict per dataloader.
        ``keep_predictions``: collect each ``predict_step`` result (:attr:`predictions`)."""
        limits = [b if num_batches is None else min(b, num_batches) for b in self.max_batches]
        if not self.loaders or sum(limits) == 0:
            return []
        trainer, metrics, stage = self.trainer, self.metrics, self.stage
        name = _HOOK_STAGE[stage]
        module = trainer.lightning_module
        several = len(self.loaders) > 1
        in_training = trainer.state.stage == RunningStage.TRAINING  # fit's validation: its own stage
        if in_training:
            trainer.state.stage = RunningStage.VALIDATING
        _check_dataloader_idx(module, name, several)
        writers = self._start_collecting(keep_predictions)
        metrics.stage = stage
        metrics.in_step = False
        metrics.epoch_results()  # start a fresh record of this run's epoch values
        metrics.start_evaluation()
        modes = _capture_modes(module if trainer.model is None else trainer.model)  # the wrapper as well
        # Lightning makes the first loader's iterator before the start hooks ([Note: fetching a
        # batch ahead] in fetcher.py); each other loader's when its turn comes
        first = Fetcher(self.loaders[0].iterate(0), ahead=math.isinf(limits[0]))
        getattr(module, f"on_{name}_model_eval")()
        hooks.call(f"on_{name}_start")
        hooks.call(f"on_{name}_epoch_start")
        # Lightning's sanity run over several dataloaders leaves callback_metrics as they were,
        # even in its own hooks (over one, its values are visible until the run ends)
        visible = metrics.snapshot() if trainer.sanity_checking and several else None
        results: list[dict[str, float]] = []
        for index, (loader, limit) in enumerate(zip(self.loaders, limits, strict=True)):
            metrics.in_step = True
            metrics.dataloader_idx = index if several else None
            batches = first if index == 0 else Fetcher(loader.iterate(0), ahead=math.isinf(limit))
            self._run_loader(hooks, loader, batches, limit, index, several, writers)
            metrics.in_step = False
            metrics.reduce_epoch(stage)
            results.append(metrics.epoch_results())
            if visible is not None:
                metrics.restore(visible)
        metrics.dataloader_idx = None
        hooks.call(f"on_{name}_epoch_end")
        self._finish_epoch(results, visible)
        hooks.call(f"on_{name}_end")
        metrics.in_step = True
        if stage != "predict" and overrides(module, Module, f"on_{name}_model_train"):
            getattr(module, f"on_{name}_model_train")()
        else:
            _restore_modes(modes)
        if not keep_predictions:
            self._predictions = []
        self._epoch_batch_indices = []
        if in_training:
            trainer.state.stage = RunningStage.TRAINING
        return results

    def _start_collecting(self, keep_predictions: bool) -> list[BasePredictionWriter]:
        """Make room for this run's predictions and batch indices; returns the prediction
        writers (an epoch writer needs the predictions even when they are not returned)."""
        writers = prediction_writers(self.trainer.callbacks) if self.stage == "predict" else []
        keep = keep_predictions or any(w.interval.on_epoch for w in writers)
        self._predictions = [[] for _ in self.loaders] if keep else []
        self._epoch_batch_indices = [[] for _ in self.loaders] if writers else []
        self.current_batch_indices = []
        return writers

    def _finish_epoch(self, results: list[dict[str, float]], visible: Any) -> None:
        """After the epoch-end hooks: the epoch's values to the loggers, and what those hooks
        logged into every dataloader's results (Lightning's rule)."""
        trainer, metrics = self.trainer, self.metrics
        values = metrics.pop_epoch_log()
        if values and not trainer.sanity_checking:
            send_to_loggers(trainer, values, trainer.logger_step)
        epoch_end = metrics.epoch_results()
        if visible is not None:
            metrics.restore(visible)
        for result in results:
            result.update(epoch_end)

    def _run_loader(
        self,
        hooks: Hooks,
        loader: PreparedLoader | PreparedCombined,
        iterator: Fetcher,
        limit: int | float,
        index: int,
        several: bool,
        writers: list[BasePredictionWriter],
    ) -> None:
        trainer, metrics, stage = self.trainer, self.metrics, self.stage
        name = _HOOK_STAGE[stage]
        steps = hooks.steps  # [Note: profiling at the dispatch] in fullshard.trainer.hooks
        batch_start = hooks[f"on_{name}_batch_start"]
        batch_end = hooks[f"on_{name}_batch_end"]
        method = f"{name}_step"
        extra = (index,) if several else ()
        predictions = self._predictions[index] if self._predictions else None
        recorder = loader if isinstance(loader, BatchIndexRecorder) else None
        batch_idx = 0
        while batch_idx < limit:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            stuck_ranks.kick(stage, batch_idx)  # [Note: stuck ranks] in fullshard.launch.stuck_ranks
            batch = steps.batch_to_device(batch, dataloader_idx=index)
            metrics.set_batch(batch)
            if writers:
                self.current_batch_indices = recorder.indices(batch_idx) if recorder is not None else []
                self._epoch_batch_indices[index].append(self.current_batch_indices)
            for hook in batch_start:
                hook(batch, batch_idx, *extra)
            output = steps.evaluation_step(method, batch, batch_idx, *extra)
            if predictions is not None:
                predictions.append(output)
            if output is None and stage == "predict" and not self._said_none:
                self._said_none = True  # once per Trainer, as Lightning says it
                rank_zero_warn(
                    "predict_step returned None for a batch, so its prediction is None: ignore this "
                    "warning if that is meant, else return the predictions from predict_step.",
                    stacklevel=1,
                )
            for hook in batch_end:
                hook(output, batch, batch_idx, *extra)
            metrics.commit()  # [Note: committed metrics] in fullshard.trainer.metrics
            batch_idx += 1
            if trainer.sanity_checking:
                metrics.pop_step_log()
                continue
            if metrics.has_step_log():
                send_to_loggers(
                    trainer, metrics.pop_step_log(), self._logged_batches[index], evaluation_step=True
                )
            self._logged_batches[index] += 1


def _capture_modes(module: torch.nn.Module) -> list[tuple[torch.nn.Module, bool]]:
    """The train/eval mode of every submodule, to put back after the run (Lightning's rule: a
    submodule frozen in eval mode during training stays so); the default eval hooks switch the
    strategy's wrapper too, so its own mode is captured with them."""
    return [(m, m.training) for m in module.modules()]


def _restore_modes(modes: list[tuple[torch.nn.Module, bool]]) -> None:
    for submodule, training in modes:
        submodule.training = training


def _check_dataloader_idx(module: Module, name: str, several: bool) -> None:
    """Lightning's rule: with several dataloaders the step and the module's batch hooks must take
    ``dataloader_idx``; with one they get none, so one that requires it is an error."""
    kind = "val" if name == "validation" else name
    for hook in (f"{name}_step", f"on_{name}_batch_start", f"on_{name}_batch_end"):
        if hook != f"{name}_step" and not overrides(module, Module, hook):
            continue
        try:
            parameters = inspect.signature(getattr(module, hook)).parameters
        except (TypeError, ValueError):  # a callable without a signature: nothing to check
            continue
        param = parameters.get("dataloader_idx")
        takes = param is not None or any(
            p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values()
        )
        cls = type(module).__name__
        if several and not takes:
            raise RuntimeError(
                f"You provided multiple `{kind}_dataloader`, but no `dataloader_idx` argument in "
                f"`{cls}.{hook}()`. Try adding `dataloader_idx=0` to its signature."
            )
        if not several and param is not None and param.default is inspect.Parameter.empty:
            raise RuntimeError(
                f"You provided only a single `{kind}_dataloader`, but have included `dataloader_idx` in "
                f"`{cls}.{hook}()`. Either remove the argument or give it a default value i.e. `dataloader_idx=0`."
            )

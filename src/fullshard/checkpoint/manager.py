"""The Trainer's checkpoints, owned by one object: :class:`CheckpointManager` builds a checkpoint
(the Trainer's state, the callbacks', the model and optimizer tensors in the strategy's format),
runs the save hooks on it, saves it (full or sharded, in the foreground or the background through
:mod:`fullshard.checkpoint.engine`), resolves ``"last"``/``"best"``, loads a checkpoint and
restores the Trainer from it. The strategy only provides its model and optimizer states
(``get_state``), loads them back (``set_state``) and lends its collectives.

The layout of a checkpoint (docs/design.md, "The checkpoint contract")::

    {
      "fullshard_version": str, "strategy": str, "world_size": int, "data_parallel_size": int,
      "optimizer_count": int,
      "optimizer_types": [class name of each optimizer]  (checked on resume; added by the engine)
      "state_dict": model state (full, unwrapped key names)          } in the file of the full
      "optimizer_states": [one per optimizer]                         } format; the sharded one
      "lr_schedulers": [one per scheduler],                             keeps them in DCP
      "grad_scaler": dict,
      "loops": {"epoch", "global_step", "batches_that_stepped", "batches_in_epoch", "samples_in_epoch",
                "epoch_finished", "total_batch_idx", "data_seed", "loader_positions" (a CombinedLoader's),
                "epoch_rng_state", "epoch_order_state" (inside an epoch: what it drew, as bytes)},
      "callbacks": {state_key: state}, "rng_states": [one per rank; on rank 0 only], "hyper_parameters": dict,
      "epoch": int, "global_step": int, "pytorch-lightning_version": str,   for Lightning's readers
      <DataModule class name>: its state_dict(), when not empty (as Lightning)
    }

The save hooks (each callback's ``on_save_checkpoint``, then the module's) see all of it, the
model and optimizer states included: whole tensors for a full checkpoint, this rank's shards for
a sharded one, as Lightning gives them. What a hook removes or changes is what is written (a
LoRA module that keeps only its adapter weights writes only those; ``strict_loading = False``
on the module loads such a checkpoint into a whole model).

Everything in it loads with ``torch.load(weights_only=True)`` (which Lightning's
``load_from_checkpoint`` uses) as long as the hyperparameters and callback states are plain
data: see [Note: portable RNG states]. fullshard loads it that way too, and a save warns when
the checkpoint will need ``trust_checkpoint=True`` (see [Note: loading without running code] in
checkpoint/trust.py).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullshard import hyperparameters
from fullshard.checkpoint.checkpointer import TENSOR_ENTRIES, Checkpointer
from fullshard.checkpoint.discovery import commit_time
from fullshard.checkpoint.io import warn_not_plain
from fullshard.checkpoint.lightning import is_lightning_checkpoint, lightning_entries, lightning_version
from fullshard.errors import CheckpointError, MisconfigurationError
from fullshard.rank_zero import rank_zero_info
from fullshard.seed import rng_states, set_rng_states
from fullshard.version import __version__

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from fullshard.checkpoint.async_save import PendingSave
    from fullshard.trainer.trainer import Trainer


class CheckpointManager:
    """One Trainer's checkpoints: :meth:`save`, :meth:`load` (for a stage's ``ckpt_path``),
    :meth:`restore_rng_states`, and the save being written in the background (:attr:`pending`,
    :meth:`wait`, :meth:`wait_for_copy`, :meth:`after_commit`, :meth:`finish_after_failure`).

    It owns the :class:`~fullshard.checkpoint.checkpointer.Checkpointer` that writes and reads
    the strategy's states, which the Trainer connects to the strategy: Lightning's
    ``strategy.save_checkpoint``/``load_checkpoint`` (for a dict built by hand) go through it too,
    so that a background save has one owner whichever way it was started."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        strategy = trainer.strategy
        #: Writes and reads the strategy's states and owns the save being written in the background
        #: (its process group, buffers and pending saves); the Trainer connects it to the strategy.
        self.checkpointer = Checkpointer(strategy, timeout=getattr(strategy, "timeout", None))

    # ------------------------------------------------------------------------------ saving
    def dump(self, weights_only: bool = False, *, to_save: bool = True) -> dict[str, Any]:
        """The whole checkpoint, the model and optimizer states in the strategy's format, after
        the save hooks ran on it. A collective call: every rank must make it. ``to_save=False``:
        kept to be restored in place (a tuner's snapshot), so a full state is on every rank
        (see [Note: full saves gathered off the GPU])."""
        trainer = self._trainer
        checkpoint = trainer_state(trainer, with_callbacks=not weights_only)
        if weights_only:  # the weights and the loops, as Lightning: no callback state or hook
            checkpoint["lr_schedulers"] = []
        checkpoint.update(self._tensor_entries(() if weights_only else trainer.optimizers, to_save))
        module = trainer.lightning_module
        for callback in (
            () if weights_only else trainer.callbacks
        ):  # Lightning's order: callbacks, then the module
            callback.on_save_checkpoint(trainer, module, checkpoint)
        module.on_save_checkpoint(checkpoint)
        if trainer.is_global_zero:  # what every rank would say: once, before a load refuses it
            warn_not_plain({k: v for k, v in checkpoint.items() if k not in TENSOR_ENTRIES})
        return checkpoint

    def restore_after_search(self, checkpoint: dict[str, Any]) -> None:
        """Give the DataModule, the module and the callbacks back what :meth:`dump` took before a
        tuner's search (their states and load hooks, in the order Lightning's tuners restore the
        checkpoint they save first); the search puts the tensors and loops back itself."""
        trainer = self._trainer
        self._restore_datamodule(checkpoint)
        trainer.lightning_module.on_load_checkpoint(checkpoint)
        # the weights as the checkpoint holds them (a save hook may have put others there, as
        # WeightAveraging puts its average), before the callbacks' load hooks
        strategy = trainer.strategy
        full = strategy.state_dict_type != "sharded"
        strategy.set_state(checkpoint["state_dict"], [], [], full=full, from_rank0=False)
        self._restore_callback_states(checkpoint)

    def save(self, path: str | Path, weights_only: bool = False, storage_options: Any = None) -> None:
        """Build the checkpoint (:meth:`dump`) and write it to ``path`` in the strategy's format;
        with ``async_save`` the files are written in the background (see
        [Note: asynchronous commit] in async_save.py). Collective.

        Raises:
            TypeError: ``storage_options`` given (fullshard writes the files itself).
        """
        if storage_options is not None:
            raise TypeError(
                f"save_checkpoint(storage_options={storage_options!r}): fullshard writes checkpoints itself and "
                "takes no storage options; leave them out."
            )
        checkpoint = self.dump(weights_only)
        self.write(checkpoint, path, () if weights_only else self._trainer.optimizers)

    def write(self, checkpoint: dict[str, Any], path: str | Path, optimizers: Sequence[Optimizer]) -> None:
        """Write a checkpoint dict as it is, in the strategy's format (:meth:`Checkpointer.write`). Collective."""
        strategy = self._trainer.strategy
        sharded = strategy.state_dict_type == "sharded"
        self.checkpointer.write(checkpoint, path, optimizers, sharded=sharded, background=strategy.async_save)

    def _tensor_entries(self, optimizers: Sequence[Optimizer], to_save: bool) -> dict[str, Any]:
        """The model's and ``optimizers``' states as the strategy provides them (:meth:`Checkpointer.states`)."""
        full = self._trainer.strategy.state_dict_type != "sharded"
        return self.checkpointer.states(optimizers, full=full, to_save=to_save)

    # ------------------------------------------------------------------ the background save
    @property
    def pending(self) -> PendingSave | None:
        """The checkpoint being written in the background (``async_save``), if any: its
        ``path``, ``step``, ``staged_bytes`` and ``copy_wait_s`` (how long optimizer steps waited
        for its copy so far)."""
        return self.checkpointer.pending

    def wait(self) -> None:
        """Wait until the checkpoint being written in the background, if any, is committed.
        Collective: every rank calls it at the same point.

        Raises:
            CheckpointError: on every rank, when that save failed and no optimizer step reported
                it yet. The checkpoint previously at its path is intact.
        """
        self.checkpointer.wait()

    def wait_for_copy(self) -> None:
        """Return once the checkpoint being written in the background, if any, has copied this
        process's parameters and optimizer state; from then on they may be changed in place.
        Optimizer steps, loads and saves wait by themselves; call it before changing them any
        other way (docs/checkpoints.md, "Asynchronous checkpoints"). No communication."""
        self.checkpointer.wait_for_copy()

    def after_commit(self, action: Callable[[], None]) -> bool:
        """Run ``action`` on this rank once the checkpoint being written in the background is
        committed, and return True; return False (and do nothing) when none is being written.
        ``action`` is dropped when that save fails. The answer is the same on every rank."""
        return self.checkpointer.after_commit(action)

    def step_boundary(self, global_step: int) -> None:
        """Called by the fit loop after each optimizer step: raises the background save's failure
        at the step every rank agrees on ([Note: failures surface at the same step on every rank]
        in async_save.py). An attribute read when no save is pending."""
        self.checkpointer.step_boundary(global_step)

    def finish_after_failure(self, exception: BaseException) -> None:
        """When a run fails, let the checkpoint being written in the background commit: it is
        complete, and the last state before the failure. Its own failure, if any, is reported
        beside the run's exception, which goes on."""
        self.checkpointer.finish_after_failure(exception)

    # ----------------------------------------------------------------------------- loading
    def load(
        self,
        ckpt_path: str | Path,
        stage: str,
        options: LoadOptions,
        fit_start: Callable[[], None] = lambda: None,
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Load ``ckpt_path`` (a path, ``"last"`` or ``"best"``) for ``stage``: the whole training
        state for ``fit``, the weights otherwise (and for ``fit(ckpt_weights_only=True)``). Returns
        the checkpoint's other contents (None where nothing more is restored, or no checkpoint was
        found) and the path it resolved to. Collective.

        Resuming ``fit``, Lightning's order: the model's state, the module's, DataModule's and
        callbacks' states and hooks, then ``fit_start()`` (the ``on_fit_start`` hooks), then the
        optimizers', schedulers' and loops' states ([Note: callbacks restored before the
        optimizers] in engine.py). ``fit_start`` runs only then, and only when resuming."""
        trainer = self._trainer
        path = resolve_ckpt_path(trainer, ckpt_path, stage)
        if path is None:
            return None, None
        module = trainer.lightning_module
        strict = module.strict_loading
        weights_only = stage != "fit" or options.weights_only

        def before_optimizers(checkpoint: dict[str, Any]) -> None:
            self._restore_callbacks(checkpoint)
            fit_start()
            check_schedulers(trainer, path, checkpoint)

        checkpoint = self.read(
            path,
            () if weights_only else trainer.optimizers,
            weights_only=weights_only,
            verify=options.verify,
            trust=options.trust,
            strict=strict,
            before_optimizers=None if weights_only else before_optimizers,
        )
        if weights_only:
            module.on_load_checkpoint(checkpoint)
            for callback in trainer.callbacks:
                callback.on_load_checkpoint(trainer, module, checkpoint)
            return (checkpoint if stage != "fit" else None), path  # fine-tuning: fresh loops and RNG states
        self.restore(checkpoint)
        return checkpoint, path

    def read(
        self,
        path: str | Path,
        optimizers: Sequence[Optimizer] = (),
        *,
        weights_only: bool = False,
        check: Callable[[dict[str, Any]], None] | None = None,
        verify: bool = True,
        trust: bool = False,
        strict: bool = True,
        before_optimizers: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint's model (and unless ``weights_only``, optimizer) states into place and
        return the rest of it, after the background save, if any, is committed (the checkpoint
        may be that one). The checks and ``before_optimizers`` are
        :func:`fullshard.checkpoint.engine.load`'s. Collective."""
        return self.checkpointer.read(
            path,
            optimizers,
            weights_only=weights_only,
            check=check,
            verify=verify,
            trust=trust,
            strict=strict,
            before_optimizers=before_optimizers,
        )

    def _restore_callbacks(self, checkpoint: dict[str, Any]) -> None:
        """Lightning's order: the module's hook, the DataModule's state, then each callback's hook
        and state (after a warning naming the states no callback of this run takes)."""
        trainer = self._trainer
        trainer.lightning_module.on_load_checkpoint(checkpoint)
        self._restore_datamodule(checkpoint)
        _warn_unused_callback_states(trainer, checkpoint)
        self._restore_callback_states(checkpoint)

    def _restore_datamodule(self, checkpoint: dict[str, Any]) -> None:
        datamodule = self._trainer.datamodule
        if datamodule is not None and type(datamodule).__qualname__ in checkpoint:
            datamodule.load_state_dict(checkpoint[type(datamodule).__qualname__])

    def _restore_callback_states(self, checkpoint: dict[str, Any]) -> None:
        """Each callback's load hook, then the state saved under its ``state_key``."""
        trainer = self._trainer
        module = trainer.lightning_module
        for callback in trainer.callbacks:
            callback.on_load_checkpoint(trainer, module, checkpoint)
        callback_states = checkpoint.get("callbacks", {})
        for callback in trainer.callbacks:
            if callback.state_key in callback_states:
                callback.load_state_dict(callback_states[callback.state_key])

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Restore schedulers, scaler and loop progress (the strategy loaded the tensors, the
        callbacks' states were restored before the optimizers': see :meth:`load`).

        RNG states are restored separately by :meth:`restore_rng_states`, as the last thing before
        the loop runs, so that nothing between here and the first step consumes random numbers.
        """
        trainer = self._trainer
        # a callback may have taken the schedulers over (check_schedulers): as Lightning, the rest load
        for config, state in zip(trainer.lr_scheduler_configs, checkpoint["lr_schedulers"], strict=False):
            config.scheduler.load_state_dict(state)
        trainer.strategy.precision.load_state_dict(checkpoint.get("grad_scaler", {}))
        epoch = int(checkpoint["loops"]["epoch"])  # the epochs finished, as Lightning's current_epoch
        if 0 <= trainer.max_epochs < epoch:
            raise MisconfigurationError(
                f"You restored a checkpoint with current_epoch={epoch}, but you have set "
                f"Trainer(max_epochs={trainer.max_epochs}): the run would end before the checkpoint. Pass "
                f"max_epochs={epoch} or more (or -1) to go on training, or ckpt_weights_only=True to start afresh "
                "from its weights."
            )
        # loop progress is put back when the fit loop starts, after on_fit_start (as in Lightning),
        # with the number of data replicas that wrote it (see [Note: resuming at another world size]):
        # the processes, in checkpoints written before tensor parallelism recorded it apart
        replicas = checkpoint.get("data_parallel_size", checkpoint.get("world_size"))
        trainer.fit_loop.load_state_dict({"world_size": replicas, **checkpoint["loops"]})

    def restore_rng_states(self, checkpoint: dict[str, Any]) -> None:
        """Put this rank's RNG states back as they were when the checkpoint was written."""
        states = checkpoint.get("rng_states")
        if not states:
            return
        trainer = self._trainer
        rank, world_size = trainer.strategy.global_rank, trainer.strategy.world_size
        if len(states) != world_size:
            if trainer.is_global_zero:  # once, not once per process
                warnings.warn(
                    f"The checkpoint was written by {len(states)} process(es) and is resumed by {world_size}: "
                    "random-number states are not restored, so dropout and shuffling will differ from an "
                    "uninterrupted run.",
                    stacklevel=2,
                )
            return
        set_rng_states(_native(states[rank]))


def trainer_state(trainer: Trainer, with_callbacks: bool = True) -> dict[str, Any]:
    """What the Trainer owns of a checkpoint: everything but the model and optimizer states, and
    before the hooks. A collective call (the RNG states are gathered to rank 0)."""
    strategy = trainer.strategy
    module = trainer.lightning_module
    loops = trainer.fit_loop.state_dict()
    checkpoint: dict[str, Any] = {
        **lightning_entries(loops, trainer.current_epoch),
        "fullshard_version": __version__,
        "strategy": strategy.strategy_name or type(strategy).__name__,
        "world_size": strategy.world_size,
        "data_parallel_size": strategy.data_parallel_size,
        "lr_schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        "grad_scaler": strategy.precision.state_dict(),
        "loops": loops,
        # as Lightning: a callback whose state is empty is not saved, so its load_state_dict is not called
        "callbacks": {
            cb.state_key: state
            for cb in (trainer.callbacks if with_callbacks else ())
            if (state := cb.state_dict())
        },
        # Rank 0 writes the checkpoint's metadata: only it receives every rank's states.
        "rng_states": [_portable(s) for s in strategy.gather_object(rng_states()) or []],
        "hyper_parameters": dict(getattr(module, "hparams", {})),
        **hyperparameters.checkpoint_entries(module),
    }
    datamodule = trainer.datamodule
    if datamodule is not None and (state := datamodule.state_dict()):
        checkpoint[type(datamodule).__qualname__] = state  # where Lightning keeps it
    if datamodule is not None and datamodule.hparams:  # for DataModule.load_from_checkpoint, as Lightning
        checkpoint["datamodule_hyper_parameters"] = dict(datamodule.hparams)
        checkpoint.update(hyperparameters.checkpoint_entries(datamodule, "datamodule_"))
    return checkpoint


# [Note: ckpt_path="last" and elastic restarts]
# ``fit(ckpt_path="last")`` resumes from the newest complete checkpoint in the directories of the
# run's ModelCheckpoint callbacks, and starts fresh (with a warning, as Lightning) when there is
# none. So one command serves both the first attempt of a torchrun job and every restart after a
# crash, at any number of processes (sharded checkpoints reshard, the data position converts).
# Global rank 0 chooses and tells the others: ranks on several machines may list a shared file
# system at different moments (or with attribute caches of different ages) and must not load
# different checkpoints.
def newest_checkpoint(trainer: Trainer, stage: str) -> str | None:
    """What ``ckpt_path="last"`` means: the newest complete checkpoint in the ModelCheckpoint
    directories, as global rank 0 sees them; None (and a warning) when there is none. Collective."""
    newest: str | None = None
    if trainer.is_global_zero:
        # every checkpointing callback's (ModelCheckpoint's newest, OnExceptionCheckpoint's file)
        newest_of = [getattr(cb, "newest_checkpoint", None) for cb in trainer.callbacks]
        found = [p for newest in newest_of if newest is not None and (p := newest()) is not None]
        newest = max(found, key=lambda p: commit_time(Path(p))) if found else None
    newest = trainer.strategy.broadcast(newest)
    if newest is None and trainer.is_global_zero:
        dirs = [cb.dirpath for cb in trainer.checkpoint_callbacks if cb.dirpath is not None]
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        warnings.warn(
            f"{stage}(ckpt_path='last') found no checkpoint in the ModelCheckpoint directories"
            + (f" ({', '.join(map(repr, dirs))})" if dirs else " (the Trainer has no ModelCheckpoint)")
            + "; "
            + ("training starts from scratch." if stage == "fit" else "the model's current weights are used.")
            + (
                f" This is restart {restart} of a torchrun job: if an earlier attempt saved checkpoints, they are"
                " elsewhere. A ModelCheckpoint without dirpath saves into the logger's version folder, which is"
                " new in every attempt: pass ModelCheckpoint(dirpath=...) so that every attempt uses the same one."
                if restart != "0"
                else ""
            ),
            stacklevel=4,
        )
    return newest


@dataclass(frozen=True)
class LoadOptions:
    """How fit/validate/test/predict load their ``ckpt_path``: their ``ckpt_weights_only``,
    ``ckpt_verify`` and ``trust_checkpoint`` arguments, checked."""

    weights_only: bool = False
    verify: bool = True
    trust: bool = False


def load_options(
    ckpt_path: str | Path | None,
    weights_only: object,
    verify: object,
    trust: object = False,
    torch_weights_only: object = None,
) -> LoadOptions:
    """The ``ckpt_weights_only``, ``ckpt_verify``, ``trust_checkpoint`` and ``weights_only``
    arguments of fit/validate/test/predict, checked.

    ``weights_only`` is Lightning's: how ``torch.load`` reads the checkpoint. True is the
    allowlist fullshard always reads with (plain data only); False unpickles anything, which is
    ``trust_checkpoint=True`` (docs/checkpoints.md, "Loading checkpoints you did not write");
    None leaves ``trust_checkpoint`` to decide. It is not ``ckpt_weights_only``, which loads the
    weights alone."""
    named = (("ckpt_weights_only", weights_only), ("ckpt_verify", verify), ("trust_checkpoint", trust))
    for name, value in named:
        if not isinstance(value, bool):
            raise MisconfigurationError(f"{name}={value!r} is invalid: pass True or False.")
    if torch_weights_only is not None and not isinstance(torch_weights_only, bool):
        raise MisconfigurationError(
            f"weights_only={torch_weights_only!r} is invalid: pass True, False or None."
        )
    if torch_weights_only is True and trust:
        raise MisconfigurationError(
            "weights_only=True (read plain data only) and trust_checkpoint=True (unpickle anything) contradict "
            "each other. Pass one of them: weights_only=False is the same as trust_checkpoint=True."
        )
    trust = trust or torch_weights_only is False
    if weights_only and ckpt_path is None:
        raise MisconfigurationError(
            "fit(ckpt_weights_only=True) loads the weights of the checkpoint given as ckpt_path, and none was "
            "given. Pass ckpt_path=... too, or leave ckpt_weights_only out."
        )
    return LoadOptions(bool(weights_only), bool(verify), bool(trust))


def best_checkpoint_path(trainer: Trainer) -> str | None:
    """The best checkpoint of the first ModelCheckpoint, if it saved one."""
    callback = trainer.checkpoint_callback
    return callback.best_model_path or None if callback is not None else None


def previous_fits_best(trainer: Trainer, stage: str) -> str | None:
    """``"best"`` when a ``validate``/``test``/``predict`` without a model and a ``ckpt_path`` can
    use the best checkpoint of the fit before (saying so on rank 0), else None."""
    if best_checkpoint_path(trainer) is None:
        return None
    rank_zero_info(
        f"Trainer.{stage}() without a model uses the best checkpoint of the previous fit; pass "
        f"ckpt_path='last' or a path to choose another."
    )
    return "best"


def resolve_ckpt_path(trainer: Trainer, ckpt_path: str | Path, stage: str) -> str | None:
    """``ckpt_path`` as a path: ``"best"`` and ``"last"`` resolved (``"last"`` may find none)."""
    if str(ckpt_path) == "best":
        best = best_checkpoint_path(trainer)
        if best is None:
            raise MisconfigurationError(
                f"{stage}(ckpt_path='best') needs a best checkpoint, but "
                + (
                    "the Trainer has no ModelCheckpoint callback."
                    if trainer.checkpoint_callback is None
                    else "its ModelCheckpoint has saved none yet (fit first)."
                )
                + " Pass ckpt_path='last' or a path instead."
            )
        return best
    if str(ckpt_path) != "last":
        return str(ckpt_path)
    return newest_checkpoint(trainer, stage)


def check_schedulers(trainer: Trainer, path: str | Path, checkpoint: dict[str, Any]) -> None:
    """The checkpoint has a state for each scheduler of the run, checked after ``on_fit_start``:
    a run whose callbacks left it no scheduler (StochasticWeightAveraging takes its own SWALR
    scheduler over, from its own state) loads none of them, as Lightning.

    Raises:
        CheckpointError: the counts differ otherwise.
    """
    n_saved, n_now = len(checkpoint["lr_schedulers"]), len(trainer.lr_scheduler_configs)
    if n_now and n_saved != n_now:
        raise CheckpointError(
            f"The checkpoint {str(path)!r} holds {n_saved} LR scheduler state(s) but configure_optimizers() "
            f"returned {n_now} scheduler(s). Resume with the scheduler setup the checkpoint was trained with."
        )


def _warn_unused_callback_states(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """One warning naming the callback states of the checkpoint that no callback of this run takes
    (a callback takes the state saved under its own ``state_key``; for ModelCheckpoint and
    EarlyStopping that of Lightning's), as Lightning warns."""
    known = {callback.state_key for callback in trainer.callbacks}
    unused = sorted(set(checkpoint.get("callbacks", {})) - known)
    if not unused or not trainer.is_global_zero:
        return
    origin = (
        f"The Lightning {lightning_version(checkpoint)} checkpoint"
        if is_lightning_checkpoint(checkpoint)
        else "The checkpoint"
    )
    warnings.warn(
        f"{origin} holds callback states that no callback of this run takes, so they are ignored: "
        f"{'; '.join(unused)}. When resuming with ckpt_path, the callbacks used to create the checkpoint need "
        "to be passed to the Trainer again, with the same arguments (for ModelCheckpoint: monitor, mode and "
        "save interval).",
        stacklevel=3,
    )


# [Note: portable RNG states]
# NumPy's generator state holds an ndarray, which ``torch.load(weights_only=True)`` refuses (and
# Lightning's load_from_checkpoint loads that way): it is stored as a list of ints instead, and
# turned back into an array on restore. Checkpoints that hold the array still restore.
def _portable(states: dict[str, Any]) -> dict[str, Any]:
    numpy_state = states.get("numpy")
    if numpy_state is None or not hasattr(numpy_state[1], "tolist"):
        return states
    kind, keys, *rest = numpy_state
    return {**states, "numpy": (kind, keys.tolist(), *rest)}


def _native(states: dict[str, Any]) -> dict[str, Any]:
    numpy_state = states.get("numpy")
    if numpy_state is None or not isinstance(numpy_state[1], list):
        return states
    import numpy as np

    kind, keys, *rest = numpy_state
    return {**states, "numpy": (kind, np.asarray(keys, dtype=np.uint32), *rest)}

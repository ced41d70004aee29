"""Lightning interoperability: the keys that make a fullshard checkpoint readable by Lightning, and
the conversion of a Lightning ``.ckpt`` into what fullshard resumes from.

[Note: Lightning checkpoints]
A Lightning checkpoint is one ``torch.save`` file with ``epoch``, ``global_step``,
``pytorch-lightning_version``, ``state_dict``, ``optimizer_states``, ``lr_schedulers``,
``callbacks``, ``hyper_parameters`` and ``loops`` (the progress counters of Lightning's loops).
Two things differ from fullshard's layout:

- ``optimizer_states`` hold ``optimizer.state_dict()`` as torch gives it: parameters are numbered
  0, 1, ... in the order of the optimizer's ``param_groups``. fullshard stores them keyed by
  parameter name (``torch.distributed.checkpoint.state_dict``'s layout), which is what loads under
  any strategy. The conversion maps each number to a name through the *current* optimizer's
  ``param_groups``, which ``configure_optimizers()`` builds in the same order as in the run that
  wrote the checkpoint, and checks every state tensor's shape against that parameter.
- ``loops`` is Lightning's progress tracking; fullshard's own ``loops`` entry is
  ``{"epoch", "global_step", "batches_in_epoch", "epoch_finished", "total_batch_idx"}``.

Lightning's ``load_from_checkpoint`` reads ``pytorch-lightning_version`` first (to migrate old
checkpoints), so fullshard writes that key too, with :data:`LIGHTNING_LAYOUT_VERSION`: the first
2.x layout, older than every release that reads it (no "newer than your Lightning" warning) and
newer than every migration Lightning has (none rewrites fullshard's entries). A checkpoint is
therefore Lightning's when it has that key and no ``fullshard_version``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.checkpoint.progress_checks import check_count, loop_state_error
from fullshard.errors import CheckpointError

LIGHTNING_VERSION_KEY = "pytorch-lightning_version"
LIGHTNING_LAYOUT_VERSION = "2.0.0"
# Where Lightning's precision plugins keep the grad scaler's state (keyed by the plugin's class name).
_SCALER_KEYS = ("MixedPrecision", "FSDPPrecision")
# Path components that wrappers insert into parameter names (FSDP1, activation checkpointing,
# torch.compile); torch.distributed.checkpoint.state_dict drops the same ones from its keys.
_WRAPPER_COMPONENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def is_lightning_checkpoint(checkpoint: Mapping[str, Any]) -> bool:
    """Whether ``checkpoint`` was written by Lightning (rather than by fullshard)."""
    return LIGHTNING_VERSION_KEY in checkpoint and "fullshard_version" not in checkpoint


def lightning_version(checkpoint: Mapping[str, Any]) -> str:
    return str(checkpoint.get(LIGHTNING_VERSION_KEY, "unknown"))


def lightning_entries(loops: Mapping[str, Any], current_epoch: int) -> dict[str, Any]:
    """The top-level entries a fullshard checkpoint carries for Lightning's readers: ``epoch`` is
    the Trainer's ``current_epoch``, as Lightning writes it, which after an epoch cut short by
    ``max_steps`` is the next one, while ``loops`` keeps the position inside the cut epoch that a
    resumed run continues from ([Note: epochs cut short] in fullshard.trainer.loops.fit_loop)."""
    return {
        "epoch": current_epoch,
        "global_step": int(loops["global_step"]),
        LIGHTNING_VERSION_KEY: LIGHTNING_LAYOUT_VERSION,
    }


# ------------------------------------------------------------------------------ conversion
def parameter_names(module: nn.Module, optimizer: Optimizer) -> list[list[str]]:
    """The names of ``optimizer``'s parameters, group by group, as ``module`` (the user's module,
    possibly with wrapped submodules) knows them, without wrapper path components.

    Raises:
        CheckpointError: a parameter of the optimizer is not a parameter of ``module``.
    """
    names = {
        id(p): ".".join(part for part in name.split(".") if part not in _WRAPPER_COMPONENTS)
        for name, p in module.named_parameters()
    }
    groups = []
    for i, group in enumerate(optimizer.param_groups):
        unknown = [tuple(p.shape) for p in group["params"] if id(p) not in names]
        if unknown:
            raise CheckpointError(
                f"Cannot map the Lightning checkpoint's optimizer state: parameter group {i} of the "
                f"{type(optimizer).__name__} holds tensors that are not parameters of the model (shapes "
                f"{unknown[:3]}). Build the optimizer in configure_optimizers() from self.parameters()."
            )
        groups.append([names[id(p)] for p in group["params"]])
    return groups


def _optimizer_state(
    saved: Mapping[str, Any], names: list[list[str]], shapes: Mapping[str, torch.Size], index: int
) -> dict[str, Any]:
    """One ``optimizer.state_dict()`` (parameters numbered) keyed by parameter names instead.

    A state keyed by names already (Lightning's sharded FSDP checkpoints, once consolidated) is
    mapped name by name in the same way, which checks that the names are this model's."""
    saved_groups = saved["param_groups"]
    saved_sizes = [len(g["params"]) for g in saved_groups]
    sizes = [len(g) for g in names]
    if saved_sizes != sizes:
        raise CheckpointError(
            f"The Lightning checkpoint's optimizer {index} has parameter groups of sizes {saved_sizes}, but "
            f"configure_optimizers() now returns groups of sizes {sizes}. Resume with the optimizer setup "
            "the checkpoint was trained with."
        )
    state: dict[str, Any] = {}
    groups = []
    mismatched = []
    for group, group_names in zip(saved_groups, names, strict=True):
        for number, name in zip(group["params"], group_names, strict=True):
            if isinstance(number, str) and number != name:
                mismatched.append(f"{number} (this run's optimizer has {name} in its place)")
                continue
            if number not in saved["state"]:
                continue  # a parameter that never had a gradient has no state
            entry = saved["state"][number]
            expected = shapes.get(name)
            for key, value in entry.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.dim() > 0
                    and expected is not None
                    and value.shape != expected
                ):
                    mismatched.append(
                        f"{name}.{key} (checkpoint {tuple(value.shape)}, model {tuple(expected)})"
                    )
            state[name] = entry
        groups.append({**group, "params": list(group_names)})
    if mismatched:
        raise CheckpointError(
            f"The Lightning checkpoint's optimizer {index} does not fit this run's parameters in the order "
            f"configure_optimizers() lists them: {', '.join(mismatched[:5])}. Build the optimizer's parameter "
            "groups in the same order as in the run that wrote the checkpoint."
        )
    return {"state": state, "param_groups": groups}


def _count(path: str, checkpoint: Mapping[str, Any], *keys: str) -> int:
    """The counter at ``checkpoint[keys[0]][keys[1]]...`` (0 where an entry is absent), checked as
    fullshard's own ([Note: loop counters checked on resume] in progress_checks.py)."""
    node: Any = checkpoint
    for depth, key in enumerate(keys):
        if not isinstance(node, Mapping):
            entry = "".join(f"[{k!r}]" for k in keys[:depth])
            raise loop_state_error(path, f"entry {entry}", node, "it must be a dict, as Lightning writes it")
        node = node.get(key, 0)
    return check_count(path, "entry " + "".join(f"[{k!r}]" for k in keys), node)


def loop_state(checkpoint: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    """fullshard's loop state from a Lightning checkpoint (at ``path``, named in errors): from its
    ``loops`` entry (Lightning's progress counters) where present, else from ``epoch`` and
    ``global_step``. Each counter is checked as it is read
    (:class:`~fullshard.errors.CorruptCheckpointError` naming the entry).

    Lightning counts an epoch ``completed`` only after its end hooks; one whose batches are all
    ``processed`` was saved at its end (``epoch_finished``), one ``started`` but not ``processed``
    was saved in its middle, after ``batch_progress.current.processed`` batches.
    """
    loops = checkpoint.get("loops")
    if loops is not None and not isinstance(loops, Mapping):
        raise loop_state_error(path, "'loops' entry", loops, "it must be a dict, as Lightning writes it")
    if loops is None or loops.get("fit_loop") is None:
        return {
            "epoch": _count(path, checkpoint, "epoch"),
            "global_step": _count(path, checkpoint, "global_step"),
            "batches_in_epoch": 0,
            "epoch_finished": False,
            "total_batch_idx": 0,
        }
    fit = ("loops", "fit_loop")
    optim = (
        *fit,
        "epoch_loop.automatic_optimization.optim_progress",
        "optimizer",
        "step",
        "total",
        "completed",
    )
    manual = (*fit, "epoch_loop.manual_optimization.optim_step_progress", "total", "completed")
    epochs = {
        k: _count(path, checkpoint, *fit, "epoch_progress", "current", k)
        for k in ("completed", "processed", "started")
    }
    batches = _count(path, checkpoint, *fit, "epoch_loop.batch_progress", "current", "processed")
    epoch = epochs["completed"]
    finished = epochs["processed"] > epoch
    mid_epoch = not finished and epochs["started"] > epoch
    return {
        "epoch": epoch,
        "global_step": _count(path, checkpoint, *optim) + _count(path, checkpoint, *manual),
        "batches_in_epoch": batches if (finished or mid_epoch) else 0,
        "epoch_finished": finished,
        "total_batch_idx": _count(path, checkpoint, *fit, "epoch_loop.batch_progress", "total", "processed"),
    }


def _scaler_state(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    for key in _SCALER_KEYS:
        state = checkpoint.get(key)
        if isinstance(state, Mapping) and "scale" in state:
            return dict(state)
    return {}


def convert_checkpoint(
    checkpoint: Mapping[str, Any],
    path: str,
    *,
    module: nn.Module | None = None,
    optimizers: Sequence[Optimizer] = (),
    shapes: Mapping[str, torch.Size] | None = None,
) -> dict[str, Any]:
    """A Lightning checkpoint in fullshard's layout (see [Note: Lightning checkpoints]).

    ``module`` and ``optimizers`` are the run's (the optimizers built by ``configure_optimizers()``),
    to name the parameters of the optimizer states; ``shapes`` the model's full parameter shapes,
    to check them. Without optimizers only the weights and the rest are converted. Entries
    fullshard does not use (``callbacks`` of Lightning's callbacks, the module's own) stay as
    they are.

    Raises:
        CheckpointError: the checkpoint holds no optimizer state (saved with
            ``save_weights_only=True``) or does not fit ``optimizers``.
    """
    out = copy.copy(dict(checkpoint))
    out["loops"] = loop_state(checkpoint, path)
    out["hyper_parameters"] = dict(checkpoint.get("hyper_parameters", {}))
    out["callbacks"] = dict(checkpoint.get("callbacks", {}))
    out["grad_scaler"] = _scaler_state(checkpoint)
    saved = list(checkpoint.get("optimizer_states", []))
    if optimizers and ("optimizer_states" not in checkpoint or "lr_schedulers" not in checkpoint):
        raise CheckpointError(
            f"The Lightning checkpoint {path!r} holds only the model weights (it was saved with "
            "save_weights_only=True), so training cannot resume from it. To fine-tune from its weights with "
            f"fresh optimizers, pass fit(..., ckpt_path={path!r}, ckpt_weights_only=True); validate, test, "
            "predict and Module.load_from_checkpoint() take it as it is."
        )
    out["lr_schedulers"] = list(checkpoint.get("lr_schedulers", []))
    out["optimizer_count"] = len(saved)
    if not optimizers:
        out["optimizer_states"] = []
    elif len(saved) == len(optimizers):  # a different count is reported by the loader's own check
        if module is None:
            raise TypeError("convert_checkpoint() needs the module to name the optimizer states.")
        out["optimizer_states"] = [
            _optimizer_state(state, parameter_names(module, optimizer), shapes or {}, i)
            for i, (state, optimizer) in enumerate(zip(saved, optimizers, strict=True))
        ]
    return out

"""``ModelPruning``: prune weights with ``torch.nn.utils.prune`` during training, as Lightning's
callback (optionally resetting the kept weights to their initial values: the lottery ticket
hypothesis of Frankle & Carbin, 2018).

``torch.nn.utils.prune`` replaces a parameter ``weight`` by ``weight_orig`` times a mask, applied
in a forward pre-hook. That works on whole parameters (one process, DDP). FSDP and FSDP2 manage
the parameters themselves, so there L1 pruning (``"l1_unstructured"``, global or per parameter)
keeps masks of each process's shards instead ([Note: pruning sharded parameters] in
``sharded_pruning.py``); the other pruning methods are refused with what to do instead.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from copy import deepcopy
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.utils import prune as torch_prune
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.module import Module
from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger(__name__)

_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "ln_structured": torch_prune.ln_structured,
    "l1_unstructured": torch_prune.l1_unstructured,
    "random_structured": torch_prune.random_structured,
    "random_unstructured": torch_prune.random_unstructured,
}
_METHODS: dict[str, type[torch_prune.BasePruningMethod]] = {
    "ln_structured": torch_prune.LnStructured,
    "l1_unstructured": torch_prune.L1Unstructured,
    "random_structured": torch_prune.RandomStructured,
    "random_unstructured": torch_prune.RandomUnstructured,
}
_CONTAINERS = (Module, nn.Sequential, nn.ModuleList, nn.ModuleDict)
ParamList = Sequence[tuple[nn.Module, str]]


def _is_pruning_method(method: Any) -> bool:
    return inspect.isclass(method) and issubclass(method, torch_prune.BasePruningMethod)


class ModelPruning(Callback):
    """Prunes ``parameters_to_prune`` (default: every ``weight`` and ``bias`` of the model's
    layers) at the end of each training epoch (or validation epoch, with
    ``prune_on_train_epoch_end=False``).

    Args:
        pruning_fn: ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
            ``"random_structured"``, a ``torch.nn.utils.prune.BasePruningMethod`` subclass (with
            ``use_global_unstructured=True``), or a function ``(module, name, amount)``.
        parameters_to_prune: ``(module, parameter_name)`` pairs.
        parameter_names: the names to prune when ``parameters_to_prune`` is empty (``weight``,
            ``bias``).
        use_global_unstructured: prune the smallest values over all the parameters together.
        amount: the fraction (float) or number (int) of values to prune; or a function of the
            epoch returning it.
        apply_pruning: whether to prune, or a function of the epoch returning it.
        make_pruning_permanent: remove the masks when training ends, and save checkpoints with
            the pruned weights (not ``*_orig``/``*_mask``).
        use_lottery_ticket_hypothesis: after pruning, reset the kept weights to their values at
            the start (or a function of the epoch saying whether to).
        resample_parameters: with the lottery ticket hypothesis, reset to new random values.
        pruning_dim, pruning_norm: the dimension (structured pruning) and norm (``ln_structured``).
        verbose: 1 logs the sparsity after each pruning, 2 also per parameter.
        prune_on_train_epoch_end: prune at the end of the training epoch (else of validation).

    Raises:
        MisconfigurationError: for a bad argument (the message names it), and under FSDP/FSDP2.
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable[..., Any] | str,
        parameters_to_prune: ParamList = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: int | float | Callable[[int], int | float] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune = parameters_to_prune
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = tuple(parameter_names or self.PARAMETER_NAMES)
        self._global_kwargs: dict[str, Any] = {}
        self._original_layers: dict[int, dict[str, Any]] | None = None
        self._pruning_method_name: str | None = getattr(pruning_fn, "__name__", None)
        bad = [n for n in self._parameter_names if n not in self.PARAMETER_NAMES]
        if bad:
            raise MisconfigurationError(
                f"ModelPruning(parameter_names={bad}): only {self.PARAMETER_NAMES} can be pruned."
            )
        if isinstance(pruning_fn, str):
            pruning_fn = self._from_name(pruning_fn.lower(), pruning_dim, pruning_norm)
        elif _is_pruning_method(pruning_fn):
            if not use_global_unstructured:
                raise MisconfigurationError(
                    "A torch BasePruningMethod class works with use_global_unstructured=True only; pass the name of a "
                    "pruning function (e.g. 'l1_unstructured') for local pruning."
                )
        elif not callable(pruning_fn):
            raise MisconfigurationError(
                f"ModelPruning(pruning_fn={pruning_fn!r}): give one of {list(_FUNCTIONS)}, a torch BasePruningMethod "
                "subclass (the class, not an instance) or a function (module, name, amount)."
            )
        elif not _is_pruning_method(pruning_fn) and use_global_unstructured:
            raise MisconfigurationError(
                "A pruning function prunes one parameter at a time: pass use_global_unstructured=False with it, or a "
                "BasePruningMethod subclass for global pruning."
            )
        if use_global_unstructured and getattr(pruning_fn, "PRUNING_TYPE", None) != "unstructured":
            raise MisconfigurationError(
                f"use_global_unstructured=True needs an unstructured pruning method; {pruning_fn} is "
                f"{getattr(pruning_fn, 'PRUNING_TYPE', 'not a pruning method')}. Pass use_global_unstructured=False."
            )
        if not (isinstance(amount, int | float) or callable(amount)):
            raise MisconfigurationError(
                f"ModelPruning(amount={amount!r}): give a fraction (float), a count (int) or a function of the epoch."
            )
        if verbose not in (0, 1, 2):
            raise MisconfigurationError(f"ModelPruning(verbose={verbose!r}): use 0, 1 or 2.")
        self.pruning_fn: Any = pruning_fn
        self._l1 = self._pruning_method_name in ("L1Unstructured", "l1_unstructured")
        self._sharded: Any = None  # ShardedMasks under FSDP/FSDP2
        self._sharded_pending = False
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        self.amount = amount
        self._verbose = verbose

    def _from_name(self, name: str, dim: int | None, norm: int | None) -> Any:
        if name not in _FUNCTIONS:
            raise MisconfigurationError(
                f"ModelPruning(pruning_fn={name!r}): torch's pruning functions are {list(_FUNCTIONS)}."
            )
        kwargs: dict[str, Any] = {}
        if name.endswith("_structured"):
            if dim is None:
                raise MisconfigurationError(f"Structured pruning ({name!r}) needs pruning_dim=...")
            if name == "ln_structured":
                if norm is None:
                    raise MisconfigurationError(
                        "'ln_structured' pruning needs pruning_norm=... (e.g. 1 or 2)."
                    )
                kwargs["n"] = norm
            kwargs["dim"] = dim
        if self._use_global_unstructured:
            self._global_kwargs = kwargs
            self._pruning_method_name = _METHODS[name].__name__
            return _METHODS[name]
        self._pruning_method_name = _FUNCTIONS[name].__name__
        return partial(_FUNCTIONS[name], **kwargs)

    def filter_parameters_to_prune(self, parameters_to_prune: ParamList = ()) -> ParamList:
        """Override to choose among the parameters found (all of them by default)."""
        return parameters_to_prune

    @staticmethod
    def make_pruning_permanent(module: nn.Module) -> None:
        """Remove the masks and forward pre-hooks: the pruned weights become plain parameters."""
        for _, sub in module.named_modules():
            for key in list(sub._forward_pre_hooks):
                hook = sub._forward_pre_hooks[key]
                if isinstance(hook, torch_prune.BasePruningMethod):
                    hook.remove(sub)
                    del sub._forward_pre_hooks[key]

    @staticmethod
    def _copy_param(new: nn.Module, old: nn.Module, name: str) -> None:
        target = getattr(new, name + "_orig", None)
        if target is None:
            target = getattr(new, name, None)
        source = getattr(old, name, None)
        if isinstance(target, torch.Tensor) and isinstance(source, torch.Tensor):
            target.data = source.data.to(target.device)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Reset the kept weights to their values at the start (or new random ones with
        ``resample_parameters``)."""
        if self._sharded is not None:
            self._sharded.reset_to_originals()
            return
        assert self._original_layers is not None
        for layer in self._original_layers.values():
            original = layer["data"]
            if self._resample_parameters and callable(getattr(original, "reset_parameters", None)):
                original = deepcopy(original)
                original.reset_parameters()
            for index, name in layer["names"]:
                self._copy_param(self._parameters_to_prune[index][0], original, name)

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        if self._sharded_pending:  # the masks are of the shards, which exist once the model is set up
            from fullshard.trainer.callbacks.sharded_pruning import ShardedMasks

            self._sharded = ShardedMasks(trainer, self._parameters_to_prune)

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Module, optimizer: Any) -> None:
        if self._sharded is None:
            return
        self._sharded.mask_gradients()
        if self._prune_on_train_epoch_end and trainer.is_last_batch:
            self._sharded.remember_forward_weights()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._sharded is not None:
            self._sharded.apply()  # pruned weights stay zero after the optimizer step

    def apply_pruning(self, amount: int | float) -> None:
        """Prune ``amount`` now."""
        if self._sharded is not None:
            before = self._sharded.sparsity() if self._verbose else (0, 1)
            self._sharded.prune(amount, together=self._use_global_unstructured)
            if self._verbose:
                (was, total), (now, _) = before, self._sharded.sparsity()
                log.info(
                    f"Applied `{self._pruning_method_name}`. Pruned: {was}/{total} ({was / total:.2%}) -> {now}/{total} "
                    f"({now / total:.2%})"
                )
            return
        before = [self._pruned_stats(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            self._global_kwargs["amount"] = amount
            accepted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
            kwargs = {k: v for k, v in self._global_kwargs.items() if k in accepted}
            torch_prune.global_unstructured(
                self._parameters_to_prune, pruning_method=self.pruning_fn, **kwargs
            )
        else:
            for module, name in self._parameters_to_prune:
                self.pruning_fn(module, name=name, amount=amount)
        if self._verbose:
            self._log_sparsity(
                before, [self._pruned_stats(m, n) for m, n in self._parameters_to_prune], amount
            )

    @staticmethod
    def _pruned_stats(module: nn.Module, name: str) -> tuple[int, int]:
        mask = getattr(module, f"{name}_mask", None)
        return (0, 1) if mask is None else (int((mask == 0).sum()), mask.numel())

    def _log_sparsity(
        self, before: list[tuple[int, int]], after: list[tuple[int, int]], amount: float
    ) -> None:
        total = sum(n for _, n in after)
        was, now = sum(z for z, _ in before), sum(z for z, _ in after)
        log.info(
            f"Applied `{self._pruning_method_name}`. Pruned: {was}/{total} ({was / total:.2%}) -> {now}/{total} "
            f"({now / total:.2%})"
        )
        if self._verbose == 2:
            for (module, name), (z0, n0), (z1, n1) in zip(
                self._parameters_to_prune, before, after, strict=True
            ):
                log.info(
                    f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. Pruned: "
                    f"{z0} ({z0 / n0:.2%}) -> {z1} ({z1 / n1:.2%})"
                )

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        strategy = trainer.strategy
        # the FSDP strategies' own units (their fsdp_kwargs) shard the parameters: masks of the shards
        fsdp_kwargs = getattr(strategy, "fsdp_kwargs", None)
        self._sharded = None
        self._sharded_pending = strategy.shards_parameters and fsdp_kwargs is not None
        if (strategy.shards_parameters and fsdp_kwargs is None) or (self._sharded_pending and not self._l1):
            raise MisconfigurationError(
                f"ModelPruning with {self._pruning_method_name} uses torch.nn.utils.prune, which replaces parameters "
                f"by masked copies; {type(strategy).__name__} manages the parameters itself, so the two cannot work "
                "together. Under FSDP and FSDP2 use pruning_fn='l1_unstructured'; for the other methods prune with "
                "strategy='ddp' (or one device)."
            )
        if self._sharded_pending and not (fsdp_kwargs or {}).get("use_orig_params", True):
            raise MisconfigurationError(
                "ModelPruning under FSDP prunes the module's own parameters, which FSDPStrategy(use_orig_params=False) "
                "replaces by flat ones: leave use_orig_params at True."
            )
        found = self.sanitize_parameters_to_prune(pl_module, self._parameters_to_prune, self._parameter_names)
        self._parameters_to_prune = self.filter_parameters_to_prune(found)
        if self._use_lottery_ticket_hypothesis and not self._sharded_pending:
            self._original_layers = {}
            for index, (module, name) in enumerate(self._parameters_to_prune):
                entry = self._original_layers.setdefault(id(module), {"data": deepcopy(module), "names": []})
                entry["names"].append((index, name))

    def _run_pruning(self, epoch: int) -> None:
        prune = self._apply_pruning(epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        self.apply_pruning(amount)
        lottery = self._use_lottery_ticket_hypothesis
        if lottery(epoch) if callable(lottery) else lottery:
            self.apply_lottery_ticket_hypothesis()

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._prune_on_train_epoch_end:
            self._run_pruning(pl_module.current_epoch)

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            self._run_pruning(pl_module.current_epoch)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._sharded_pending:  # the pruned weights are zeros already: nothing to make permanent
            return
        if self._make_pruning_permanent:
            self.make_pruning_permanent(pl_module)

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        if (
            not self._make_pruning_permanent or self._sharded_pending
        ):  # sharded: the weights are pruned already
            return
        state = pl_module.state_dict()
        for name in {k[: -len("_mask")] for k in state if k.endswith("_mask")}:
            original, mask = state.pop(name + "_orig"), state.pop(name + "_mask")
            state[name] = mask.to(dtype=original.dtype) * original
        checkpoint["state_dict"] = {k: v.detach().cpu() for k, v in state.items()}

    @staticmethod
    def sanitize_parameters_to_prune(
        pl_module: Module, parameters_to_prune: ParamList = (), parameter_names: Sequence[str] = ()
    ) -> ParamList:
        """The ``(module, name)`` pairs to prune: every layer's ``parameter_names`` when none are
        given, else the given ones, checked to exist in the model."""
        names = parameter_names or ModelPruning.PARAMETER_NAMES
        layers = [m for m in pl_module.modules() if not isinstance(m, _CONTAINERS)]
        if not parameters_to_prune:
            return [(m, n) for n in names for m in layers if isinstance(getattr(m, n, None), nn.Parameter)]
        pairs = list(parameters_to_prune) if isinstance(parameters_to_prune, list | tuple) else None
        if pairs is None or not all(
            isinstance(p, tuple | list)
            and len(p) == 2
            and isinstance(p[0], nn.Module)
            and isinstance(p[1], str)
            for p in pairs
        ):
            raise MisconfigurationError(
                "parameters_to_prune must be a list of (torch.nn.Module, parameter name) pairs, e.g. "
                "[(model.fc, 'weight')], or empty for every layer."
            )
        missing_modules = [m for m, _ in pairs if not any(m is layer for layer in layers)]
        missing_names = [n for m, n in pairs if any(m is layer for layer in layers) and not hasattr(m, n)]
        if missing_modules or missing_names:
            raise MisconfigurationError(
                f"Some parameters_to_prune are not in the model: modules {missing_modules}, parameters {missing_names}."
            )
        return [(m, n) for m, n in pairs]

"""Precision strings -> autocast, parameter dtype and gradient scaling.

=================  ==========================  ===========================================
string             parameters / optimizer      compute
=================  ==========================  ===========================================
``"32-true"``      float32                     float32
``"16-mixed"``     float32                     autocast to float16, gradients scaled
``"bf16-mixed"``   float32                     autocast to bfloat16
``"16-true"``      float16                     float16
``"bf16-true"``    bfloat16                    bfloat16
=================  ==========================  ===========================================

Lightning's older spellings are accepted for the same settings (:data:`PRECISION_ALIASES`):
``32``/``"32"``, ``16``/``"16"`` (``"16-mixed"``) and ``"bf16"`` (``"bf16-mixed"``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from fullshard.errors import MisconfigurationError, did_you_mean
from fullshard.nested import apply_to_collection

PrecisionStr = Literal["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]
PRECISIONS: tuple[PrecisionStr, ...] = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
_NULL_CONTEXT: contextlib.nullcontext[None] = contextlib.nullcontext()  # stateless: one shared instance
# Lightning 2.x's older spellings (its _PRECISION_INPUT_INT and _PRECISION_INPUT_STR_ALIAS), mapped
# as its connector maps them. "64"/64 ("64-true") is among them, but fullshard has no float64.
PRECISION_ALIASES: dict[int | str, PrecisionStr] = {
    32: "32-true",
    "32": "32-true",
    16: "16-mixed",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}
_ALIASES_TEXT = "32 / '32' for '32-true', 16 / '16' for '16-mixed', 'bf16' for 'bf16-mixed'"


def _alias_key(value: Any) -> int | str | None:
    """``value`` as a key of PRECISION_ALIASES (ints and strings only: not True, not 32.0)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return value


def parse_precision(value: Any) -> PrecisionStr:
    """Normalise a user's precision setting to one of :data:`PRECISIONS`; Lightning's aliases
    (:data:`PRECISION_ALIASES`) become the setting they stand for.

    Raises:
        MisconfigurationError: the value is not a supported precision.
    """
    if isinstance(value, str) and value in PRECISIONS:
        return value  # type: ignore[return-value]
    key = _alias_key(value)
    if key is not None and key in PRECISION_ALIASES:
        return PRECISION_ALIASES[key]
    if key in (64, "64", "64-true"):
        reason = " fullshard does not train in float64 (Lightning's '64-true')."
    else:
        reason = did_you_mean(value, PRECISIONS)
    raise MisconfigurationError(
        f"Precision {value!r} is not supported.{reason} Valid values: {', '.join(repr(p) for p in PRECISIONS)}, "
        f"and Lightning's aliases {_ALIASES_TEXT}. For half precision with float32 weights use '16-mixed' "
        "or 'bf16-mixed'."
    )


def alias_warning(value: Any) -> str | None:
    """The warning Lightning gives for the aliases that hide that they mean mixed precision
    (16, "16", "bf16"); None for any other value."""
    key = _alias_key(value)
    if key not in (16, "16", "bf16"):
        return None
    return (
        f"precision={value!r} is an alias kept for Lightning's older spelling; it means "
        f"precision={PRECISION_ALIASES[key]!r} (float32 weights, half-precision autocast). Pass "
        f"{PRECISION_ALIASES[key]!r} to say so and silence this warning."
    )


class Precision:
    """How a strategy runs forward, backward and the optimizer step for one precision string.

    Args:
        precision: one of :data:`PRECISIONS`.
        device_type: ``"cpu"`` or ``"cuda"``, the device autocast and the grad scaler act on.
    """

    def __init__(self, precision: Any = "32-true", device_type: str = "cpu") -> None:
        self.precision: PrecisionStr = parse_precision(precision)
        self.device_type = device_type
        self.scaler: torch.amp.GradScaler | None = None
        if self.precision == "16-mixed":
            self.scaler = self._make_scaler()
        # [Note: a window with no gradients]
        # Under automatic optimization a window whose training steps all returned None has its
        # optimizer step all the same (Lightning counts it), with no gradient to unscale: torch's
        # GradScaler.step would fail ("No inf checks were recorded"), and an unscale_ not followed
        # by update() would make the next unscale_ fail. So the backward passes are counted, and an
        # optimizer with none since its last step is stepped without the scaler (and not clipped,
        # see Strategy.clip_gradients). Every rank runs the same backward passes (a None is agreed
        # on), so every rank decides alike, even where the sharded scaler's unscale_ is a collective.
        self._backwards = 0
        self._stepped_at: weakref.WeakKeyDictionary[Optimizer, int] = weakref.WeakKeyDictionary()
        self._automatic = True

    def start_fit(self, manual: bool) -> None:
        """Forget the previous run's steps (each ``fit`` makes its optimizers anew); under manual
        optimization (``manual``) every step goes through the scaler, as the module asks."""
        self._automatic = not manual
        self._backwards = 0
        self._stepped_at = weakref.WeakKeyDictionary()

    def __getstate__(self) -> dict[str, Any]:
        # the spawn launcher pickles the Trainer (and this with its strategy); the step counts
        # are a run's own (start_fit forgets them) and a WeakKeyDictionary does not pickle
        state = dict(self.__dict__)
        state["_stepped_at"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stepped_at = weakref.WeakKeyDictionary()

    def has_new_gradients(self, optimizer: Optimizer) -> bool:
        """Whether a backward pass ran since ``optimizer``'s last step (always True under manual
        optimization); see [Note: a window with no gradients]."""
        return not self._automatic or self._stepped_at.get(optimizer, 0) != self._backwards

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` as backward gets it (scaled when a grad scaler is in use); counts the backward pass."""
        self._backwards += 1
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def _make_scaler(self) -> torch.amp.GradScaler:
        """The grad scaler "16-mixed" uses; FSDP swaps in its sharded variant."""
        return torch.amp.GradScaler(self.device_type)

    @property
    def is_mixed(self) -> bool:
        """True for the autocast precisions, whose parameters stay in float32."""
        return self.precision.endswith("-mixed")

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype forward and backward compute in."""
        if self.precision.startswith("bf16"):
            return torch.bfloat16
        if self.precision.startswith("16"):
            return torch.float16
        return torch.float32

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype the parameters (and so the optimizer states) are kept in."""
        return torch.float32 if self.is_mixed else self.compute_dtype

    @contextlib.contextmanager
    def module_init_context(self) -> Iterator[None]:
        """Create parameters directly in :attr:`param_dtype` (for the "-true" precisions)."""
        if self.param_dtype == torch.float32:
            yield
            return
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.param_dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast a module's floating point parameters and buffers to :attr:`param_dtype`."""
        if self.param_dtype != torch.float32:
            return module.to(dtype=self.param_dtype)
        return module

    def convert_input(self, data: Any) -> Any:
        """Cast floating point tensors of a batch to the compute dtype (the "-true" precisions)."""
        if self.is_mixed or self.compute_dtype == torch.float32:
            return data
        dtype = self.compute_dtype
        return apply_to_collection(
            data, torch.Tensor, lambda t: t.to(dtype) if torch.is_floating_point(t) else t
        )

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """The context ``training_step`` / ``validation_step`` run in."""
        if self.is_mixed:
            return torch.autocast(self.device_type, dtype=self.compute_dtype)
        return _NULL_CONTEXT

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss``, scaled when a grad scaler is in use (``args``, ``kwargs``: to
        ``Tensor.backward``)."""
        self.scale_loss(loss).backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling on ``optimizer``'s gradients (before clipping); nothing to undo
        without a backward pass since its last step."""
        if self.scaler is not None and self.has_new_gradients(optimizer):
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> bool:
        """Step ``optimizer`` (``kwargs``: to its ``step``); returns False when the grad scaler
        skipped it (inf/nan gradients). Without a backward pass since its last step, a grad
        scaler leaves it alone ([Note: a window with no gradients]); the step still counts."""
        new_gradients = self.has_new_gradients(optimizer)
        self._stepped_at[optimizer] = self._backwards
        if self.scaler is None:
            optimizer.step(**kwargs)
            return True
        if not new_gradients:
            return True
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # a fused optimizer is stepped always and skips inside its kernel: only the scale,
            # lowered after a skip, says so (two reads of it from the device)
            scale_before = self.scaler.get_scale()
            self.scaler.step(optimizer, **kwargs)
            self.scaler.update()
            return self.scaler.get_scale() >= scale_before
        # the scaler steps the optimizer only when its gradients were finite: a step hook says
        # whether it did, without reading the scale back from the device (the scaler's own
        # check is the step's one read, as under Lightning)
        stepped: list[bool] = []
        handle = optimizer.register_step_post_hook(lambda *_: stepped.append(True))
        try:
            self.scaler.step(optimizer, **kwargs)
        finally:
            handle.remove()
        self.scaler.update()
        return bool(stepped)

    def state_dict(self) -> dict[str, Any]:
        """Grad scaler state for a checkpoint (empty when there is no scaler)."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.precision!r})"


class FSDPPrecision(Precision):
    """Precision under FSDP: the string also sets FSDP's ``MixedPrecision`` dtypes.

    =================  =============  ==============  ==============
    string             param_dtype    reduce_dtype    buffer_dtype
    =================  =============  ==============  ==============
    ``"32-true"``      float32        float32         float32
    ``"16-mixed"``     float16        float32         float32
    ``"bf16-mixed"``   bfloat16       float32         float32
    ``"16-true"``      float16        float16         float16
    ``"bf16-true"``    bfloat16       bfloat16        bfloat16
    =================  =============  ==============  ==============

    Under the "-mixed" settings the sharded parameters and the optimizer stay in float32 while
    FSDP gathers them in half precision for compute, and gradients are reduced in float32;
    autocast (and for "16-mixed" a ``ShardedGradScaler``) works as without FSDP. A user's own
    ``MixedPrecision`` replaces the table's row.
    """

    def __init__(
        self, precision: Any = "32-true", device_type: str = "cpu", mixed_precision: Any = None
    ) -> None:
        super().__init__(precision, device_type)
        self.user_mixed_precision = mixed_precision

    def _make_scaler(self) -> torch.amp.GradScaler:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=self.device_type)

    @property
    def mixed_precision_config(self) -> Any:
        """The ``torch.distributed.fsdp.MixedPrecision`` FSDP is built with."""
        from torch.distributed.fsdp import MixedPrecision

        if self.user_mixed_precision is not None:
            return self.user_mixed_precision
        half = self.compute_dtype
        if self.is_mixed:
            return MixedPrecision(param_dtype=half, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
        return MixedPrecision(param_dtype=half, reduce_dtype=half, buffer_dtype=half)


class FSDP2Precision(FSDPPrecision):
    """Precision under FSDP2 (``fully_shard``): the string sets a ``MixedPrecisionPolicy``.

    =================  =============  ==============
    string             param_dtype    reduce_dtype
    =================  =============  ==============
    ``"32-true"``      (none)         (none)
    ``"16-mixed"``     float16        float32
    ``"bf16-mixed"``   bfloat16       float32
    ``"16-true"``      (none)         (none)
    ``"bf16-true"``    (none)         (none)
    =================  =============  ==============

    Under "-true" the module is cast to the half dtype before sharding, so the policy has nothing
    to cast. FSDP2 does not cast buffers; autocast runs the forward as it does without FSDP. A
    user's own ``MixedPrecisionPolicy`` replaces the table's row.
    """

    @property
    @override
    def mixed_precision_config(self) -> Any:
        """The ``torch.distributed.fsdp.MixedPrecisionPolicy`` each ``fully_shard`` call gets."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.user_mixed_precision is not None:
            return self.user_mixed_precision
        if self.is_mixed:
            return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        return MixedPrecisionPolicy()

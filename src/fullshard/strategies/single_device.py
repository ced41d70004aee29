"""One process on one device: what ``strategy="auto"`` picks when there is a single device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.strategies.lightning_api import refuse_lightning_plugins
from fullshard.strategies.strategy import Strategy

if TYPE_CHECKING:
    from fullshard.strategies.registry import StrategyRegistry


class SingleDeviceStrategy(Strategy):
    """Train in this process on one device, with no process group and no wrapper.

    Args:
        device: the device (``"cpu"``, ``"cuda:1"``, a ``torch.device`` or a GPU index), as
            Lightning's ``SingleDeviceStrategy(device)``; None: the one the Trainer's
            ``accelerator``/``devices`` choose. Its type must be the Trainer's accelerator's.
        state_dict_type: ``"full"`` or ``"sharded"`` checkpoints (see :class:`Strategy`).
    """

    strategy_name = "single_device"
    runs_in_one_process = True

    def __init__(
        self,
        device: str | int | torch.device | None = None,
        *,
        state_dict_type: str = "full",
        **lightning: Any,
    ) -> None:
        refuse_lightning_plugins("SingleDeviceStrategy", lightning)
        if lightning:
            raise TypeError(
                f"SingleDeviceStrategy() got unexpected keyword arguments {sorted(lightning)}; it takes device= "
                "and state_dict_type=."
            )
        super().__init__(state_dict_type=state_dict_type)
        self._device = (
            None if device is None else torch.device(f"cuda:{device}" if isinstance(device, int) else device)
        )

    @override
    def configure(self, **kwargs: Any) -> None:
        if self._device is not None:
            chosen = kwargs["devices"][0]
            if chosen.type != self._device.type:
                raise MisconfigurationError(
                    f"SingleDeviceStrategy(device={str(self._device)!r}) runs on {self._device.type}, but the Trainer's "
                    f"accelerator is {chosen.type!r}: pass Trainer(accelerator={self._device.type!r}), or a "
                    f"{chosen.type} device to the strategy."
                )
            kwargs["devices"] = [self._device]
        super().configure(**kwargs)

    @classmethod
    @override
    def register_strategies(cls, registry: StrategyRegistry) -> None:
        registry.register(cls.strategy_name, cls, description="One process on one device (CPU or one GPU).")

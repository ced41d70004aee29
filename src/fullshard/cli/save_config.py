"""``SaveConfigCallback``: the callback :class:`~fullshard.cli.LightningCLI` adds to write the
run's full configuration next to its logs (docs/cli.md). It imports no jsonargparse itself: the
parser it is given writes the file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import override

from fullshard.module import Module
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.trainer import Trainer

if TYPE_CHECKING:
    from jsonargparse import Namespace

    from fullshard.cli.lightning_cli import LightningArgumentParser


class SaveConfigCallback(Callback):
    """Writes the run's full configuration to ``trainer.log_dir/config.yaml`` when it starts (on
    global rank 0), as Lightning's. An existing file is an error unless ``overwrite=True``: it
    belongs to an earlier run. Override :meth:`save_config` to store it elsewhere too.

    Raises:
        RuntimeError: the file exists and ``overwrite`` is False.
    """

    def __init__(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError(
                "SaveConfigCallback(save_to_log_dir=False) saves nothing: subclass it and override save_config() "
                "to store the configuration elsewhere, or pass LightningCLI(save_config_callback=None)."
            )

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        if self.already_saved:
            return
        if self.save_to_log_dir:
            path = Path(trainer.log_dir, self.config_filename)
            if not self.overwrite:
                exists = trainer.strategy.broadcast(path.is_file() if trainer.is_global_zero else False)
                if exists:
                    raise RuntimeError(
                        f"{type(self).__name__} expected {path} to not exist: it holds the configuration of an earlier "
                        "run, which would be overwritten. Delete it, log to another directory (--trainer.default_root_dir, "
                        "or a logger version), pass LightningCLI(save_config_kwargs={'overwrite': True}) to overwrite "
                        "it, or LightningCLI(save_config_callback=None) to save no configuration."
                    )
            if trainer.is_global_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.parser.save(
                    self.config, path, skip_unset=False, overwrite=self.overwrite, multifile=self.multifile
                )
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def save_config(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        """Override to store the configuration somewhere else as well; runs on global rank 0 only
        (no collectives here)."""

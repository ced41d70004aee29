"""``LightningCLI``: a training script's command line and config files, built from its classes'
signatures with jsonargparse, as Lightning's ``lightning.pytorch.cli`` (docs/cli.md)::

    # train.py
    from fullshard.cli import LightningCLI
    LightningCLI(MyModule, MyDataModule)

    python train.py fit --config run.yaml --trainer.strategy fsdp --trainer.devices 2
    python train.py fit --print_config > run.yaml

Needs ``jsonargparse`` (``pip install 'fullshard[cli]'``). Configuration files Lightning wrote
load unchanged where fullshard has the names: see [Note: Lightning configs] in
:mod:`fullshard.cli.config`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache
from typing_extensions import override

try:
    import yaml
    from jsonargparse import (  # type: ignore[attr-defined]  # ActionConfigFile: public, not in its __all__
        ActionConfigFile,
        ArgumentParser,
        Namespace,
        get_loader,
    )
except ImportError as _err:  # pragma: no cover - the test extra installs it
    raise ImportError(
        "fullshard.cli.LightningCLI needs jsonargparse, which is not installed: "
        "pip install 'fullshard[cli]' (or pip install 'jsonargparse[signatures]')."
    ) from _err
if not RequirementCache("jsonargparse>=4.49"):
    raise ImportError(
        "fullshard.cli.LightningCLI needs jsonargparse>=4.49 (older ones lack instantiate() and skip_unset): "
        "pip install -U 'fullshard[cli]' (or pip install -U 'jsonargparse[signatures]>=4.49')."
    )

from fullshard.cli.config import from_lightning, instantiate_class
from fullshard.cli.save_config import SaveConfigCallback
from fullshard.datamodule import DataModule
from fullshard.errors import MisconfigurationError
from fullshard.module import Module
from fullshard.rank_zero import rank_zero_warn
from fullshard.seed import seed_everything
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.trainer import Trainer

__all__ = ["LightningArgumentParser", "LightningCLI", "ReduceLROnPlateau"]

ArgsType = list[str] | dict[str, Any] | Namespace | None
_LR_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ``ReduceLROnPlateau`` with the metric it watches (``monitor``), so that
    ``--lr_scheduler ReduceLROnPlateau --lr_scheduler.monitor val_loss`` configures it fully."""

    def __init__(self, optimizer: torch.optim.Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's parser, with the methods LightningCLI adds its groups through; it reads
    Lightning-written configuration files as fullshard's ([Note: Lightning configs])."""

    def __init__(
        self,
        *args: Any,
        description: str = "fullshard Trainer command line tool",
        env_prefix: str = "FULLSHARD",
        default_env: bool = False,
        **kwargs: Any,
    ) -> None:
        """Arguments as jsonargparse's ``ArgumentParser``; ``default_env=True`` also reads
        ``FULLSHARD_TRAINER__MAX_EPOCHS``-style environment variables."""
        super().__init__(
            *args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs
        )
        self.callback_keys: list[str] = []
        self.optimizer_groups: dict[str, tuple[type | tuple[type, ...], str]] = {}
        self.lr_scheduler_groups: dict[str, tuple[type | tuple[type, ...], str]] = {}
        self.trainer_class: Any = Trainer
        self.subcommand: str | None = None

    # ------------------------------------------------------------------------ argument groups
    def add_lightning_class_args(
        self,
        lightning_class: type | Callable[..., Any],
        nested_key: str,
        subclass_mode: bool = False,
        required: bool = True,
    ) -> list[str]:
        """Add the constructor arguments of a Trainer, Module, DataModule or Callback class
        under ``nested_key``; ``subclass_mode``: any subclass, chosen by ``class_path``.

        Raises:
            MisconfigurationError: ``lightning_class`` is none of those.
        """
        if isinstance(lightning_class, type) and issubclass(
            lightning_class, Trainer | Module | DataModule | Callback
        ):
            if issubclass(lightning_class, Callback):
                self.callback_keys.append(nested_key)
            if subclass_mode:
                self.add_subclass_arguments(
                    lightning_class, nested_key, fail_untyped=False, required=required
                )
                return [nested_key]
            return list(
                self.add_class_arguments(
                    lightning_class,
                    nested_key,
                    fail_untyped=False,
                    instantiate=not issubclass(lightning_class, Trainer),
                    sub_configs=True,
                )
            )
        if callable(lightning_class) and not isinstance(lightning_class, type):
            return list(self.add_function_arguments(lightning_class, nested_key, fail_untyped=False))
        raise MisconfigurationError(
            f"Cannot add arguments from {lightning_class!r}: give a subclass of fullshard's Trainer, Module, "
            "DataModule or Callback, or a function returning one."
        )

    def add_optimizer_args(
        self,
        optimizer_class: type[torch.optim.Optimizer] | tuple[type[torch.optim.Optimizer], ...] = (
            torch.optim.Optimizer,
        ),
        nested_key: str = "optimizer",
        link_to: str = "AUTOMATIC",
    ) -> None:
        """Add an optimizer's arguments under ``nested_key`` (a tuple: any subclass, by class path).
        ``link_to="AUTOMATIC"``: LightningCLI builds the module's optimizer from it."""
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"params"}}
        if isinstance(optimizer_class, tuple):
            self.add_subclass_arguments(optimizer_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(optimizer_class, nested_key, sub_configs=True, **kwargs)
        self.optimizer_groups[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(
        self,
        lr_scheduler_class: type | tuple[type, ...] = _LR_SCHEDULERS,
        nested_key: str = "lr_scheduler",
        link_to: str = "AUTOMATIC",
    ) -> None:
        """Add an LR scheduler's arguments under ``nested_key``, as :meth:`add_optimizer_args`."""
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"optimizer"}}
        if isinstance(lr_scheduler_class, tuple):
            self.add_subclass_arguments(lr_scheduler_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(lr_scheduler_class, nested_key, sub_configs=True, **kwargs)
        self.lr_scheduler_groups[nested_key] = (lr_scheduler_class, link_to)

    # ----------------------------------------------------- Lightning-written configuration files
    # [Note: where configs are translated]
    # Every configuration document jsonargparse reads from text (--config files, strings,
    # default_config_files, a FULLSHARD_CONFIG variable) goes through its private
    # `_load_config_parser_mode`; no public method sees the default config files, so the
    # translation of [Note: Lightning configs] (cli/config.py) hooks in there. Mappings given as
    # objects (`args={...}`) come through the public `parse_object`. tests/test_cli_config.py
    # pins both paths, so a jsonargparse that renames the private method fails there.
    @override
    def _load_config_parser_mode(self, content: str, path: Any = "", *args: Any, **kwargs: Any) -> Namespace:
        document = get_loader(self.parser_mode)(content)
        if isinstance(document, Mapping):
            try:
                translated = from_lightning(
                    document, trainer_class=self.trainer_class, subcommand=self.subcommand
                )
            except ValueError as err:
                raise TypeError(f"{err}{f' (in {os.fspath(path)})' if path else ''}") from None
            if translated != document:
                content = yaml.safe_dump(translated, sort_keys=False)
        loaded: Namespace = super()._load_config_parser_mode(content, path, *args, **kwargs)
        return loaded

    @override
    def parse_object(self, obj: Any, *args: Any, **kwargs: Any) -> Namespace:
        if isinstance(obj, Namespace):
            obj = obj.as_dict()
        if isinstance(obj, Mapping):
            try:
                obj = from_lightning(obj, trainer_class=self.trainer_class, subcommand=self.subcommand)
            except ValueError as err:
                self.error(str(err))
        parsed: Namespace = super().parse_object(obj, *args, **kwargs)
        return parsed


def _with_class_path(cls: type, init_args: Any) -> dict[str, Any]:
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": dict(init_args or {})}


class _AutomaticOptimizers:
    """The ``configure_optimizers`` LightningCLI gives a module from ``--optimizer`` /
    ``--lr_scheduler``. It builds them when the Trainer asks, from the parameters the module has
    then (sharded ones under FSDP: fullshard calls ``configure_optimizers`` after wrapping)."""

    def __init__(
        self,
        cli: type[LightningCLI],
        module: Module,
        optimizer: dict[str, Any],
        lr_scheduler: dict[str, Any] | None,
    ) -> None:
        self.cli, self.module, self.optimizer, self.lr_scheduler = cli, module, optimizer, lr_scheduler

    def __call__(self) -> Any:
        optimizer = instantiate_class(self.module.parameters(), self.optimizer)
        lr_scheduler = instantiate_class(optimizer, self.lr_scheduler) if self.lr_scheduler else None
        return self.cli.configure_optimizers(self.module, optimizer, lr_scheduler)


class LightningCLI:
    """A command line for training ``model_class`` on ``datamodule_class``, as Lightning's
    ``LightningCLI`` (docs/cli.md lists every option and the differences)."""

    def __init__(
        self,
        model_class: type[Module] | Callable[..., Module] | None = None,
        datamodule_class: type[DataModule] | Callable[..., DataModule] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type[Trainer] | Callable[..., Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        parser_kwargs: dict[str, Any] | None = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: ArgsType = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
    ) -> None:
        """Parse the command line (or ``args``), build the classes and, with ``run=True``, run
        the subcommand (``fit``, ``validate``, ``test``, ``predict``).

        Args:
            model_class: the module class (or a function returning a module); None: any module,
                chosen with ``--model.class_path``.
            datamodule_class: the DataModule class (or function); None: any, optional.
            save_config_callback: writes the configuration into the log directory
                (:class:`SaveConfigCallback`); None: no file.
            save_config_kwargs: keyword arguments of ``save_config_callback`` (``overwrite``,
                ``config_filename``, ``multifile``).
            trainer_class: the Trainer class (or a function returning one).
            trainer_defaults: Trainer argument defaults; its ``callbacks`` are always added and not
                configurable.
            seed_everything_default: ``--seed_everything``'s default: an int, True (draw one), False (no seeding).
            parser_kwargs: keyword arguments of the parsers; a key naming a subcommand
                (``{"fit": {"default_config_files": [...]}}``) applies to that subcommand's only.
            parser_class: the parser class.
            subclass_mode_model: accept any subclass of ``model_class`` (``--model.class_path``).
            subclass_mode_data: accept any subclass of ``datamodule_class``.
            args: what to parse instead of ``sys.argv[1:]``: a list of command-line words, or a
                dict (or Namespace) of the configuration.
            run: False: no subcommands; the classes are built (``cli.model``, ``cli.datamodule``,
                ``cli.trainer``) and nothing runs.
            auto_configure_optimizers: add ``--optimizer`` and ``--lr_scheduler``; when given, they
                replace the module's ``configure_optimizers``.
        """
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.model_class = model_class
        self.datamodule_class = datamodule_class
        self._model_class = model_class or Module
        self._datamodule_class = datamodule_class or DataModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        self.datamodule: DataModule | None = None

        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in self.subcommands()}
        subcommand_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in self.subcommands()}
        self.setup_parser(run, main_kwargs, subcommand_kwargs)
        self.parse_arguments(self.parser, args)
        self.subcommand: str | None = self.config["subcommand"] if run else None
        self._set_seed()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # ------------------------------------------------------------------------------- parsers
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Build one parser (with ``-c/--config``)."""
        from fullshard import __version__

        kwargs.setdefault("dump_header", [f"fullshard=={__version__}"])
        parser = self.parser_class(**kwargs)
        parser.trainer_class = self.trainer_class
        parser.add_argument(
            "-c",
            "--config",
            action=ActionConfigFile,
            help="Path to a configuration file in json or yaml format.",
        )
        return parser

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subcommand_kwargs: dict[str, Any]
    ) -> None:
        """Build ``self.parser``: with a subparser per subcommand, or (``run=False``) without."""
        self.parser = self.init_parser(**main_kwargs)
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        self._subcommand_method_arguments: dict[str, list[str]] = {}
        if not add_subcommands:
            self._add_arguments(self.parser)
            return
        subcommands = self.parser.add_subcommands()
        for name, skip in self.subcommands().items():
            method = getattr(self.trainer_class, name)
            description = (method.__doc__ or "").strip().split("\n")[0] or None
            kwargs = {"description": description, **subcommand_kwargs.get(name, {})}
            parser = self.init_parser(**kwargs)
            parser.subcommand = name
            self._add_arguments(parser)
            trainer_type = self.trainer_class if isinstance(self.trainer_class, type) else Trainer
            added = parser.add_method_arguments(trainer_type, name, skip=set(skip))
            self._subcommand_method_arguments[name] = list(added)
            self._subcommand_parsers[name] = parser
            subcommands.add_subcommand(name, parser, help=description)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add ``--seed_everything``."""
        parser.add_argument(
            "--seed_everything",
            type=bool | int,
            default=self.seed_everything_default,
            help="An int: seed_everything(value, workers=True) before the classes are built; true: a random seed "
            "(the same in every process); false: no seeding.",
        )

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the ``trainer``, ``model`` and ``data`` groups."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        defaults = {f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"}
        if self.trainer_class is Trainer and "preemption_signals" not in self.trainer_defaults:
            # the default tuple, as the list a config file writes (a tuple does not round-trip)
            defaults["trainer.preemption_signals"] = ["SIGTERM", "SIGUSR1"]
        parser.set_defaults(defaults)
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(
            self._datamodule_class,
            "data",
            subclass_mode=self.subclass_mode_data,
            required=self.datamodule_class is not None,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments or links (``parser.link_arguments``) to every parser."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser.optimizer_groups:
                parser.add_optimizer_args((torch.optim.Optimizer,))
            if not parser.lr_scheduler_groups:
                parser.add_lr_scheduler_args(_LR_SCHEDULERS)
        for key, (declared, link_to) in {**parser.optimizer_groups, **parser.lr_scheduler_groups}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(declared, tuple):  # a subclass group: its value has a class_path already
                parser.link_arguments(key, link_to)
            else:  # the target gets {"class_path", "init_args"}, for instantiate_class
                parser.link_arguments(key, link_to, compute_fn=functools.partial(_with_class_path, declared))

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the Trainer-method arguments the CLI fills itself."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse ``args`` (default ``sys.argv[1:]``) into ``self.config``."""
        if args is not None and len(sys.argv) > 1:
            rank_zero_warn(
                f"LightningCLI got args={args!r} and reads those, not the command line's {sys.argv[1:]!r}."
            )
        if isinstance(args, dict | Namespace):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    # --------------------------------------------------------------------------- instantiation
    def _get(self, config: Namespace, key: str, default: Any = None) -> Any:
        """``config[key]``, inside the subcommand's section when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        seed = seed_everything(None if seed is True else seed, workers=True)
        self.config.get(str(self.subcommand), self.config)["seed_everything"] = seed

    def before_instantiate_classes(self) -> None:
        """Override to run code before the classes are built."""

    def instantiate_classes(self) -> None:
        """Build the datamodule, the module and the Trainer (``self.datamodule``, ``self.model``,
        ``self.trainer``); ``self.config_init`` holds every built object."""
        self.config_init = self.parser.instantiate(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model: Module = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code after the classes are built."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Build the Trainer from its configuration, the callback groups, ``trainer_defaults``'
        callbacks and the config-saving callback; ``kwargs`` override the configuration."""
        parser = self._parser(self.subcommand)
        extra = [self._get(self.config_init, key) for key in parser.callback_keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        callbacks = config.get("callbacks")
        callbacks = (
            []
            if callbacks is None
            else list(callbacks)
            if isinstance(callbacks, list | tuple)
            else [callbacks]
        )
        callbacks += extra
        default = self.trainer_defaults.get("callbacks", [])
        callbacks += default if isinstance(default, list | tuple) else [default]
        if self.save_config_callback is not None and not config.get("fast_dev_run", False):
            callbacks.append(
                self.save_config_callback(
                    parser, self.config.get(str(self.subcommand), self.config), **self.save_config_kwargs
                )
            )
        config["callbacks"] = callbacks
        return self.trainer_class(**config)

    @staticmethod
    def configure_optimizers(
        module: Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None
    ) -> Any:
        """What the module's ``configure_optimizers`` returns when ``--optimizer`` is given:
        override to change it (a ``ReduceLROnPlateau`` is stepped with its ``monitor``)."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor},
            }
        return {"optimizer": optimizer, "lr_scheduler": lr_scheduler}

    def _automatic(
        self, groups: Mapping[str, tuple[type | tuple[type, ...], str]], base: type | tuple[type, ...]
    ) -> list[str]:
        bases = base if isinstance(base, tuple) else (base,)
        found = []
        for key, (declared, link_to) in groups.items():
            declared_tuple = declared if isinstance(declared, tuple) else (declared,)
            if link_to == "AUTOMATIC" and any(issubclass(c, bases) for c in declared_tuple):
                found.append(key)
        return found

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """Give the module the ``configure_optimizers`` of ``--optimizer``/``--lr_scheduler``, when given."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)
        optimizers = self._automatic(parser.optimizer_groups, torch.optim.Optimizer)
        schedulers = self._automatic(parser.lr_scheduler_groups, _LR_SCHEDULERS)
        clash = [group for group in (optimizers, schedulers) if len(group) > 1]
        if clash:
            raise MisconfigurationError(
                f"LightningCLI builds at most one optimizer and one LR scheduler itself, but the groups "
                f"{clash[0]} are all link_to='AUTOMATIC'. Link them to the module's arguments "
                "(link_to='model.optimizer') and build them in its configure_optimizers (docs/cli.md)."
            )
        if not optimizers:
            return
        optimizer_init = self._class_init(
            parser.optimizer_groups[optimizers[0]][0], self._get(self.config_init, optimizers[0])
        )
        if not optimizer_init:
            return  # the groups exist, but no optimizer was given: the module's own configure_optimizers
        scheduler_init = None
        if schedulers:
            scheduler_init = self._class_init(
                parser.lr_scheduler_groups[schedulers[0]][0], self._get(self.config_init, schedulers[0])
            )
        if type(self.model).configure_optimizers is not Module.configure_optimizers:
            rank_zero_warn(
                f"{type(self.model).__name__}.configure_optimizers is replaced by the optimizer given with "
                f"--{optimizers[0]} ({type(self).__name__}.configure_optimizers)."
            )
        # an instance attribute: preflight's check for a defined configure_optimizers sees it
        automatic = _AutomaticOptimizers(type(self), self.model, optimizer_init, scheduler_init)
        self.model.configure_optimizers = automatic  # type: ignore[method-assign]

    @staticmethod
    def _class_init(declared: type | tuple[type, ...], init: Any) -> dict[str, Any] | None:
        if isinstance(init, Namespace):
            init = init.as_dict()
        if not init:
            return None
        if isinstance(declared, tuple):
            return dict(init)  # already {"class_path": ..., "init_args": ...}
        return _with_class_path(declared, init)

    # ------------------------------------------------------------------------------------ run
    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        method = getattr(self, subcommand, None) or getattr(self.trainer, subcommand)
        method(**self._prepare_subcommand_kwargs(subcommand))
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        section = self.config_init[subcommand]
        kwargs = {k: v for k, v in section.items() if k in self._subcommand_method_arguments[subcommand]}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return kwargs

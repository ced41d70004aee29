"""LightningCLI (fullshard.cli): config files, subcommands, strategies from configuration, Lightning-
written configs, config saving, and a two-process FSDP run of a CLI script (docs/cli.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import fullshard
import lightning_env
from conftest import SCRIPTS, check_ok, run_script
from fullshard.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from fullshard.cli import (
    LightningCLI,
    SaveConfigCallback,
    instantiate_class,
    lightning_class_path,
    strategy_from_config,
)
from fullshard.cli.config import from_lightning
from fullshard.errors import MisconfigurationError, StrategyRegistryError
from fullshard.loggers import CSVLogger
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy, SingleDeviceStrategy

sys.path.insert(0, str(SCRIPTS))
from cli_train import Data, Model, WideModel

FIXTURE = Path(__file__).parent / "fixtures" / "lightning_cli_fit.yaml"
LIGHTNING_PYTHON = lightning_env.PYTHON


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The tests pass ``args=``; pytest's own command line is not the script's."""
    monkeypatch.setattr(sys, "argv", ["cli_train.py"])
    monkeypatch.chdir(tmp_path)


def _quiet(root: Path) -> list[str]:
    return [
        "--trainer.accelerator=cpu", "--trainer.devices=1", f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
    ]  # fmt: skip


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def _cli(*args: str, **kwargs: Any) -> LightningCLI:
    return LightningCLI(Model, Data, args=list(args), **kwargs)


def _error(capsys: pytest.CaptureFixture[str], *args: str, **kwargs: Any) -> str:
    """The message a bad command line ends with (jsonargparse prints it and exits 2)."""
    with pytest.raises(SystemExit) as exit_info:
        _cli(*args, **kwargs)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# ----------------------------------------------------------------------------- fit from a config
def test_fit_from_a_yaml_config_with_a_command_line_override(tmp_path: Path) -> None:
    config = _write(tmp_path / "run.yaml", {
        "seed_everything": 3,
        "trainer": {"max_epochs": 2, "limit_train_batches": 3, "logger": False},
        "model": {"hidden": 6, "lr": 0.05},
        "data": {"batch_size": 8},
    })  # fmt: skip
    cli = _cli("fit", "--config", str(config), "--model.hidden=5", *_quiet(tmp_path))
    assert isinstance(cli.model, Model) and isinstance(cli.datamodule, Data)
    assert cli.model.hparams["hidden"] == 5 and cli.model.hparams["lr"] == 0.05  # the flag wins over the file
    assert cli.model.net[0].out_features == 5
    assert cli.datamodule.batch_size == 8
    assert (cli.trainer.current_epoch, cli.trainer.global_step) == (2, 6)
    assert cli.config["fit"]["seed_everything"] == 3
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())  # no logger: log_dir is default_root_dir
    assert saved["model"] == {"hidden": 5, "lr": 0.05} and saved["trainer"]["max_epochs"] == 2


def test_print_config_is_complete_and_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _write(
        tmp_path / "run.yaml", {"trainer": {"max_epochs": 3, "strategy": "fsdp"}, "model": {"hidden": 7}}
    )
    with pytest.raises(SystemExit) as exit_info:
        _cli("fit", "--config", str(config), "--print_config")
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    document = yaml.safe_load(printed)
    assert printed.startswith(f"# fullshard=={fullshard.__version__}")
    # every argument is spelled out, the file's and the defaults
    assert document["trainer"]["max_epochs"] == 3 and document["trainer"]["strategy"] == "fsdp"
    assert {"accumulate_grad_batches", "precision", "callbacks", "preemption_signals"} <= set(
        document["trainer"]
    )
    assert document["model"] == {"hidden": 7, "lr": 0.1}
    assert {"seed_everything", "ckpt_path", "optimizer", "lr_scheduler", "ckpt_weights_only"} <= set(document)
    (tmp_path / "printed.yaml").write_text(printed)
    with pytest.raises(SystemExit):
        _cli("fit", "--config", str(tmp_path / "printed.yaml"), "--print_config")
    assert capsys.readouterr().out == printed


# ---------------------------------------------------------------------------------- strategies
@pytest.mark.parametrize(
    ("name", "cls"),
    [("fsdp", FSDPStrategy), ("fsdp2", FSDP2Strategy), ("ddp", DDPStrategy), ("auto", SingleDeviceStrategy)],
)
def test_strategy_by_registry_name(name: str, cls: type, tmp_path: Path) -> None:
    cli = _cli(
        f"--trainer.strategy={name}",
        *_quiet(tmp_path),
        f"--trainer.devices={1 if name == 'auto' else 2}",
        run=False,
    )
    assert type(cli.trainer.strategy) is cls


def test_strategy_as_class_path_with_policies_by_class_name(tmp_path: Path) -> None:
    config = _write(tmp_path / "run.yaml", {"trainer": {"strategy": {
        "class_path": "fullshard.strategies.FSDPStrategy",
        "init_args": {
            "auto_wrap_policy": ["torch.nn.Linear"],
            "activation_checkpointing_policy": ["Tanh"],
            "sharding_strategy": "SHARD_GRAD_OP",
            "state_dict_type": "sharded",
            "timeout": "0:02:00",
        },
    }}})  # fmt: skip
    cli = _cli("--config", str(config), *_quiet(tmp_path), "--trainer.devices=2", run=False)
    strategy = cli.trainer.strategy
    assert type(strategy) is FSDPStrategy
    assert strategy.auto_wrap_policy is not None and strategy.auto_wrap_policy.classes == frozenset(
        {"torch.nn.Linear"}
    )
    assert strategy.activation_checkpointing_policy is not None
    assert strategy.activation_checkpointing_policy.classes == frozenset({"Tanh"})
    assert strategy.state_dict_type == "sharded"


def test_strategy_options_on_the_command_line(tmp_path: Path) -> None:
    cli = _cli("--trainer.strategy=fullshard.strategies.FSDP2Strategy", "--trainer.strategy.state_dict_type=sharded",
               "--trainer.strategy.async_save=true", *_quiet(tmp_path), "--trainer.devices=2", run=False)  # fmt: skip
    assert type(cli.trainer.strategy) is FSDP2Strategy and cli.trainer.strategy.async_save is True


def test_a_strategy_class_that_is_not_a_strategy_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write(tmp_path / "run.yaml", {"trainer": {"strategy": {"class_path": "torch.nn.Linear"}}})
    err = _error(capsys, "--config", str(config), *_quiet(tmp_path), run=False)
    assert 'Parser key "trainer.strategy"' in err and "torch.nn.Linear" in err and "Strategy" in err
    # a bare word is a registry name
    with pytest.raises(
        StrategyRegistryError, match=r"Unknown strategy 'torch.nn.Linear'.*Available strategies: ddp"
    ):
        _cli("--trainer.strategy=torch.nn.Linear", *_quiet(tmp_path), run=False)


def test_an_unknown_strategy_name_lists_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(
        StrategyRegistryError, match=r"Unknown strategy 'fsdq'.*Did you mean 'fsdp'.*Available strategies"
    ):
        _cli("--trainer.strategy=fsdq", *_quiet(tmp_path), "--trainer.devices=2", run=False)


def test_strategy_from_config_forms() -> None:
    assert type(strategy_from_config("fsdp")) is FSDPStrategy
    built = strategy_from_config({
        "class_path": "fullshard.strategies.FSDPStrategy",
        "init_args": {"auto_wrap_policy": ["torch.nn.TransformerEncoderLayer"], "sharding_strategy": "SHARD_GRAD_OP"},
    })  # fmt: skip
    assert built.auto_wrap_policy.classes == frozenset({"torch.nn.TransformerEncoderLayer"})
    mmengine_style = strategy_from_config({"type": "fsdp", "state_dict_type": "sharded"})
    assert type(mmengine_style) is FSDPStrategy and mmengine_style.state_dict_type == "sharded"
    by_class_name = strategy_from_config(
        {"type": "FSDP2Strategy", "activation_checkpointing_policy": ["Block"]}
    )
    assert type(by_class_name) is FSDP2Strategy
    lightning_path = strategy_from_config(
        {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {}}
    )
    assert type(lightning_path) is DDPStrategy
    assert strategy_from_config(mmengine_style) is mmengine_style


def test_strategy_from_config_errors() -> None:
    with pytest.raises(
        ValueError,
        match=r"strategy type 'fsdq' is neither a registered name nor a class of fullshard.strategies\. Did you mean 'fsdp'.*classes: DDPStrategy",
    ):
        strategy_from_config({"type": "fsdq"})
    with pytest.raises(ValueError, match=r"needs 'class_path' \(with 'init_args'\) or 'type'"):
        strategy_from_config({"name": "fsdp"})
    with pytest.raises(ValueError, match=r"built a Linear, which is not a fullshard.strategies.Strategy"):
        strategy_from_config(
            {"class_path": "torch.nn.Linear", "init_args": {"in_features": 1, "out_features": 1}}
        )
    with pytest.raises(ValueError, match=r"got int \(3\); give a registry name"):
        strategy_from_config(3)
    with pytest.raises(StrategyRegistryError, match="Available strategies"):
        strategy_from_config("nope")
    with pytest.raises(TypeError, match="auto_wrap_policy"):
        strategy_from_config({"type": "fsdp", "auto_wrap_policy": [3]})


def test_instantiate_class_matches_lightnings_signature() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = instantiate_class(params, {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.5}})
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.param_groups[0]["lr"] == 0.5
    scheduler = instantiate_class(
        (optimizer,), {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 2}}
    )
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
    checkpoint = instantiate_class(
        (), {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitor": "x"}}
    )
    assert isinstance(checkpoint, ModelCheckpoint) and checkpoint.monitor == "x"
    with pytest.raises(
        ValueError,
        match=r"class_path='torch.optim.Adamm': module 'torch.optim' has no 'Adamm'. Did you mean 'Adam'",
    ):
        instantiate_class(params, {"class_path": "torch.optim.Adamm"})
    with pytest.raises(
        ValueError, match=r"class_path='AdamW' is not a dotted path: give the module and the name"
    ):
        instantiate_class(params, {"class_path": "AdamW"})
    with pytest.raises(
        ValueError, match=r"class_path='no_such_pkg.Thing': cannot import module 'no_such_pkg'"
    ):
        instantiate_class(params, {"class_path": "no_such_pkg.Thing"})
    with pytest.raises(ValueError, match=r"expects a mapping \{'class_path'"):
        instantiate_class(params, {"init_args": {}})
    with pytest.raises(ValueError, match=r"got keys \['lr'\] beside class_path"):
        instantiate_class(params, {"class_path": "torch.optim.SGD", "lr": 1})


# ------------------------------------------------------------------------- Lightning class paths
def test_lightning_class_paths_map_to_fullshard() -> None:
    assert (
        lightning_class_path("lightning.pytorch.callbacks.ModelCheckpoint")
        == "fullshard.callbacks.ModelCheckpoint"
    )
    assert (
        lightning_class_path("pytorch_lightning.callbacks.EarlyStopping")
        == "fullshard.callbacks.EarlyStopping"
    )
    assert lightning_class_path("lightning.pytorch.loggers.CSVLogger") == "fullshard.loggers.CSVLogger"
    assert (
        lightning_class_path("lightning.pytorch.strategies.FSDPStrategy")
        == "fullshard.strategies.FSDPStrategy"
    )
    assert (
        lightning_class_path("lightning.pytorch.cli.ReduceLROnPlateau") == "fullshard.cli.ReduceLROnPlateau"
    )
    assert lightning_class_path("lightning.pytorch.LightningModule") == "fullshard.LightningModule"
    assert lightning_class_path("torch.optim.AdamW") == "torch.optim.AdamW"
    with pytest.raises(ValueError, match=(
        r"'lightning.pytorch.strategies.DeepSpeedStrategy' names a Lightning class that fullshard has no "
        r"counterpart of in `fullshard.strategies`\. .*Classes there: DDPStrategy, FSDP2Strategy, FSDPStrategy"
    )):  # fmt: skip
        lightning_class_path("lightning.pytorch.strategies.DeepSpeedStrategy")
    with pytest.raises(
        ValueError, match=r"'lightning.pytorch.tuner.Tuner' names a Lightning class .* in fullshard\."
    ):
        lightning_class_path("lightning.pytorch.tuner.Tuner")


def test_from_lightning_drops_only_what_means_the_default() -> None:
    document = {"trainer": {"precision": None, "model_registry": None, "barebones": False, "enable_autolog_hparams": True,
                            "max_epochs": None, "logger": None}, "weights_only": None}  # fmt: skip
    assert from_lightning(
        document, subcommand="fit"
    ) == {  # barebones, enable_autolog_hparams and fit's weights_only are fullshard's too
        "trainer": {"barebones": False, "enable_autolog_hparams": True, "max_epochs": None, "logger": None},
        "weights_only": None,
    }
    with pytest.raises(
        ValueError,
        match=r"trainer.model_registry: Trainer\(model_registry='x'\) is a Lightning option that fullshard does not support",
    ):
        from_lightning({"trainer": {"model_registry": "x"}})
    with pytest.raises(
        ValueError,
        match=r"trainer.max_epoch: Trainer\(\) got an unexpected keyword argument 'max_epoch'. Did you mean 'max_epochs'",
    ):
        from_lightning({"trainer": {"max_epoch": 3}})
    assert from_lightning({"fit": {"weights_only": False}}) == {"fit": {"weights_only": False}}
    with pytest.raises(
        ValueError,
        match=r"ModelCheckpoint got monitr='x', which fullshard's ModelCheckpoint does not take\. Did you mean 'monitor'",
    ):
        from_lightning(
            {"c": {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitr": "x"}}}
        )
    csv = from_lightning({"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                     "init_args": {"save_dir": "x", "prefix": "run", "flush_logs_every_n_steps": 5}}})  # fmt: skip
    assert csv["logger"]["init_args"] == {"save_dir": "x", "prefix": "run", "flush_logs_every_n_steps": 5}
    mine = {"trainer": {"max_epochs": 2, "strategy": "fsdp"}, "model": {"hidden": 3}}
    assert from_lightning(mine) == mine


def test_a_config_written_by_lightning_loads_unchanged(tmp_path: Path) -> None:
    """tests/fixtures/lightning_cli_fit.yaml: Lightning's --print_config of tests/scripts/cli_train.py
    (the command is in the file), with Lightning's callback, logger and optimizer class paths."""
    cli = _cli("fit", "--config", str(FIXTURE), "--trainer.devices=1", "--trainer.strategy=auto", f"--trainer.default_root_dir={tmp_path}",
               "--trainer.max_epochs=1", run=True)  # fmt: skip
    trainer = cli.trainer
    checkpoint = next(c for c in trainer.callbacks if isinstance(c, ModelCheckpoint))
    assert checkpoint.monitor == "val_loss" and checkpoint.save_last is True
    assert any(isinstance(c, LearningRateMonitor) for c in trainer.callbacks)
    assert isinstance(trainer.logger, CSVLogger) and trainer.logger.name == "lightning_logs"
    assert Path(trainer.logger.save_dir) == Path("logs")
    assert cli.model.hparams["hidden"] == 8 and cli.datamodule.batch_size == 8
    assert cli.config["fit"]["seed_everything"] == 7
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["weight_decay"] == 0.01
    assert isinstance(trainer.lr_scheduler_configs[0].scheduler, torch.optim.lr_scheduler.StepLR)
    assert trainer.global_step == 4 and checkpoint.best_model_path
    assert (Path("logs") / "lightning_logs" / "version_0" / "config.yaml").is_file()


@pytest.mark.lightning
def test_lightnings_print_config_of_the_same_script_runs_under_fullshard(tmp_path: Path) -> None:
    env = {**os.environ, "PORT_FRAMEWORK": "lightning"}
    printed = subprocess.run(
        [str(LIGHTNING_PYTHON), str(SCRIPTS / "cli_train.py"), "fit", "--trainer.max_epochs=1", "--model.hidden=5",
         "--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping", "--trainer.callbacks.monitor=val_loss",
         "--trainer.callbacks.patience=2", "--print_config"],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    ).stdout  # fmt: skip
    (tmp_path / "lightning.yaml").write_text(printed)
    cli = _cli("fit", "--config", str(tmp_path / "lightning.yaml"), *_quiet(tmp_path))
    stopper = next(c for c in cli.trainer.callbacks if isinstance(c, fullshard.EarlyStopping))
    assert stopper.patience == 2 and cli.model.hparams["hidden"] == 5 and cli.trainer.current_epoch == 1


# --------------------------------------------------------------------------- errors in configs
def test_an_unknown_key_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _write(tmp_path / "run.yaml", {"trainer": {"max_epoch": 2}})
    err = _error(capsys, "fit", "--config", str(config), *_quiet(tmp_path))
    assert "max_epoch" in err


def test_a_bad_class_path_says_what_was_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(
        capsys, "fit", "--trainer.callbacks+=fullshard.callbacks.ModelCheckpointt", *_quiet(tmp_path)
    )
    assert "fullshard.callbacks.ModelCheckpointt" in err


def test_an_unknown_lightning_class_in_a_config_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write(
        tmp_path / "run.yaml",
        {
            "trainer": {
                "logger": [
                    {
                        "class_path": "lightning.pytorch.loggers.LitLogger",
                        "init_args": {"name": "run"},
                    }
                ]
            }
        },
    )
    err = _error(capsys, "fit", "--config", str(config), *_quiet(tmp_path))
    assert "'lightning.pytorch.loggers.LitLogger' names a Lightning class" in err
    assert "Classes there: CSVLogger, CometLogger, Logger" in err and "run.yaml" in err


def test_a_lightning_only_trainer_option_that_is_on_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write(tmp_path / "run.yaml", {"trainer": {"model_registry": "hub"}})
    err = _error(capsys, "fit", "--config", str(config), *_quiet(tmp_path))
    assert (
        "trainer.model_registry: Trainer(model_registry='hub') is a Lightning option that fullshard does not "
        "support" in err
    )
    assert "leave it out" in err


def test_jsonargparse_missing_says_how_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['jsonargparse'] = None\n"
        "import fullshard.cli\n"
        "assert fullshard.cli.main(['checkpoint', 'inspect', 'nowhere']) == 1\n"
        "from fullshard.cli import LightningCLI\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert (
        "ImportError: fullshard.cli.LightningCLI needs jsonargparse, which is not installed: pip install 'fullshard[cli]'"
        in result.stderr
    )


def test_jsonargparse_too_old_says_how_to_upgrade(tmp_path: Path) -> None:
    """An installed jsonargparse older than 4.49 (no instantiate(), no skip_unset) is refused at import."""
    info = tmp_path / "jsonargparse-4.40.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jsonargparse\nVersion: 4.40.0\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\nfrom fullshard.cli import LightningCLI\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert (
        "ImportError: fullshard.cli.LightningCLI needs jsonargparse>=4.49 (older ones lack instantiate() and "
        "skip_unset): pip install -U 'fullshard[cli]'" in result.stderr
    ), result.stderr


# ------------------------------------------------------------------------------- subcommands
def test_validate_test_predict_with_ckpt_path(tmp_path: Path) -> None:
    fit = _cli("fit", "--trainer.max_epochs=2", "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor=val_loss",
               "--trainer.logger=false", *_quiet(tmp_path))  # fmt: skip
    best = fit.trainer.checkpoint_callback.best_model_path
    assert best and Path(best).exists()
    expected = Model(hidden=4)
    expected.load_state_dict(
        {k.removeprefix("model."): v for k, v in torch.load(best, weights_only=False)["state_dict"].items()}
    )
    x, y = Data()._data(2).tensors
    with torch.no_grad():
        test_loss = float(torch.nn.functional.mse_loss(expected(x), y))
        predictions = expected(x)
    for stage in ("validate", "test", "predict"):
        root = tmp_path / stage
        cli = _cli(stage, f"--ckpt_path={best}", "--trainer.logger=false", *_quiet(root))
        if stage == "test":
            assert float(cli.trainer.callback_metrics["test_loss"]) == pytest.approx(test_loss, rel=1e-5)
        if stage == "validate":
            assert "val_loss" in cli.trainer.callback_metrics
        assert (root / "config.yaml").is_file()
    cli = LightningCLI(Model, Data, args=["predict", f"--ckpt_path={best}", *_quiet(tmp_path / "p2")],
                       save_config_callback=None)  # fmt: skip
    # the subcommand's return value is not kept (as in Lightning); predict again to compare
    out = cli.trainer.predict(cli.model, datamodule=cli.datamodule, ckpt_path=best)
    assert torch.allclose(torch.cat(out), predictions, atol=1e-6)


def test_subcommand_arguments_come_from_the_trainer_methods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _cli("test", "--help")
    help_text = capsys.readouterr().out
    assert "--ckpt_path" in help_text and "--ckpt_verify" in help_text and "--verbose" in help_text
    assert (
        "--trainer.strategy" in help_text
        and "--model.hidden" in help_text
        and "--data.batch_size" in help_text
    )


def test_run_false_builds_without_running(tmp_path: Path) -> None:
    cli = _cli("--trainer.max_epochs=4", "--model.lr=0.3", "--data.n=16", *_quiet(tmp_path), run=False)
    assert (
        isinstance(cli.trainer, fullshard.Trainer)
        and isinstance(cli.model, Model)
        and isinstance(cli.datamodule, Data)
    )
    assert cli.subcommand is None and cli.model.hparams["lr"] == 0.3 and cli.datamodule.n == 16
    assert cli.trainer.max_epochs == 4 and cli.trainer.global_step == 0
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written


def test_args_as_a_dict_and_trainer_defaults(tmp_path: Path) -> None:
    class Marker(Callback):
        pass

    marker = Marker()
    cli = LightningCLI(
        Model, Data, run=False,
        trainer_defaults={"max_epochs": 5, "callbacks": [marker], "accelerator": "cpu", "devices": 1},
        args={"model": {"hidden": 3}, "trainer": {"default_root_dir": str(tmp_path), "limit_val_batches": 2}},
    )  # fmt: skip
    assert (
        cli.model.hparams["hidden"] == 3
        and cli.trainer.max_epochs == 5
        and cli.trainer.limit_val_batches == 2
    )
    assert marker in cli.trainer.callbacks
    assert any(isinstance(c, SaveConfigCallback) for c in cli.trainer.callbacks)


def test_subclass_mode_model_and_data(tmp_path: Path) -> None:
    cli = LightningCLI(Model, Data, subclass_mode_model=True, subclass_mode_data=True, run=False,
                       args=["--model=cli_train.WideModel", "--model.depth=3", "--data=cli_train.Data", "--data.n=8",
                             *_quiet(tmp_path)])  # fmt: skip
    assert type(cli.model) is WideModel and cli.model.depth == 3 and cli.model.hparams["hidden"] == 16
    assert cli.datamodule.n == 8


def test_no_classes_given_means_any_chosen_by_class_path(tmp_path: Path) -> None:
    cli = LightningCLI(args=["--model=cli_train.WideModel", "--model.hidden=5", *_quiet(tmp_path)], run=False)
    assert type(cli.model) is WideModel and cli.model.hparams["hidden"] == 5 and cli.datamodule is None
    cli = LightningCLI(
        args=["--model=cli_train.Model", "--data=cli_train.Data", "--data.n=4", *_quiet(tmp_path)], run=False
    )
    assert type(cli.model) is Model and isinstance(cli.datamodule, Data) and cli.datamodule.n == 4


def test_automatic_optimizer_and_lr_scheduler(tmp_path: Path) -> None:
    with pytest.warns(
        UserWarning, match=r"Model.configure_optimizers is replaced by the optimizer given with --optimizer"
    ):
        cli = _cli("fit", "--optimizer=torch.optim.AdamW", "--optimizer.lr=0.01", "--optimizer.weight_decay=0.5",
                   "--lr_scheduler=torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size=1",
                   "--lr_scheduler.gamma=0.5", "--trainer.max_epochs=2", "--trainer.logger=false", *_quiet(tmp_path))  # fmt: skip
    optimizer = cli.trainer.optimizers[0]
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["weight_decay"] == 0.5
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**2)  # stepped once per epoch


class LinkedOptimizerModel(Model):
    def __init__(self, hidden: int = 4, optimizer_init: dict | None = None) -> None:
        super().__init__(hidden=hidden)
        self.optimizer_init = optimizer_init

    def configure_optimizers(self):
        return instantiate_class(self.parameters(), self.optimizer_init)


def test_an_optimizer_group_linked_to_the_module(tmp_path: Path) -> None:
    class LinkedCLI(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.add_optimizer_args(torch.optim.Adam, link_to="model.optimizer_init")

    cli = LinkedCLI(LinkedOptimizerModel, Data, args=["fit", "--optimizer.lr=0.01", "--trainer.max_epochs=1",
                                                      "--trainer.logger=false", *_quiet(tmp_path)])  # fmt: skip
    assert cli.model.optimizer_init["class_path"] == "torch.optim.adam.Adam"
    optimizer = cli.trainer.optimizers[0]
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["lr"] == 0.01


def test_reduce_lr_on_plateau_with_monitor(tmp_path: Path) -> None:
    cli = _cli("fit", "--optimizer=SGD", "--optimizer.lr=0.1", "--lr_scheduler=fullshard.cli.ReduceLROnPlateau",
               "--lr_scheduler.monitor=val_loss", "--lr_scheduler.patience=0", "--trainer.max_epochs=1",
               "--trainer.logger=false", *_quiet(tmp_path))  # fmt: skip
    config = cli.trainer.lr_scheduler_configs[0]
    assert config.monitor == "val_loss"


def test_parser_hooks_before_and_after_fit(tmp_path: Path) -> None:
    calls: list[str] = []

    class MyCLI(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.add_argument("--tag", default="none")
            parser.link_arguments("data.batch_size", "model.hidden")

        def before_fit(self) -> None:
            calls.append(f"before {self.config['fit']['tag']} {self.trainer.global_step}")

        def after_fit(self) -> None:
            calls.append(f"after {self.trainer.global_step}")

    cli = MyCLI(Model, Data, args=["fit", "--tag=x", "--data.batch_size=16", "--trainer.max_epochs=1",
                                   "--trainer.logger=false", *_quiet(tmp_path)])  # fmt: skip
    assert calls == ["before x 0", "after 2"]
    assert cli.model.hparams["hidden"] == 16


def test_default_config_files_written_by_lightning_are_translated_too(tmp_path: Path) -> None:
    """Default config files reach jsonargparse by another path than --config ([Note: where configs
    are translated] in fullshard/cli/lightning_cli.py)."""
    defaults = _write(
        tmp_path / "defaults.yaml",
        {
            "trainer": {
                "profiler": None,
                "max_epochs": 3,
                "callbacks": [
                    {
                        "class_path": "lightning.pytorch.callbacks.EarlyStopping",
                        "init_args": {"monitor": "val_loss"},
                    }
                ],
            }
        },
    )
    cli = _cli(*_quiet(tmp_path), run=False, parser_kwargs={"default_config_files": [str(defaults)]})
    assert cli.trainer.max_epochs == 3
    assert any(
        isinstance(c, fullshard.EarlyStopping) and c.monitor == "val_loss" for c in cli.trainer.callbacks
    )


def test_parser_kwargs_per_subcommand(tmp_path: Path) -> None:
    defaults = _write(tmp_path / "defaults.yaml", {"trainer": {"max_epochs": 2}, "model": {"hidden": 9}})
    cli = _cli("fit", "--trainer.logger=false", *_quiet(tmp_path),
               parser_kwargs={"fit": {"default_config_files": [str(defaults)]}})  # fmt: skip
    assert cli.model.hparams["hidden"] == 9 and cli.trainer.current_epoch == 2


def test_only_fullshard_classes_get_class_argument_groups(tmp_path: Path) -> None:
    class MyCLI(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.add_lightning_class_args(torch.nn.Linear, "layer")

    with pytest.raises(
        MisconfigurationError,
        match=r"Cannot add arguments from <class 'torch.nn.modules.linear.Linear'>: give a subclass of fullshard's Trainer, Module",
    ):
        MyCLI(Model, Data, args=_quiet(tmp_path), run=False)


def test_one_automatic_optimizer_at_most(tmp_path: Path) -> None:
    class TwoOptimizers(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.add_optimizer_args(torch.optim.SGD, nested_key="opt_a")
            parser.add_optimizer_args(torch.optim.Adam, nested_key="opt_b")

    with pytest.raises(
        MisconfigurationError,
        match=r"at most one optimizer and one LR scheduler itself, but the groups \['opt_a', 'opt_b'\]",
    ):
        TwoOptimizers(Model, Data, args=["--opt_a.lr=0.1", *_quiet(tmp_path)], run=False)


def test_a_callback_group_is_always_added(tmp_path: Path) -> None:
    class WithStopper(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.add_lightning_class_args(fullshard.EarlyStopping, "early_stopping")

    cli = WithStopper(
        Model,
        Data,
        args=["--early_stopping.monitor=val_loss", "--early_stopping.patience=4", *_quiet(tmp_path)],
        run=False,
    )
    stopper = next(c for c in cli.trainer.callbacks if isinstance(c, fullshard.EarlyStopping))
    assert stopper.patience == 4


def test_args_and_a_command_line_together_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", "fit", "--trainer.max_epochs=9"])
    with pytest.warns(
        UserWarning,
        match=r"LightningCLI got args=.* and reads those, not the command line's \['fit', '--trainer.max_epochs=9'\]",
    ):
        cli = _cli(*_quiet(tmp_path), run=False)
    assert cli.trainer.max_epochs != 9


# ----------------------------------------------------------------------------- saving configs
def test_save_config_refuses_to_overwrite_unless_asked(tmp_path: Path) -> None:
    args = ["fit", "--trainer.max_epochs=1", "--trainer.logger=CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
            "--trainer.logger.version=run", *_quiet(tmp_path)]  # fmt: skip
    _cli(*args)
    saved = tmp_path / "lightning_logs" / "run" / "config.yaml"
    assert yaml.safe_load(saved.read_text())["trainer"]["max_epochs"] == 1
    with pytest.raises(
        RuntimeError,
        match=r"SaveConfigCallback expected .*config.yaml to not exist.*save_config_kwargs=\{'overwrite': True\}",
    ):
        _cli(*args)
    _cli(*args[:1], "--trainer.max_epochs=2", *args[2:], save_config_kwargs={"overwrite": True})
    assert yaml.safe_load(saved.read_text())["trainer"]["max_epochs"] == 2
    _cli(*args, save_config_callback=None)  # no file written, no refusal


def test_save_to_log_dir_false_needs_an_override() -> None:
    with pytest.raises(
        ValueError, match=r"save_to_log_dir=False\) saves nothing: subclass it and override save_config"
    ):
        SaveConfigCallback(None, None, save_to_log_dir=False)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ two processes
@pytest.mark.multiprocess
def test_two_process_fsdp_run_of_a_cli_script(tmp_path: Path) -> None:
    config = _write(tmp_path / "run.yaml", {
        "seed_everything": 11,
        "trainer": {"max_epochs": 2, "accelerator": "cpu", "enable_progress_bar": False, "enable_model_summary": False,
                    "default_root_dir": str(tmp_path), "logger": False,
                    "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                   "init_args": {"monitor": "val_loss", "dirpath": str(tmp_path / "ckpt")}}]},
        "model": {"hidden": 6},
    })  # fmt: skip
    result = run_script("cli_train.py", "fit", "--config", str(config), "--trainer.strategy", "fsdp",
                        "--trainer.devices", "2", cwd=tmp_path, env={"CLI_TRAIN_REPORT": "1"}, timeout=240)  # fmt: skip
    check_ok(result)
    reports = [json.loads((tmp_path / f"rank{r}-fit.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2] and {r["strategy"] for r in reports} == {
        "FSDPStrategy"
    }
    # 32 samples, 4 per batch per rank: 4 steps an epoch
    assert [r["global_step"] for r in reports] == [8, 8]
    assert reports[0]["metrics"]["val_loss"] == pytest.approx(reports[1]["metrics"]["val_loss"])
    assert (tmp_path / "config.yaml").is_file() and any((tmp_path / "ckpt").iterdir())
    test = run_script("cli_train.py", "test", "--config", str(config), "--trainer.strategy", "fsdp", "--trainer.devices", "2",
                      "--ckpt_path", "best", cwd=tmp_path, env={"CLI_TRAIN_REPORT": "1"}, timeout=240)  # fmt: skip
    # the test run's SaveConfigCallback finds fit's config.yaml in the same directory: refused, as Lightning does
    assert test.returncode != 0 and "to not exist" in test.stderr
    test = run_script("cli_train.py", "test", "--config", str(config), "--trainer.strategy", "fsdp", "--trainer.devices", "2",
                      f"--trainer.default_root_dir={tmp_path / 'test'}", "--ckpt_path", str(next((tmp_path / "ckpt").iterdir())),
                      cwd=tmp_path, env={"CLI_TRAIN_REPORT": "1"}, timeout=240)  # fmt: skip
    check_ok(test)
    losses = [
        json.loads((tmp_path / "test" / f"rank{r}-test.json").read_text())["metrics"]["test_loss"]
        for r in range(2)
    ]
    assert losses[0] == pytest.approx(losses[1])

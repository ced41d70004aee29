"""Trainer and module behaviours Lightning's own tests pin, compared with Lightning 2.6.6 (issue 36):
``self.log`` reductions and the ``"step"`` key, step values logged in evaluation, what
``save_hyperparameters`` records and sends, validation switched off, ``trainer.state``, the
``weights_only=`` keyword, Ctrl+C during ``fit`` and the ``ModelCheckpoint`` checks. The cases are
in tests/twins/trainer_pins.py."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import compare
import fullshard
from conftest import quiet_trainer, run_script
from fullshard import hyperparameters
from fullshard.callbacks import OnExceptionCheckpoint
from fullshard.checkpoint.manager import load_options
from fullshard.errors import MisconfigurationError
from fullshard.module import AttributeDict

twins = compare.Twins("trainer_pins.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


# --------------------------------------------------------- what only fullshard can show (no twin)
def test_a_dict_config_is_recorded_as_a_plain_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    """omegaconf is recognised by its type's module, never imported: a stand-in module named
    omegaconf shows the path a real ``DictConfig`` takes (omegaconf is not installed here)."""
    omegaconf = types.ModuleType("omegaconf")

    class DictConfig:
        __module__ = "omegaconf.dictconfig"

        def __init__(self, content: dict[str, Any]) -> None:
            self.content = content

    class OmegaConf:
        @staticmethod
        def to_container(config: DictConfig, resolve: bool = False) -> dict[str, Any]:
            assert resolve
            return dict(config.content)

    omegaconf.DictConfig, omegaconf.OmegaConf = DictConfig, OmegaConf  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "omegaconf", omegaconf)

    class FromConfig(fullshard.LightningModule):
        def __init__(self, cfg: Any) -> None:
            super().__init__()
            self.save_hyperparameters(cfg)

    model = FromConfig(DictConfig({"lr": 0.5, "layers": 2}))
    assert type(model.hparams) is AttributeDict and dict(model.hparams) == {"lr": 0.5, "layers": 2}
    assert hyperparameters.checkpoint_entries(model) == {"hparams_name": "cfg"}


def test_save_hyperparameters_refuses_what_is_no_config() -> None:
    class Bad(fullshard.LightningModule):
        def __init__(self, value: Any) -> None:
            super().__init__()
            self.save_hyperparameters(value)

    with pytest.raises(
        ValueError, match=r"save_hyperparameters\(5\): a single value cannot be the hyperparameters"
    ):
        Bad(5)
    with pytest.raises(
        ValueError, match=r"save_hyperparameters got a object; it takes the names of __init__"
    ):
        Bad(object())
    assert dict(Bad({}).hparams) == {}  # an empty config records nothing, as in Lightning


def test_weights_only_maps_to_the_trust_rules() -> None:
    assert not load_options("x.ckpt", False, True, False, True).trust
    assert load_options("x.ckpt", False, True, False, False).trust
    assert not load_options("x.ckpt", False, True, False, None).trust
    with pytest.raises(
        MisconfigurationError, match=r"weights_only=True \(read plain data only\) and trust_checkpoint=True"
    ):
        load_options("x.ckpt", False, True, True, True)
    with pytest.raises(
        MisconfigurationError, match=r"weights_only='yes' is invalid: pass True, False or None"
    ):
        load_options("x.ckpt", False, True, False, "yes")


def test_checkpointing_off_with_a_checkpoint_callback_is_refused() -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"enable_checkpointing=False \(or barebones=True\) and callbacks holding OnExceptionCheckpoint, "
        r"which saves checkpoints \(Lightning refuses it too\). Remove the ModelCheckpoint",
    ):
        fullshard.Trainer(
            accelerator="cpu", enable_checkpointing=False, callbacks=[OnExceptionCheckpoint("ckpts")]
        )


def test_ctrl_c_ends_a_script_with_status_1_and_no_traceback() -> None:
    result = run_script("ctrl_c_job.py")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output and "fit returned" not in output
    assert "Detected KeyboardInterrupt, attempting graceful shutdown" in output
    assert "exiting; SIGINT handler is the default: True" in output


def test_a_datamodule_given_a_config_loads_back_from_a_checkpoint(tmp_path: Any) -> None:
    class Data(fullshard.LightningDataModule):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.save_hyperparameters(config)

        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)), batch_size=2)

    class Net(fullshard.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(Net(), datamodule=Data({"batch": 2, "root": "data"}))
    trainer.save_checkpoint(tmp_path / "d.ckpt")
    loaded = Data.load_from_checkpoint(tmp_path / "d.ckpt")
    assert dict(loaded.hparams) == {"batch": 2, "root": "data"}

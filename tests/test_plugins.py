"""``Trainer(plugins=[...])``: Lightning's plugin objects fullshard has a setting for change that
setting; the others are refused with what to do (fullshard.plugins.resolve)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fullshard
from fullshard.errors import MisconfigurationError
from fullshard.plugins import (
    AsyncCheckpointIO,
    HalfPrecision,
    MixedPrecision,
    TorchCheckpointIO,
    TorchSyncBatchNorm,
)
from fullshard.strategies import FSDP2Strategy


def _trainer(tmp_path: Path, devices: int = 1, **kwargs: object) -> fullshard.Trainer:
    return fullshard.Trainer(
        accelerator="cpu", devices=devices, logger=False, default_root_dir=tmp_path, **kwargs
    )  # type: ignore[arg-type]


def test_precision_plugins_set_the_precision(tmp_path: Path) -> None:
    assert _trainer(tmp_path).precision == "32-true"
    assert _trainer(tmp_path, plugins=[MixedPrecision("bf16-mixed", "cpu")]).precision == "bf16-mixed"
    assert _trainer(tmp_path, plugins=HalfPrecision("bf16-true")).precision == "bf16-true"
    assert _trainer(tmp_path, plugins=[fullshard.precision.Precision("bf16-mixed")]).precision == "bf16-mixed"
    with pytest.raises(
        MisconfigurationError,
        match=r"Trainer\(precision='16-true', plugins=\[MixedPrecision\(...\)\]\): both set the precision",
    ):
        _trainer(tmp_path, precision="16-true", plugins=[MixedPrecision("bf16-mixed", "cpu")])
    with pytest.raises(
        MisconfigurationError, match=r"got two precision plugins, MixedPrecision and HalfPrecision: give one"
    ):
        _trainer(tmp_path, plugins=[MixedPrecision("bf16-mixed", "cpu"), HalfPrecision()])
    with pytest.raises(
        MisconfigurationError,
        match=r"MixedPrecision\(precision='16-true'\): it takes '16-mixed' or 'bf16-mixed'",
    ):
        MixedPrecision("16-true")
    with pytest.raises(
        MisconfigurationError,
        match=r"HalfPrecision\(precision='bf16-mixed'\): it takes '16-true' or 'bf16-true'",
    ):
        HalfPrecision("bf16-mixed")


def test_environment_sync_batchnorm_and_checkpoint_io_plugins(tmp_path: Path) -> None:
    from fullshard.plugins.environments import LightningEnvironment

    environment = LightningEnvironment()
    trainer = _trainer(tmp_path, plugins=[environment, TorchSyncBatchNorm(), TorchCheckpointIO()])
    assert trainer.strategy.cluster_environment is environment and trainer.strategy.sync_batchnorm
    assert not _trainer(tmp_path).strategy.sync_batchnorm
    sharded = FSDP2Strategy(state_dict_type="sharded")
    assert not sharded.async_save
    _trainer(tmp_path, devices=2, strategy=sharded, plugins=[AsyncCheckpointIO()])
    assert sharded.async_save
    with pytest.raises(
        MisconfigurationError,
        match=r"AsyncCheckpointIO\(\)\]\) with SingleDeviceStrategy: fullshard saves in the background under FSDP2Strategy",
    ):
        _trainer(tmp_path, plugins=[AsyncCheckpointIO()])
    with pytest.raises(
        MisconfigurationError,
        match=r"with FSDP2Strategy writing full checkpoints: .*state_dict_type='sharded'",
    ):
        _trainer(tmp_path, devices=2, strategy=FSDP2Strategy(), plugins=[AsyncCheckpointIO()])


def test_other_plugins_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"Trainer\(plugins=\['x'\]\): fullshard takes only the plugins it has a setting for: MixedPrecision",
    ):
        _trainer(tmp_path, plugins=["x"])
    with pytest.raises(
        MisconfigurationError,
        match=r"Trainer\(plugins=\[builtins.object\]\).*pass the setting itself \(Trainer\(precision=\)",
    ):
        _trainer(tmp_path, plugins=[object()])
    with pytest.raises(ImportError, match=r"DoublePrecision.*fullshard has no float64 precision"):
        from fullshard.plugins.precision import DoublePrecision  # noqa: F401
    with pytest.raises(ImportError, match=r"KubeflowEnvironment.*launch the job with torchrun"):
        from fullshard.plugins.environments import KubeflowEnvironment  # noqa: F401


def test_lightnings_plugin_paths_are_the_same_classes() -> None:
    from fullshard.plugins.environments import SLURMEnvironment
    from fullshard.plugins.io.async_plugin import AsyncCheckpointIO as Async
    from fullshard.plugins.precision.amp import MixedPrecision as Mixed

    assert Mixed is MixedPrecision and Async is AsyncCheckpointIO
    assert issubclass(SLURMEnvironment, fullshard.launch.SLURMEnvironment)
    with pytest.raises(
        MisconfigurationError, match=r"auto_requeue=False\): .*Trainer\(requeue_on_preemption=False\)"
    ):
        SLURMEnvironment(auto_requeue=False)

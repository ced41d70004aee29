"""Hyperparameters that build another module than the checkpoint's weights fit (issue 37).

A checkpoint's ``hyper_parameters`` decide what ``Module.load_from_checkpoint`` builds, and
anyone can edit them (``torch.save`` writes the CRC-32s anew, as a tamperer would). The module
is built on the meta device first and its shapes compared with the weights the checkpoint holds
([Note: the model built on the meta device first] in fullshard/checkpoint/module_loading.py): a
forged ``{"hidden": 200_000_000}`` is refused in bounded time and memory, naming the entry, both
shapes and the hyperparameters; what loaded before still loads, the same way.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import quiet_trainer
from fullshard.checkpoint.module_loading import HyperParametersMismatchError
from fullshard.checkpoint.validate import StateDictMismatchError

FORGED_HIDDEN = 200_000_000  # a (200M, 4) float32 weight: 3.2 GB


class Wide(fullshard.Module):
    def __init__(self, hidden: int = 8, extra: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, hidden)
        self.extra = nn.Linear(hidden, 1) if extra else None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _save(model: fullshard.Module, path: Path) -> Path:
    trainer = quiet_trainer(path.parent, max_steps=1)
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=4))
    trainer.save_checkpoint(path)
    return path


def _forge(path: Path, out: Path, **hyper_parameters: Any) -> Path:
    """``path`` with ``hyper_parameters`` changed, saved again by torch (CRC-32s recomputed)."""
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"].update(hyper_parameters)
    torch.save(checkpoint, out)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    fullshard.seed_everything(0)
    return _save(Wide(), tmp_path_factory.mktemp("hparams") / "wide.ckpt")


def test_huge_hyperparameters_are_refused_before_anything_is_built(saved: Path, tmp_path: Path) -> None:
    """In a fresh process: the refusal takes under a few seconds and the peak RSS grows by far
    less than the forged layer (before the fix: 13 s, peak RSS 4.8 GB)."""
    forged = _forge(saved, tmp_path / "forged.ckpt", hidden=FORGED_HIDDEN)
    child = textwrap.dedent(
        f"""
        import resource, sys, time
        import torch
        from torch import nn
        import fullshard
        from fullshard.checkpoint.module_loading import HyperParametersMismatchError

        class Wide(fullshard.Module):
            def __init__(self, hidden=8, extra=False):
                super().__init__()
                self.save_hyperparameters()
                self.layer = nn.Linear(4, hidden)

        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.monotonic()
        try:
            Wide.load_from_checkpoint({str(forged)!r})
        except HyperParametersMismatchError as err:
            message = str(err)
        else:
            sys.exit("loaded")
        took = time.monotonic() - start
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(f"took={{took:.3f}} grown_mb={{grown_mb:.1f}}")
        print(message)
        """
    )
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    figures, message = result.stdout.split("\n", 1)
    took, grown_mb = (float(part.split("=")[1]) for part in figures.split())
    assert took < 5, figures
    assert grown_mb < 512, figures  # the forged layer alone is 3200 MB
    assert "layer.weight (checkpoint (8, 4), model (200000000, 4))" in message
    assert "layer.bias (checkpoint (8,), model (200000000,))" in message
    assert "Wide(hidden=200000000, extra=False)" in message
    assert "meta device" in message and "nothing was allocated" in message


def test_the_error_names_the_hyperparameters_and_what_to_do(saved: Path, tmp_path: Path) -> None:
    forged = _forge(saved, tmp_path / "forged.ckpt", hidden=16)
    with pytest.raises(HyperParametersMismatchError) as raised:
        Wide.load_from_checkpoint(forged, extra=False)
    message = str(raised.value)
    assert f"load_from_checkpoint({str(forged)!r}): the module its hyperparameters build" in message
    assert (
        "Wide(hidden=16, extra=False) (from the checkpoint's hyper_parameters; given as arguments: extra)"
        in message
    )
    assert "shape mismatches: layer.weight (checkpoint (8, 4), model (16, 4))" in message
    assert "pass the hyperparameters it was trained with as keyword arguments" in message
    assert isinstance(raised.value, StateDictMismatchError)  # what callers caught before
    assert raised.value.mismatched == [
        "layer.weight (checkpoint (8, 4), model (16, 4))",
        "layer.bias (checkpoint (8,), model (16,))",
    ]
    copy = pickle.loads(pickle.dumps(raised.value))  # sent to other ranks as any checkpoint error
    assert type(copy) is HyperParametersMismatchError and str(copy) == message


def test_a_long_hyperparameter_is_shown_cut_short(saved: Path, tmp_path: Path) -> None:
    forged = _forge(saved, tmp_path / "forged.ckpt", hidden=16, note="x" * 100_000)
    with pytest.raises(HyperParametersMismatchError, match=r"Wide\(hidden=16, extra=False\)") as raised:
        Wide.load_from_checkpoint(forged)  # note is not an __init__ argument: left out
    assert len(str(raised.value)) < 1000

    class Noted(Wide):
        def __init__(self, hidden: int = 8, note: str = "") -> None:
            super().__init__(hidden)

    with pytest.raises(HyperParametersMismatchError, match=r"note='x+\.\.\.x+'") as raised:
        Noted.load_from_checkpoint(forged)
    assert len(str(raised.value)) < 1000


def test_arguments_that_fix_the_hyperparameters_load(saved: Path, tmp_path: Path) -> None:
    forged = _forge(saved, tmp_path / "forged.ckpt", hidden=FORGED_HIDDEN)
    model = Wide.load_from_checkpoint(forged, hidden=8)
    expected = torch.load(saved, weights_only=True)["state_dict"]
    assert model.layer.weight.shape == (8, 4) and torch.equal(model.layer.weight, expected["layer.weight"])
    assert model.hparams.hidden == 8


def test_missing_keys_are_refused_before_building_unless_strict_is_false(saved: Path, tmp_path: Path) -> None:
    forged = _forge(saved, tmp_path / "forged.ckpt", extra=True)
    with pytest.raises(HyperParametersMismatchError, match=r"missing keys: extra\.bias, extra\.weight"):
        Wide.load_from_checkpoint(forged)
    with pytest.warns(UserWarning, match="loaded .* partially"):
        model = Wide.load_from_checkpoint(forged, strict=False)  # as before: the layer left as initialised
    assert model.extra is not None and model.extra.weight.shape == (1, 8)
    forged = _forge(saved, tmp_path / "wider.ckpt", hidden=16)
    with pytest.raises(HyperParametersMismatchError, match="shape mismatches"):
        Wide.load_from_checkpoint(forged, strict=False)  # shapes are checked either way


class Counted(Wide):
    """Its ``__init__`` takes a config dict that it changes, and counts its builds."""

    builds = 0

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = config if config is not None else {"hidden": 8}
        super().__init__(config.pop("hidden"))
        type(self).builds += 1


def test_a_module_that_fits_is_built_once_more_on_meta_with_its_own_arguments(tmp_path: Path) -> None:
    model = Counted({"hidden": 8})
    model.save_hyperparameters({"config": {"hidden": 8}})
    ckpt = _save(model, tmp_path / "counted.ckpt")
    Counted.builds = 0
    loaded = Counted.load_from_checkpoint(ckpt)  # the meta build popped from a copy of config
    assert Counted.builds == 2 and loaded.layer.weight.device.type == "cpu"
    assert torch.equal(loaded.layer.weight, model.layer.weight)


class ReadsValues(Wide):
    """An ``__init__`` the meta device cannot run: it reads a tensor's value."""

    def __init__(self, hidden: int = 8, extra: bool = False) -> None:
        super().__init__(int(torch.tensor(hidden).item()), extra)


def test_a_module_the_meta_device_cannot_build_is_built_for_real_as_before(
    saved: Path, tmp_path: Path
) -> None:
    with torch.device("meta"), pytest.raises(RuntimeError):
        ReadsValues()  # what the meta build meets
    assert ReadsValues.load_from_checkpoint(saved).layer.weight.shape == (8, 4)
    forged = _forge(saved, tmp_path / "forged.ckpt", hidden=16)
    with pytest.raises(StateDictMismatchError) as raised:  # checked after the real build, as before
        ReadsValues.load_from_checkpoint(forged)
    assert type(raised.value) is StateDictMismatchError
    assert "layer.weight (checkpoint (8, 4), model (16, 4))" in str(raised.value)


class Renames(Wide):
    """Its ``on_load_checkpoint`` reads checkpoints of an older version, whose weight was
    ``old.weight`` stored flat."""

    calls = 0

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        type(self).calls += 1
        state = checkpoint["state_dict"]
        if "old.weight" in state:
            state["layer.weight"] = state.pop("old.weight").reshape(-1, 4)


def test_on_load_checkpoint_that_fixes_old_weights_still_loads(saved: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(saved, weights_only=True)
    checkpoint["state_dict"]["old.weight"] = checkpoint["state_dict"].pop("layer.weight").flatten()
    torch.save(checkpoint, tmp_path / "old.ckpt")
    Renames.calls = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and says nothing twice
        model = Renames.load_from_checkpoint(tmp_path / "old.ckpt")
    assert model.layer.weight.shape == (8, 4)
    assert Renames.calls == 2  # the meta module's (on a copy), then the module's with the checkpoint itself
    forged = _forge(tmp_path / "old.ckpt", tmp_path / "forged.ckpt", hidden=16)
    with pytest.raises(
        HyperParametersMismatchError, match=r"layer\.weight \(checkpoint \(8, 4\), model \(16, 4\)\)"
    ):
        Renames.load_from_checkpoint(forged)


class BuiltInConfigureModel(fullshard.Module):
    """Layers built in ``configure_model`` (the big-model pattern), one renamed by a wrapper there."""

    configured = 0

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.stem = nn.Linear(4, hidden)
        self.head: nn.Module | None = None

    def configure_model(self) -> None:
        type(self).configured += 1
        if self.head is None:
            self.head = nn.Sequential(nn.Linear(self.hparams.hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.head is not None
        return self.head(self.stem(batch[0])).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_configure_model_runs_once_and_its_layers_are_not_refused_unbuilt(tmp_path: Path) -> None:
    """The meta module is ``__init__``'s alone: hooks run once, as in Lightning's recordings, and
    the names configure_model adds are not missing keys; the shapes of ``__init__``'s layers are
    still checked before anything is built."""
    ckpt = _save(BuiltInConfigureModel(), tmp_path / "configured.ckpt")
    BuiltInConfigureModel.configured = 0
    model = BuiltInConfigureModel.load_from_checkpoint(ckpt)
    assert BuiltInConfigureModel.configured == 1
    assert model.head is not None and model.head[0].weight.shape == (1, 8)
    forged = _forge(ckpt, tmp_path / "forged.ckpt", hidden=FORGED_HIDDEN)
    with pytest.raises(
        HyperParametersMismatchError, match=r"stem\.weight \(checkpoint \(8, 4\), model \(200000000, 4\)\)"
    ):
        BuiltInConfigureModel.load_from_checkpoint(forged)
    assert BuiltInConfigureModel.configured == 1

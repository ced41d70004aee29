"""Lightning interoperability of checkpoints, both ways, and ``Module.load_from_checkpoint``.

Lightning is never a dependency of fullshard. Tests that need it run
tests/scripts/lckpt_lightning.py with a Python that has it (this one, or /tmp/lvenv) and are
skipped otherwise; the committed fixture tests/fixtures/lightning_2.6.6_mlp.ckpt (a real
Lightning 2.6.6 checkpoint, made by that script) keeps the resume tests running without it.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fullshard
from conftest import check_ok, quiet_trainer, run_script
from fullshard.checkpoint.lightning import (
    LIGHTNING_LAYOUT_VERSION,
    LIGHTNING_VERSION_KEY,
    convert_checkpoint,
    is_lightning_checkpoint,
    loop_state,
)
from fullshard.checkpoint.validate import StateDictMismatchError
from fullshard.errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from fullshard.strategies import SingleDeviceStrategy
from lckpt_models import (
    LIGHTNING_FIXTURE,
    MLP,
    batches,
    loader,
    make_optimizer,
    plain_continuation,
    run_lightning,
)

LIGHTNING_KEYS = (
    "epoch",
    "global_step",
    "state_dict",
    "optimizer_states",
    "lr_schedulers",
    "hyper_parameters",
)
PARAMS = ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]  # in the optimizer's order


def _fit(
    root: Path, *, fmt: str = "full", ckpt_path: Any = None, **kwargs: Any
) -> tuple[Any, MLP, list[str]]:
    """Train ``MLP`` in this process; returns the trainer, the model and the warnings raised."""
    fullshard.seed_everything(7)
    model = MLP()
    kwargs.setdefault("max_epochs", 2)
    trainer = quiet_trainer(root, strategy=SingleDeviceStrategy(state_dict_type=fmt), **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, loader(), ckpt_path=ckpt_path)
    return trainer, model, [str(w.message) for w in caught]


def _assert_matches(trainer: Any, model: MLP, expected: dict[str, Any], exact: bool = True) -> None:
    """The run's weights, optimizer and scheduler states equal ``expected`` (a plain run's)."""

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-7)

    for key, value in expected["state_dict"].items():
        assert same(model.state_dict()[key], value), key
    state = trainer.optimizers[0].state_dict()
    for number in expected["optimizer"]["state"]:
        for key, value in expected["optimizer"]["state"][number].items():
            assert same(state["state"][number][key], value), (number, key)
    for group, reference in zip(state["param_groups"], expected["optimizer"]["param_groups"], strict=True):
        assert {k: v for k, v in group.items() if k != "betas"} == {
            k: v for k, v in reference.items() if k != "betas"
        }
    assert trainer.lr_scheduler_configs[0].scheduler.state_dict() == expected["scheduler"]


def _lightning_fixture() -> dict[str, Any]:
    return torch.load(LIGHTNING_FIXTURE, weights_only=True)


# ---------------------------------------------------------------- fullshard -> Lightning
@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoints fullshard wrote of ``MLP``: at the end of epoch 0 (ModelCheckpoint), and full
    and sharded after ``fit`` returned at step 12."""
    root = tmp_path_factory.mktemp("written")
    paths = {}
    for fmt in ("full", "sharded"):
        callback = fullshard.ModelCheckpoint(dirpath=root / fmt, save_top_k=-1)
        trainer, _, _ = _fit(root, fmt=fmt, max_steps=12, callbacks=[callback], enable_checkpointing=True)
        trainer.save_checkpoint(root / f"{fmt}.ckpt")
        paths[fmt] = root / f"{fmt}.ckpt"
        paths[f"{fmt}_epoch_end"] = next((root / fmt).glob("*step=8*"))
    return paths


def test_full_checkpoint_has_what_lightning_reads(written: dict[str, Path]) -> None:
    # Lightning's load_from_checkpoint loads with torch.load's default, weights_only=True
    checkpoint = torch.load(written["full"], weights_only=True)
    for key in (*LIGHTNING_KEYS, "callbacks", "loops", "rng_states", "world_size", "fullshard_version"):
        assert key in checkpoint, key
    # older than every Lightning that reads it, newer than all its migrations (none is applied)
    assert checkpoint[LIGHTNING_VERSION_KEY] == LIGHTNING_LAYOUT_VERSION == "2.0.0"
    assert not is_lightning_checkpoint(checkpoint)
    # max_steps=12 cut epoch 1 (8 steps an epoch): "epoch" is current_epoch (2), as Lightning
    # writes it; the loops keep the position inside the cut epoch, where fullshard resumes
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (2, 12)
    assert (checkpoint["loops"]["epoch"], checkpoint["loops"]["batches_in_epoch"]) == (1, 4)
    assert type(checkpoint["hyper_parameters"]) is dict
    assert checkpoint["hyper_parameters"] == {"hidden": 8, "lr": 0.05}
    # what Lightning's _load_state does: cls(**hyper_parameters), then a strict load_state_dict
    plain = MLP(**checkpoint["hyper_parameters"])
    plain.load_state_dict(checkpoint["state_dict"], strict=True)
    assert {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items()} == {
        "calls": (),
        "net.0.weight": (8, 4),
        "net.0.bias": (8,),
        "net.2.weight": (1, 8),
        "net.2.bias": (1,),
    }
    assert int(checkpoint["state_dict"]["calls"]) == 12
    (optimizer,) = checkpoint["optimizer_states"]
    assert [g["params"] for g in optimizer["param_groups"]] == [PARAMS[:2], PARAMS[2:]]
    assert checkpoint["lr_schedulers"][0]["last_epoch"] == 12


def test_epoch_and_step_are_lightnings(written: dict[str, Path]) -> None:
    # saved by ModelCheckpoint at the end of epoch 0: Lightning writes the epoch in progress
    checkpoint = torch.load(written["full_epoch_end"], weights_only=True)
    assert written["full_epoch_end"].name == "epoch=0-step=8.ckpt"
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (0, 8)
    assert checkpoint["loops"]["epoch_finished"] is True


def test_sharded_meta_has_the_non_tensor_entries(written: dict[str, Path]) -> None:
    from fullshard.checkpoint.layout import META_NAME, CommitRecord

    record = CommitRecord.read(written["sharded"])
    meta = torch.load(written["sharded"] / record.data / META_NAME, weights_only=True)
    for key in (
        "epoch",
        "global_step",
        "lr_schedulers",
        "hyper_parameters",
        "callbacks",
        LIGHTNING_VERSION_KEY,
    ):
        assert key in meta, key
    assert (meta["epoch"], meta["global_step"]) == (2, 12)
    assert "state_dict" not in meta and "optimizer_states" not in meta  # in the DCP files


def test_rng_states_restore_from_the_portable_form(written: dict[str, Path], tmp_path: Path) -> None:
    # [Note: portable RNG states]: NumPy's state is a list in the file, an array again on restore
    np = pytest.importorskip("numpy")
    checkpoint = torch.load(written["full"], weights_only=True)
    assert isinstance(checkpoint["rng_states"][0]["numpy"][1], list)
    np.random.seed(0)
    _fit(tmp_path, ckpt_path=written["full"], max_steps=12)
    keys = np.random.get_state()[1]
    assert keys.tolist() == checkpoint["rng_states"][0]["numpy"][1]


def test_lightning_load_from_checkpoint_reads_a_fullshard_checkpoint(
    written: dict[str, Path], tmp_path: Path
) -> None:
    """Lightning's MLP.load_from_checkpoint of a full checkpoint, and of a consolidated sharded one."""
    from fullshard.checkpoint.tools import consolidate

    consolidated = consolidate(written["sharded"], tmp_path / "consolidated.ckpt")
    check_ok(
        run_lightning(
            "load",
            str(written["full"]),
            str(tmp_path / "full.pt"),
            str(consolidated),
            str(tmp_path / "sharded.pt"),
        )
    )
    saved = torch.load(written["full"], weights_only=True)
    for name in ("full", "sharded"):
        loaded = torch.load(tmp_path / f"{name}.pt", weights_only=True)
        assert loaded["hparams"] == {"hidden": 8, "lr": 0.05}
        assert loaded["state_dict"].keys() == saved["state_dict"].keys()
        for key, value in saved["state_dict"].items():
            assert torch.equal(loaded["state_dict"][key], value), (name, key)
        # Lightning leaves the module in training mode, on the device the weights were saved from
        assert (loaded["training"], loaded["device"]) == (True, "cpu")


# ---------------------------------------------------------------- Lightning -> fullshard
def test_detects_lightning_checkpoints(written: dict[str, Path]) -> None:
    assert is_lightning_checkpoint(_lightning_fixture())
    assert not is_lightning_checkpoint(torch.load(written["full"], weights_only=True))


# Lightning 2.6.6's fit-loop counters, as recorded in checkpoints of the 8-batch epochs of
# tests/scripts/lckpt_lightning.py (current/total of epoch_progress and batch_progress, steps)
def _fit_loop(epoch: tuple[int, int, int], batch: tuple[int, int], total: int, steps: int) -> dict[str, Any]:
    started, processed, completed = epoch
    return {
        "loops": {
            "fit_loop": {
                "epoch_progress": {
                    "current": {
                        "ready": started,
                        "started": started,
                        "processed": processed,
                        "completed": completed,
                    }
                },
                "epoch_loop.batch_progress": {
                    "current": {
                        "ready": batch[0],
                        "started": batch[0],
                        "processed": batch[0],
                        "completed": batch[1],
                    },
                    "total": {"ready": total, "started": total, "processed": total, "completed": total - 1},
                },
                "epoch_loop.automatic_optimization.optim_progress": {
                    "optimizer": {"step": {"total": {"ready": steps, "completed": steps}}}
                },
                "epoch_loop.manual_optimization.optim_step_progress": {"total": {"ready": 0, "completed": 0}},
            }
        }
    }


@pytest.mark.parametrize(
    ("saved_at", "loops", "expected"),
    [
        # ModelCheckpoint(every_n_train_steps=3) after the 3rd batch of epoch 0
        ("step=3", _fit_loop((1, 0, 0), (3, 2), 3, 3), (0, 3, 3, False)),
        # the same after the first batch of epoch 1
        ("step=9", _fit_loop((2, 1, 1), (1, 0), 9, 9), (1, 9, 1, False)),
        # ModelCheckpoint at the end of epoch 0: processed, not yet completed
        ("epoch=0-step=8", _fit_loop((1, 1, 0), (8, 8), 8, 8), (0, 8, 8, True)),
        # trainer.save_checkpoint after fit(max_epochs=2) returned
        ("final", _fit_loop((2, 2, 2), (8, 8), 16, 16), (2, 16, 0, False)),
        # trainer.save_checkpoint after fit(max_steps=5) stopped in epoch 0
        ("max_steps=5", _fit_loop((1, 1, 1), (5, 5), 5, 5), (1, 5, 0, False)),
    ],
)
def test_loop_position_from_lightning_counters(
    saved_at: str, loops: dict[str, Any], expected: tuple[int, int, int, bool]
) -> None:
    state = loop_state(loops)
    assert (
        state["epoch"],
        state["global_step"],
        state["batches_in_epoch"],
        state["epoch_finished"],
    ) == expected


def test_loop_position_without_loops_comes_from_epoch_and_step() -> None:
    state = loop_state({"epoch": 3, "global_step": 40})
    assert state == {
        "epoch": 3,
        "global_step": 40,
        "batches_in_epoch": 0,
        "epoch_finished": False,
        "total_batch_idx": 0,
    }


def test_fixture_resumes_like_an_uninterrupted_run(tmp_path: Path) -> None:
    """The committed Lightning checkpoint (step 9: epoch 1, one batch in) resumes under fullshard
    exactly as a plain PyTorch loop continues from its state."""
    checkpoint = _lightning_fixture()
    ckpt = shutil.copy(LIGHTNING_FIXTURE, tmp_path / "lightning.ckpt")
    trainer, model, caught = _fit(tmp_path, ckpt_path=ckpt)
    assert (trainer.global_step, trainer.current_epoch) == (16, 2)
    _assert_matches(trainer, model, plain_continuation(checkpoint, batches()[1:]))
    # one warning, naming every Lightning callback state that has no fullshard counterpart
    (warning,) = [w for w in caught if "callback states" in w]
    assert "Lightning 2.6.6 checkpoint holds callback states that no callback of this run takes" in warning
    for key in checkpoint["callbacks"]:
        assert key in warning


def test_callback_states_go_to_the_matching_callbacks(tmp_path: Path) -> None:
    """fullshard's ModelCheckpoint has Lightning's state key: the same configuration takes its state."""
    taken = "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 3, 'every_n_epochs': 0, 'train_time_interval': None}"
    left = "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}"
    assert set(_lightning_fixture()["callbacks"]) == {taken, left}
    callback = fullshard.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3)
    assert callback.state_key == taken
    _, _, caught = _fit(
        tmp_path, ckpt_path=LIGHTNING_FIXTURE, callbacks=[callback], enable_checkpointing=True
    )
    (warning,) = [w for w in caught if "callback states" in w]
    assert left in warning and taken not in warning


def test_conversion_maps_numbers_to_names() -> None:
    checkpoint = _lightning_fixture()
    model = MLP()
    optimizer, _ = make_optimizer(model)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    converted = convert_checkpoint(checkpoint, "x.ckpt", module=model, optimizers=[optimizer], shapes=shapes)
    (state,) = converted["optimizer_states"]
    assert [g["params"] for g in state["param_groups"]] == [PARAMS[:2], PARAMS[2:]]
    saved = checkpoint["optimizer_states"][0]["state"]
    for number, name in enumerate(PARAMS):
        assert torch.equal(state["state"][name]["exp_avg"], saved[number]["exp_avg"])
    assert converted["loops"]["global_step"] == 9 and converted["hyper_parameters"] == {
        "hidden": 8,
        "lr": 0.05,
    }
    # the same state keyed by names already (Lightning's consolidated sharded FSDP checkpoints)
    named = {**checkpoint, "optimizer_states": [state]}
    again = convert_checkpoint(named, "x.ckpt", module=model, optimizers=[optimizer], shapes=shapes)
    assert again["optimizer_states"][0]["param_groups"] == state["param_groups"]


class _OneGroup(MLP):
    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.05)


class _Reversed(MLP):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(
            [
                {"params": list(self.net[0].parameters())[::-1]},
                {"params": self.net[2].parameters(), "lr": 0.025},
            ],
            lr=0.05,
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (
            _OneGroup,
            r"optimizer 0 has parameter groups of sizes \[2, 2\], but configure_optimizers\(\) now returns groups of sizes \[4\]",
        ),
        (
            _Reversed,
            r"does not fit this run's parameters in the order configure_optimizers\(\) lists them: net\.0\.bias\.exp_avg \(checkpoint \(8, 4\), model \(8,\)\)",
        ),
    ],
)
def test_optimizer_setup_that_does_not_fit_is_refused(tmp_path: Path, cls: type[MLP], match: str) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    model = cls()
    with pytest.raises(CheckpointError, match=match):
        trainer.fit(model, loader(), ckpt_path=LIGHTNING_FIXTURE)
    assert torch.equal(model.calls, torch.zeros((), dtype=torch.long))  # nothing was loaded


def test_weights_only_lightning_checkpoint(tmp_path: Path) -> None:
    checkpoint = _lightning_fixture()
    for key in ("optimizer_states", "lr_schedulers", "callbacks"):
        del checkpoint[key]  # what ModelCheckpoint(save_weights_only=True) leaves out
    path = tmp_path / "weights.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(
        CheckpointError, match=r"holds only the model weights \(it was saved with save_weights_only=True\)"
    ):
        quiet_trainer(tmp_path, max_epochs=2).fit(MLP(), loader(), ckpt_path=path)
    model = MLP()
    quiet_trainer(tmp_path).validate(model, loader(), ckpt_path=path)
    assert torch.equal(model.net[0].weight, checkpoint["state_dict"]["net.0.weight"])


def test_lightning_sharded_directory_gets_a_hint(tmp_path: Path) -> None:
    directory = tmp_path / "lightning-sharded.ckpt"
    directory.mkdir()
    (directory / ".metadata").write_bytes(b"")
    (directory / "meta.pt").write_bytes(b"")
    with pytest.raises(
        CheckpointError,
        match=r"looks like a sharded checkpoint written by Lightning's FSDPStrategy .*utilities\.consolidate_checkpoint",
    ):
        quiet_trainer(tmp_path, max_epochs=1).fit(MLP(), loader(), ckpt_path=directory)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Lightning's checkpoints of the same run, made now (see tests/scripts/lckpt_lightning.py)."""
    out = tmp_path_factory.mktemp("lightning")
    check_ok(run_lightning("make", str(out)))
    return out


@pytest.mark.parametrize("name", ["step=3", "step=6", "epoch=0-step=8", "step=9", "step=12", "step=15"])
def test_lightning_checkpoints_resume_like_an_uninterrupted_run(
    made: Path, tmp_path: Path, name: str
) -> None:
    path = made / f"{name}.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    trainer, model, _ = _fit(tmp_path, ckpt_path=path)
    assert (trainer.global_step, trainer.current_epoch) == (16, 2)
    done = checkpoint["global_step"]
    _assert_matches(trainer, model, plain_continuation(checkpoint, (batches() * 2)[done:]))
    # and as Lightning's own 16 steps without interruption (unshuffled data, one step per batch)
    straight = torch.load(made / "straight.pt", weights_only=True)
    _assert_matches(trainer, model, straight)


def test_lightning_resumes_its_epoch_end_checkpoint_like_fullshard(made: Path, tmp_path: Path) -> None:
    trainer, model, _ = _fit(tmp_path, ckpt_path=made / "epoch=0-step=8.ckpt")
    _assert_matches(trainer, model, torch.load(made / "continued.pt", weights_only=True))


def test_lightning_final_checkpoint_has_nothing_left_to_do(made: Path, tmp_path: Path) -> None:
    trainer, model, _ = _fit(tmp_path, ckpt_path=made / "final.ckpt")
    assert (trainer.global_step, trainer.current_epoch) == (16, 2)
    _assert_matches(trainer, model, torch.load(made / "straight.pt", weights_only=True))


@pytest.fixture(scope="module")
def resumed_on_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Lightning fixture resumed on 2 processes by DDP, then FSDP, in one job (in turn):
    ``<strategy>/final.pt``."""
    out = tmp_path_factory.mktemp("resumed_on_two")
    args = ("--ckpt", str(LIGHTNING_FIXTURE), "--strategy", "ddp,fsdp", "--out", str(out))
    check_ok(run_script("lckpt_resume.py", *args, timeout=240))
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_fixture_resumes_on_two_processes(resumed_on_two: Path, strategy: str) -> None:
    """DDP and FSDP (each Linear its own unit: wrapped parameter names) load the Lightning
    checkpoint through the full-state path and continue as a plain loop over the global batches."""
    result = torch.load(resumed_on_two / strategy / "final.pt", weights_only=True)
    # 2 processes: 4 steps per epoch of 8-sample global batches; the checkpoint is 1 batch into epoch 1
    assert (result["global_step"], result["epoch"]) == (12, 2)
    expected = plain_continuation(_lightning_fixture(), batches(world_size=2)[1:])
    for key, value in expected["state_dict"].items():
        assert torch.allclose(result["state_dict"][key], value, rtol=1e-5, atol=1e-7), key
    for number, name in enumerate(PARAMS):
        for key, value in expected["optimizer"]["state"][number].items():
            assert torch.allclose(result["optimizer"]["state"][name][key], value, rtol=1e-5, atol=1e-7), (
                name,
                key,
            )
    assert result["scheduler"] == expected["scheduler"]
    assert sum("Lightning 2.6.6 checkpoint holds callback states" in w for w in result["warnings"]) == 1


# ---------------------------------------------------------------- Module.load_from_checkpoint
@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_load_from_checkpoint(written: dict[str, Path], fmt: str) -> None:
    model = MLP.load_from_checkpoint(written[fmt])
    expected = torch.load(written["full"], weights_only=True)["state_dict"]
    for key, value in expected.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert model.hparams == {"hidden": 8, "lr": 0.05}
    # as Lightning: training mode, on the device the weights were read onto, hooks called
    assert model.training and model.net[0].weight.device == torch.device("cpu")
    assert model.loaded is not None and model.loaded["global_step"] == 12
    assert torch.equal(model.loaded["state_dict"]["net.0.weight"], expected["net.0.weight"])


def test_load_from_checkpoint_reads_lightning_checkpoints() -> None:
    model = MLP.load_from_checkpoint(LIGHTNING_FIXTURE, map_location="cpu")
    checkpoint = _lightning_fixture()
    for key, value in checkpoint["state_dict"].items():
        assert torch.equal(model.state_dict()[key], value), key
    assert model.loaded is not None and model.loaded[LIGHTNING_VERSION_KEY] == "2.6.6"


class _Configured(MLP):
    """Builds its head in configure_model() and reads the checkpoint in on_load_checkpoint()."""

    def __init__(self, hidden: int = 8, lr: float = 0.05, extra: int = 0) -> None:
        super().__init__(hidden, lr)
        self.save_hyperparameters()
        self.configured = False

    def configure_model(self) -> None:
        self.configured = True


def test_load_from_checkpoint_arguments(written: dict[str, Path]) -> None:
    model = _Configured.load_from_checkpoint(written["full"], extra=3, lr=0.5)
    assert model.configured
    assert model.hparams == {"hidden": 8, "lr": 0.5, "extra": 3}  # kwargs override the saved ones
    assert model.loaded is not None and model.loaded["hyper_parameters"] == {
        "hidden": 8,
        "lr": 0.5,
        "extra": 3,
    }


def test_load_from_checkpoint_strict_false_warns(written: dict[str, Path]) -> None:
    class Wider(MLP):
        def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
            super().__init__(hidden, lr)
            self.extra = nn.Linear(2, 2)

    with pytest.warns(
        UserWarning,
        match=r"loaded .* partially: not in the checkpoint \(left as initialised\): \['extra\.weight', 'extra\.bias'\]",
    ):
        model = Wider.load_from_checkpoint(written["full"], strict=False)
    with pytest.raises(StateDictMismatchError, match=r"missing keys: extra\.bias, extra\.weight"):
        Wider.load_from_checkpoint(written["full"])
    assert model.net[0].weight.shape == (8, 4)


def test_load_from_checkpoint_map_location(written: dict[str, Path]) -> None:
    model = MLP.load_from_checkpoint(written["sharded"], map_location=torch.device("cpu"))
    assert model.net[0].weight.device == torch.device("cpu")
    with pytest.raises(
        TypeError,
        match=r"a sharded checkpoint is read onto the CPU and then moved, so map_location must be a device",
    ):
        MLP.load_from_checkpoint(written["sharded"], map_location={"cuda:0": "cpu"})
    full = MLP.load_from_checkpoint(written["full"], map_location=lambda storage, location: storage)
    assert full.net[0].weight.device == torch.device("cpu")


def test_load_from_checkpoint_errors(written: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(
        CheckpointNotFoundError,
        match=r"MLP\.load_from_checkpoint\(\): nothing at '.*nowhere\.ckpt'\. Pass the path of a checkpoint",
    ):
        MLP.load_from_checkpoint(tmp_path / "nowhere.ckpt")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")
    with pytest.raises(
        CheckpointNotFoundError, match=r"logs' is a directory that holds no checkpoint \(found metrics\.csv\)"
    ):
        MLP.load_from_checkpoint(tmp_path / "logs")
    with pytest.raises(
        StateDictMismatchError,
        match=r"shape mismatches: net\.0\.weight \(checkpoint \(8, 4\), model \(16, 4\)\)",
    ):
        MLP.load_from_checkpoint(written["full"], hidden=16)
    with pytest.raises(
        StateDictMismatchError, match=r"missing keys: .*head\.weight.*unexpected keys: calls, net\.0\.bias"
    ):
        _OtherModel.load_from_checkpoint(written["full"])
    with pytest.raises(
        TypeError,
        match=r"MLP\.load_from_checkpoint\(\) got hiden, which MLP\.__init__ does not take \(it takes hidden, lr\)",
    ):
        MLP.load_from_checkpoint(written["full"], hiden=16)
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(CorruptCheckpointError, match=r"notes\.ckpt' is damaged or not a checkpoint"):
        MLP.load_from_checkpoint(text)


class _OtherModel(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 3)


class _Data(fullshard.DataModule):
    """A DataModule with state: Lightning keeps it under the class name; so does fullshard."""

    def __init__(self) -> None:
        super().__init__()
        self.served = 0
        self.restored: dict[str, Any] | None = None

    def train_dataloader(self) -> Any:
        self.served += 1
        return loader()

    def state_dict(self) -> dict[str, Any]:
        return {"served": self.served}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = state_dict


@pytest.mark.filterwarnings("ignore:The Lightning 2.6.6 checkpoint holds callback states")
def test_datamodule_state_is_saved_and_restored(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(MLP(), datamodule=_Data())
    trainer.save_checkpoint(tmp_path / "fullshard.ckpt")
    assert torch.load(tmp_path / "fullshard.ckpt", weights_only=True)["_Data"] == {"served": 1}
    lightning = _lightning_fixture()
    lightning["_Data"] = {"served": 7}
    torch.save(lightning, tmp_path / "lightning.ckpt")
    for name, expected in (("fullshard", 1), ("lightning", 7)):
        data = _Data()
        quiet_trainer(tmp_path, max_epochs=2).fit(MLP(), datamodule=data, ckpt_path=tmp_path / f"{name}.ckpt")
        assert data.restored == {"served": expected}, name

"""Integrity on every load, failed saves, and the errors that say how to fix a refused load.

One process (single device) unless marked ``multiprocess`` (FSDP on 2 CPU processes).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.utils.serialization
from torch.utils.data import DataLoader

import fullshard
import fullshard.trainer.nonfinite
from ckpt_helpers import Net, assert_same_state, full_state, make_data, run_single
from conftest import check_ok, quiet_trainer, run_script
from fullshard.checkpoint.archive import archive_entries
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.layout import RECORD_NAME, CommitRecord, assign_shares
from fullshard.checkpoint.tools import consolidate, export_safetensors, inspect
from fullshard.cli import main as cli_main
from fullshard.errors import (
    CheckpointError,
    CheckpointSaveError,
    CorruptCheckpointError,
    MisconfigurationError,
)
from fullshard.strategies import SingleDeviceStrategy

ENOSPC = r"OSError: \[Errno 28\] No space left on device"
# DCP's note when it saves without a process group (the one-process sharded saves)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    set_event_hook(None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full and a sharded checkpoint at step 4 (AdamW + StepLR), and a weights-only one of each."""
    root = tmp_path_factory.mktemp("saved")
    paths = {}
    for fmt in ("full", "sharded"):
        trainer, _ = run_single(root, fmt=fmt, save=root / f"{fmt}.ckpt")
        trainer.save_checkpoint(root / f"{fmt}-weights.ckpt", weights_only=True)
        paths[fmt] = root / f"{fmt}.ckpt"
        paths[f"{fmt}-weights"] = root / f"{fmt}-weights.ckpt"
    return paths


def _copy(src: Path, dst: Path) -> Path:
    (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return dst


def _weights(path: Path) -> dict[str, torch.Tensor]:
    """The model weights a checkpoint holds (a sharded one through ``consolidate``)."""
    if path.is_dir():
        path = consolidate(path, path.parent / f"{path.name}-consolidated.ckpt", verify=False)
    return torch.load(path, weights_only=False)["state_dict"]  # type: ignore[no-any-return]


def _flip(path: Path, tensor: torch.Tensor) -> Path:
    """Flip one bit inside ``tensor``'s bytes in ``path`` (a file, or the shard file of a sharded
    checkpoint): the value changes a little, and nothing but its checksum says so."""
    file = path / CommitRecord.read(path).data / "__0_0.distcp" if path.is_dir() else path
    data = bytearray(file.read_bytes())
    needle = tensor.contiguous().view(-1).numpy().tobytes()[:32]
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0
    data[at + 1] ^= 0x01
    file.write_bytes(bytes(data))
    return path


def _damaged(saved: dict[str, Path], fmt: str, tmp_path: Path) -> Path:
    broken = _copy(saved[fmt], tmp_path / f"broken-{fmt}.ckpt")
    return _flip(broken, _weights(saved[fmt])["blocks.1.fc.weight"])


class ValNet(Net):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.head(self.blocks(x)).squeeze(-1), y))


class SGDNet(Net):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _trained(tmp_path: Path, fmt: str = "full", model: Net | None = None) -> fullshard.Trainer:
    """A trainer 2 steps in, whose model and optimizer states differ from the saved ones."""
    trainer, _ = run_single(tmp_path, fmt=fmt, max_steps=2, model=model)
    return trainer


# ----------------------------------------------------------------------- pure logic
def test_assign_shares_gives_each_rank_its_own_files_then_balances_bytes() -> None:
    sizes = {"__0_0.distcp": 100, "__1_0.distcp": 90, "__2_0.distcp": 10, "__3_0.distcp": 5}
    assert assign_shares(sizes, 4) == [[name] for name in sizes]  # the world size that wrote them
    assert assign_shares(sizes, 1) == [list(sizes)]
    # fewer ranks: the files of the missing ones go to the rank with the fewest bytes so far
    assert assign_shares(sizes, 2) == [["__0_0.distcp", "__3_0.distcp"], ["__1_0.distcp", "__2_0.distcp"]]
    assert assign_shares(sizes, 3) == [["__0_0.distcp"], ["__1_0.distcp"], ["__2_0.distcp", "__3_0.distcp"]]
    other = {"a": 1, "b": 7, "c": 3, "d": 3}  # no rank's name: by size alone
    assert assign_shares(other, 2) == [["b"], ["c", "d", "a"]]
    assert assign_shares({"a": 1}, 3) == [["a"], [], []]  # more ranks than files: some idle


# ----------------------------------------------------------- verification on every load
@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_flipped_byte_is_refused_and_changes_nothing(
    saved: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    broken = _damaged(saved, fmt, tmp_path)
    trainer = _trained(tmp_path)
    before = full_state(trainer)
    named = (
        r"entry '[^']*/data/\d+' fails its CRC-32 check"
        if fmt == "full"
        else r"__0_0\.distcp fails its CRC-32"
    )
    with pytest.raises(
        CorruptCheckpointError, match=rf"broken-{fmt}\.ckpt'? is damaged: {named}.*ckpt_verify=False"
    ):
        trainer.strategy.load_checkpoint(broken, trainer.optimizers)
    assert_same_state(full_state(trainer), before)  # model and optimizer untouched
    with pytest.raises(CorruptCheckpointError, match=named):  # through the Trainer, before anything loads
        run_single(tmp_path, fmt=fmt, max_steps=6, resume=broken)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_verify_false_loads_the_damaged_bytes(saved: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    broken = _damaged(saved, fmt, tmp_path)
    expected = _weights(saved[fmt])
    trainer = _trained(tmp_path)
    trainer.strategy.load_checkpoint(broken, trainer.optimizers, verify=False)
    loaded, _ = trainer.strategy.get_state((), full=True)
    differ = {k: int((v != expected[k]).sum()) for k, v in loaded.items() if not torch.equal(v, expected[k])}
    assert differ == {"blocks.1.fc.weight": 1}  # silently: one weight is not what was saved
    model = ValNet()
    trainer = quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type=fmt))
    trainer.validate(model, DataLoader(make_data(), batch_size=16), ckpt_path=broken, ckpt_verify=False)
    assert not torch.equal(model.state_dict()["blocks.1.fc.weight"], expected["blocks.1.fc.weight"])


def test_full_files_without_checksums_load_unverified(saved: dict[str, Path], tmp_path: Path) -> None:
    checkpoint = torch.load(saved["full"], weights_only=False)
    del checkpoint["optimizer_types"]  # as written before optimizer classes were recorded
    legacy = tmp_path / "legacy.ckpt"
    torch.save(checkpoint, legacy, _use_new_zipfile_serialization=False)  # no zip archive at all
    config = torch.utils.serialization.config.save
    config.compute_crc32 = False
    try:
        torch.save(checkpoint, tmp_path / "no-crc.ckpt")
    finally:
        config.compute_crc32 = True
    assert archive_entries(legacy) is None and archive_entries(tmp_path / "no-crc.ckpt") is None
    torch.save(checkpoint, tmp_path / "older.ckpt")  # an older fullshard's file: its CRC-32s are checked
    assert archive_entries(tmp_path / "older.ckpt")
    expected = full_state(run_single(tmp_path, max_steps=4, resume=saved["full"])[0])
    for name in ("legacy.ckpt", "no-crc.ckpt", "older.ckpt"):
        trainer, _ = run_single(tmp_path, max_steps=4, resume=tmp_path / name)
        assert_same_state(full_state(trainer), expected)


# ------------------------------------------------------------------------- failed saves
def _listing(directory: Path, checkpoint: Path) -> list[str]:
    """The names in ``directory``, and in ``checkpoint`` when it is a directory."""
    inside = sorted(p.name for p in checkpoint.iterdir()) if checkpoint.is_dir() else []
    return sorted(p.name for p in directory.iterdir()) + inside


FAILED_SAVES = [
    ("full", "full.mid_data", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), ENOSPC),
    (
        "full",
        "full.before_commit",
        PermissionError(errno.EACCES, "Permission denied"),
        r"PermissionError: \[Errno 13\]",
    ),
    ("sharded", "sharded.data_written", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), ENOSPC),
    ("sharded", "sharded.metadata_written", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), ENOSPC),
    ("sharded", "sharded.before_commit", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), ENOSPC),
]


@pytest.mark.parametrize(("fmt", "point", "error", "cause"), FAILED_SAVES, ids=[f[1] for f in FAILED_SAVES])
def test_failed_save_raises_one_error_and_the_next_save_works(
    saved: dict[str, Path], tmp_path: Path, fmt: str, point: str, error: OSError, cause: str
) -> None:
    path = _copy(saved[fmt], tmp_path / "ckpt")
    trainer = _trained(tmp_path, fmt)
    entries = _listing(tmp_path, path)

    def fail(reached: str) -> None:
        if reached == point:
            raise error

    set_event_hook(fail)
    with pytest.raises(
        CheckpointSaveError,
        match=rf"Could not write the checkpoint '{path}': rank 0: {cause}.*Nothing was committed: the checkpoint "
        r"previously at that path, if any, is intact and loads, and the partial files were removed\. Free disk space",
    ) as raised:
        trainer.save_checkpoint(path)
    assert isinstance(raised.value, OSError) and raised.value.errno == error.errno
    set_event_hook(None)
    # what it wrote is gone; the previous checkpoint is as it was, and loads
    assert _listing(tmp_path, path) == entries
    report = inspect(path, verify_checksums=True)
    assert (report.verified, report.global_step) == (True, 4)
    # space is back: the next save to the same place works
    trainer.save_checkpoint(path)
    assert inspect(path, verify_checksums=True).global_step == 2
    resumed, _ = run_single(tmp_path, fmt=fmt, max_steps=2, resume=path)
    assert_same_state(full_state(resumed), full_state(trainer))


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_failure_after_the_commit_says_the_checkpoint_is_there(
    saved: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    path = _copy(saved[fmt], tmp_path / "ckpt")
    trainer = _trained(tmp_path, fmt)

    def fail(reached: str) -> None:
        if reached == f"{fmt}.after_commit":
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    set_event_hook(fail)
    with pytest.raises(
        CheckpointError,
        match=rf"'{path}' was written and committed \(it loads\), but .* rank 0: OSError: \[Errno 5\]",
    ) as raised:
        trainer.save_checkpoint(path)
    assert not isinstance(raised.value, CheckpointSaveError)
    assert inspect(path, verify_checksums=True).global_step == 2  # the new checkpoint


def test_state_that_cannot_be_pickled_fails_the_save_cleanly(tmp_path: Path) -> None:
    trainer, model = run_single(tmp_path, max_steps=1)
    model.hparams["fn"] = lambda: None  # type: ignore[index]
    path = tmp_path / "x.ckpt"
    with pytest.raises(
        CheckpointSaveError, match=r"rank 0: (AttributeError|PicklingError).*keep hyperparameters"
    ):
        trainer.save_checkpoint(path)
    assert not path.exists() and not list(tmp_path.glob(".tmp-*"))


# ------------------------------------------------------------ refused loads, with the fix
@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_optimizer_of_another_class_is_refused(saved: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    trainer = _trained(tmp_path, model=SGDNet())
    before = full_state(trainer)
    message = (
        r"The checkpoint's optimizer 0 is AdamW, the model's \(configure_optimizers\(\)\) is SGD: the state of "
        rf"AdamW does not fit SGD\. Resume with AdamW, .* fit\(\.\.\., ckpt_path='{saved[fmt]}', ckpt_weights_only=True\)"
    )
    with pytest.raises(CheckpointError, match=message):
        trainer.strategy.load_checkpoint(saved[fmt], trainer.optimizers)
    assert_same_state(full_state(trainer), before)
    with pytest.raises(CheckpointError, match=message):
        run_single(tmp_path, fmt=fmt, max_steps=6, resume=saved[fmt], model=SGDNet())
    # the fix the message gives: the weights, with a fresh SGD
    trainer = quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type=fmt), max_steps=0)
    model = SGDNet()
    trainer.fit(model, DataLoader(make_data(), batch_size=8), ckpt_path=saved[fmt], ckpt_weights_only=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in _weights(saved[fmt]).items())


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_weights_only_checkpoint_in_fit_needs_the_option(
    saved: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    weights_only = saved[f"{fmt}-weights"]
    with pytest.raises(
        CheckpointError,
        match=rf"holds only model weights: no optimizer or scheduler state \(it was saved with save_checkpoint"
        rf".*To fine-tune .* pass fit\(\.\.\., ckpt_path='{weights_only}', ckpt_weights_only=True\)",
    ):
        run_single(tmp_path, fmt=fmt, max_steps=6, resume=weights_only)
    expected = _weights(saved[fmt])
    model = Net()
    trainer = quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type=fmt), max_steps=0)
    trainer.fit(model, DataLoader(make_data(), batch_size=8), ckpt_path=weights_only, ckpt_weights_only=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    assert trainer.ckpt_path == str(weights_only) and trainer.global_step == 0
    trainer = quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type=fmt), max_steps=3)
    trainer.fit(Net(), DataLoader(make_data(), batch_size=8), ckpt_path=weights_only, ckpt_weights_only=True)
    assert trainer.global_step == 3  # fresh counters: 3 steps of fine-tuning
    trainer = quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type=fmt))
    model = ValNet()
    trainer.validate(model, DataLoader(make_data(), batch_size=16), ckpt_path=weights_only)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


def test_checkpoint_options_are_checked(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=1)
    loader = DataLoader(make_data(), batch_size=8)
    with pytest.raises(
        MisconfigurationError, match=r"ckpt_weights_only=True\) loads the weights .* Pass ckpt_path"
    ):
        trainer.fit(Net(), loader, ckpt_weights_only=True)
    with pytest.raises(MisconfigurationError, match=r"ckpt_verify='no' is invalid: pass True or False"):
        trainer.validate(Net(), loader, ckpt_path="x.ckpt", ckpt_verify="no")  # type: ignore[arg-type]


def test_other_number_of_param_groups_is_refused_before_loading(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    class TwoGroups(Net):
        def configure_optimizers(self) -> Any:
            groups: list[dict[str, Any]] = [
                {"params": self.blocks.parameters()},
                {"params": self.head.parameters(), "lr": 0.1},
            ]
            opt = torch.optim.AdamW(groups, lr=0.01)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    for fmt in ("full", "sharded"):
        trainer = _trained(tmp_path, model=TwoGroups())
        before = full_state(trainer)
        with pytest.raises(
            CheckpointError,
            match=r"optimizer 0 \(AdamW\) with 1 parameter group\(s\), but configure_optimizers\(\)",
        ):
            trainer.strategy.load_checkpoint(saved[fmt], trainer.optimizers)
        assert_same_state(full_state(trainer), before)


MALFORMED_RECORDS: list[tuple[str, Any, str]] = [
    ("not JSON", "{not json", r"it is not valid JSON"),
    ("a list", [], r"it holds a JSON list, not an object"),
    ("no files", {"files": None}, r"it lacks the field\(s\) 'files'"),
    ("files a string", {"files": "abc"}, r"field 'files' is \"abc\", not an object"),
    ("world size a string", {"world_size": "2"}, r"field 'world_size' is \"2\", not an integer"),
    ("step a bool", {"global_step": True}, r"field 'global_step' is true, not an integer"),
    (
        "data outside",
        {"data": "../elsewhere"},
        r"field 'data' is '\.\./elsewhere', not the name of a data-\*",
    ),
    (
        "file outside",
        {"files": {"../x": {"size": 1, "crc32": 1}}},
        r"'files' names '\.\./x', which is not a file",
    ),
    (
        "size a string",
        {"files": {"meta.pt": {"size": "1", "crc32": 1}}},
        r"'files' entry 'meta\.pt' is .*size",
    ),
]


@pytest.mark.parametrize(
    ("what", "change", "match"), MALFORMED_RECORDS, ids=[m[0] for m in MALFORMED_RECORDS]
)
def test_malformed_commit_records_are_refused(
    saved: dict[str, Path], tmp_path: Path, what: str, change: Any, match: str
) -> None:
    path = _copy(saved["sharded"], tmp_path / "ckpt")
    record = json.loads((path / RECORD_NAME).read_text())
    if isinstance(change, dict):
        record.update(change)
        record = {k: v for k, v in record.items() if v is not None}
    text = change if isinstance(change, str) else json.dumps(record if isinstance(change, dict) else change)
    (path / RECORD_NAME).write_text(text)
    with pytest.raises(
        CorruptCheckpointError, match=rf"The commit record '.*{RECORD_NAME}' is damaged: {match}"
    ):
        CommitRecord.read(path)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CorruptCheckpointError, match=match):
        run_single(tmp_path, fmt="sharded", max_steps=6, resume=path, model=model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_commit_record_of_a_newer_format_says_so(saved: dict[str, Path], tmp_path: Path) -> None:
    path = _copy(saved["sharded"], tmp_path / "ckpt")
    record = json.loads((path / RECORD_NAME).read_text())
    (path / RECORD_NAME).write_text(json.dumps({**record, "format_version": 99, "new_field": 1}))
    with pytest.raises(
        CheckpointError, match=r"has format version 99; this fullshard reads format 3 and older"
    ):
        CommitRecord.read(path)
    (path / RECORD_NAME).write_text(json.dumps({**record, "new_field": 1}))  # same format, a field added
    assert CommitRecord.read(path).global_step == 4


# ----------------------------------------------------------------- the offline tools
def test_consolidate_and_export_refuse_damaged_input(
    saved: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = _damaged(saved, "sharded", tmp_path)
    out = tmp_path / "out.ckpt"
    with pytest.raises(CorruptCheckpointError, match=r"__0_0\.distcp fails its CRC-32 check.*--no-verify"):
        consolidate(broken, out)
    assert not out.exists()
    # the command line: in this process where it refuses (no interpreter start-up), as a process
    # of its own where it succeeds (`python -m fullshard.cli` and its exit status)
    assert cli_main(["checkpoint", "consolidate", str(broken), str(out)]) == 1
    assert "__0_0.distcp fails its CRC-32 check" in capsys.readouterr().err and not out.exists()
    cli = [sys.executable, "-m", "fullshard.cli", "checkpoint"]
    done = subprocess.run(
        [*cli, "consolidate", "--no-verify", str(broken), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    check_ok(done)
    assert out.is_file()
    pytest.importorskip("safetensors")
    full = _damaged(saved, "full", tmp_path)
    for damaged, named in ((broken, r"__0_0\.distcp"), (full, r"entry '[^']*/data/\d+'")):
        target = tmp_path / f"{damaged.name}.safetensors"
        with pytest.raises(CorruptCheckpointError, match=rf"{named} fails its CRC-32 check"):
            export_safetensors(damaged, target)
        assert not target.exists()
        export_safetensors(damaged, target, verify=False)


def test_load_from_checkpoint_verifies(saved: dict[str, Path], tmp_path: Path) -> None:
    for fmt in ("full", "sharded"):
        with pytest.raises(CorruptCheckpointError, match=r"fails its CRC-32 check.*ckpt_verify=False"):
            Net.load_from_checkpoint(_damaged(saved, fmt, tmp_path))


# --------------------------------------------------------------- several processes
@pytest.mark.multiprocess
def test_every_rank_refuses_damage_and_failed_saves(tmp_path: Path) -> None:
    check_ok(run_script("integrity_job.py", "--out", str(tmp_path), timeout=180))
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, log in enumerate(logs):
        for case, named in (
            ("damaged_sharded", r"__1_0\.distcp fails its CRC-32 check"),
            ("damaged_full", "entry"),
        ):
            assert log[case]["error"] == "CorruptCheckpointError", (rank, log[case])
            assert log[case]["message"] == logs[0][case]["message"]  # the same error on every rank
            assert re.search(named, log[case]["message"]), log[case]["message"]
            # model and optimizer untouched
            assert log[case]["changed"] == [], (rank, case, log[case]["changed"])
        assert log["unverified"]["error"] is None
        assert len(log["unverified"]["changed"]) == 1 and log["unverified"]["changed"][0].endswith(": 1")
        for point in (
            "sharded.data_written",
            "sharded.metadata_written",
            "sharded.before_commit",
            "full.mid_data",
        ):
            failed = log[f"save_{point}"]
            assert (failed["error"], failed["errno"]) == ("CheckpointSaveError", errno.ENOSPC), failed
            assert failed["message"] == logs[0][f"save_{point}"]["message"]
            assert "No space left on device" in failed["message"]
            assert failed["previous"][0] is True  # still verifies
            if point.startswith("sharded"):
                assert failed["previous"][1] == 3 and len(failed["entries"]) == 2, failed  # record + old data
            else:
                assert failed["entries"] == []  # no temporary file left
        assert log["record_step"] == 6 and len(log["data_dirs"]) == 1 and log["resaved_changed"] == []
    # each rank checksummed the tensor file it wrote, once; rank 0 also the files it parses
    assert sorted(logs[0]["checked"]) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert logs[1]["checked"] == ["__1_0.distcp"]


@pytest.mark.multiprocess
def test_a_nonfinite_loss_on_one_rank_is_skipped_everywhere_or_ends_the_job(tmp_path: Path) -> None:
    # one job: the skip run, then the raise run in the same processes (one start-up for both)
    result = run_script("nonfinite_job.py", "--out", str(tmp_path), "--mode", "skip,raise", timeout=180)
    for rank in (0, 1):
        # rank 1's NaN at batch 2: both ranks skipped that step (5 batches for 4 steps), and stayed replicas
        log = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert log == {"global_step": 4, "batches": 5, "finite": True, "replicas_equal": True}
    skip_done = max((tmp_path / f"rank{rank}.json").stat().st_mtime for rank in (0, 1))
    assert result.returncode != 0 and time.time() - skip_done < 90  # the raise run ended the job promptly
    assert (
        "NonFiniteLossError: The training loss was nan at epoch 0, batch 2 (before optimizer step 3) on rank 1."
        in result.stdout + result.stderr
    )


# ------------------------------------------------------------------- non-finite loss
class NaNAt(Net):
    """Its loss is NaN (or ``value``) at the batches ``at`` of every epoch."""

    def __init__(self, at: set[int], value: float = float("nan")) -> None:
        super().__init__()
        self.at, self.value = at, value

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * self.value if batch_idx in self.at else loss


class NoneAt(NaNAt):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:  # type: ignore[override]
        loss = super().training_step(batch, batch_idx)
        return None if batch_idx in self.at else loss


def _fit(root: Path, make: Callable[[], Net], **kwargs: Any) -> tuple[fullshard.Trainer, Net]:
    """``make()`` a model and train it from the same seed as every other."""
    fullshard.seed_everything(11)
    model = make()
    trainer = quiet_trainer(root, **{"max_steps": 6, **kwargs})
    trainer.fit(model, DataLoader(make_data(), batch_size=8, shuffle=True))
    return trainer, model


def test_nonfinite_loss_raises_before_the_step_by_default(tmp_path: Path) -> None:
    _, reference = _fit(tmp_path, Net, max_steps=2)
    made: list[Net] = []

    def make() -> Net:
        made.append(NaNAt({2}, float("inf")))
        return made[-1]

    with pytest.raises(
        fullshard.errors.NonFiniteLossError,
        match=r"The training loss was inf at epoch 0, batch 2 \(before optimizer step 3\) on rank 0\. "
        r"Trainer\(on_nonfinite_loss='raise'\) stops before that optimizer step.*on_nonfinite_loss='skip'",
    ):
        _fit(tmp_path, make)
    (model,) = made  # its weights are those of the 2 finite steps
    assert all(torch.equal(model.state_dict()[k], v) for k, v in reference.state_dict().items())


def test_nonfinite_loss_skip_skips_the_step_that_a_none_loss_takes_and_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, skipped = _fit(
        tmp_path, lambda: NaNAt({2, 3}), on_nonfinite_loss="skip", accumulate_grad_batches=2
    )
    assert "The training loss was nan at epoch 0, batch 2 (before optimizer step 2) on rank 0" in caplog.text
    assert "the optimizer step was skipped" in caplog.text
    # batches 2-3 return None: their window steps with no gradient (changing no weight) and counts,
    # as in Lightning (the step-interval scheduler too), so the NaN run without its scheduler
    # equals the None run without one that takes one more step over the same batches
    _, skipped = _fit(
        tmp_path, lambda: _Unscheduled({2, 3}), on_nonfinite_loss="skip", accumulate_grad_batches=2
    )
    reference, none = _fit(tmp_path, lambda: _UnscheduledNone({2, 3}), accumulate_grad_batches=2, max_steps=7)
    assert trainer.global_step == 6 and reference.global_step == 7
    assert all(torch.equal(skipped.state_dict()[k], v) for k, v in none.state_dict().items())


class _Unscheduled(NaNAt):
    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class _UnscheduledNone(NoneAt):
    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def test_nonfinite_loss_skip_stops_after_a_bounded_run_of_skips(tmp_path: Path) -> None:
    """A loss that is NaN on every batch is not skipped forever: after max_consecutive_nonfinite_skips
    skipped steps in a row the next raises, saying how many; a finite step in between resets the count."""
    always = lambda: NaNAt(set(range(100)))  # noqa: E731
    with pytest.raises(
        fullshard.errors.NonFiniteLossError,
        match=r"The training loss was nan at epoch 0, batch 3 \(before optimizer step 1\) on rank 0, after 3 "
        r"optimizer steps in a row were skipped .* skips at most max_consecutive_nonfinite_skips=3 in a row",
    ):
        _fit(tmp_path, always, on_nonfinite_loss="skip", max_consecutive_nonfinite_skips=3)
    with pytest.raises(fullshard.errors.NonFiniteLossError, match=r"after 25 optimizer steps in a row"):
        _fit(tmp_path, always, on_nonfinite_loss="skip", max_epochs=100)  # the default bound: 25
    # runs of 2 bad batches between good ones never reach a bound of 2
    trainer, _ = _fit(
        tmp_path, lambda: NaNAt({1, 2, 4, 5}), on_nonfinite_loss="skip", max_consecutive_nonfinite_skips=2
    )
    assert trainer.global_step == 6
    with pytest.raises(
        MisconfigurationError,
        match=r"max_consecutive_nonfinite_skips=0 is invalid: pass a whole number of 1 or more",
    ):
        quiet_trainer(tmp_path, on_nonfinite_loss="skip", max_consecutive_nonfinite_skips=0)


def test_nonfinite_loss_with_the_check_off_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """on_nonfinite_loss=None trains on, but not silently: one warning, at the first NaN (a
    monitored ModelCheckpoint never improves on a NaN metric, so nothing else would say it)."""
    trainer, _ = _fit(tmp_path, lambda: NaNAt({2, 4}), on_nonfinite_loss=None)
    assert trainer.global_step == 6  # not stopped, not skipped
    said = [r.getMessage() for r in caplog.records if "on_nonfinite_loss=None" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(
        "The training loss was nan at epoch 0, batch 2, and Trainer(on_nonfinite_loss=None)"
    )


def test_nonfinite_check_off_reads_the_losses_at_logging_steps(caplog: pytest.LogCaptureFixture) -> None:
    """on_nonfinite_loss=None: no read between logging steps; the first non-finite loss is named."""
    trainer = SimpleNamespace(global_step=0, log_every_n_steps=3, is_global_zero=True, current_epoch=0)
    check = fullshard.trainer.nonfinite.parse(None)
    check.observe(torch.tensor(float("inf")), 0)
    assert check.step_allowed(trainer)  # type: ignore[arg-type]
    assert not caplog.records  # step 1 logs nothing: not read
    trainer.global_step = 2
    check.observe(torch.tensor(float("nan")), 1)
    assert check.step_allowed(trainer)  # type: ignore[arg-type]
    (record,) = [r for r in caplog.records if "on_nonfinite_loss=None" in r.getMessage()]
    assert record.getMessage().startswith("The training loss was inf at epoch 0, batch 0,")


def test_nonfinite_weights_never_replace_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    run_single(tmp_path, max_steps=2, save=path)
    # no check: the weights become NaN
    trainer, _ = _fit(tmp_path, lambda: NaNAt({2}), on_nonfinite_loss=None)
    assert not torch.isfinite(trainer.lightning_module.state_dict()["head.weight"]).all()
    for fmt in ("full", "sharded"):
        target = path if fmt == "full" else tmp_path / "sharded"
        if fmt == "sharded":
            run_single(tmp_path, fmt="sharded", max_steps=2, save=target)
        trainer.strategy.state_dict_type = fmt
        with pytest.raises(
            CheckpointError,
            match=rf"parameters hold NaN or infinite values \(blocks\.0\.fc\.bias, .*\), so the checkpoint "
            rf"'{target}' was not written: the checkpoint previously at that path, if any, stays as it was",
        ):
            trainer.save_checkpoint(target)
        assert inspect(target, verify_checksums=True).global_step == 2


def test_nonfinite_check_reads_the_first_nonfinite_loss_of_a_window() -> None:
    trainer = SimpleNamespace(
        strategy=SingleDeviceStrategy(), optimizers=[], current_epoch=1, global_step=4, is_global_zero=True
    )
    check = fullshard.trainer.nonfinite.NonFiniteLoss("raise")
    for batch, value in enumerate((0.5, float("inf"), float("nan"), 0.25)):
        check.observe(torch.tensor(value), batch)
    with pytest.raises(
        fullshard.errors.NonFiniteLossError,
        match=r"was inf at epoch 1, batch 1 \(before optimizer step 5\) on rank 0",
    ):
        check.step_allowed(trainer)  # type: ignore[arg-type]
    check.observe(torch.tensor([0.5, 1.0]), 7)
    assert check.step_allowed(trainer)  # type: ignore[arg-type]


class _SlowCopy:
    """A stand-in for a GPU's copy to the host: done only when the test says so, or waited for."""

    def __init__(self) -> None:
        self.done: list[bool] = []
        self.waited = 0

    def __call__(self, window: torch.Tensor) -> fullshard.trainer.nonfinite.HostCopy:
        index = len(self.done)
        self.done.append(False)

        def wait() -> None:
            self.waited += 1
            self.done[index] = True

        return fullshard.trainer.nonfinite.HostCopy(window.clone(), lambda: self.done[index], wait)


def test_nonfinite_check_on_a_device_raises_at_the_next_step_without_waiting_before() -> None:
    """[Note: reading the loss without waiting]: a copy not done at its step is read at the next
    one (waited for only then); the error names the step the loss went into, and says it was taken."""
    trainer = SimpleNamespace(
        strategy=SingleDeviceStrategy(), optimizers=[], current_epoch=0, global_step=0, is_global_zero=True
    )
    copies = _SlowCopy()
    check = fullshard.trainer.nonfinite.NonFiniteLoss("raise", copy=copies)
    for step, value in enumerate((1.0, 2.0, float("nan"), 3.0)):
        trainer.global_step = step
        check.observe(torch.tensor(value), step)
        if step == 3:
            with pytest.raises(
                fullshard.errors.NonFiniteLossError,
                match=r"was nan at epoch 0, batch 2 \(optimizer step 3\) on rank 0\. .* stops at the latest one "
                r"optimizer step later: that optimizer step was taken, and the weights may hold",
            ):
                check.step_allowed(trainer)  # type: ignore[arg-type]
        else:
            assert check.step_allowed(trainer)  # type: ignore[arg-type]
        if step == 0:
            copies.done[0] = True  # the first copy completes during the next step: read without waiting
    assert (
        copies.waited == 2
    )  # step 0's copy was read without waiting; step 1's waited for at step 2, step 2's at 3
    # the last copies of an epoch are read (waited for) before its end hooks
    check.observe(torch.tensor(float("inf")), 4)
    trainer.global_step = 4
    assert check.step_allowed(trainer)  # type: ignore[arg-type]
    with pytest.raises(
        fullshard.errors.NonFiniteLossError, match=r"was inf at epoch 0, batch 4 \(optimizer step 5\)"
    ):
        check.settle(trainer)  # type: ignore[arg-type]


def test_nonfinite_check_reads_a_dtensor_loss(tmp_path: Path) -> None:
    """A loss computed from tensor-parallel outputs is a DTensor: its whole value is checked."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        trainer = SimpleNamespace(
            strategy=SingleDeviceStrategy(),
            optimizers=[],
            current_epoch=0,
            global_step=0,
            is_global_zero=True,
        )
        check = fullshard.trainer.nonfinite.NonFiniteLoss("raise")
        check.observe(distribute_tensor(torch.tensor(0.5), mesh, [Replicate()]), 0)
        assert check.step_allowed(trainer)  # type: ignore[arg-type]
        check.observe(distribute_tensor(torch.tensor(float("nan")), mesh, [Replicate()]), 1)
        with pytest.raises(fullshard.errors.NonFiniteLossError, match=r"was nan at epoch 0, batch 1"):
            check.step_allowed(trainer)  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()


def test_nonfinite_loss_option_is_checked(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError, match=r"on_nonfinite_loss='warn' is invalid: use 'raise' .* 'skip'"
    ):
        quiet_trainer(tmp_path, on_nonfinite_loss="warn")

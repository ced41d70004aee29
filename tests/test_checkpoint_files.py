"""Checkpoint formats, integrity and tools, in one process (single device)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fullshard
from ckpt_helpers import Net, assert_same_state, full_state, run_single
from fullshard.checkpoint.archive import verify
from fullshard.checkpoint.layout import RECORD_NAME, CommitRecord, rank_record_name, recorded_files
from fullshard.checkpoint.tools import consolidate, export_safetensors, inspect
from fullshard.checkpoint.validate import StateDictMismatchError
from fullshard.cli import main as cli_main
from fullshard.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full and a sharded checkpoint at step 4, and the trainer state they hold."""
    root = tmp_path_factory.mktemp("saved")
    paths = {}
    for fmt in ("full", "sharded"):
        trainer, _ = run_single(root, fmt=fmt, save=root / f"{fmt}.ckpt")
        torch.save(full_state(trainer), root / f"{fmt}.state.pt")
        paths[fmt] = root / f"{fmt}.ckpt"
    return paths


def _copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)
    return dst


def _data_dir(path: Path) -> Path:
    return path / CommitRecord.read(path).data


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_resume_mid_epoch_is_exact(tmp_path: Path, fmt: str) -> None:
    _, straight = run_single(tmp_path, fmt=fmt, max_steps=10)
    run_single(tmp_path, fmt=fmt, max_steps=4, save=tmp_path / "c")
    trainer, resumed = run_single(tmp_path, fmt=fmt, max_steps=10, resume=tmp_path / "c")
    assert resumed.losses == straight.losses[4:]
    assert trainer.global_step == 10


def test_layouts(saved: dict[str, Path]) -> None:
    assert saved["full"].is_file()
    record = CommitRecord.read(saved["sharded"])
    data = saved["sharded"] / record.data
    # every file is recorded: rank 0's in the commit record, each rank's tensor files in its rank record
    assert set(record.files) == {".metadata", "meta.pt"} and record.rank_records == 1
    listed = set(recorded_files(saved["sharded"], record)) | {rank_record_name(0)}
    assert listed == {p.name for p in data.iterdir()} >= {".metadata", "meta.pt", "__0_0.distcp"}
    assert record.world_size == 1 and record.global_step == 4 and record.strategy == "single_device"
    full = torch.load(saved["full"], weights_only=False)
    Net().load_state_dict(full["state_dict"])  # plain module, no prefixes
    assert full["optimizer_count"] == 1 and len(full["rng_states"]) == 1


def test_full_loads_where_sharded_was_written_and_back(saved: dict[str, Path], tmp_path: Path) -> None:
    for fmt, other in (("full", "sharded"), ("sharded", "full")):
        trainer, _ = run_single(tmp_path, fmt=other, max_steps=4, resume=saved[fmt])
        assert_same_state(
            full_state(trainer), torch.load(saved[fmt].parent / f"{fmt}.state.pt", weights_only=False)
        )


def test_consolidate_and_export(saved: dict[str, Path], tmp_path: Path) -> None:
    out = consolidate(saved["sharded"], tmp_path / "consolidated.ckpt")
    expected = torch.load(saved["sharded"].parent / "sharded.state.pt", weights_only=False)
    plain = torch.load(out, weights_only=False)
    module = Net()
    module.load_state_dict(plain["state_dict"])
    trainer, _ = run_single(tmp_path, fmt="full", max_steps=4, resume=out)
    assert_same_state(full_state(trainer), expected)
    verify(out)
    with pytest.raises(CheckpointError, match="is a full checkpoint file already"):
        consolidate(saved["full"], tmp_path / "x.ckpt")
    safetensors = pytest.importorskip("safetensors.torch")
    for fmt in ("full", "sharded"):
        weights = safetensors.load_file(str(export_safetensors(saved[fmt], tmp_path / f"{fmt}.safetensors")))
        for key, value in expected["model"].items():
            assert torch.equal(weights[key], value), key


def test_inspect_reports_and_verifies(
    saved: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for fmt in ("full", "sharded"):
        result = inspect(saved[fmt], verify_checksums=True)
        assert (result.format, result.complete, result.verified, result.problem) == (fmt, True, True, None)
        assert (result.world_size, result.strategy, result.epoch, result.global_step) == (
            1,
            "single_device",
            0,
            4,
        )
        names = {t.name for t in result.tensors}
        assert any("fc.weight" in n for n in names) and result.total_bytes > 0
        weight = next(t for t in result.tensors if t.name.endswith("blocks.0.fc.weight"))
        assert weight.shape == (16, 16) and weight.dtype == "float32"
    # the command line: in this process where it succeeds (no interpreter start-up), as a process
    # of its own where it fails (`python -m fullshard.cli` and its exit status)
    assert cli_main(["checkpoint", "inspect", "--verify", str(saved["sharded"])]) == 0
    stdout = capsys.readouterr().out
    assert "checksums:   all match" in stdout and "global step 4" in stdout
    cli = [sys.executable, "-m", "fullshard.cli", "checkpoint", "inspect", "--verify"]
    broken = _copy(saved["sharded"], tmp_path / "broken")
    shard = _data_dir(broken) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = subprocess.run([*cli, str(broken)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "__0_0.distcp fails its CRC-32 check" in out.stdout


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[offset if offset is not None else len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_are_caught_by_verify(saved: dict[str, Path], tmp_path: Path) -> None:
    full = _copy(saved["full"], tmp_path / "full.ckpt")
    _flip_byte(full)
    with pytest.raises(
        CorruptCheckpointError, match=r"full\.ckpt' is damaged: entry .* fails its CRC-32 check"
    ):
        verify(full)
    sharded = _copy(saved["sharded"], tmp_path / "sharded")
    _flip_byte(_data_dir(sharded) / "meta.pt")
    with pytest.raises(CorruptCheckpointError, match=r"meta\.pt fails its CRC-32 check"):
        verify(sharded)


def _mutations(saved: dict[str, Path], tmp: Path) -> list[tuple[str, Path, type[Exception], str]]:
    cases = []
    truncated = _copy(saved["full"], tmp / "truncated.ckpt")
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    cases.append(
        (
            "truncated file",
            truncated,
            CorruptCheckpointError,
            r"truncated\.ckpt' is damaged or not a checkpoint",
        )
    )
    missing_shard = _copy(saved["sharded"], tmp / "missing_shard")
    (_data_dir(missing_shard) / "__0_0.distcp").unlink()
    cases.append(
        ("missing shard", missing_shard, CorruptCheckpointError, r"is damaged: __0_0\.distcp is missing")
    )
    missing_metadata = _copy(saved["sharded"], tmp / "missing_metadata")
    (_data_dir(missing_metadata) / ".metadata").unlink()
    cases.append(("missing metadata", missing_metadata, CorruptCheckpointError, r"\.metadata is missing"))
    truncated_shard = _copy(saved["sharded"], tmp / "truncated_shard")
    shard = _data_dir(truncated_shard) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    cases.append(
        (
            "truncated shard",
            truncated_shard,
            CorruptCheckpointError,
            r"__0_0\.distcp has 100 bytes, \d+ were written",
        )
    )
    uncommitted = _copy(saved["sharded"], tmp / "uncommitted")
    (uncommitted / RECORD_NAME).unlink()
    cases.append(
        (
            "interrupted save",
            uncommitted,
            IncompleteCheckpointError,
            r"was never completed: its save was interrupted",
        )
    )
    bad_record = _copy(saved["sharded"], tmp / "bad_record")
    (bad_record / RECORD_NAME).write_text("{not json")
    cases.append(("damaged record", bad_record, CorruptCheckpointError, r"commit record .* is damaged"))
    empty = tmp / "empty"
    empty.mkdir()
    cases.append(
        (
            "empty directory",
            empty,
            CheckpointNotFoundError,
            r"is a directory that holds no checkpoint \(it is empty\)",
        )
    )
    text = tmp / "notes.txt"
    text.write_text("not a checkpoint")
    cases.append(
        ("not a checkpoint", text, CorruptCheckpointError, r"notes\.txt' is damaged or not a checkpoint")
    )
    foreign_dir = tmp / "foreign"
    foreign_dir.mkdir()
    (foreign_dir / "README").write_text("hello")
    cases.append(
        ("unrelated directory", foreign_dir, CheckpointNotFoundError, r"holds no checkpoint \(found README\)")
    )
    cases.append(("missing path", tmp / "nope", CheckpointNotFoundError, r"the path does not exist"))
    return cases


def test_damaged_inputs_raise_specific_errors(saved: dict[str, Path], tmp_path: Path) -> None:
    for what, path, error, match in _mutations(saved, tmp_path):
        model = Net()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(error, match=match):
            run_single(tmp_path, max_steps=6, resume=path, model=model)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), f"{what}: model changed"


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_checkpoint_of_another_model(saved: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    wider = Net()
    wider.head = torch.nn.Linear(16, 2)
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(
        StateDictMismatchError,
        match=r"shape mismatches: .*head\.weight \(checkpoint \(1, 16\), model \(2, 16\)\)",
    ):
        run_single(tmp_path, max_steps=6, resume=saved[fmt], model=wider)
    assert all(torch.equal(before[k], v) for k, v in wider.state_dict().items())
    extra = Net()
    extra.extra = torch.nn.Linear(2, 2)
    with pytest.raises(StateDictMismatchError, match=r"missing keys: extra\.bias, extra\.weight"):
        run_single(tmp_path, max_steps=6, resume=saved[fmt], model=extra)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_other_number_of_optimizers(saved: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    with pytest.raises(
        CheckpointError, match=r"holds 1 optimizer state\(s\) but configure_optimizers\(\) returned 2"
    ):
        run_single(tmp_path, max_steps=6, resume=saved[fmt], model=Net(optimizers=2))


def test_validate_loads_weights_only(saved: dict[str, Path], tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from ckpt_helpers import make_data

    class WithVal(Net):
        def validation_step(self, batch: object, batch_idx: int) -> None:
            x, y = batch  # type: ignore[misc]
            self.log("val_loss", torch.nn.functional.mse_loss(self.head(self.blocks(x)).squeeze(-1), y))

    expected = torch.load(saved["sharded"].parent / "sharded.state.pt", weights_only=False)["model"]
    for fmt in ("full", "sharded"):
        model = WithVal(optimizers=2)  # optimizers do not matter for validation
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            default_root_dir=tmp_path,
        )
        trainer.validate(model, DataLoader(make_data(), batch_size=16), ckpt_path=saved[fmt])
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


def test_overwrite_and_leftover_cleanup(tmp_path: Path) -> None:
    path = tmp_path / "ck"
    run_single(tmp_path, fmt="sharded", max_steps=2, save=path)
    first = CommitRecord.read(path).data
    (path / "data-leftover").mkdir()
    (path / f".tmp-{RECORD_NAME}.abc").write_text("partial")
    run_single(tmp_path, fmt="sharded", max_steps=3, save=path)
    record = CommitRecord.read(path)
    assert record.data != first and record.global_step == 3
    assert sorted(p.name for p in path.iterdir()) == sorted([record.data, RECORD_NAME])
    full = tmp_path / "f.ckpt"
    run_single(tmp_path, max_steps=2, save=full)
    (tmp_path / ".tmp-f.ckpt.xyz").write_text("partial")
    run_single(tmp_path, max_steps=3, save=full)
    assert not list(tmp_path.glob(".tmp-f.ckpt.*"))
    with pytest.raises(CheckpointError, match=r"a directory \(a sharded checkpoint\?\) is there"):
        run_single(tmp_path, max_steps=1, save=path)
    with pytest.raises(CheckpointError, match=r"a file \(a full checkpoint\?\) is there"):
        run_single(tmp_path, fmt="sharded", max_steps=1, save=full)


def test_model_checkpoint_with_sharded_directories(tmp_path: Path) -> None:
    callback = fullshard.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        every_n_train_steps=2,
        save_top_k=2,
        save_last=True,
        monitor="step",
        mode="max",
    )
    run_single(tmp_path, fmt="sharded", max_steps=8, callbacks=[callback], enable_checkpointing=True)
    names = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    assert names == ["epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt", "last.ckpt"]
    assert all(inspect(tmp_path / "ckpts" / n).complete for n in names)
    # an interrupted newer save is skipped by ckpt_path="last": last.ckpt (complete) is used
    (tmp_path / "ckpts" / "epoch=0-step=10.ckpt" / "data-partial").mkdir(parents=True)
    os.utime(tmp_path / "ckpts" / "epoch=0-step=10.ckpt")
    callback = fullshard.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        every_n_train_steps=2,
        save_top_k=2,
        save_last=True,
        monitor="step",
        mode="max",
    )
    trainer, model = run_single(
        tmp_path, fmt="sharded", max_steps=10, resume="last", callbacks=[callback], enable_checkpointing=True
    )
    assert len(model.losses) == 2 and trainer.global_step == 10
    record = json.loads((tmp_path / "ckpts" / "last.ckpt" / RECORD_NAME).read_text())
    assert record["global_step"] == 10

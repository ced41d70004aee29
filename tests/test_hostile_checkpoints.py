"""Checkpoints that lie about themselves: every load path refuses them, naming the entry.

A sharded checkpoint's own metadata is checked before it is believed (docs/checkpoints.md, "What
a load checks"): storage paths that leave the checkpoint, files that are not regular files,
shards of another save, shapes, lengths and offsets that cannot be, record counts that never end.
Each mutated checkpoint is loaded by every path a user has: ``inspect``, ``consolidate``,
``export_safetensors``, ``load_from_checkpoint`` and ``fit(ckpt_path=...)``; each must refuse it
with :class:`CorruptCheckpointError` before reading a tensor, leave the run's weights as they
were, and never hang (the test's timeout). Where a mutation changes a file the commit record
covers, the record's CRC-32s are recomputed, as anyone editing a checkpoint can do.

The checkpoints come from one job of 2 CPU processes (FSDP1 and FSDP2, sharded, saved at steps 3
and 6); the loads run in this process (sharded checkpoints load at any world size).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import resource
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex
from torch.utils.data import DataLoader

import fullshard
from ckpt_helpers import Net, make_data, run_scenarios
from fullshard.checkpoint.layout import PARSED_BY_RANK0, RECORD_NAME, CommitRecord, crc32_of, rank_record_name
from fullshard.checkpoint.tools import consolidate, export_safetensors, inspect
from fullshard.cli import main as cli
from fullshard.errors import CorruptCheckpointError
from fullshard.strategies import SingleDeviceStrategy

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
STRATEGIES = ("fsdp", "fsdp2")


@pytest.fixture(scope="module")
def saves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Per strategy, its two sharded checkpoints of one run (steps 3 and 6), on 2 processes."""
    root = tmp_path_factory.mktemp("saves")
    common = ["--format", "sharded", "--save-every", "3", "--keep", "-1", "--max-steps", "6"]
    run_scenarios(root, [["--out", str(root / s), "--strategy", s, *common] for s in STRATEGIES])
    return {
        s: sorted((root / s / "ckpts").glob("epoch=*.ckpt"), key=lambda p: CommitRecord.read(p).global_step)
        for s in STRATEGIES
    }


def _copy(ckpt: Path, tmp_path: Path, name: str = "ckpt") -> Path:
    return Path(shutil.copytree(ckpt, tmp_path / name))


def _data(ckpt: Path) -> Path:
    return ckpt / CommitRecord.read(ckpt).data


def _reseal(ckpt: Path) -> None:
    """Recompute the commit record's sizes and CRC-32s of the files it covers."""
    record = CommitRecord.read(ckpt)
    data = ckpt / record.data
    files = {n: {"size": (data / n).stat().st_size, "crc32": crc32_of(data / n)} for n in PARSED_BY_RANK0}
    (ckpt / RECORD_NAME).write_text(dataclasses.replace(record, files=files).to_json())


def _edit_index(ckpt: Path, change: Callable[[Metadata], None]) -> Path:
    """Change DCP's ``.metadata`` of ``ckpt`` (our own file: plain pickle) and reseal the record."""
    index = _data(ckpt) / ".metadata"
    with open(index, "rb") as f:
        metadata = pickle.load(f)
    change(metadata)
    with open(index, "wb") as f:
        pickle.dump(metadata, f)
    _reseal(ckpt)
    return ckpt


def _storage_of(metadata: Metadata, fqn: str) -> Any:
    return next(info for index, info in metadata.storage_data.items() if index.fqn == fqn)


def _loads(ckpt: Path, tmp_path: Path) -> dict[str, Callable[[], object]]:
    """Every load path a user has, each on ``ckpt``."""

    def fit() -> None:
        fullshard.seed_everything(11)
        model = Net()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=1,
            strategy=SingleDeviceStrategy(state_dict_type="sharded"),
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        try:
            trainer.fit(model, DataLoader(make_data(), batch_size=8), ckpt_path=ckpt)
        finally:  # a refused load changes nothing: the run's weights are as they were
            assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())

    return {
        "consolidate": lambda: consolidate(ckpt, tmp_path / "out.ckpt"),
        "export": lambda: export_safetensors(ckpt, tmp_path / "out.safetensors"),
        "load_from_checkpoint": lambda: Net.load_from_checkpoint(ckpt),
        "fit": fit,
    }


def _refused_everywhere(ckpt: Path, tmp_path: Path, match: str) -> None:
    """Every load path raises CorruptCheckpointError matching ``match``; ``inspect`` says it."""
    for name, load in _loads(ckpt, tmp_path).items():
        with pytest.raises(CorruptCheckpointError, match=match):
            load()
        assert not (tmp_path / "out.ckpt").exists() and not (tmp_path / "out.safetensors").exists(), name
    report = inspect(ckpt)
    assert not report.complete and report.problem is not None and re.search(match, report.problem), (
        report.problem
    )


def _set_path(name: str) -> Callable[[Metadata], None]:
    def change(metadata: Metadata) -> None:
        for info in metadata.storage_data.values():
            if info.relative_path == "__0_0.distcp":
                info.relative_path = name

    return change


# ------------------------------------------------------------------------ reads outside it
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("where", ["parent", "absolute", "device"])
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(
    saves: dict[str, list[Path]], tmp_path: Path, strategy: str, where: str
) -> None:
    other = _copy(saves[strategy][0], tmp_path, "other")  # a real shard of the same model elsewhere
    name = {
        "parent": "../../other/" + CommitRecord.read(other).data + "/__0_0.distcp",
        "absolute": str(_data(other) / "__0_0.distcp"),
        "device": "/dev/zero",
    }[where]
    ckpt = _edit_index(_copy(saves[strategy][1], tmp_path), _set_path(name))
    _refused_everywhere(
        ckpt, tmp_path, rf"names '{name}', not a tensor file of the checkpoint's data directory"
    )


@pytest.mark.parametrize("listed", [False, True])
def test_a_fifo_in_the_checkpoint_is_never_opened(
    saves: dict[str, list[Path]], tmp_path: Path, listed: bool
) -> None:
    """A FIFO inside the data directory, named by the index (and, ``listed``, by a rank record
    rewritten to list it): refused by its kind, before anything opens it (opening blocks)."""
    ckpt = _copy(saves["fsdp2"][1], tmp_path)
    data = _data(ckpt)
    os.mkfifo(data / "__0_7.distcp")
    _edit_index(ckpt, _set_path("__0_7.distcp"))
    if listed:  # the rank record lists it too, its own CRC-32 recomputed (of its other fields)
        record = data / rank_record_name(0)
        content = json.loads(record.read_text())
        content["files"]["__0_7.distcp"] = {"size": 0, "crc32": 0}
        del content["crc32"]
        content["crc32"] = zlib.crc32(json.dumps(content, sort_keys=True).encode())
        record.write_text(json.dumps(content, sort_keys=True))
        # refused by its kind, or (where the index is checked first) by the bytes it cannot hold
        _refused_everywhere(
            ckpt, tmp_path, r"__0_7\.distcp is a FIFO, not a regular file|of __0_7\.distcp, which has 0"
        )
    else:
        _refused_everywhere(ckpt, tmp_path, r"names __0_7\.distcp, which no rank record lists")


def test_a_fifo_given_as_the_checkpoint_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "ckpt")
    with pytest.raises(CorruptCheckpointError, match=r"'.*ckpt' is a FIFO, not a regular file"):
        Net.load_from_checkpoint(tmp_path / "ckpt")


# ---------------------------------------------------------------------- another save's files
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("ranks", [(0,), (1,), (0, 1)])
def test_shards_of_another_save_never_load(
    saves: dict[str, list[Path]], tmp_path: Path, strategy: str, ranks: tuple[int, ...]
) -> None:
    """A rank's shard and its record replaced by another save's of the same model (each with its
    own valid CRC-32s): the mixture is refused, naming the record."""
    older, ckpt = saves[strategy][0], _copy(saves[strategy][1], tmp_path)
    for rank in ranks:
        for name in (f"__{rank}_0.distcp", rank_record_name(rank)):
            shutil.copyfile(_data(older) / name, _data(ckpt) / name)
    _refused_everywhere(
        ckpt,
        tmp_path,
        rf"__{ranks[0]}\.checksums\.json belongs to another save \('{CommitRecord.read(older).data}' at step 3",
    )


@pytest.mark.parametrize("name", [".metadata", "meta.pt"])
def test_an_index_or_meta_of_another_save_never_loads(
    saves: dict[str, list[Path]], tmp_path: Path, name: str
) -> None:
    older, ckpt = saves["fsdp"][0], _copy(saves["fsdp"][1], tmp_path)
    shutil.copyfile(_data(older) / name, _data(ckpt) / name)
    _reseal(ckpt)
    said = r"it belongs to another save" if name == ".metadata" else r"meta\.pt belongs to another save"
    _refused_everywhere(ckpt, tmp_path, said)


def test_inspect_reports_the_save_id(
    saves: dict[str, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    for ckpt in saves["fsdp2"]:
        report = inspect(ckpt, verify_checksums=True)
        assert report.complete and report.verified and report.save_id == CommitRecord.read(ckpt).data
        assert report.save_id.startswith("data-")
    assert len({inspect(c).save_id for c in saves["fsdp2"]}) == 2
    assert cli(["checkpoint", "inspect", str(saves["fsdp2"][0])]) == 0
    assert f"save id:     {inspect(saves['fsdp2'][0]).save_id}\n" in capsys.readouterr().out


# ---------------------------------------------------------------------- sizes that cannot be
def _claim(shape: tuple[int, ...]) -> Callable[[Metadata], None]:
    """``head.weight`` (1 x 16) claims ``shape``, as one chunk stored where its first chunk is."""

    def change(metadata: Metadata) -> None:
        entry = metadata.state_dict_metadata["model.head.weight"]
        origin = torch.Size([0] * len(shape))
        entry.size = torch.Size(shape)
        entry.chunks = [ChunkStorageMetadata(offsets=origin, sizes=torch.Size(shape))]
        first = _storage_of(metadata, "model.head.weight")
        storage = {k: v for k, v in metadata.storage_data.items() if k.fqn != "model.head.weight"}
        metadata.storage_data = {**storage, MetadataIndex("model.head.weight", origin): first}

    return change


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        (
            (10**12, 4),
            r"'model\.head\.weight' claims a chunk of \(1000000000000, 4\) float32 \(16000000000000 bytes\) stored in \d+ bytes",
        ),
        ((-1, 4), r"'model\.head\.weight' has shape \(-1, 4\), not sizes of 0 or more"),
        (
            (250_000_000, 4),
            r"'model\.head\.weight' claims a chunk of \(250000000, 4\) float32 \(4000000000 bytes\)",
        ),
    ],
)
def test_a_shape_the_files_cannot_hold_is_refused_before_any_allocation(
    saves: dict[str, list[Path]], tmp_path: Path, shape: tuple[int, ...], said: str
) -> None:
    ckpt = _edit_index(_copy(saves["fsdp2"][1], tmp_path), _claim(shape))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _refused_everywhere(ckpt, tmp_path, said)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mb < 200  # the 4 GB claim was never allocated (nor written by consolidate)


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("length", 10**15, r"reads bytes \d+ to 10000000000\d+ of __0_0\.distcp, which has \d+"),
        ("offset", -5, r"has offset -5 and length \d+, not byte counts"),
    ],
)
def test_a_storage_entry_outside_its_file_is_refused(
    saves: dict[str, list[Path]], tmp_path: Path, field: str, value: int, said: str
) -> None:
    def change(metadata: Metadata) -> None:
        setattr(_storage_of(metadata, "model.head.weight"), field, value)

    _refused_everywhere(_edit_index(_copy(saves["fsdp"][1], tmp_path), change), tmp_path, said)


def test_a_dtype_fullshard_never_writes_is_refused(saves: dict[str, list[Path]], tmp_path: Path) -> None:
    def change(metadata: Metadata) -> None:
        metadata.state_dict_metadata["model.head.weight"].properties.dtype = torch.complex32

    ckpt = _edit_index(_copy(saves["fsdp"][1], tmp_path), change)
    _refused_everywhere(
        ckpt, tmp_path, r"'model\.head\.weight' has dtype torch\.complex32, which fullshard never writes"
    )


def test_chunks_that_leave_part_of_a_tensor_unread_are_refused(
    saves: dict[str, list[Path]], tmp_path: Path
) -> None:
    """A shape larger than its chunks cover would hand back uninitialised memory as weights."""

    def change(metadata: Metadata) -> None:
        entry = metadata.state_dict_metadata["model.head.bias"]
        entry.size = torch.Size([2])

    ckpt = _edit_index(_copy(saves["fsdp"][1], tmp_path), change)
    _refused_everywhere(
        ckpt, tmp_path, r"'model\.head\.bias' has shape \(2,\) \(2 elements\), but its chunks hold 1"
    )


# ---------------------------------------------------------------------- counts that never end
@pytest.mark.parametrize("world_size", [2, 10**9])
def test_a_record_count_the_directory_cannot_hold_ends_at_once(
    saves: dict[str, list[Path]], tmp_path: Path, world_size: int
) -> None:
    ckpt = _copy(saves["fsdp2"][1], tmp_path)
    record = CommitRecord.read(ckpt)
    (ckpt / RECORD_NAME).write_text(
        dataclasses.replace(record, rank_records=10**9, world_size=world_size).to_json()
    )
    said = (
        r"field 'rank_records' is 1000000000, but its data directory data-\w+ holds \d+ file\(s\)"
        if world_size == 10**9
        else r"field 'rank_records' is 1000000000, but the checkpoint was written by 2 process\(es\)"
    )
    _refused_everywhere(ckpt, tmp_path, said)


def test_a_checkpoint_written_before_save_ids_still_loads(
    saves: dict[str, list[Path]], tmp_path: Path
) -> None:
    """Format 2 (before [Note: one save, one identity]): rank records and meta.pt without the id,
    an index with DCP's own save id. It loads, and its rank records are still checked."""
    ckpt = _copy(saves["fsdp"][1], tmp_path)
    record = CommitRecord.read(ckpt)
    data = ckpt / record.data
    for rank in range(record.rank_records):  # as format 2 wrote them: files and rank, under their CRC-32
        path = data / rank_record_name(rank)
        content = {k: v for k, v in json.loads(path.read_text()).items() if k in ("files", "rank")}
        path.write_text(
            json.dumps({**content, "crc32": zlib.crc32(json.dumps(content, sort_keys=True).encode())})
        )
    meta = torch.load(data / "meta.pt", weights_only=True)
    del meta["fullshard_save"]
    torch.save(meta, data / "meta.pt")
    _edit_index(ckpt, lambda metadata: setattr(metadata.storage_meta, "save_id", "dcp-own-uuid"))
    (ckpt / RECORD_NAME).write_text(dataclasses.replace(CommitRecord.read(ckpt), format_version=2).to_json())
    assert inspect(ckpt, verify_checksums=True).verified
    assert set(Net.load_from_checkpoint(ckpt).state_dict()) == set(Net().state_dict())
    consolidate(ckpt, tmp_path / "out.ckpt")

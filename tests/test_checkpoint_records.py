"""Rank records (format 2): each rank's checksums beside its shard, a commit that gathers none of
them, DCP's index not sent back to every rank; and format 1 checkpoints still loading.

One process (single device) unless marked ``multiprocess`` (FSDP on 2 CPU processes).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ckpt_helpers import assert_same_state, full_state, run_single
from conftest import SCRIPTS, check_ok, run_script
from fullshard.checkpoint.archive import verify
from fullshard.checkpoint.commit import ShardWriter
from fullshard.checkpoint.dcp_reading import read_metadata
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.layout import (
    RECORD_NAME,
    CommitRecord,
    rank_record_name,
    read_rank_record,
    recorded_files,
    write_rank_record,
)
from fullshard.checkpoint.tools import inspect
from fullshard.errors import CorruptCheckpointError

sys.path.insert(0, str(SCRIPTS))
from old_formats import as_format_1

# DCP's note when it saves without a process group (the one-process sharded saves)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    set_event_hook(None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded checkpoint at step 4, and beside it (``state.pt``) the state it holds."""
    root = tmp_path_factory.mktemp("records")
    trainer, _ = run_single(root, fmt="sharded", save=root / "sharded.ckpt")
    torch.save(full_state(trainer), root / "state.pt")
    return root / "sharded.ckpt"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _loaded(tmp_path: Path, path: Path, **kwargs: bool) -> dict[str, object]:
    """The state after loading ``path`` into a trainer 2 steps in (whose state differs)."""
    trainer, _ = run_single(tmp_path, fmt="sharded", max_steps=2)
    trainer.strategy.load_checkpoint(path, trainer.optimizers, **kwargs)
    return full_state(trainer)


def _state(saved: Path) -> dict[str, object]:
    return torch.load(saved.parent / "state.pt", weights_only=False)  # type: ignore[no-any-return]


# -------------------------------------------------------------------------- the format
def test_the_commit_record_lists_rank_0s_files_and_each_rank_its_own(saved: Path) -> None:
    record = CommitRecord.read(saved)
    assert (record.format_version, record.rank_records, set(record.files)) == (3, 1, {".metadata", "meta.pt"})
    files, problem = read_rank_record(saved / record.data, 0, record.identity)
    assert problem is None and set(files) == {"__0_0.distcp"}
    assert files["__0_0.distcp"]["size"] == (saved / record.data / "__0_0.distcp").stat().st_size
    assert set(recorded_files(saved, record)) == {".metadata", "meta.pt", "__0_0.distcp"}


def test_dcp_index_is_written_whole_but_not_sent_back(tmp_path: Path) -> None:
    state = {"w": torch.arange(6.0), "b": torch.ones(2)}
    # plain DCP returns the whole index from save (on every rank, through its final broadcast)
    assert set(
        dcp_save(state, storage_writer=FileSystemWriter(tmp_path / "plain"), no_dist=True).state_dict_metadata
    )
    returned = dcp_save(state, storage_writer=ShardWriter(tmp_path / "ours", sync_files=False), no_dist=True)
    assert returned.state_dict_metadata == {} and returned.storage_data == {}
    assert set(read_metadata(tmp_path / "ours").state_dict_metadata) == {"w", "b"}  # the file holds it all


# ------------------------------------------------------------ damaged or missing rank records
def _rewrite(path: Path, change: str) -> Path:
    data = path / CommitRecord.read(path).data
    record = data / rank_record_name(0)
    if change == "missing":
        record.unlink()
    elif change == "flipped":  # one digit of a size: still JSON, but not what was written
        text = record.read_text()
        at = re.search(r'"size": (\d)', text)
        assert at is not None
        digit = at.start(1)
        record.write_text(text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1 :])
    elif change == "other rank's file":
        files, _ = read_rank_record(data, 0)
        write_rank_record(
            data, 0, {"__1_0.distcp": files["__0_0.distcp"]}, step=CommitRecord.read(path).global_step
        )
    else:
        record.write_text("not json")
    return path


RECORD_PROBLEMS = [
    ("missing", r"__0\.checksums\.json is missing"),
    ("flipped", r"__0\.checksums\.json is damaged: it fails its CRC-32 check"),
    ("other rank's file", r"__0\.checksums\.json is damaged: it lists files rank 0 did not write"),
    ("not json", r"__0\.checksums\.json cannot be read \(JSONDecodeError"),
]


@pytest.mark.parametrize(("change", "match"), RECORD_PROBLEMS, ids=[c for c, _ in RECORD_PROBLEMS])
def test_damaged_rank_records_are_refused_on_load_and_by_verify(
    saved: Path, tmp_path: Path, change: str, match: str
) -> None:
    broken = _rewrite(_copy(saved, tmp_path / "broken"), change)
    trainer, _ = run_single(tmp_path, fmt="sharded", max_steps=2)
    before = full_state(trainer)
    for verify_checksums in (True, False):  # the record is where the sizes are: checked either way
        with pytest.raises(CorruptCheckpointError, match=rf"'.*broken' is damaged: {match}"):
            trainer.strategy.load_checkpoint(broken, trainer.optimizers, verify=verify_checksums)
    assert_same_state(full_state(trainer), before)
    with pytest.raises(CorruptCheckpointError, match=match):
        verify(broken)
    report = inspect(broken, verify_checksums=True)  # `fullshard checkpoint inspect --verify`
    assert not report.verified and re.search(match, report.problem or ""), report


def test_verify_false_still_checks_the_sizes_rank_records_list(saved: Path, tmp_path: Path) -> None:
    broken = _copy(saved, tmp_path / "truncated")
    shard = broken / CommitRecord.read(broken).data / "__0_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 8)
    with pytest.raises(
        CorruptCheckpointError, match=rf"__0_0\.distcp has {size - 8} bytes, {size} were written"
    ):
        _loaded(tmp_path, broken, verify=False)


def test_commit_record_without_rank_records_is_refused(saved: Path, tmp_path: Path) -> None:
    path = _copy(saved, tmp_path / "ckpt")
    record = json.loads((path / RECORD_NAME).read_text())
    for value, said in ((0, "0"), (None, "null"), ("2", '"2"')):
        (path / RECORD_NAME).write_text(json.dumps({**record, "rank_records": value}))
        with pytest.raises(
            CorruptCheckpointError,
            match=rf"field 'rank_records' is {said}, not a number of ranks \(1 or more\)",
        ):
            CommitRecord.read(path)


# ---------------------------------------------------------------- format 1 checkpoints
def test_format_1_checkpoint_loads_verifies_and_is_checked(saved: Path, tmp_path: Path) -> None:
    old = as_format_1(_copy(saved, tmp_path / "old"))
    record = CommitRecord.read(old)
    assert (record.format_version, record.rank_records) == (1, 0)
    assert set(record.files) == {".metadata", "meta.pt", "__0_0.distcp"}
    assert_same_state(_loaded(tmp_path, old), _state(saved))
    assert verify(old) == "sharded" and inspect(old, verify_checksums=True).verified
    # its checksums are still checked: a flipped byte in the tensor file, a truncated one
    shard = old / record.data / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(
        CorruptCheckpointError, match=r"'.*old' is damaged: __0_0\.distcp fails its CRC-32 check"
    ):
        _loaded(tmp_path, old)
    shard.write_bytes(bytes(data[:-8]))
    with pytest.raises(CorruptCheckpointError, match=r"__0_0\.distcp has \d+ bytes, \d+ were written"):
        _loaded(tmp_path, old, verify=False)


# --------------------------------------------------------------- several processes
@pytest.mark.multiprocess
def test_two_ranks_commit_without_gathering_checksums(tmp_path: Path) -> None:
    check_ok(run_script("rank_records_job.py", "--out", str(tmp_path), timeout=180))
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, log in enumerate(logs):
        # between the shards written and the commit, nothing but a flag and rank 0's answer
        assert log["gathers_in_commit"] == 0 and log["reductions_in_commit"] == 1, log
        # every rank's RNG states go to rank 0 alone, which writes them into meta.pt
        assert log["object_gathers"] == ([2] if rank == 0 else [None]), log
        assert log["rng_states_saved"] == 2
        assert log["record"] == {"files": [".metadata", "meta.pt"], "rank_records": 2, "format_version": 3}
        assert log["own_record"] == [f"__{rank}_0.distcp"]
        assert log["format_1_same_state"] is True  # an old checkpoint loads at 2 ranks, exactly
        assert log["damaged_record"]["error"] == "CorruptCheckpointError"
        assert log["damaged_record"]["message"] == logs[0]["damaged_record"]["message"]  # on every rank
        assert "__1.checksums.json is missing" in log["damaged_record"]["message"]
        assert log["damaged_record"]["changed"] is False

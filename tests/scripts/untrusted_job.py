"""Checkpoints forged to run code, refused on every rank of FSDP on 2 CPU processes; used by
tests/test_untrusted_checkpoints.py, which imports the forging helpers from here. Each rank writes
what it saw to ``OUT/rank<r>.json``.

python tests/scripts/untrusted_job.py --out DIR

1. 2 steps; a full checkpoint F and a sharded one S.
2. Rank 0 forges copies as an attacker would: F with code in its hyperparameters, S with code in
   ``meta.pt`` and S with code in ``.metadata`` (the commit record's sizes and CRC-32s fixed up).
3. Every rank loads each (``Strategy.load_checkpoint``, what ``fit``/``validate(ckpt_path=...)``
   call) and must raise UntrustedCheckpointError, the same on every rank, with nothing run and the
   model unchanged; then the forged ``.metadata`` loads with ``trust_checkpoint=True``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ckpt_job import Block, Net, make_data  # beside this script, on sys.path
from torch.utils.data import DataLoader

import fullshard
from fullshard.checkpoint.layout import (
    META_NAME,
    PARSED_BY_RANK0,
    RECORD_NAME,
    CommitRecord,
    crc32_of,
    write_rank_record,
)
from fullshard.strategies import FSDPStrategy

RANK = int(os.environ.get("LOCAL_RANK", "0"))
SYSTEM = f"{os.system.__module__}.system"  # how pickle names os.system: "posix.system"


class Payload:
    """What an attacker puts into a checkpoint: unpickling it runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def fix_record(ckpt: Path) -> None:
    """Rewrite the records of the sharded checkpoint ``ckpt`` (the commit record and each rank's)
    with the size and CRC-32 of every file now in its data directory: what anyone who can write
    the files can do."""
    record = CommitRecord.read(ckpt)
    data = ckpt / record.data

    def sums(files: Any) -> dict[str, dict[str, int]]:
        return {f.name: {"size": f.stat().st_size, "crc32": crc32_of(f)} for f in files}

    for rank in range(record.rank_records):
        write_rank_record(data, rank, sums(sorted(data.glob(f"__{rank}_*.distcp"))), step=record.global_step)
    files = sums(data / name for name in PARSED_BY_RANK0)
    (ckpt / RECORD_NAME).write_text(dataclasses.replace(record, files=files).to_json())


def forge_full(ckpt: Path, marker: Path, where: str = "hyper_parameters") -> Path:
    """The full checkpoint ``ckpt`` with code in its hyperparameters (or ``where="callbacks"``: in
    a callback state), rewritten by ``torch.save`` (its archive CRC-32s valid)."""
    checkpoint = torch.load(ckpt, weights_only=True)
    if where == "callbacks":
        checkpoint["callbacks"]["Evil"] = {"state": Payload(marker)}
    else:
        checkpoint["hyper_parameters"]["n_blocks"] = Payload(marker)
    torch.save(checkpoint, ckpt)
    return ckpt


def forge_meta(ckpt: Path, marker: Path) -> Path:
    """The sharded checkpoint ``ckpt`` with code in ``meta.pt``; returns that file."""
    meta = ckpt / CommitRecord.read(ckpt).data / META_NAME
    checkpoint = torch.load(meta, weights_only=True)
    checkpoint["hyper_parameters"]["n_blocks"] = Payload(marker)
    torch.save(checkpoint, meta)
    fix_record(ckpt)
    return meta


def forge_index(ckpt: Path, marker: Path) -> Path:
    """The sharded checkpoint ``ckpt`` with code in DCP's ``.metadata`` (an otherwise valid
    index); returns that file."""
    index = ckpt / CommitRecord.read(ckpt).data / ".metadata"
    with open(index, "rb") as f:
        metadata = pickle.load(f)  # our own file, just written
    metadata.planner_data["evil"] = Payload(marker)
    with open(index, "wb") as f:
        pickle.dump(metadata, f)
    fix_record(ckpt)
    return index


def forge_bytes(ckpt: Path, marker: Path) -> Path:
    """The sharded checkpoint ``ckpt`` rewritten by DCP with a non-tensor model entry
    ``model.evil`` holding code (DCP stores it as ``torch.save`` bytes); returns the data directory."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from fullshard.checkpoint.commit import ShardWriter
    from fullshard.checkpoint.tools import read_sharded

    data = ckpt / CommitRecord.read(ckpt).data
    _, state = read_sharded(ckpt, verify=True, trust=False)
    state["model"]["evil"] = Payload(marker)
    for file in [data / ".metadata", *data.glob("*.distcp")]:
        file.unlink()
    # fullshard's own writer: the index carries the save's id, as a forger can make it do
    dcp_save(state, storage_writer=ShardWriter(data, single_file_per_rank=True), no_dist=True)
    fix_record(ckpt)
    return data


def state(trainer: fullshard.Trainer) -> dict[str, torch.Tensor]:
    model, _ = trainer.strategy.get_state(trainer.optimizers, full=True)
    return {k: v.clone() for k, v in model.items()}


def attempt(log: dict[str, Any], name: str, action: Callable[[], Any]) -> None:
    try:
        action()
        log[name] = {"error": None}
    except Exception as err:
        log[name] = {"error": type(err).__name__, "message": str(err)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    out: Path = p.parse_args().out
    fullshard.seed_everything(11)
    strategy = FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="full")
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )
    model = Net()
    loader = DataLoader(make_data(), batch_size=8)
    trainer.fit(model, loader)
    full, sharded = out / "full.ckpt", out / "sharded.ckpt"
    trainer.save_checkpoint(full)
    strategy.state_dict_type = "sharded"  # the strategy reads its format at every save
    trainer.save_checkpoint(sharded)
    marker, marker_full = out / "MARKER", out / "MARKER-full"
    if RANK == 0:
        shutil.copy(full, out / "evil-full.ckpt")
        forge_full(out / "evil-full.ckpt", marker_full)
        shutil.copytree(sharded, out / "evil-meta.ckpt")
        forge_meta(out / "evil-meta.ckpt", marker)
        shutil.copytree(sharded, out / "evil-index.ckpt")
        forge_index(out / "evil-index.ckpt", marker)
    strategy.barrier()

    log: dict[str, Any] = {}
    before = state(trainer)
    # what fit(ckpt_path=...) and validate(ckpt_path=...) call. (A Trainer call that fails on rank 0
    # ends the other processes at once: see [Note: a failure ends the job] in launch/launchers.py.)
    attempt(log, "full", lambda: strategy.load_checkpoint(out / "evil-full.ckpt", weights_only=True))
    for name in ("meta", "index"):
        forged = out / f"evil-{name}.ckpt"
        attempt(log, name, lambda forged=forged: strategy.load_checkpoint(forged, trainer.optimizers))
    log["changed"] = [k for k, v in state(trainer).items() if not torch.equal(v, before[k])]
    strategy.barrier()  # every rank has tried every load before the marker is looked for
    log["ran"] = marker.exists() or marker_full.exists()
    strategy.barrier()
    attempt(
        log,
        "trusted",
        lambda: strategy.load_checkpoint(out / "evil-index.ckpt", trainer.optimizers, trust_checkpoint=True),
    )
    log["ran_trusted"] = marker.exists()
    (out / f"rank{RANK}.json").write_text(json.dumps(log))


if __name__ == "__main__":
    main()

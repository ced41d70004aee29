"""Rank records with FSDP on 2 CPU processes; used by tests/test_checkpoint_records.py. Each rank
writes what it saw to ``OUT/rank<r>.json``.

python tests/scripts/rank_records_job.py --out DIR

1. 2 steps, then a sharded save (A), counting the collectives each rank makes between its shards
   being written (``sharded.metadata_written``) and the save returning: the commit's agreement.
2. A's commit record and this rank's record, as each rank reads them.
3. A copy of A rewritten as format 1 (tests/scripts/old_formats.py) loads with the same state as A.
4. A copy of A without rank 1's record: every rank raises the same CorruptCheckpointError, and
   the model is unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from ckpt_job import Block, Net, make_data  # beside this script, on sys.path
from old_formats import as_format_1
from torch.utils.data import DataLoader

import fullshard
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.layout import CommitRecord, rank_record_name, read_rank_record
from fullshard.strategies import FSDPStrategy

RANK = int(os.environ.get("LOCAL_RANK", "0"))


def state(trainer: fullshard.Trainer) -> dict[str, Any]:
    model, optimizers = trainer.strategy.get_state(trainer.optimizers, full=True)
    return {"model": model, "optimizers": optimizers}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    pairs = [(v, b["model"][k]) for k, v in a["model"].items()]
    for oa, ob in zip(a["optimizers"], b["optimizers"], strict=True):
        pairs += [(v, ob["state"][fqn][n]) for fqn, values in oa["state"].items() for n, v in values.items()]
    return all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in pairs)


def shift(strategy: FSDPStrategy) -> None:
    """Change every parameter this rank holds."""
    assert strategy.module is not None
    with torch.no_grad():
        for param in strategy.module.parameters():
            param.add_(0.5)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    out: Path = p.parse_args().out
    fullshard.seed_everything(11)
    strategy = FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded")
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=out,
    )  # fmt: skip
    trainer.fit(Net(), DataLoader(make_data(), batch_size=8, shuffle=True))
    log: dict[str, Any] = {"gathers_in_commit": 0, "reductions_in_commit": 0, "object_gathers": []}

    # 1. the collectives of the commit
    in_commit = [False]
    gather, reduce, gather_to_0 = strategy.all_gather_object, strategy.all_reduce, strategy.gather_object

    def counted_gather(obj: Any) -> Any:
        log["gathers_in_commit"] += in_commit[0]
        return gather(obj)

    def counted_reduce(*args: Any, **kwargs: Any) -> Any:
        log["reductions_in_commit"] += in_commit[0]
        return reduce(*args, **kwargs)

    def recorded_gather_to_0(obj: Any) -> Any:
        gathered = gather_to_0(obj)
        log["object_gathers"].append(None if gathered is None else len(gathered))
        return gathered

    strategy.all_gather_object = counted_gather  # type: ignore[method-assign]
    strategy.gather_object = recorded_gather_to_0  # type: ignore[method-assign]
    strategy.all_reduce = counted_reduce  # type: ignore[method-assign]
    set_event_hook(
        lambda point: in_commit.__setitem__(0, in_commit[0] or point == "sharded.metadata_written")
    )
    a = out / "a.ckpt"
    trainer.save_checkpoint(a)
    set_event_hook(None)
    strategy.all_gather_object, strategy.all_reduce = gather, reduce  # type: ignore[method-assign]
    strategy.gather_object = gather_to_0  # type: ignore[method-assign]
    saved = state(trainer)

    # 2. the records
    record = CommitRecord.read(a)
    log["record"] = {
        "files": sorted(record.files), "rank_records": record.rank_records, "format_version": record.format_version
    }  # fmt: skip
    log["own_record"] = sorted(read_rank_record(a / record.data, RANK)[0])
    meta = torch.load(a / record.data / "meta.pt", weights_only=True)
    log["rng_states_saved"] = len(meta["rng_states"])

    # 3. format 1
    if RANK == 0:
        as_format_1(shutil.copytree(a, out / "old.ckpt"))
        shutil.copytree(a, out / "broken.ckpt")
        (out / "broken.ckpt" / record.data / rank_record_name(1)).unlink()
    strategy.barrier()
    shift(strategy)  # any load would show
    strategy.load_checkpoint(out / "old.ckpt", trainer.optimizers)
    log["format_1_same_state"] = same(state(trainer), saved)

    # 4. a missing rank record
    shift(strategy)
    before = state(trainer)
    try:
        strategy.load_checkpoint(out / "broken.ckpt", trainer.optimizers)
        log["damaged_record"] = {"error": None}
    except Exception as err:
        log["damaged_record"] = {"error": type(err).__name__, "message": str(err)}
    log["damaged_record"]["changed"] = not same(state(trainer), before)
    (out / f"rank{RANK}.json").write_text(json.dumps(log))


if __name__ == "__main__":
    main()

"""Checksums on load and failed saves with FSDP on 2 CPU processes; used by tests/test_integrity.py.
Each rank writes what it saw to ``OUT/rank<r>.json``.

python tests/scripts/integrity_job.py --out DIR

1. 6 steps, a sharded checkpoint at step 3 (A, by ModelCheckpoint) and a full one at step 6 (F).
2. The model and optimizer states are changed (so that any load would show), then A with a flipped
   byte in rank 1's tensor file and F with a flipped byte in a tensor are loaded: every rank must
   raise CorruptCheckpointError and keep its state; the files each rank checksummed are recorded.
3. The damaged A loads with verify=False: against the intact A, one element differs.
4. Saves over a copy of A fail with OSError(ENOSPC) at several points, on one rank: every rank must
   raise one CheckpointSaveError, and the copy must stay as it was; then a save without fault works.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ckpt_job import Block, Net, make_data  # beside this script, on sys.path
from torch.utils.data import DataLoader

import fullshard
from fullshard.checkpoint import layout
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.layout import RECORD_NAME, CommitRecord
from fullshard.checkpoint.tools import consolidate, inspect
from fullshard.strategies import FSDPStrategy

RANK = int(os.environ.get("LOCAL_RANK", "0"))


def flip_inside(file: Path, tensor: torch.Tensor) -> None:
    """Flip one bit inside ``tensor``'s bytes in ``file`` (found by its last 32 bytes)."""
    data = bytearray(file.read_bytes())
    needle = tensor.detach().contiguous().view(-1).numpy().tobytes()[-32:]
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, f"{file.name}: no unique place to damage"
    data[at + 1] ^= 0x01
    file.write_bytes(bytes(data))


def damage_rank1_file(source: Path, target: Path, scratch: Path) -> None:
    """A copy of the sharded checkpoint ``source`` with a flipped bit in a weight in ``__1_0.distcp``."""
    shutil.copytree(source, target)
    data = target / CommitRecord.read(target).data
    weights = torch.load(consolidate(source, scratch / "a.ckpt"), weights_only=False)["state_dict"]
    for tensor in weights.values():  # the end of a weight that rank 1's shard holds
        needle = tensor.contiguous().view(-1).numpy().tobytes()[-32:]
        if (
            needle in (data / "__1_0.distcp").read_bytes()
            and needle not in (data / "__0_0.distcp").read_bytes()
        ):
            flip_inside(data / "__1_0.distcp", tensor)
            return
    raise AssertionError("no weight of rank 1's file to damage")


def state(trainer: fullshard.Trainer) -> dict[str, Any]:
    model, optimizers = trainer.strategy.get_state(trainer.optimizers, full=True)
    return {"model": model, "optimizers": optimizers}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``key: n`` for each tensor of ``a`` that differs from ``b`` in n elements."""
    out = []
    pairs = [(f"model.{k}", v, b["model"][k]) for k, v in a["model"].items()]
    for i, (oa, ob) in enumerate(zip(a["optimizers"], b["optimizers"], strict=True)):
        for fqn, values in oa["state"].items():
            pairs += [(f"optimizer{i}.{fqn}.{n}", v, ob["state"][fqn][n]) for n, v in values.items()]
    for key, x, y in pairs:
        x, y = torch.as_tensor(x), torch.as_tensor(y)
        if not torch.equal(x, y):
            out.append(f"{key}: {int((x != y).sum())}")
    return out


def attempt(log: dict[str, Any], name: str, action: Callable[[], Any]) -> None:
    try:
        action()
        log[name] = {"error": None}
    except Exception as err:
        log[name] = {"error": type(err).__name__, "message": str(err), "errno": getattr(err, "errno", None)}


def fail_at(point: str, rank: int) -> None:
    def hook(reached: str) -> None:
        if reached == point and rank == RANK:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    set_event_hook(hook)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    out: Path = p.parse_args().out
    fullshard.seed_everything(11)
    strategy = FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded")
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=6,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[fullshard.ModelCheckpoint(dirpath=out / "ckpts", every_n_train_steps=3, save_top_k=-1)],
        default_root_dir=out,
    )
    trainer.fit(Net(), DataLoader(make_data(), batch_size=8, shuffle=True))
    a, full = out / "ckpts" / "epoch=0-step=3.ckpt", out / "full.ckpt"
    strategy.state_dict_type = "full"  # the strategy reads its format at every save
    trainer.save_checkpoint(full)
    strategy.state_dict_type = "sharded"
    if RANK == 0:
        (out / "scratch").mkdir()
        damage_rank1_file(a, out / "broken", out / "scratch")
        shutil.copy(full, out / "broken.ckpt")
        flip_inside(
            out / "broken.ckpt", torch.load(full, weights_only=False)["state_dict"]["blocks.1.fc.weight"]
        )
    strategy.barrier()
    log: dict[str, Any] = {}

    # 2. damaged checkpoints change nothing, on any rank
    with torch.no_grad():
        for param in strategy.model.parameters():  # type: ignore[union-attr]
            param.add_(0.5)
        for optimizer in trainer.optimizers:
            for values in optimizer.state.values():
                for value in values.values():
                    if torch.is_tensor(value) and value.is_floating_point():
                        value.add_(0.5)
    before = state(trainer)
    checked: list[str] = []
    crc32_of_range = layout.crc32_of_range

    def recording(f: Any, buffer: bytearray, size: int | None) -> int:
        checked.append(Path(f.name).name)
        return crc32_of_range(f, buffer, size)

    layout.crc32_of_range = recording  # type: ignore[assignment]
    attempt(log, "damaged_sharded", lambda: strategy.load_checkpoint(out / "broken", trainer.optimizers))
    layout.crc32_of_range = crc32_of_range  # type: ignore[assignment]
    log["checked"] = checked
    log["damaged_sharded"]["changed"] = differences(state(trainer), before)
    attempt(log, "damaged_full", lambda: strategy.load_checkpoint(out / "broken.ckpt", trainer.optimizers))
    log["damaged_full"]["changed"] = differences(state(trainer), before)

    # 3. verify=False loads the damaged bytes
    strategy.load_checkpoint(a, trainer.optimizers)
    intact = state(trainer)
    attempt(
        log, "unverified", lambda: strategy.load_checkpoint(out / "broken", trainer.optimizers, verify=False)
    )
    log["unverified"]["changed"] = differences(state(trainer), intact)

    # 4. failed saves: one error everywhere, the previous checkpoint as it was, the next save works
    previous = out / "previous"
    if RANK == 0:
        shutil.copytree(a, previous)
    strategy.barrier()
    for point, rank in (
        ("sharded.data_written", 1),  # inside DCP's write: DCP gathers the ranks' failures
        ("sharded.metadata_written", 1),  # after DCP, on rank 1 alone
        ("sharded.before_commit", 0),  # rank 0's commit
    ):
        fail_at(point, rank)
        attempt(log, f"save_{point}", lambda: trainer.save_checkpoint(previous))
        set_event_hook(None)
        log[f"save_{point}"]["entries"] = sorted(p.name for p in previous.iterdir())
        report = inspect(previous, verify_checksums=True)
        log[f"save_{point}"]["previous"] = [report.verified, report.global_step]
        strategy.barrier()
    strategy.state_dict_type = "full"
    fail_at("full.mid_data", 0)
    attempt(log, "save_full.mid_data", lambda: trainer.save_checkpoint(full))
    set_event_hook(None)
    log["save_full.mid_data"]["entries"] = sorted(p.name for p in out.iterdir() if p.name.startswith(".tmp"))
    log["save_full.mid_data"]["previous"] = [inspect(full, verify_checksums=True).verified, None]
    strategy.state_dict_type = "sharded"
    saved = state(trainer)
    trainer.save_checkpoint(previous)
    log["record_step"] = CommitRecord.read(previous).global_step
    log["data_dirs"] = sorted(p.name for p in previous.iterdir() if p.name != RECORD_NAME)
    strategy.load_checkpoint(previous, trainer.optimizers)
    log["resaved_changed"] = differences(state(trainer), saved)
    (out / f"rank{RANK}.json").write_text(json.dumps(log))


if __name__ == "__main__":
    main()

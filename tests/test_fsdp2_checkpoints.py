"""FSDP2 checkpoints on CPU processes: exact resume in both formats, and checkpoints that cross
between fsdp (FSDP1) and fsdp2 at the same and another world size, and into ddp and one process.

Run: pytest tests/test_fsdp2_checkpoints.py
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_helpers import assert_same_state, full_state, run_scenarios, run_single

pytestmark = pytest.mark.multiprocess


def _final(out: Path) -> dict:
    final = torch.load(out / "final.pt", weights_only=False)
    return {"model": final["model"], "optimizers": final["optimizers"], "global_step": final["global_step"]}


def _losses(out: Path, rank: int) -> list[float]:
    return json.loads((out / f"losses_rank{rank}.json").read_text())


def _run(out: Path, strategy: str, fmt: str, *args: str) -> list[str]:
    return ["--out", str(out), "--strategy", strategy, "--format", fmt, *args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """Every multi-process run of this file for one checkpoint format, in one job per world size
    after the straight runs' job (tests/scripts/ckpt_job.py --scenarios; each run has its own
    directory under ``root``, named below); on first use, once per format.

    A full checkpoint holds whole tensors (any world size reads them alike): the crossings between
    fsdp and fsdp2 run at 2 processes; a sharded one is resharded by DCP between FSDP1's
    ShardedTensors and FSDP2's DTensors: they run at 3.
    """

    @functools.cache
    def run(fmt: str) -> dict[str, Any]:
        root = tmp_path_factory.mktemp(f"fsdp2_{fmt}")
        # 10 uninterrupted fsdp2 steps, a checkpoint every 5 (mid-epoch: 6 steps an epoch)
        first = [
            _run(root / "straight", "fsdp2", fmt, "--max-steps", "10", "--save-every", "5", "--keep", "-1")
        ]
        two_optimizers = ["--optimizers", "2", "--max-steps", "6"]
        if fmt == "sharded":
            first.append(
                _run(root / "two_opt", "fsdp2", fmt, *two_optimizers, "--save-every", "3", "--keep", "-1")
            )
        run_scenarios(root / "first", first)
        last, fsdp1 = root / "straight" / "ckpts" / "epoch=1-step=10.ckpt", root / "fsdp1.ckpt"
        mid = root / "straight" / "ckpts" / "epoch=0-step=5.ckpt"
        at2 = [  # the resume first: N straight steps + save, then a new process and N more
            _run(root / "resumed", "fsdp2", fmt, "--max-steps", "10", "--resume", str(mid)),
            _run(root / "fsdp1_writer", "fsdp", fmt, "--max-steps", "10", "--save", str(fsdp1)),
            _run(root / "ddp", "ddp", fmt, "--resume", str(last), "--max-steps", "10"),
        ]
        devices = 3 if fmt == "sharded" else 2
        readers = [
            _run(root / "fsdp2-fsdp", "fsdp", fmt, "--devices", str(devices), "--resume", str(last), "--max-steps", "10"),
            _run(root / "fsdp-fsdp2", "fsdp2", fmt, "--devices", str(devices), "--resume", str(fsdp1), "--max-steps", "10"),
        ]  # fmt: skip
        found: dict[str, Any] = {"root": root}
        if fmt == "full":
            run_scenarios(root / "at2", at2 + readers)
            return found
        ckpt = root / "two_opt" / "ckpts" / "epoch=0-step=3.ckpt"
        at2.append(_run(root / "two_opt_resumed", "fsdp2", fmt, *two_optimizers, "--resume", str(ckpt)))
        run_scenarios(root / "at2", at2)
        single = root / "single.ckpt"  # test_a_single_process_checkpoint_loads_under_fsdp2_at_3
        trainer, _ = run_single(root / "single", fmt="sharded", max_steps=5, save=single)
        found["single"] = full_state(trainer)
        at3 = [_run(root / "single_at_3", "fsdp2", "sharded", "--devices", "3", "--resume", str(single), "--max-steps", "5")]  # fmt: skip
        run_scenarios(root / "at3", readers + at3, devices=3)
        return found

    return run


@pytest.fixture(scope="module", params=["full", "sharded"])
def straight(request: pytest.FixtureRequest, runs: Callable[[str], dict[str, Any]]) -> tuple[str, Path]:
    """10 uninterrupted fsdp2 steps on 2 ranks, a checkpoint every 5; the other runs in ``root``."""
    return request.param, runs(request.param)["root"]


def test_resume_is_bitwise_identical(straight: tuple[str, Path]) -> None:
    # 2N straight vs N + save + a new process + N
    _, root = straight
    out = root / "straight"
    assert (out / "ckpts" / "epoch=0-step=5.ckpt").exists()
    for rank in (0, 1):
        assert _losses(root / "resumed", rank) == _losses(out, rank)[5:], f"rank {rank}"
    assert_same_state(_final(root / "resumed"), _final(out))


@pytest.mark.parametrize(("writer", "reader"), [("fsdp2", "fsdp"), ("fsdp", "fsdp2")])
def test_checkpoints_cross_between_fsdp_and_fsdp2(
    straight: tuple[str, Path], writer: str, reader: str
) -> None:
    _, root = straight
    # the writer's 10 steps: the straight fsdp2 run, or fsdp's (fsdp1_writer, --save fsdp1.ckpt);
    # the reader resumes its checkpoint at 2 processes (full) or 3 (sharded)
    expected = _final(root / ("straight" if writer == "fsdp2" else "fsdp1_writer"))
    assert_same_state(_final(root / f"{writer}-{reader}"), expected)


def test_fsdp2_checkpoints_load_under_ddp_and_one_process(straight: tuple[str, Path], tmp_path: Path) -> None:
    fmt, root = straight
    ckpt, expected = root / "straight" / "ckpts" / "epoch=1-step=10.ckpt", _final(root / "straight")
    assert_same_state(_final(root / "ddp"), expected)  # ddp, --resume ckpt
    trainer, _ = run_single(tmp_path, fmt=fmt, max_steps=10, resume=ckpt)
    assert_same_state(full_state(trainer), expected)


def test_a_single_process_checkpoint_loads_under_fsdp2_at_3(runs: Callable[[str], dict[str, Any]]) -> None:
    # run_single(fmt="sharded", max_steps=5) saved single.ckpt; 3 fsdp2 ranks resumed it
    found = runs("sharded")
    assert_same_state(_final(found["root"] / "single_at_3"), found["single"])


def test_two_optimizers_resume_exactly(runs: Callable[[str], dict[str, Any]]) -> None:
    root = runs("sharded")["root"]  # fsdp2, sharded, AdamW + SGD: 6 steps, resumed from step 3
    assert_same_state(_final(root / "two_opt_resumed"), _final(root / "two_opt"))

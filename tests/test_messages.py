"""What a user reads while a job runs: the model summary, and warnings printed once per job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from conftest import check_ok, quiet_trainer, run_script
from fullshard.strategies.parameter_sizes import ParameterSize
from fullshard.trainer.summary import model_summary


def _three_layers() -> nn.Module:
    model = nn.Module()
    model.a, model.b = nn.Linear(30, 30), nn.Linear(30, 1)
    model.b.requires_grad_(False)
    return model


def test_summary_counts_the_parameters_as_they_are() -> None:
    summary = model_summary(_three_layers())
    assert re.search(r"0\s+a\s+Linear\s+930\s+train", summary), summary
    assert "930  Trainable params\n31  Non-trainable params\n961  Total params\n" in summary
    assert "sharded" not in summary


def test_summary_of_a_sharded_model_counts_it_whole() -> None:
    """Given the full sizes (a strategy's parameter_sizes), the totals are the model's, with the
    share this process holds beside them."""
    model = _three_layers()
    sizes = [
        ParameterSize("a.weight", 900, 450, True, 4),
        ParameterSize("a.bias", 30, 15, True, 4),
        ParameterSize("b.weight", 30, 0, False, 4),
        ParameterSize("b.bias", 1, 0, False, 4),
    ]
    summary = model_summary(model, sizes)
    assert re.search(r"1\s+b\s+Linear\s+31\s+train", summary), summary
    assert "961  Total params (sharded: this process holds 465)" in summary
    assert "0.004  Total estimated model params size (MB)" in summary


@pytest.mark.multiprocess
def test_summary_of_fsdp_and_fsdp2_models_counts_the_whole_model() -> None:
    """2 ranks: FSDP1 (use_orig_params True and False) and FSDP2 all show 1.9 K parameters, not
    a rank's half, and the half beside it; rank 0 alone prints it."""
    result = run_script("summary_job.py", timeout=180)
    check_ok(result)
    output = result.stderr  # the summary is logged to stderr
    sections = output.split("=== ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["fsdp", "fsdp, use_orig_params=False", "fsdp2"], output
    for section in sections:
        assert re.search(r"0\s+a\s+\w+\s+930\s+train", section), section
        assert re.search(r"2\s+c\s+\w+\s+31\s+train", section), section
        assert "961  Trainable params\n930  Non-trainable params\n" in section, section
        share = re.search(r"1\.9 K  Total params \(sharded: this process holds (\d+)\)", section)
        # about half (FSDP2 splits each tensor by rows: c.weight, one row, sits on rank 0 alone)
        assert share is not None and 900 <= int(share.group(1)) <= 1000, section
        assert section.count("Total params") == 1


def _cpu_warnings(tmp_path: Path, **kwargs: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(tmp_path, **kwargs)
    return [str(w.message) for w in caught if "CPU core" in str(w.message)]


def test_more_cpu_processes_than_cores_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _cpu_warnings(tmp_path, devices=3, strategy="ddp") == [
        "devices=3 starts 3 CPU processes on this machine, but only 2 CPU core(s) are available to them. The "
        "processes share the cores, so each step takes longer than with one process per core. Pass devices=2 "
        "or fewer (devices <= CPU cores) unless you mean to test more ranks than the machine has cores."
    ]
    assert len(_cpu_warnings(tmp_path, devices=4, strategy="ddp_spawn")) == 1
    assert _cpu_warnings(tmp_path, devices=2, strategy="ddp") == []
    # the processes exist already (rank 0 after its first launch; torchrun): nothing is started here
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert _cpu_warnings(tmp_path, devices=3, strategy="ddp") == []


@pytest.mark.multiprocess
def test_warnings_that_read_the_same_on_every_rank_print_once(tmp_path: Path) -> None:
    """2 ranks: each of fullshard's warnings about the configuration, the model or a checkpoint
    appears once in the job's combined output, from rank 0."""
    result = run_script("warnings_once_job.py", "--out", str(tmp_path), timeout=180)
    check_ok(result)
    output = result.stdout + result.stderr
    for text in (
        "RuntimeWarning: EarlyStopping(monitor='not_logged') cannot find 'not_logged'",
        "UserWarning: ModelCheckpoint's dirpath changed from",
        "second exists and is not empty.",
        "UserWarning: auto_wrap_policy selects no submodule of Tiny",
        "UserWarning: Tiny.load_from_checkpoint(strict=False) loaded",
        "lightning_utilities' rank_zero_only ran",  # its rank set on both ranks by the Trainer
    ):
        assert output.count(text) == 1, f"{text!r} appears {output.count(text)} times:\n{output}"
    assert "rank 0 done" in output and "rank 1 done" in output


def test_rank_zero_warn_speaks_on_rank_zero_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from fullshard import rank_zero
    from fullshard.rank_zero import rank_zero_warn

    monkeypatch.setattr(rank_zero.rank_zero_only, "rank", 1)
    monkeypatch.setattr(rank_zero, "_recorded", True)  # as a Trainer on rank 1 records it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_zero_warn("from rank 1")
    assert caught == []
    monkeypatch.setattr(rank_zero.rank_zero_only, "rank", 0)
    monkeypatch.setattr(rank_zero, "_recorded", False)  # no Trainer yet, no process group: rank 0
    with pytest.warns(RuntimeWarning, match="before any Trainer") as record:
        rank_zero_warn("before any Trainer", RuntimeWarning, stacklevel=1)
    assert record[0].filename == __file__  # stacklevel counts from the caller, as for warnings.warn


def test_the_rank_is_lightning_utilities_rank_zero_only_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """One record of the rank, lightning_utilities' (Lightning's): set_global_rank sets it, and
    fullshard's rank_zero_only is that decorator."""
    from lightning_utilities.core import rank_zero as shared

    from fullshard import rank_zero

    assert rank_zero.rank_zero_only is shared.rank_zero_only
    monkeypatch.setattr(shared.rank_zero_only, "rank", shared.rank_zero_only.rank)  # restored after
    monkeypatch.setattr(rank_zero, "_recorded", rank_zero._recorded)
    ran: list[int] = []
    record = rank_zero.rank_zero_only(ran.append)
    rank_zero.set_global_rank(1)
    assert (shared.rank_zero_only.rank, rank_zero.global_rank(), record(1)) == (1, 1, None)
    rank_zero.set_global_rank(0)
    record(0)
    rank_zero.set_global_rank(None)  # forgotten: no process group here, so 0
    assert (shared.rank_zero_only.rank, rank_zero.global_rank()) == (0, 0)
    assert ran == [0]


def test_rank_zero_only_works_before_any_trainer() -> None:
    """lightning_utilities' decorator raises while its rank is unset: importing fullshard sets it
    (to 0 until a Trainer records the rank: a launched rank before its Trainer, here, too) unless
    something imported earlier did."""
    code = (
        "import fullshard\n"
        "from fullshard.rank_zero import rank_zero_only\n"
        "assert rank_zero_only(lambda: 'ran')() == 'ran'\n"
        "from lightning_utilities.core.rank_zero import rank_zero_only as shared\n"
        "assert shared.rank == 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LOCAL_RANK": "1"},
    )
    assert done.returncode == 0, done.stderr
    code = (
        "from lightning_utilities.core.rank_zero import rank_zero_only\n"
        "rank_zero_only.rank = 3  # as Lightning sets it when imported first\n"
        "from fullshard.rank_zero import global_rank\n"
        "assert rank_zero_only.rank == global_rank() == 3\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

"""Sharded checkpoints written in the background (``FSDP2Strategy(async_save=True)``).

Two tiers. In one process, the machinery itself, at world size 1: a ``SingleDeviceStrategy``
with ``async_save`` switched on goes through the same engine and background thread as FSDP2
(only the collectives between ranks are absent), and event hooks hold or fail the writer at
exact points, so nothing depends on timing. On 2 gloo processes with FSDP2
(tests/scripts/async_save_job.py): parity with a synchronous save, training going on during the
write, staging memory, failures raised on every rank, SIGKILL at points of the background write,
and the process exit waiting for the save.

Run: pytest tests/test_async_save.py
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import fullshard
from ckpt_helpers import Net, assert_same_state, full_state, killed_at, make_data, run_single
from conftest import check_ok, quiet_trainer, run_script
from fullshard.checkpoint import async_save, staging
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.layout import RECORD_NAME
from fullshard.checkpoint.tools import inspect
from fullshard.errors import CheckpointError
from fullshard.strategies import SingleDeviceStrategy

ENOSPC = r"OSError: \[Errno 28\] No space left on device"
# DCP's note when it saves without a process group (the one-process tests), from the writer thread
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    set_event_hook(None)


def _trainer(
    root: Path, max_steps: int, callbacks: list[Any] | None = None, **kwargs: Any
) -> fullshard.Trainer:
    strategy = SingleDeviceStrategy(state_dict_type="sharded")
    strategy.async_save = True  # what FSDP2Strategy(async_save=True) switches on, here in one process
    return quiet_trainer(root, strategy=strategy, max_steps=max_steps, callbacks=callbacks or [], **kwargs)  # type: ignore[no-any-return]


def _loader() -> DataLoader:
    return DataLoader(make_data(), batch_size=8, shuffle=True)


class SaveAt(fullshard.Callback):
    """Save to ``path`` after the optimizer steps in ``steps``, then call ``then(trainer)``."""

    def __init__(self, path: Path, steps: set[int], then: Callable[[Any], None] | None = None) -> None:
        self.path, self.steps, self.then = path, steps, then

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step in self.steps:
            trainer.save_checkpoint(self.path)
        if self.then is not None:
            self.then(trainer)


def _unfinished(trainer: fullshard.Trainer) -> list[async_save.PendingSave]:
    """The background saves of ``trainer`` whose outcome no main thread has taken yet."""
    return list(trainer.checkpoint_manager.checkpointer.background.unfinished())


def _in_background() -> bool:
    return threading.current_thread() is not threading.main_thread()


def _fail_writer(point: str) -> None:
    if point == "sharded.data_written" and _in_background():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# ----------------------------------------------------------------------------- staging, unit
def test_stage_copies_every_tensor_and_counts_its_bytes() -> None:
    weight, step = torch.ones(3, 4), torch.tensor(5.0)
    state = {
        "model": {"w": weight},
        "optimizers": {"0": {"w": {"step": step, "betas": (0.9, 0.99)}}},
        "n": [1],
    }
    staged = staging.stage(state)  # copies every tensor now: nothing deferred
    staged, nbytes = staged.state, staged.nbytes
    weight.add_(1)
    step.add_(1)
    assert torch.equal(staged["model"]["w"], torch.ones(3, 4))
    assert staged["optimizers"]["0"]["w"]["step"].item() == 5.0
    assert staged["optimizers"]["0"]["w"]["betas"] == (0.9, 0.99) and staged["n"] == [1]
    assert nbytes == (12 + 1) * 4


def test_stage_copies_only_the_view_of_a_larger_buffer() -> None:
    buffer = torch.zeros(100)
    staged = staging.stage({"shard": buffer[10:20]})  # as FSDP's shards are views of a padded buffer
    assert staged.nbytes == 10 * 4


def test_stage_refuses_tensors_it_cannot_copy_shard_by_shard() -> None:
    class Sharded(torch.Tensor):  # stands for FSDP1's ShardedTensor, another torch.Tensor subclass
        pass

    state = {"model": {"layer.weight": torch.zeros(2).as_subclass(Sharded)}}
    with pytest.raises(
        CheckpointError,
        match=r"async_save=True cannot copy state\.model\.layer\.weight \(Sharded\) to host memory for a "
        r"background save: it accepts plain tensors and DTensors \(FSDP2Strategy's state\)\. Save this model with "
        r"async_save=False",
    ):
        staging.stage(state)


# ----------------------------------------------------------------- one process, world size 1
def test_training_goes_on_while_the_writer_is_held(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    release = threading.Event()
    expected: dict[str, Any] = {}
    seen_during_write: list[tuple[int, bool]] = []

    def hold_writer(point: str) -> None:
        if point == "async.writing":  # before the writer reads anything of the staged copy
            assert release.wait(30)

    def watch(trainer: Any) -> None:
        if trainer.global_step == 2 and not expected:
            expected.update(copy.deepcopy(full_state(trainer)))  # the state the save was given
        if trainer.global_step == 4:  # two optimizer steps later the write is still held
            seen_during_write.append((trainer.global_step, (path / RECORD_NAME).exists()))
            release.set()

    set_event_hook(hold_writer)
    trainer = _trainer(tmp_path, max_steps=5, callbacks=[SaveAt(path, {2}, then=watch)])
    trainer.fit(Net(), _loader())
    assert seen_during_write == [(4, False)]  # trained on, nothing committed yet
    assert trainer.checkpoint_manager.pending is None  # fit returned once it was committed
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 2)
    resumed, _ = run_single(tmp_path / "resume", fmt="sharded", max_steps=2, resume=path)
    assert_same_state(full_state(resumed), expected)  # the staged copy, not the parameters of step 5


def test_one_staged_copy_at_a_time_freed_once_written(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    live_copies: list[int] = []
    staged_refs: list[weakref.ref[torch.Tensor]] = []

    def count(point: str) -> None:
        if point == "async.staged":  # the new save's copy exists; the previous one must be gone
            live_copies.append(sum(p._staging.state is not None for p in _unfinished(trainer)))
        if point == "async.copied":  # the writer thread copied the parameters
            newest = [p._staging for p in _unfinished(trainer) if p._staging.state is not None]
            staged_refs.append(weakref.ref(newest[0].state["model"]["head.weight"]))

    set_event_hook(count)
    trainer = _trainer(tmp_path, max_steps=4, callbacks=[SaveAt(path, {1, 2, 3})])
    trainer.fit(Net(), _loader())
    assert live_copies == [1, 1, 1]
    assert [ref() for ref in staged_refs] == [None, None, None]  # freed when its files were written
    model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=False)
    tensors = [
        *model_state.values(),
        *(v for s in optimizer_states for p in s["state"].values() for v in p.values()),
    ]
    trainer.save_checkpoint(path)
    assert trainer.checkpoint_manager.pending is not None
    assert trainer.checkpoint_manager.pending.staged_bytes == sum(
        t.numel() * t.element_size() for t in tensors
    )
    trainer.checkpoint_manager.wait()


def test_failed_write_raises_at_the_next_optimizer_step(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    staged: list[str] = []
    decided = threading.Event()

    def hook(point: str) -> None:
        if point == "async.staged":
            staged.append(point)
        elif len(staged) == 2:  # the second save's writer fails
            _fail_writer(point)
            if point == "async.finished":
                decided.set()

    def after_save(trainer: Any) -> None:
        if trainer.global_step == 3:  # let the thread fail and decide before step 4: no race in the test
            assert decided.wait(30)

    set_event_hook(hook)
    trainer = _trainer(tmp_path, max_steps=8, callbacks=[SaveAt(path, {2, 3}, then=after_save)])
    with pytest.raises(
        CheckpointError,
        match=rf"The checkpoint written in the background to '{path}' at global step 3 failed: rank 0: {ENOSPC}\. "
        r"Nothing of it was committed: the checkpoint previously at that path, if any, is intact and loads\. "
        r"\(Raised on every process at global step 4\.\) Fix the cause \(free disk space",
    ):
        trainer.fit(Net(), _loader())
    assert trainer.global_step == 4
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.global_step) == (True, 2)  # the partial save is invisible
    assert len(list(path.glob("data-*"))) == 2
    assert run_single(tmp_path / "resume", fmt="sharded", max_steps=2, resume=path)[0].global_step == 2


def test_failure_surfaces_at_the_end_of_fit_and_the_next_save_works(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    trainer = _trainer(tmp_path, max_steps=3, callbacks=[SaveAt(path, {2})])
    trainer.fit(Net(), _loader())  # step 2 committed
    first = json.loads((path / RECORD_NAME).read_text())["data"]
    set_event_hook(_fail_writer)
    trainer.save_checkpoint(path)  # at step 3; fails in the background
    with pytest.raises(
        CheckpointError, match=rf"to '{path}' at global step 3 failed: rank 0: {ENOSPC}\. Nothing"
    ):
        trainer.save_checkpoint(path)  # the next save raises it, before writing anything
    set_event_hook(None)
    trainer.save_checkpoint(path)
    trainer.checkpoint_manager.wait()
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 3)
    assert [d.name for d in path.glob("data-*")] != [first] and len(list(path.glob("data-*"))) == 1

    # a save at the last step whose write fails: no optimizer step follows, fit's end raises it
    set_event_hook(_fail_writer)
    trainer = _trainer(tmp_path, max_steps=2, callbacks=[SaveAt(tmp_path / "other", {2})])
    with pytest.raises(
        CheckpointError, match=rf"at global step 2 failed: rank 0: {ENOSPC}\. Nothing of it was committed"
    ):
        trainer.fit(Net(), _loader())


def test_state_that_cannot_be_pickled_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    trainer = _trainer(tmp_path, max_steps=1)
    model = Net()
    trainer.fit(model, _loader())
    model.hparams["transform"] = lambda x: x  # not plain data
    with pytest.raises(
        CheckpointError,
        match=rf"The checkpoint to '{path}' could not be copied for the background save: rank 0: \w+: .*pickle.*"
        r"Nothing was written; the checkpoint previously at that path, if any, is intact\. Every entry but the "
        r"tensors is pickled: keep hyperparameters and callback states to plain data",
    ):
        trainer.save_checkpoint(path)
    assert trainer.checkpoint_manager.pending is None and _unfinished(trainer) == []
    del model.hparams["transform"]
    trainer.save_checkpoint(path)  # the next save works, and removes the first one's empty directory
    trainer.checkpoint_manager.wait()
    assert inspect(path).complete and len(list(path.glob("data-*"))) == 1


class BreaksAtStep3(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == 3:
            raise RuntimeError("training broke")
        return super().training_step(batch, batch_idx)


class ReleaseOnException(fullshard.Callback):
    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.release.set()


@pytest.mark.parametrize("write_fails", [False, True], ids=["commits", "write-fails"])
def test_an_error_in_fit_lets_the_save_in_flight_finish(tmp_path: Path, write_fails: bool) -> None:
    path = tmp_path / "ckpt"
    release = threading.Event()

    def hold_until_the_error(point: str) -> None:  # the writer is still busy when training breaks
        if point == "sharded.data_written" and _in_background():
            assert release.wait(30)
            if write_fails:
                _fail_writer(point)

    set_event_hook(hold_until_the_error)
    trainer = _trainer(tmp_path, max_steps=6, callbacks=[SaveAt(path, {2}), ReleaseOnException(release)])
    with pytest.raises(RuntimeError, match="training broke"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(BreaksAtStep3(), _loader())
    assert trainer.checkpoint_manager.pending is None  # waited for, in the exception path
    reported = [str(w.message) for w in caught if "written in the background" in str(w.message)]
    if write_fails:  # its own failure is reported beside the run's error, which goes on
        assert len(reported) == 1
        assert re.search(
            rf"at global step 2 failed: rank 0: {ENOSPC}\..*\(The run itself failed with RuntimeError\.\)",
            reported[0],
        )
        assert not path.exists() or inspect(path).complete is False
    else:
        assert reported == []
        report = inspect(path, verify_checksums=True)
        assert (report.complete, report.verified, report.global_step) == (True, True, 2)


def test_model_checkpoint_deletes_what_a_background_save_replaces_only_once_committed(tmp_path: Path) -> None:
    dirpath = tmp_path / "ckpts"
    previous_there: list[bool] = []

    def check(point: str) -> None:
        if point == "sharded.before_commit":  # this save's data is written; the record not yet renamed
            names = sorted(p.name for p in dirpath.glob("*.ckpt") if (p / RECORD_NAME).exists())
            previous_there.append(len(names) == 1)

    set_event_hook(check)
    checkpoints = fullshard.ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=1)
    trainer = _trainer(tmp_path, max_steps=3, callbacks=[checkpoints], enable_checkpointing=True)
    trainer.fit(Net(), _loader())
    assert previous_there == [False, True, True]  # the first save had nothing before it
    assert sorted(p.name for p in dirpath.iterdir()) == ["epoch=0-step=3.ckpt"]


# ----------------------------------------------------------------------- 2 processes, FSDP2
def _job(out: Path, *args: str) -> Any:
    return run_script("async_save_job.py", "--out", str(out), *args, timeout=150)


def _logs(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _events(log: dict[str, Any], point: str) -> list[list[Any]]:
    return [e for e in log["events"] if e[0] == point]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 steps; at step 3 a synchronous save to S, the full state, then a background save to A
    whose writer sleeps 1 s; a ModelCheckpoint every 5 steps; after fit the --after-fit sequence on B."""
    out = tmp_path_factory.mktemp("async_straight")
    args = ["--path", str(out / "A"), "--save-at", "3", "--sync-copy", str(out / "S"), "--slow", "1"]
    check_ok(_job(out, *args, "--max-steps", "10", "--model-checkpoint", "5", "--after-fit", str(out / "B")))
    return out


KILLS = ["1:sharded.data_written", "0:async.written", "0:sharded.before_commit"]
# The 2-rank job's SIGKILL is kept where only several ranks have it: rank 1's writer dies, rank 0
# goes on. Rank 0's points get the same SIGKILL in a forked one-process background save
# (ckpt_helpers.killed_at): the same engine and writer thread, without a job's start-up.
REAL_KILLS = {"1:sharded.data_written"}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Jobs whose second save (at step 5, over a committed one of step 3) is killed (REAL_KILLS)
    or fails; run side by side to save time."""
    root = tmp_path_factory.mktemp("async_interrupted")
    runs = {kill: ["--save-at", "3,5", "--kill", f"{kill}:2"] for kill in REAL_KILLS}
    runs["enospc"] = ["--save-at", "3,4", "--fail", "1:2", "--max-steps", "8"]
    runs["copy"] = ["--save-at", "3,4", "--fail-copy", "1:2", "--max-steps", "8"]
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {
            name: pool.submit(
                _job, root / name.replace(":", "_"), "--path", str(root / name.replace(":", "_") / "P"), *args
            )
            for name, args in runs.items()
        }
        return {name: (root / name.replace(":", "_"), future.result()) for name, future in futures.items()}


@pytest.mark.multiprocess
def test_background_save_equals_a_synchronous_one(straight: Path, tmp_path: Path) -> None:
    reference = torch.load(straight / "reference.pt", weights_only=False)
    states = {}
    for name in ("A", "S"):  # both written at step 3: A in the background, S synchronously
        trainer, _ = run_single(tmp_path / name, fmt="sharded", max_steps=3, resume=straight / name)
        states[name] = full_state(trainer)
        assert_same_state(states[name], reference)
    resumed = [
        run_single(tmp_path / f"{n}6", fmt="sharded", max_steps=6, resume=straight / n)[1] for n in "AS"
    ]
    for a, s in zip(resumed[0].state_dict().values(), resumed[1].state_dict().values(), strict=True):
        assert torch.equal(a, s)


@pytest.mark.multiprocess
def test_training_goes_on_and_the_next_save_waits(straight: Path) -> None:
    for log in _logs(straight):
        staged = _events(log, "async.staged")
        finished = _events(log, "async.finished")
        assert staged[0][2] == 3 and finished[0][2] > 3  # the step-3 save finished steps later
        assert staged[1][2] == 5 and staged[1][4] > finished[0][4]  # ModelCheckpoint's save waited for it
        fit_returned = _events(log, "fit_returned")[0][4]
        assert all(e[4] < fit_returned for e in finished[:3])  # fit returned once its saves were committed
        assert log["pending_after_fit"] is False
    assert sorted(p.name for p in (straight / "mc").iterdir()) == ["epoch=1-step=10.ckpt"]  # step 5 deleted


@pytest.mark.multiprocess
def test_staging_holds_this_ranks_shard_only(straight: Path) -> None:
    saves = [next(s for s in log["saves"] if s["label"] == "step3") for log in _logs(straight)]
    for save in saves:
        assert save["staged"] == save["shard"]  # model + optimizer state of this rank, nothing more
        # every parameter and the optimizer's state are copied by the writer thread, off training's
        assert save["deferred"] == save["parameters"] + 1
        assert save["staged"] < 0.55 * save["whole"]
    # both shards together: the whole state, plus each rank's copy of AdamW's per-parameter step count
    assert sum(s["staged"] for s in saves) == saves[0]["whole"] + 8 * 4


@pytest.mark.multiprocess
def test_failure_after_fit_is_raised_at_the_next_save_on_every_rank(straight: Path) -> None:
    path = straight / "B"
    for log in _logs(straight):
        assert [(e["where"], e["type"]) for e in log["errors"]] == [("next_save", "CheckpointError")]
        assert (
            f"to '{path}' at global step 10 failed: rank 0: OSError: [Errno 28]"
            in log["errors"][0]["message"]
        )
        (_, before), (_, after) = log["inspections"]
        assert before == after and before["complete"] and before["verified"]  # the previous one untouched


@pytest.mark.multiprocess
def test_process_exit_waits_for_the_save_in_flight(straight: Path) -> None:
    for log in _logs(straight):
        main_returns = _events(log, "main_returns")[0][4]
        assert _events(log, "async.finished")[-1][4] > main_returns  # its writer slept 1 s past the end
    report = inspect(straight / "B", verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 10)
    before = _logs(straight)[0]["inspections"][0][1]["data"]
    assert [d.name for d in (straight / "B").glob("data-*")] != [before]  # a new save, the only data left
    assert len(list((straight / "B").glob("data-*"))) == 1


@pytest.mark.multiprocess
@pytest.mark.parametrize("kill", KILLS)
def test_killed_background_write_leaves_the_previous_checkpoint(
    interrupted: dict[str, tuple[Path, Any]], tmp_path: Path, kill: str
) -> None:
    if kill in REAL_KILLS:
        out, result = interrupted[kill]
        assert result.returncode != 0, "the SIGKILL should have ended the job"
    else:  # the job's run in one process: saves at steps 3 and 5, the second killed at the point
        rank, point = kill.split(":", 1)
        assert rank == "0"
        out = tmp_path / "forked"
        trainer = _trainer(out, max_steps=6, callbacks=[SaveAt(out / "P", {3, 5})])
        killed_at(point, lambda: trainer.fit(Net(), _loader()), nth=2)
    report = inspect(out / "P", verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 3), report
    assert len(list((out / "P").glob("data-*"))) == 2  # the partial save is there, and invisible
    assert run_single(tmp_path, fmt="sharded", max_steps=3, resume=out / "P")[0].global_step == 3


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("run", "cause"),
    [
        ("enospc", "rank 1: OSError: [Errno 28]"),
        ("copy", "rank 1 while copying the state to host memory: MemoryError"),
    ],
    ids=["write", "copy"],
)
def test_failed_write_raises_on_every_rank_at_the_same_step(
    interrupted: dict[str, tuple[Path, Any]], tmp_path: Path, run: str, cause: str
) -> None:
    """A write, or the writer thread's copy of the state (staging.py), fails on rank 1."""
    out, result = interrupted[run]
    assert result.returncode != 0
    errors = [log["errors"] for log in _logs(out)]
    assert [[(e["where"], e["type"]) for e in rank] for rank in errors] == [[("fit", "CheckpointError")]] * 2
    steps = {rank[0]["step"] for rank in errors}
    assert len(steps) == 1 and 4 < steps.pop() <= 8  # one step for both, after the failed save of step 4
    for rank in errors:
        message = rank[0]["message"]
        assert f"to '{out / 'P'}' at global step 4 failed: {cause}" in message
    report = inspect(out / "P", verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 3)
    assert run_single(tmp_path, fmt="sharded", max_steps=3, resume=out / "P")[0].global_step == 3


def test_a_dict_saved_through_the_strategy_is_owned_by_the_trainers_manager(tmp_path: Path) -> None:
    """Lightning's ``strategy.save_checkpoint(checkpoint, path)`` with a dict built by hand: the
    background save it starts is the Trainer's checkpoint manager's, which the next load waits for."""
    trainer = _trainer(tmp_path, max_steps=2)
    trainer.fit(Net(), _loader())
    reached: list[str] = []
    release = threading.Event()

    def hold(point: str) -> None:  # the writer waits at its first step until the test lets it go
        if point == "async.copied":
            reached.append(point)
            assert release.wait(30)

    set_event_hook(hold)
    checkpoint = {**trainer.checkpoint_manager.dump(), "by_hand": 7}
    trainer.strategy.save_checkpoint(checkpoint, tmp_path / "hand", optimizers=trainer.optimizers)
    pending = trainer.checkpoint_manager.pending
    assert pending is not None and pending.path == tmp_path / "hand"
    release.set()
    rest = trainer.strategy.load_checkpoint(tmp_path / "hand", trainer.optimizers)  # waits for it first
    assert trainer.checkpoint_manager.pending is None and rest["by_hand"] == 7

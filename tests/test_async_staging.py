"""The copy of a background save taken off the training thread (fullshard/checkpoint/staging.py).

A background save (``async_save=True``) copies buffers at the save and leaves the parameters and
the optimizer state to its writer thread; the next optimizer step waits for that copy. Checked
here at world size 1 (a ``SingleDeviceStrategy`` with ``async_save`` on: the same engine and
thread as FSDP2), with event hooks that slow or fail the copy at exact points: the checkpoint
holds the state of the save's step and nothing later (buffers that the next forward changes,
parameters that the next step changes), the step waits (automatic and manual optimization), and
a failed copy or non-finite weights fail the save the way a failed write does. The 2-process
case of a failed copy is in tests/test_async_save.py. The buffer reuse is checked on CPU; the
pinned buffers themselves need a GPU.

Run: pytest tests/test_async_staging.py
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import fullshard
from ckpt_helpers import Net, assert_same_state, full_state, make_data, run_single
from conftest import quiet_trainer
from fullshard.checkpoint import staging
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.tools import consolidate, inspect
from fullshard.errors import CheckpointError
from fullshard.strategies import SingleDeviceStrategy

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized",
    "ignore:Resuming with the data order of the checkpoint",
)
SAVE_AT = 2


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    set_event_hook(None)


class NormNet(Net):
    """Net with a BatchNorm: buffers that every training forward changes."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(16)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.head(self.norm(self.blocks(x))).squeeze(-1), y)


class ManualNet(Net):
    """Net under manual optimization: ``LightningOptimizer.step`` steps the optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class SaveAndWatch(fullshard.Callback):
    """Saves at step ``SAVE_AT`` (keeping the state it was given), records the order of the save,
    the copy and the optimizer steps, and tells the copy when the next step's backward is done."""

    def __init__(self, path: Path, weights_only: bool = False) -> None:
        self.path, self.weights_only = path, weights_only
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.expected: dict[str, Any] = {}
        self.pending: Any = None
        self.next_step_reached = threading.Event()  # the step after the save ran forward and backward

    def note(self, what: str) -> None:
        with self.lock:
            self.order.append(what)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        for optimizer in trainer.optimizers:
            optimizer.register_step_post_hook(lambda *args: self.note("step"))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == SAVE_AT and not self.expected:
            self.expected.update(copy.deepcopy(full_state(trainer)))
            trainer.save_checkpoint(self.path, weights_only=self.weights_only)
            self.pending = trainer.checkpoint_manager.pending
            self.note("saved")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.expected:
            self.next_step_reached.set()


def _trainer(root: Path, max_steps: int, callbacks: list[Any]) -> fullshard.Trainer:
    strategy = SingleDeviceStrategy(state_dict_type="sharded")
    strategy.async_save = True  # what FSDP2Strategy(async_save=True) switches on, here in one process
    return quiet_trainer(root, strategy=strategy, max_steps=max_steps, callbacks=callbacks)  # type: ignore[no-any-return]


def _loader() -> DataLoader:
    return DataLoader(make_data(), batch_size=8, shuffle=True)


def _copy_late(watch: SaveAndWatch, seconds: float = 0.2) -> None:
    """The writer thread copies only once the next step's backward is done, and ``seconds`` later:
    an optimizer step that did not wait would change the parameters first."""

    def hook(point: str) -> None:
        if point == "async.copying":
            assert watch.next_step_reached.wait(30)
            time.sleep(seconds)
        elif point == "async.copied":
            watch.note("copied")

    set_event_hook(hook)


def _saved_state(root: Path, path: Path, model: Net) -> dict[str, Any]:
    """The state a new run resumed from ``path`` holds (it trains no further step)."""
    resumed, _ = run_single(root, fmt="sharded", max_steps=SAVE_AT, resume=path, model=model)
    return full_state(resumed)


# ------------------------------------------------------------------------------------- units
def test_buffers_are_reused_by_shape_and_dtype() -> None:
    buffers = staging.StagingBuffers(pin=False, reuse=True)
    a, b = buffers.take((2, 3), torch.float32), buffers.take((2, 3), torch.float32)
    assert a is not b and a.shape == (2, 3) and a.dtype == torch.float32
    buffers.give_back([a, b])
    assert buffers.kept_bytes() == 2 * 6 * 4
    again = [buffers.take((2, 3), torch.float32), buffers.take((2, 3), torch.float32)]
    assert {id(t) for t in again} == {id(a), id(b)} and buffers.kept_bytes() == 0  # the same two, once each
    buffers.give_back(again)
    other_shape, other_dtype = buffers.take((3, 2), torch.float32), buffers.take((2, 3), torch.float64)
    assert all(t is not a and t is not b for t in (other_shape, other_dtype))
    assert buffers.kept_bytes() == 2 * 6 * 4  # still kept for a save of the same shapes

    dropping = staging.StagingBuffers(pin=False, reuse=False)
    first = dropping.take((4,), torch.float32)
    dropping.give_back([first])
    assert dropping.kept_bytes() == 0 and dropping.take((4,), torch.float32) is not first


def test_parameters_and_optimizer_state_are_copied_later_buffers_now() -> None:
    module = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    moment = torch.zeros(2, 3)
    state = {"model": module.state_dict(), "optimizers": {"0": {"0.weight": {"exp_avg": moment, "step": 4}}}}
    staged = staging.stage(state, defer=staging.changed_only_by_steps(module))
    assert staged.deferred == 5  # 4 parameters, 1 optimizer's state; 3 buffers copied
    every = [*module.state_dict().values(), moment]
    assert staged.nbytes == sum(t.numel() * t.element_size() for t in every)
    with torch.no_grad():  # before the copy: what training must not do (the optimizer step waits)
        module[1].running_mean.add_(1)  # a buffer: copied already
        module[0].weight.add_(1)  # a parameter: copied later, so this one shows
    staged.copy()
    assert staged.copied.is_set()
    assert torch.equal(staged.state["model"]["1.running_mean"], torch.zeros(2))
    assert torch.equal(staged.state["model"]["0.weight"], module[0].weight)
    with torch.no_grad():
        module[0].weight.add_(1)
        moment.add_(1)
    assert not torch.equal(staged.state["model"]["0.weight"], module[0].weight)  # a copy now
    assert torch.equal(staged.state["optimizers"]["0"]["0.weight"]["exp_avg"], torch.zeros(2, 3))
    assert staged.state["optimizers"]["0"]["0.weight"]["step"] == 4


def test_a_tensor_it_cannot_copy_is_refused_at_the_save_even_when_deferred() -> None:
    class Sharded(torch.Tensor):  # stands for FSDP1's ShardedTensor
        pass

    state = {"optimizers": {"0": {"w": {"exp_avg": torch.zeros(2).as_subclass(Sharded)}}}}
    with pytest.raises(CheckpointError, match=r"cannot copy state\.optimizers\.0\.w\.exp_avg \(Sharded\)"):
        staging.stage(state, defer=staging.changed_only_by_steps(None))


# ------------------------------------------------------------------ one process, world size 1
@pytest.mark.parametrize("weights_only", [False, True], ids=["full-state", "weights-only"])
def test_the_steps_after_the_save_do_not_leak_into_it(tmp_path: Path, weights_only: bool) -> None:
    path = tmp_path / "ckpt"
    watch = SaveAndWatch(path, weights_only)  # weights_only: the save is given no optimizer
    _copy_late(watch)
    trainer = _trainer(tmp_path, max_steps=SAVE_AT + 3, callbacks=[watch])
    trainer.fit(NormNet(), _loader())
    assert trainer.global_step == SAVE_AT + 3
    assert inspect(path, verify_checksums=True).global_step == SAVE_AT
    if weights_only:
        weights = torch.load(consolidate(path, tmp_path / "full.ckpt"), weights_only=True)["state_dict"]
        saved = {"model": weights, "optimizers": []}
        assert_same_state(saved, {"model": watch.expected["model"], "optimizers": []})
    else:
        saved = _saved_state(tmp_path / "resume", path, NormNet())
        assert_same_state(saved, watch.expected)  # the BatchNorm statistics and weights of the save's step
    assert "norm.running_mean" in saved["model"]
    now = full_state(trainer)
    assert not torch.equal(now["model"]["norm.running_mean"], saved["model"]["norm.running_mean"])
    assert not torch.equal(now["model"]["head.weight"], saved["model"]["head.weight"])


@pytest.mark.parametrize("model", [NormNet, ManualNet], ids=["automatic", "manual"])
def test_the_optimizer_step_waits_for_the_copy(tmp_path: Path, model: type[Net]) -> None:
    watch = SaveAndWatch(tmp_path / "ckpt")
    _copy_late(watch, seconds=0.3)
    trainer = _trainer(tmp_path, max_steps=SAVE_AT + 2, callbacks=[watch])
    trainer.fit(model(), _loader())
    after = watch.order[watch.order.index("saved") :]
    assert after == ["saved", "copied", "step", "step"], watch.order
    assert watch.pending.copy_wait_s > 0  # the step waited
    saved = _saved_state(tmp_path / "resume", tmp_path / "ckpt", model())
    assert_same_state(saved, watch.expected)


def test_changing_weights_in_a_hook_after_waiting_for_the_copy(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"

    class ScaleWeights(fullshard.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == SAVE_AT:  # the first batch after the save
                trainer.checkpoint_manager.wait_for_copy()
                with torch.no_grad():
                    pl_module.head.weight.mul_(2)

    watch = SaveAndWatch(path)
    watch.next_step_reached.set()  # the copy starts at once, slowed down

    def slow_copy(point: str) -> None:
        if point == "async.copying":
            time.sleep(0.3)

    set_event_hook(slow_copy)
    trainer = _trainer(tmp_path, max_steps=SAVE_AT + 1, callbacks=[watch, ScaleWeights()])
    trainer.fit(NormNet(), _loader())
    assert_same_state(_saved_state(tmp_path / "resume", path, NormNet()), watch.expected)


def test_a_failed_copy_raises_at_the_next_optimizer_step(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    saves: list[str] = []
    decided = threading.Event()

    def hook(point: str) -> None:
        if point == "async.staged":
            saves.append(point)
        elif len(saves) == 2 and point == "async.copying":  # the second save's copy fails
            raise MemoryError("cannot allocate 4096 bytes")
        elif len(saves) == 2 and point == "async.finished":
            decided.set()

    class SaveAt(fullshard.Callback):
        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if trainer.global_step in (2, 3):
                trainer.save_checkpoint(path)
            if trainer.global_step == 3:  # let the thread fail and decide before step 4: no race in the test
                assert decided.wait(30)

    set_event_hook(hook)
    trainer = _trainer(tmp_path, max_steps=8, callbacks=[SaveAt()])
    with pytest.raises(
        CheckpointError,
        match=rf"The checkpoint written in the background to '{path}' at global step 3 failed: rank 0 while "
        r"copying the state to host memory: MemoryError: cannot allocate 4096 bytes\. Nothing of it was "
        r"committed: the checkpoint previously at that path, if any, is intact and loads\. \(Raised on every "
        r"process at global step 4\.\)",
    ):
        trainer.fit(Net(), _loader())
    assert trainer.global_step == 4
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.global_step) == (True, 2)
    assert trainer.checkpoint_manager.pending is None


def test_nonfinite_weights_fail_a_background_save(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    trainer = _trainer(tmp_path, max_steps=2, callbacks=[])
    model = Net()
    trainer.fit(model, _loader())
    trainer.save_checkpoint(path)
    trainer.checkpoint_manager.wait()
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    trainer.save_checkpoint(path)  # returns: the writer thread checks the copy
    with pytest.raises(
        CheckpointError,
        match=rf"to '{path}' at global step 2 failed: rank 0: CheckpointError: The model's parameters hold NaN or "
        rf"infinite values \(head\.weight\), so the checkpoint '{path}' was not written",
    ):
        trainer.checkpoint_manager.wait()
    assert inspect(path, verify_checksums=True).complete


def test_a_directory_that_cannot_be_made_fails_the_background_save(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    path = tmp_path / "file" / "ckpt"  # the writer thread makes the data directory: it cannot
    trainer = _trainer(tmp_path, max_steps=1, callbacks=[])
    trainer.fit(Net(), _loader())
    trainer.save_checkpoint(path)  # returns: no file system work on the training thread
    with pytest.raises(
        CheckpointError,
        match=rf"to '{path}' at global step 1 failed: rank 0: NotADirectoryError: \[Errno 20\] Not a directory",
    ):
        trainer.checkpoint_manager.wait()
    trainer.save_checkpoint(tmp_path / "ckpt")  # the next save works
    trainer.checkpoint_manager.wait()
    assert inspect(tmp_path / "ckpt", verify_checksums=True).complete


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="pinned staging buffers are for state on a CUDA device"
)
def test_pinned_buffers_are_reused_by_the_next_save_on_cuda(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    copies: list[tuple[set[int], bool]] = []

    def hook(point: str) -> None:
        if point == "async.copied":
            (pending,) = [
                p
                for p in trainer.checkpoint_manager.checkpointer.background.unfinished()
                if p._staging.state is not None
            ]
            state = pending._staging.state
            moments = [v for s in state["optimizers"].values() for p in s.values() for v in p.values()]
            # the parameters and AdamW's moments (its step counts are CPU tensors)
            tensors = [
                *state["model"].values(),
                *(v for v in moments if isinstance(v, torch.Tensor) and v.dim()),
            ]
            copies.append(({t.data_ptr() for t in tensors}, all(t.is_pinned() for t in tensors)))

    class SaveAt(fullshard.Callback):
        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if trainer.global_step in (2, 3):
                trainer.save_checkpoint(path)

    set_event_hook(hook)
    strategy = SingleDeviceStrategy(state_dict_type="sharded")
    strategy.async_save = True
    trainer = quiet_trainer(
        tmp_path, accelerator="cuda", strategy=strategy, max_steps=4, callbacks=[SaveAt()]
    )
    trainer.fit(Net(), _loader())
    assert len(copies) == 2 and copies[0][1] and copies[1][1]  # pinned
    assert copies[0][0] == copies[1][0]  # the second save copied into the first one's buffers
    assert inspect(path, verify_checksums=True).global_step == 3

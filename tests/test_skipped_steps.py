"""A ``training_step`` that returns None counts as Lightning 2.6.6 counts it
(tests/twins/skipped_steps.py under both): the optimizer step of its window still runs and counts.
Beyond what Lightning can show on a CPU: the grad scaler of ``"16-mixed"`` with windows that have
no gradient, and two processes (FSDP, DDP) returning None at the same batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import compare
import fullshard
from conftest import check_ok, quiet_trainer, run_script

twins = compare.Twins("skipped_steps.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


# ------------------------------------------------------------------ "16-mixed": the grad scaler
class Net(fullshard.Module):
    def __init__(self, none_at: set[int]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)
        self.none_at = none_at

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx in self.none_at:
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x).float(), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class ClipsItself(Net):
    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None) -> None:  # fmt: skip
        self.clip_gradients(optimizer, gradient_clip_val=0.05, gradient_clip_algorithm="norm")


def _samples(n: int) -> torch.Tensor:
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(1))


def _fit(root: Path, model: Net, x: torch.Tensor, **kwargs: Any) -> fullshard.Trainer:
    trainer = quiet_trainer(root, precision="16-mixed", max_epochs=1, **kwargs)
    trainer.fit(model, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2))
    return trainer


@pytest.mark.parametrize("model_class", [Net, ClipsItself])
@pytest.mark.parametrize(
    ("accumulate", "none_at", "clip"),
    [(1, {1, 3}, {"gradient_clip_val": 0.05}), (2, {2, 3}, {"gradient_clip_val": 0.05, "gradient_clip_algorithm": "value"})],
)  # fmt: skip
def test_16_mixed_steps_a_window_without_gradients_without_the_scaler(
    tmp_path: Path, model_class: type[Net], accumulate: int, none_at: set[int], clip: dict[str, Any]
) -> None:
    """torch's GradScaler refuses a step with no gradient (and an unscale_ before clipping that no
    step follows): such a window steps and counts without it, and the run goes on as one that
    never had those batches."""
    if model_class is ClipsItself:
        clip = {}
    x = _samples(12)
    model = model_class(none_at)
    trainer = _fit(tmp_path, model, x, accumulate_grad_batches=accumulate, **clip)
    assert trainer.global_step == 6 // accumulate
    kept = torch.cat([x[2 * i : 2 * i + 2] for i in range(6) if i not in none_at])
    reference_model = model_class(set())
    reference = _fit(tmp_path, reference_model, kept, accumulate_grad_batches=accumulate, **clip)
    assert reference.global_step == trainer.global_step - len(none_at) // accumulate
    scaler, reference_scaler = trainer.strategy.precision.scaler, reference.strategy.precision.scaler
    assert scaler is not None and reference_scaler is not None
    assert scaler.get_scale() == reference_scaler.get_scale()  # updated only by the steps with gradients
    for ours, theirs in zip(model.parameters(), reference_model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


# ------------------------------------------------------------------ several processes
def _job(tmp_path: Path, *args: str) -> Any:
    out = tmp_path / f"{'_'.join(args)}.json"
    result = run_script("skipped_steps_job.py", "--devices", "2", *args, "--out", str(out), timeout=240)
    return result, out


@pytest.mark.multiprocess
def test_every_rank_returning_none_at_the_same_batch_counts_as_one_process(tmp_path: Path) -> None:
    """FSDP, FSDP2 and DDP on two processes, None at batches 2, 4 and 5 (windows of 2): no hang,
    the counters of one process (a step per window, the scheduler stepped with it), the same
    weights under all three. A None last in a window whose earlier batch had a loss is refused."""
    results = {}
    for strategy in ("fsdp", "fsdp2", "ddp"):
        result, out = _job(tmp_path, "--strategy", strategy)
        check_ok(result)
        results[strategy] = json.loads(out.read_text())
    expected_seen = [[i, i // 2, i // 2] for i in range(8)]  # what one process sees (the twin's count)
    ddp = results["ddp"]
    for strategy in ("fsdp", "fsdp2", "ddp"):
        run = results[strategy]
        assert run["global_step"] == 4, strategy
        assert run["seen"] == expected_seen, strategy
        assert run["lr"] == pytest.approx(0.1 * 0.8**4), strategy
        for key, values in ddp["weights"].items():
            assert run["weights"][key] == pytest.approx(values, rel=1e-5, abs=1e-6), (strategy, key)
    result, _ = _job(tmp_path, "--strategy", "fsdp", "--none-at", "1")
    assert result.returncode != 0
    assert (
        "MisconfigurationError: training_step returned None at batch 1, the last of an accumulation window "
        "(accumulate_grad_batches=2) whose earlier batches had a loss." in result.stderr
    ), result.stderr[-3000:]


@pytest.mark.parametrize("fused", [False, True])
def test_the_grad_scalers_step_says_whether_it_stepped(fused: bool) -> None:
    """``optimizer_step`` returns False for a step the scaler skipped (inf gradients), True for one
    it took; for a non-fused optimizer without reading the scale back (the scaler's own check of
    the gradients is the step's one read)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fullshard.precision import Precision

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.count += 1
            return func(*args, **(kwargs or {}))

    precision = Precision("16-mixed", "cpu")
    assert precision.scaler is not None
    layer = torch.nn.Linear(3, 1)
    optimizer = (
        torch.optim.Adam(layer.parameters(), fused=True)
        if fused
        else torch.optim.SGD(layer.parameters(), lr=0.1)
    )
    steps = []
    for bad in (True, False):
        precision.backward(layer(torch.ones(2, 3)).sum() * (float("inf") if bad else 1.0))
        with Reads():
            before = Reads.count
            steps.append(precision.optimizer_step(optimizer))
            reads = Reads.count - before
        optimizer.zero_grad()
        assert reads == (2 if fused else 1), (bad, reads)  # fused: the scale, before and after
    assert steps == [False, True]

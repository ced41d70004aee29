"""Single-process Trainer behaviour: loops, accumulation, clipping, schedulers, checkpoints, logging."""

from __future__ import annotations

import copy
import csv
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import fullshard
from conftest import SCRIPTS, quiet_trainer
from fullshard.errors import MisconfigurationError
from fullshard.loggers import CSVLogger

sys.path.insert(0, str(SCRIPTS))
from train_mlp import MLP, make_data


def _trainer(tmp_path: Path, **kwargs: Any) -> fullshard.Trainer:
    return quiet_trainer(tmp_path, **kwargs)  # type: ignore[no-any-return]


def test_fit_counts_steps_and_epochs(tmp_path: Path) -> None:
    model = MLP()
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    assert trainer.global_step == 12 and trainer.current_epoch == 2
    assert len(model.losses) == 12
    assert model.losses[-1] < model.losses[0]
    trainer = _trainer(tmp_path, max_steps=5, limit_train_batches=0.5)
    trainer.fit(MLP(), DataLoader(make_data(), batch_size=16))
    # an epoch cut short by max_steps still ends (hooks, checkpoint), as in Lightning
    assert trainer.num_training_batches == 3 and trainer.global_step == 5 and trainer.current_epoch == 2


def test_gradient_accumulation_equals_a_larger_batch(tmp_path: Path) -> None:
    fullshard.seed_everything(1)
    accumulated = MLP()
    reference = copy.deepcopy(accumulated)
    trainer = _trainer(tmp_path, max_steps=4, accumulate_grad_batches=2)
    trainer.fit(accumulated, DataLoader(make_data(), batch_size=8))
    assert trainer.global_step == 4 and len(accumulated.losses) == 8
    _trainer(tmp_path, max_steps=4).fit(reference, DataLoader(make_data(), batch_size=16))
    for (name, a), b in zip(accumulated.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def _grad_norm(module: Any) -> float:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


class _GradNorms(fullshard.Callback):
    """Gradient norms after backward, before the optimizer step (unclipped, as in Lightning) and
    after the step (clipped: gradients stay until the next window zeroes them)."""

    def __init__(self) -> None:
        self.before: list[float] = []
        self.before_step: list[float] = []
        self.after: list[float] = []

    def on_after_backward(self, trainer: Any, module: Any) -> None:
        self.before.append(_grad_norm(module))

    def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
        self.before_step.append(_grad_norm(module))

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.after.append(_grad_norm(module))


def test_gradient_clipping_by_norm_and_value(tmp_path: Path) -> None:
    norms = _GradNorms()
    _trainer(tmp_path, max_steps=3, gradient_clip_val=0.01, callbacks=[norms]).fit(
        MLP(), DataLoader(make_data(), batch_size=16)
    )
    assert all(b > 0.01 for b in norms.before)
    assert norms.before_step == norms.before
    assert norms.after == pytest.approx([0.01] * 3, rel=1e-4)

    class _MaxGrad(fullshard.Callback):
        peak = 0.0

        def on_train_batch_end(
            self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            _MaxGrad.peak = max(_MaxGrad.peak, max(float(p.grad.abs().max()) for p in module.parameters()))

    _trainer(
        tmp_path,
        max_steps=3,
        gradient_clip_val=0.001,
        gradient_clip_algorithm="value",
        callbacks=[_MaxGrad()],
    ).fit(MLP(), DataLoader(make_data(), batch_size=16))
    assert _MaxGrad.peak == pytest.approx(0.001)  # float32 0.001, every step has larger raw gradients


def test_step_and_epoch_schedulers(tmp_path: Path) -> None:
    class Scheduled(MLP):
        def __init__(self, interval: str) -> None:
            super().__init__()
            self.interval = interval

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {
                "optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": self.interval, "frequency": 2},
            }

    # lr=1.0 makes the loss diverge to NaN: only the schedule matters here, so no NaN check
    trainer = _trainer(tmp_path, max_steps=12, on_nonfinite_loss=None)
    trainer.fit(Scheduled("step"), DataLoader(make_data(), batch_size=16))
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.5**6
    trainer = _trainer(tmp_path, max_epochs=4, on_nonfinite_loss=None)
    trainer.fit(Scheduled("epoch"), DataLoader(make_data(), batch_size=16))
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.5**2


def test_logging_and_validation(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    trainer = _trainer(tmp_path, max_epochs=2, logger=logger, log_every_n_steps=2, val_check_interval=3)
    trainer.fit(MLP(), DataLoader(make_data(), batch_size=16), DataLoader(make_data(), batch_size=32))
    metrics = trainer.callback_metrics
    assert set(metrics) >= {"train_loss", "val_loss"}
    assert "train_loss" in trainer.progress_bar_metrics
    log_file = next(Path(tmp_path).glob("lightning_logs/version_0/metrics.csv"))
    rows = list(csv.DictReader(log_file.open()))
    # Lightning's step numbers: the step count before the logging step (the 2nd step logs at 1)
    assert [int(r["step"]) for r in rows if r.get("train_loss")] == [1, 3, 5, 7, 9, 11]
    # every 3 of 6 batches, 2 epochs, at the number of steps taken before that validation
    assert [int(r["step"]) for r in rows if r.get("val_loss")] == [2, 5, 8, 11]
    result = trainer.validate(MLP(), DataLoader(make_data(), batch_size=32))
    assert set(result[0]) == {"val_loss"}


def test_log_epoch_and_step_variants(tmp_path: Path) -> None:
    class Logs(MLP):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("idx", float(batch_idx), on_step=True, on_epoch=True, reduce_fx="max")
            self.log("count", 1.0, on_step=False, on_epoch=True, reduce_fx="sum")
            return super().training_step(batch, batch_idx)

    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(Logs(), DataLoader(make_data(), batch_size=16))
    metrics = trainer.callback_metrics
    assert float(metrics["idx_epoch"]) == 5.0 and float(metrics["idx_step"]) == 5.0
    assert float(metrics["count"]) == 6.0


def test_model_checkpoint_top_k_last_and_resume_last(tmp_path: Path) -> None:
    ckpt = fullshard.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        monitor="train_loss",
        mode="min",
        save_top_k=2,
        save_last=True,
        every_n_train_steps=2,
        filename="{step}-{train_loss:.4f}",
    )
    trainer = _trainer(tmp_path, max_steps=10, callbacks=[ckpt], enable_checkpointing=True)
    trainer.fit(MLP(), DataLoader(make_data(), batch_size=16))
    files = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    assert "last.ckpt" in files and len(files) == 3, files
    assert Path(ckpt.best_model_path).exists()
    assert ckpt.best_model_score == min(ckpt.best_k_models.values())
    assert torch.load(tmp_path / "ckpts" / "last.ckpt", weights_only=False)["loops"]["global_step"] == 10

    resumed_cb = fullshard.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        monitor="train_loss",
        save_top_k=2,
        save_last=True,
        every_n_train_steps=2,
        filename="{step}-{train_loss:.4f}",
    )
    resumed = _trainer(tmp_path, max_steps=14, callbacks=[resumed_cb], enable_checkpointing=True)
    model = MLP()
    resumed.fit(model, DataLoader(make_data(), batch_size=16), ckpt_path="last")
    assert len(model.losses) == 4 and resumed.global_step == 14
    assert resumed_cb.best_k_models  # ranking carried over from the checkpoint


def test_ckpt_path_last_without_checkpoint_warns(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=2, enable_checkpointing=True)
    with pytest.warns(UserWarning, match="found no checkpoint"):
        trainer.fit(MLP(), DataLoader(make_data(), batch_size=16), ckpt_path="last")
    assert trainer.global_step == 2


def test_default_checkpoint_every_epoch(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=2, enable_checkpointing=True)
    trainer.fit(MLP(), DataLoader(make_data(), batch_size=16))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch=1-step=12.ckpt"]


def test_checkpoint_contents_and_plain_load(tmp_path: Path) -> None:
    class WithHparams(MLP):
        def __init__(self, hidden: int = 32) -> None:
            super().__init__(hidden=hidden)
            self.save_hyperparameters()

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["extra"] = 42

    trainer = _trainer(tmp_path, max_steps=3)
    model = WithHparams()
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=False)
    assert checkpoint["fullshard_version"] == fullshard.__version__
    assert checkpoint["hyper_parameters"] == {"hidden": 32}
    loops = checkpoint["loops"]
    # what the cut epoch drew: the global generator's state as its iterator was made (an
    # unshuffled loader has no order state); [Note: the epoch's draws] in fullshard.trainer.data
    assert isinstance(loops.pop("epoch_rng_state"), bytes) and loops.pop("epoch_order_state") is None
    assert loops == {
        "epoch": 0,
        "global_step": 3,
        "batches_that_stepped": 3,
        "batches_in_epoch": 3,
        "samples_in_epoch": 48,
        "epoch_finished": False,
        "total_batch_idx": 3,
        "data_seed": fullshard.seed.current_seed(),  # the seed the epoch's order was drawn from
    }
    assert checkpoint["extra"] == 42 and checkpoint["world_size"] == 1
    assert len(checkpoint["rng_states"]) == 1 and checkpoint["strategy"] == "single_device"
    plain = WithHparams()
    plain.load_state_dict(checkpoint["state_dict"])  # no wrapper prefixes
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"])
def test_precisions_train(tmp_path: Path, precision: str) -> None:
    class Precise(MLP):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            out = self.net(x).squeeze(-1)
            self.seen_dtype = out.dtype
            loss = F.mse_loss(out.float(), y.float())
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> Any:
            # Adam's eps=1e-8 underflows in float16 ("16-true"); plain SGD keeps the test about precision
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Precise()
    trainer = _trainer(tmp_path, max_steps=6, precision=precision)
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    expected_compute = {
        "32-true": torch.float32,
        "16-mixed": torch.float16,
        "bf16-mixed": torch.bfloat16,
        "16-true": torch.float16,
        "bf16-true": torch.bfloat16,
    }[precision]
    assert model.seen_dtype == expected_compute
    param_dtype = next(model.parameters()).dtype
    assert param_dtype == (torch.float32 if precision.endswith(("mixed", "32-true")) else expected_compute)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    if precision == "16-mixed":
        assert trainer.strategy.precision.scaler is not None
        trainer.save_checkpoint(tmp_path / "scaled.ckpt")
        assert torch.load(tmp_path / "scaled.ckpt", weights_only=False)["grad_scaler"]["scale"] > 0


def test_configure_model_runs_in_init_context(tmp_path: Path) -> None:
    class Late(MLP):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.extra: torch.nn.Linear | None = None

        def configure_model(self) -> None:
            self.calls += 1
            if self.extra is None:
                self.extra = torch.nn.Linear(2, 2)
                self.dtype_at_init = self.extra.weight.dtype

    model = Late()
    trainer = _trainer(tmp_path, max_steps=1, precision="bf16-true")
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    trainer.validate(model, DataLoader(make_data(), batch_size=16))
    assert model.calls == 2 and model.dtype_at_init == torch.bfloat16
    assert model.trainer is trainer and model.device == torch.device("cpu")


def test_a_configure_model_that_fails_when_run_again_says_to_make_it_idempotent(tmp_path: Path) -> None:
    class Once(MLP):
        """Fails the second time, as parallelize_module does on a layer it has split already."""

        def __init__(self, fail_first: bool = False) -> None:
            super().__init__()
            self.calls, self.fail_first = 0, fail_first

        def configure_model(self) -> None:
            self.calls += 1
            if self.calls > 1 or self.fail_first:
                raise RuntimeError("distribute_module should only be called once on a module")

    model = Once()
    trainer = _trainer(tmp_path, max_steps=1)
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    with pytest.raises(
        MisconfigurationError,
        match=r"Once\.configure_model\(\) failed when validate\(\) ran it again on a model an earlier call had set "
        r"up \(RuntimeError: distribute_module should only be called once on a module\)\. As in Lightning, .* "
        r"`if isinstance\(self, FSDPModule\): return`",
    ) as raised:
        trainer.validate(model, DataLoader(make_data(), batch_size=16))
    assert isinstance(raised.value.__cause__, RuntimeError)
    # a configure_model that fails on a model nothing set up yet: its own error, as it was
    with pytest.raises(RuntimeError, match=r"^distribute_module should only be called once on a module$"):
        _trainer(tmp_path, max_steps=1).fit(Once(fail_first=True), DataLoader(make_data(), batch_size=16))


def test_resume_mid_epoch_single_process_is_exact(tmp_path: Path) -> None:
    def run(max_steps: int, ckpt: Path | None = None, save: Path | None = None) -> MLP:
        fullshard.seed_everything(3)
        model = MLP(dropout=0.3)
        trainer = _trainer(tmp_path, max_steps=max_steps)
        trainer.fit(model, DataLoader(make_data(), batch_size=16, shuffle=True), ckpt_path=ckpt)
        if save is not None:
            trainer.save_checkpoint(save)
        return model

    straight = run(10)
    first = run(4, save=tmp_path / "r.ckpt")
    second = run(10, ckpt=tmp_path / "r.ckpt")
    assert first.losses + second.losses == straight.losses
    for a, b in zip(straight.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_resume_with_a_stateless_optimizer(tmp_path: Path) -> None:
    """Plain SGD keeps no per-parameter state; its learning rate must still come back."""

    class PlainSGD(MLP):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)}

    loader = DataLoader(make_data(), batch_size=16)
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(PlainSGD(), loader)
    trainer.save_checkpoint(tmp_path / "sgd.ckpt")
    resumed = _trainer(tmp_path, max_epochs=2)
    resumed.fit(PlainSGD(), loader, ckpt_path=tmp_path / "sgd.ckpt")
    assert resumed.global_step == 12 and resumed.optimizers[0].param_groups[0]["lr"] == 0.1 * 0.5**2


def test_a_datamodule_hears_of_the_exception_and_no_teardown(tmp_path: Path) -> None:
    events: list[str] = []

    class Data(fullshard.DataModule):
        def train_dataloader(self) -> Any:
            return DataLoader(make_data(), batch_size=16)

        def on_exception(self, exception: BaseException) -> None:
            events.append(f"on_exception({exception})")

        def teardown(self, stage: str) -> None:
            events.append(f"teardown({stage})")

    class Failing(MLP):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        quiet_trainer(tmp_path, max_steps=2).fit(Failing(), datamodule=Data())
    assert events == ["on_exception(boom)"]  # as Lightning: no teardown after a failure

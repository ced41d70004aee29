"""Manual optimization (``automatic_optimization = False``), as Lightning 2.x runs it.

Fast tests in one process (wrappers, toggling, refusals, outputs, resume), then a GAN on 2 CPU
processes under ddp, fsdp and fsdp2 (tests/scripts/manual_opt_job.py) compared with one process
of plain PyTorch: the whole training, a resumed one (bitwise the same weights), and manual
gradient accumulation.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import SCRIPTS, check_ok, quiet_trainer, run_script
from fullshard.errors import MisconfigurationError
from fullshard.trainer.optimization import LightningOptimizer

sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(Path(__file__).parent / "porting"))
from manual_opt_job import CLIP, GAN, LR_D, LR_G, d_loss, losses, make_data
from reference import global_batches


def reference(
    world_size: int, epochs: int, accumulate: int = 1, *, shuffle: bool = True
) -> dict[str, torch.Tensor]:
    """The GAN of manual_opt_job.py in one process of plain PyTorch, on the union of the ranks' batches."""
    torch.manual_seed(11)
    gan = GAN(accumulate)
    gen, dis = gan.generator, gan.discriminator
    opt_g = torch.optim.Adam(gen.parameters(), lr=LR_G)
    opt_d = torch.optim.SGD(dis.parameters(), lr=LR_D, momentum=0.9)
    data = make_data()
    (x,) = data.tensors
    for epoch in range(epochs):
        batches = list(global_batches(len(data), 8, world_size, shuffle=shuffle, seed=11, epoch=epoch))
        for i, idx in enumerate(batches):
            real = x[idx]
            stepping = (i + 1) % accumulate == 0
            dis.requires_grad_(False)
            g_loss, fake = losses(gan, real)
            (g_loss / accumulate).backward()
            dis.requires_grad_(True)
            if stepping:
                torch.nn.utils.clip_grad_norm_(gen.parameters(), CLIP)
                opt_g.step()
                opt_g.zero_grad()
            gen.requires_grad_(False)
            (d_loss(gan, real, fake) / accumulate).backward()
            gen.requires_grad_(True)
            if stepping:
                opt_d.step()
                opt_d.zero_grad()
    return gan.state_dict()


def assert_close(got: dict[str, Any], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        torch.testing.assert_close(torch.as_tensor(got[key]), value, rtol=1e-5, atol=1e-6, msg=key)


def loader(shuffle: bool = False) -> DataLoader:
    return DataLoader(make_data(), batch_size=8, shuffle=shuffle)


# ----------------------------------------------------------------------- one process
def test_gan_in_one_process_matches_plain_pytorch(tmp_path: Path) -> None:
    torch.manual_seed(11)
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    model = GAN()
    trainer.fit(model, loader())
    assert trainer.global_step == 2 * 2 * 8  # every step of either optimizer counts, as in Lightning
    assert_close(model.state_dict(), reference(1, 2, shuffle=False))


def test_manual_accumulation_in_one_process_matches_plain_pytorch(tmp_path: Path) -> None:
    torch.manual_seed(11)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    model = GAN(accumulate=2)
    trainer.fit(model, loader())
    assert trainer.global_step == 2 * 4
    assert_close(model.state_dict(), reference(1, 1, accumulate=2, shuffle=False))


class Probe(GAN):
    """Records what the optimizer wrappers look like, and steps a scheduler itself."""

    def __init__(self, returns: Any = "loss") -> None:
        super().__init__()
        self.returns = returns
        self.seen: dict[str, Any] = {}
        self.outputs: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 0:
            opt_g, opt_d = self.optimizers()
            raw_g, raw_d = self.optimizers(use_pl_optimizer=False)
            self.seen.update(
                wrapped=isinstance(opt_g, LightningOptimizer) and isinstance(opt_g, torch.optim.Adam),
                raw=type(raw_g) is torch.optim.Adam and opt_g.optimizer is raw_g and opt_d.optimizer is raw_d,
                same_wrapper=self.optimizers()[0] is opt_g,
                groups=opt_g.param_groups is raw_g.param_groups and opt_d.state is raw_d.state,
                closure=opt_d.step(closure=lambda: "ran"),
                schedulers=self.lr_schedulers(),
            )
        if self.returns == "loss":
            return loss
        if self.returns == "dict":
            return {"loss": loss, "extra": 3}
        return self.returns

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.outputs.append(outputs)

    def configure_optimizers(self) -> Any:
        opt_g, opt_d = super().configure_optimizers()
        step = {
            "scheduler": torch.optim.lr_scheduler.StepLR(opt_g, step_size=1, gamma=0.5),
            "interval": "step",
        }
        plateau = {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt_d), "interval": "epoch"}
        return [{"optimizer": opt_g, "lr_scheduler": step}, {"optimizer": opt_d, "lr_scheduler": plateau}]


def test_optimizers_are_wrapped_and_schedulers_left_to_the_module(tmp_path: Path) -> None:
    model = Probe()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, loader())
    seen = model.seen
    assert seen["wrapped"] and seen["raw"] and seen["same_wrapper"] and seen["groups"]
    assert seen["closure"] == "ran"  # step(closure) returns what the closure returned
    step, plateau = seen["schedulers"]
    assert isinstance(step, torch.optim.lr_scheduler.StepLR)
    assert isinstance(plateau, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert trainer.global_step == 8 * 2 + 1  # the extra opt_d.step() of batch 0 counts too
    assert step.last_epoch == 0 and plateau.last_epoch == 0  # neither stepped by the Trainer
    assert trainer.optimizers[0].param_groups[0]["lr"] == LR_G


@pytest.mark.parametrize(
    ("returns", "expected"),
    [("loss", ["loss"]), ("dict", ["extra", "loss"]), (None, [])],
)
def test_training_step_outputs_reach_on_train_batch_end(
    tmp_path: Path, returns: Any, expected: list[str]
) -> None:
    model = Probe(returns)
    quiet_trainer(tmp_path, max_steps=2).fit(model, loader())
    assert [sorted(o) for o in model.outputs] == [expected]
    if "loss" in expected:
        assert model.outputs[0]["loss"].grad_fn is None  # detached, as in Lightning


def test_a_training_step_returning_something_else_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError, match="under manual optimization it must return a tensor, a dict, or None"
    ):
        quiet_trainer(tmp_path, max_steps=2).fit(Probe(returns=1.5), loader())


def test_step_with_a_closure_that_is_not_callable_is_refused(tmp_path: Path) -> None:
    class Bad(GAN):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            self.optimizers()[0].step(closure=3)

    with pytest.raises(
        MisconfigurationError, match=r"optimizer.step\(closure=...\) got a int, which is not callable"
    ):
        quiet_trainer(tmp_path, max_steps=1).fit(Bad(), loader())


def test_toggle_optimizer_switches_requires_grad_and_restores_it(tmp_path: Path) -> None:
    states: list[tuple[bool, bool, bool]] = []

    class Toggle(GAN):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt_g, opt_d = self.optimizers()
            gen, dis = self.generator[0].weight, self.discriminator[0].weight
            frozen = self.discriminator[2].bias  # frozen by the user: stays frozen
            with self.toggled_optimizer(opt_g):
                states.append((gen.requires_grad, dis.requires_grad, frozen.requires_grad))
            states.append((gen.requires_grad, dis.requires_grad, frozen.requires_grad))
            self.toggle_optimizer(opt_d)
            states.append((gen.requires_grad, dis.requires_grad, frozen.requires_grad))
            self.untoggle_optimizer(opt_d)
            states.append((gen.requires_grad, dis.requires_grad, frozen.requires_grad))
            opt_g.step()

    model = Toggle()
    model.discriminator[2].bias.requires_grad_(False)
    quiet_trainer(tmp_path, max_steps=1).fit(model, loader())
    assert states == [(True, False, False), (True, True, False), (False, True, False), (True, True, False)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"gradient_clip_val": 0.5},
            r"Trainer\(gradient_clip_val=0.5\) clips in automatic optimization only",
        ),
        (
            {"accumulate_grad_batches": 2},
            r"Trainer\(accumulate_grad_batches=2\) accumulates in automatic optimization only",
        ),
    ],
)
def test_trainer_clipping_and_accumulation_are_refused(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(MisconfigurationError, match=message):
        quiet_trainer(tmp_path, max_steps=1, **options).fit(GAN(), loader())


def test_manual_backward_needs_manual_optimization(tmp_path: Path) -> None:
    class Automatic(GAN):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = True

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss, _ = losses(self, batch[0])
            self.manual_backward(loss)
            return loss

    with pytest.raises(
        MisconfigurationError, match=r"Automatic.manual_backward\(\) is for manual optimization"
    ):
        quiet_trainer(tmp_path, max_steps=1).fit(Automatic(), loader())


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"gradient_clip_val": 0.1, "gradient_clip_algorithm": "sideways"},
            MisconfigurationError,
            "gradient_clip_algorithm='sideways' is invalid: use 'norm' or 'value'",
        ),
        ({"gradient_clip_val": "0.1"}, TypeError, "gradient_clip_val must be an int or a float, got '0.1'"),
    ],
)
def test_clip_gradients_checks_its_arguments(
    tmp_path: Path, kwargs: dict[str, Any], error: type, message: str
) -> None:
    class Clip(GAN):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt_g, _ = self.optimizers()
            loss, _ = losses(self, batch[0])
            self.manual_backward(loss)
            self.clip_gradients(opt_g, **kwargs)

    with pytest.raises(error, match=message):
        quiet_trainer(tmp_path, max_steps=1).fit(Clip(), loader())


def test_clip_gradients_by_value(tmp_path: Path) -> None:
    grads: list[float] = []

    class Clip(GAN):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt_g, _ = self.optimizers()
            loss, _ = losses(self, batch[0])
            self.manual_backward(loss * 100)
            self.clip_gradients(opt_g, gradient_clip_val=0.01, gradient_clip_algorithm="value")
            grads.extend(float(p.grad.abs().max()) for p in self.generator.parameters())
            opt_g.step()

    quiet_trainer(tmp_path, max_steps=1).fit(Clip(), loader())
    assert max(grads) == pytest.approx(0.01)


def test_resume_gives_bitwise_the_weights_of_an_uninterrupted_run(tmp_path: Path) -> None:
    torch.manual_seed(11)
    whole = GAN()
    quiet_trainer(tmp_path, max_epochs=2).fit(whole, loader(shuffle=True))
    torch.manual_seed(11)
    first = GAN()
    trainer = quiet_trainer(tmp_path, max_epochs=2, max_steps=20)  # stops inside the second epoch
    trainer.fit(first, loader(shuffle=True))
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=False)
    assert len(saved["optimizer_states"]) == 2 and saved["loops"]["global_step"] == 20
    torch.manual_seed(5)  # another start: the checkpoint must bring everything back
    resumed = GAN()
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(resumed, loader(shuffle=True), ckpt_path=tmp_path / "mid.ckpt")
    assert trainer.global_step == 32
    assert trainer.fit_loop.progress.batches_that_stepped == 16  # the loggers' step counts batches
    for key, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


# -------------------------------------------------------------------- several processes
@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2"])
def test_gan_on_two_processes(tmp_path: Path, strategy: str) -> None:
    check_ok(run_script("manual_opt_job.py", "--out", str(tmp_path), "--strategy", strategy, timeout=300))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["whole_step"] == result["resumed_step"] == 2 * 2 * 4
    assert result["optimizer_states"] == 2
    assert_close(result["whole"], reference(2, 2))
    assert result["resumed"] == result["whole"]  # bitwise
    if strategy != "fsdp":
        assert result["accumulated_step"] == 2 * 2 * 2
        assert_close(result["accumulated"], reference(2, 2, accumulate=2))
    if strategy != "ddp":
        assert (
            "under manual optimization (automatic_optimization = False) needs every parameter in a nested"
            in result["refused"]
        )
        assert "the root unit holds generator.0.weight" in result["refused"]


def test_manual_backward_scales_under_16_mixed_and_clip_gradients_unscales(tmp_path: Path) -> None:
    seen: list[tuple[float, float, float]] = []

    class Mixed(GAN):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt_g, _ = self.optimizers()
            loss, _ = losses(self, batch[0])
            opt_g.zero_grad()
            self.manual_backward(loss)
            weight = self.generator[0].weight
            scaled = weight.grad.detach().clone()
            self.clip_gradients(opt_g, gradient_clip_val=1e9)  # unscales, clips nothing
            scale = self.trainer.strategy.precision.scaler.get_scale()
            seen.append((scale, float(scaled.abs().sum()), float(weight.grad.abs().sum())))
            opt_g.step()

    trainer = quiet_trainer(tmp_path, max_steps=8, precision="16-mixed")
    trainer.fit(Mixed(), loader())
    assert trainer.global_step == 8
    # the first steps overflow (the scaler skips them and lowers its scale); the others are finite
    finite = [(scale, scaled, unscaled) for scale, scaled, unscaled in seen if math.isfinite(scaled)]
    assert finite and seen[0][0] > finite[-1][0]
    scale, scaled, unscaled = finite[-1]
    assert scale > 1 and scaled == pytest.approx(unscaled * scale, rel=1e-3)

"""Lightning 2.6.6's other callbacks and the tuner: results on one process equal to Lightning's
(Lightning's numbers come from tests/scripts/callbacks_lightning_reference.py, run under
Lightning 2.6.6 by the test; the same script prints the same numbers under fullshard), arguments checked,
and every callback at work under ddp, fsdp and fsdp2 on 2 processes, compared with one process
(tests/scripts/callbacks_job.py)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
import lightning_env
from compare import LIGHTNING_PYTHON
from conftest import check_ok, quiet_trainer, run_script
from fullshard.callbacks import (
    BackboneFinetuning,
    BatchSizeFinder,
    EMAWeightAveraging,
    GradientAccumulationScheduler,
    LambdaCallback,
    LearningRateFinder,
    ModelPruning,
    ModelSummary,
    OnExceptionCheckpoint,
    RichProgressBar,
    SpikeDetection,
    StochasticWeightAveraging,
    Throughput,
    ThroughputMonitor,
    TrainingSpikeException,
    WeightAveraging,
)
from fullshard.errors import MisconfigurationError
from fullshard.strategies import FSDP2Strategy, FSDPStrategy, ModelParallelStrategy
from fullshard.tuner import Tuner
from fullshard.utilities import measure_flops


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1)


class _Net(fullshard.LightningModule):
    def __init__(self, bn: bool = False, sched: bool = False, lr: float = 0.02) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(4, 8), *([nn.BatchNorm1d(8)] if bn else []), nn.ReLU()]
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Linear(8, 1)
        self.lr, self.sched, self.batch_size = lr, sched, 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)).squeeze(-1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.mse_loss(self(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr, momentum=0.9)
        if self.sched:
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)}
        return opt

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(_data(), batch_size=self.batch_size)


def _sums(model: nn.Module) -> list[float]:
    return [round(float(p.detach().sum()), 5) for p in model.parameters()]


_CASES = ("gas", "swa", "swa_bn", "ema", "wa", "finetune", "prune", "prune_local")


@pytest.fixture(scope="module")
def lightnings_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, list[float]]]:
    """Each case's global step and parameter sums under Lightning 2.6.6, run here
    (tests/scripts/callbacks_lightning_reference.py): float sums differ in the fifth digit between
    machines (the CPU's kernels), so the reference is computed on the machine that compares."""
    lightning_env.require()
    script = Path(__file__).parent / "scripts" / "callbacks_lightning_reference.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(LIGHTNING_PYTHON), str(script)],
        env={**env, "FW": "lightning"},
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path_factory.mktemp("lightning_callbacks"),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    results = ast.literal_eval(
        "{" + "".join(line for line in out.stdout.splitlines() if line.startswith('"')) + "}"
    )
    assert set(results) == set(_CASES), out.stdout
    return results


def _callbacks(case: str) -> list[Any]:
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2)
    return {
        "gas": [GradientAccumulationScheduler({1: 2, 2: 4})],
        "swa": [swa],
        "swa_bn": [swa],
        "ema": [EMAWeightAveraging(decay=0.9)],
        "wa": [WeightAveraging()],
        "prune": [ModelPruning("l1_unstructured", amount=0.3)],
        "prune_local": [
            ModelPruning(
                "ln_structured",
                amount=0.25,
                use_global_unstructured=False,
                parameter_names=["weight"],
                pruning_dim=0,
                pruning_norm=2,
                use_lottery_ticket_hypothesis=False,
                make_pruning_permanent=False,
            )
        ],
        "finetune": [BackboneFinetuning(unfreeze_backbone_at_epoch=2, lambda_func=lambda e: 1.5)],
    }[case]


@pytest.mark.parametrize("case", _CASES)
def test_weights_equal_lightnings_on_one_process(
    tmp_path: Path, case: str, lightnings_results: dict[str, tuple[int, list[float]]]
) -> None:
    fullshard.seed_everything(0)
    model = _Net(bn=case == "swa_bn", sched=case.startswith("swa"))
    trainer = quiet_trainer(tmp_path, max_epochs=4, callbacks=_callbacks(case), num_sanity_val_steps=0)
    trainer.fit(model, val_dataloaders=DataLoader(_data(), batch_size=16))
    steps, sums = lightnings_results[case]
    # SWA with batch norm: Lightning runs an extra epoch (one more step count) to recompute the
    # statistics; fullshard recomputes them in a pass after the last epoch. Same weights.
    assert trainer.global_step == (64 if case == "swa_bn" else steps)
    assert _sums(model) == pytest.approx(sums, abs=2e-5)
    if case == "prune_local":  # the masks stay (make_pruning_permanent=False), as in Lightning
        assert sorted(n for n, _ in model.named_parameters())[1] == "backbone.0.weight_orig"
        assert int((model.backbone[0].weight == 0).sum()) == 24
    if case == "finetune":
        assert [g["lr"] for g in trainer.optimizers[0].param_groups] == pytest.approx([0.02, 0.003])


def test_ema_resumes_exactly(tmp_path: Path) -> None:
    """A checkpoint holds the average as state_dict and the trained weights as current_model_state;
    resuming from it continues both (2 + 2 epochs equal 4)."""

    def fit(tag: str, epochs: int, ckpt: Path | None = None) -> list[float]:
        fullshard.seed_everything(0)
        checkpoints = fullshard.ModelCheckpoint(dirpath=tmp_path / tag, save_last=True)
        trainer = quiet_trainer(
            tmp_path, max_epochs=epochs, callbacks=[EMAWeightAveraging(decay=0.9), checkpoints]
        )
        model = _Net(sched=True)
        trainer.fit(model, ckpt_path=ckpt)
        return _sums(model)

    whole = fit("whole", 4)
    fit("half", 2)
    saved = torch.load(tmp_path / "half" / "last.ckpt", weights_only=True)
    assert _sums_of(saved["state_dict"]) != _sums_of(saved["current_model_state"])  # average, trained
    assert fit("resumed", 4, tmp_path / "half" / "last.ckpt") == whole


def _sums_of(state: dict[str, torch.Tensor]) -> list[float]:
    return [round(float(v.sum()), 5) for _, v in sorted(state.items())]


def test_a_search_during_training_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    """Lightning's documented pattern: a LearningRateFinder subclass searching again at an epoch's
    start. The run then goes on as if the learning rate had been set by hand there."""

    class AtEpoch(LearningRateFinder):
        def __init__(self, by_hand: float | None = None) -> None:
            super().__init__(num_training_steps=20, early_stop_threshold=None)
            self.by_hand = by_hand
            self.found: list[float] = []

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            return

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch != 2:
                return
            if self.by_hand is None:
                self.lr_find(trainer, pl_module)
            else:
                pl_module.lr = self.by_hand
                for group in trainer.optimizers[0].param_groups:
                    group["lr"] = self.by_hand
            self.found.append(pl_module.lr)

    def fit(callback: AtEpoch) -> tuple[list[float], float]:
        fullshard.seed_everything(0)
        trainer = quiet_trainer(tmp_path, max_epochs=4, callbacks=[callback], num_sanity_val_steps=0)
        model = _Net(lr=1e-3)
        trainer.fit(model, val_dataloaders=DataLoader(_data(), batch_size=16))
        assert trainer.global_step == 64
        return _sums(model), float(trainer.callback_metrics["val_loss"])

    searched = AtEpoch()
    result = fit(searched)
    assert searched.found[0] != 1e-3  # the search moved the learning rate
    assert fit(AtEpoch(by_hand=searched.found[0])) == result


def test_tuner_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    fullshard.seed_everything(0)
    model = _Net(lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    tuner = Tuner(trainer)
    finder = tuner.lr_find(model, num_training=30)
    assert finder is not None and 2 < len(finder.results["lr"]) <= 30
    assert finder.results["lr"][:2] == pytest.approx([1e-08, 3.414548873833602e-08])  # Lightning's sweep
    assert model.lr == finder.suggestion()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert trainer.global_step == 0 and not any(
        isinstance(cb, LearningRateFinder) for cb in trainer.callbacks
    )
    assert tuner.scale_batch_size(model, max_trials=4) == 16 and model.batch_size == 16
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not any(isinstance(cb, BatchSizeFinder) for cb in trainer.callbacks)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: GradientAccumulationScheduler({}), TypeError, "non-empty dict"),
        (lambda: GradientAccumulationScheduler({-1: 2}), MisconfigurationError, r"ints >= 0.*\[-1\]"),
        (lambda: GradientAccumulationScheduler({0: 0}), MisconfigurationError, r"factors must be ints >= 1"),
        (lambda: StochasticWeightAveraging(swa_lrs=-1.0), MisconfigurationError, "positive float"),
        (
            lambda: StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=0),
            MisconfigurationError,
            "int >= 1",
        ),
        (lambda: EMAWeightAveraging(decay=1.5), ValueError, r"decay must lie in \[0, 1\]"),
        (lambda: WeightAveraging(decay=0.9), TypeError, "unexpected keyword arguments"),
        (lambda: LambdaCallback(on_train_epoch_ended=print), TypeError, "not a Callback hook"),
        (lambda: LambdaCallback(on_fit_start=3), TypeError, "must be a function"),
        (lambda: ModelSummary(max_depth=-2), ValueError, "int >= -1"),
        (lambda: OnExceptionCheckpoint("x", filename=""), ValueError, "give the checkpoint a name"),
        (lambda: SpikeDetection(mode="lower"), ValueError, "use 'min'"),
        (lambda: LearningRateFinder(mode="cubic"), ValueError, "use one of"),
        (lambda: BatchSizeFinder(margin=1.0), ValueError, r"fraction in \[0, 1\)"),
        (lambda: ThroughputMonitor(len, windowsize=3), TypeError, "window_size, separator"),
        (lambda: ModelPruning("l0_unstructured"), MisconfigurationError, "torch's pruning functions are"),
        (
            lambda: ModelPruning("ln_structured", use_global_unstructured=False),
            MisconfigurationError,
            "pruning_dim",
        ),
        (
            lambda: ModelPruning("l1_unstructured", parameter_names=["gamma"]),
            MisconfigurationError,
            "can be pruned",
        ),
    ],
)
def test_bad_arguments_say_what_is_accepted(make: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    ("strategy", "method"),
    [
        (FSDPStrategy, "random_unstructured"),
        (FSDP2Strategy, "random_unstructured"),
        (ModelParallelStrategy, "l1_unstructured"),
    ],
)
def test_pruning_methods_sharded_strategies_refuse(strategy: type[Any], method: str) -> None:
    trainer: Any = type("T", (), {"strategy": strategy()})()
    with pytest.raises(MisconfigurationError, match=f"{strategy.__name__} manages the parameters itself"):
        ModelPruning(method).setup(trainer, _Net(), "fit")


def test_gradient_accumulation_with_the_trainer_argument_is_refused(tmp_path: Path) -> None:
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({0: 2})]
    )
    with pytest.raises(ValueError, match="remove one of them"):
        trainer.fit(_Net())


def test_rich_is_optional_and_named_when_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import fullshard.trainer.callbacks.rich_support as rich_support

    bar = RichProgressBar(leave=True, console_kwargs={"file": open(tmp_path / "bar.txt", "w"), "width": 120})  # noqa: SIM115
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[bar], enable_progress_bar=True)
    assert trainer.progress_bar_callback is bar
    trainer.fit(_Net())
    bar._console_kwargs["file"].close()
    assert "Epoch 0" in (tmp_path / "bar.txt").read_text()
    monkeypatch.setattr(rich_support, "RICH_AVAILABLE", False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'fullshard\[rich\]'"):
        RichProgressBar()


def test_throughput_rates_and_flops() -> None:
    throughput = Throughput(available_flops=100.0, world_size=2, window_size=2)
    throughput.update(time=1.0, batches=1, samples=4, flops=10)
    throughput.update(time=3.0, batches=3, samples=12, flops=10)
    metrics = throughput.compute()
    assert metrics["device/samples_per_sec"] == 4.0 and metrics["samples_per_sec"] == 8.0
    assert metrics["device/flops_per_sec"] == 5.0 and metrics["device/mfu"] == 0.05
    linear = nn.Linear(8, 4)
    assert measure_flops(linear, lambda: linear(torch.randn(2, 8))) == 2 * 2 * 8 * 4


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 9.894e14),
        ("NVIDIA H100 PCIe", torch.float16, 7.56e14),
        ("NVIDIA H200", torch.bfloat16, 9.89e14),
        ("NVIDIA A100-SXM4-80GB", torch.float32, 1.95e13),
        ("NVIDIA L40S", torch.bfloat16, 3.62e14),
        ("NVIDIA L4", torch.bfloat16, 1.21e14),
        ("Some Future GPU", torch.bfloat16, None),
    ],
)
def test_peak_flops_by_device_name(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: torch.dtype, peak: float | None
) -> None:
    from fullshard.trainer.callbacks.throughput import get_available_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert get_available_flops(torch.device("cuda", 0), dtype) == (None if peak is None else int(peak))
    assert get_available_flops(torch.device("cpu"), dtype) is None


def test_monitors_log_at_lightnings_steps(tmp_path: Path) -> None:
    """The names and steps Lightning 2.6.6's CSVLogger got from the same run (2 epochs of 8 steps,
    log_every_n_steps=2, a validation of 8 batches after each epoch)."""
    import csv

    from fullshard.callbacks import DeviceStatsMonitor
    from fullshard.loggers import CSVLogger

    class Linear(_Net):
        def setup(self, stage: str) -> None:
            with torch.device("meta"):
                model, x = nn.Linear(4, 1), torch.randn(8, 4)
            self.flops_per_batch = measure_flops(model, lambda: model(x), lambda y: y.sum())

    x = torch.randn(64, 4)
    data = DataLoader(TensorDataset(x, x.sum(1)), batch_size=8)
    logger = CSVLogger(tmp_path)
    monitors = [ThroughputMonitor(batch_size_fn=lambda b: len(b[0]), window_size=3), DeviceStatsMonitor()]
    trainer = quiet_trainer(
        tmp_path, max_epochs=2, logger=logger, log_every_n_steps=2, callbacks=monitors, num_sanity_val_steps=0
    )
    trainer.fit(Linear(), data, data)
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    names = set(rows[0])
    assert {"train/device/flops_per_sec", "validate/device/samples_per_sec", "train/time"} <= names
    assert "DeviceStatsMonitor.on_validation_batch_start/cpu_vm_percent" in names
    assert [r["step"] for r in rows if r["train/samples"]] == [str(s) for s in range(1, 16, 2)]
    assert [r["step"] for r in rows if r["DeviceStatsMonitor.on_train_batch_end/cpu_percent"]] == [
        str(s) for s in range(1, 16, 2)
    ]
    assert [(r["step"], float(r["validate/samples"])) for r in rows if r["validate/samples"]][:6] == [
        ("2", 16.0),
        ("4", 32.0),
        ("6", 48.0),
        ("8", 64.0),
        ("2", 16.0),
        ("4", 32.0),
    ]


def test_spike_detection_raises_and_records_the_batch(tmp_path: Path) -> None:
    spike = SpikeDetection(window=3, warmup=1, exclude_batches_path=tmp_path)
    trainer: Any = type("T", (), {"default_root_dir": str(tmp_path), "is_global_zero": True})()
    trainer.strategy = type("S", (), {"reduce_boolean_decision": staticmethod(lambda d, all=True: d)})()
    for i, loss in enumerate([1.0, 1.0, 0.9, 0.8]):
        spike.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, None, i)  # type: ignore[arg-type]
    with pytest.raises(TrainingSpikeException, match="batch 4"):
        spike.on_train_batch_end(trainer, None, {"loss": torch.tensor(50.0)}, None, 4)  # type: ignore[arg-type]
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [3, 4]


def test_on_exception_checkpoint_is_kept_after_a_failure_and_removed_after_success(tmp_path: Path) -> None:
    class Failing(_Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == 2:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    callback = OnExceptionCheckpoint(tmp_path / "ckpts")
    with pytest.raises(RuntimeError, match="boom"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(Failing())
    assert torch.load(callback.ckpt_path, weights_only=True)["global_step"] == 2
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(_Net())
    assert not Path(callback.ckpt_path).exists()


def test_model_summary_depth(tmp_path: Path, captured: pytest.LogCaptureFixture) -> None:
    trainer = quiet_trainer(
        tmp_path, max_steps=1, callbacks=[ModelSummary(max_depth=2)], enable_model_summary=True
    )
    trainer.fit(_Net())
    text = "\n".join(r.getMessage() for r in captured.records if "Total params" in r.getMessage())
    assert text.count("Total params") == 1  # the callback's table replaces the Trainer's own
    assert "backbone.0" in text and "Linear" in text


def test_model_summary_subclass_gets_lightnings_arguments(tmp_path: Path) -> None:
    seen: list[Any] = []

    class Recorded(ModelSummary):
        def summarize(
            self, summary_data: Any, total: int, trainable: int, size: float, modes: Any, **kw: Any
        ) -> None:
            seen.append((summary_data, total, trainable, modes))

    quiet_trainer(tmp_path, max_steps=1, callbacks=[Recorded(max_depth=-1), BackboneFinetuning(10)]).fit(
        _Net()
    )
    (columns, total, trainable, modes) = seen[0]
    assert [h for h, _ in columns] == [" ", "Name", "Type", "Params", "Mode", "FLOPs"]  # no example input
    assert columns[1][1] == ["backbone", "backbone.0", "backbone.1", "head"]
    assert (total, trainable, modes) == (49, 9, {"train": 4, "eval": 0})  # the backbone is frozen


def test_rich_model_summary_draws_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fullshard.callbacks import RichModelSummary

    quiet_trainer(tmp_path, max_steps=1, callbacks=[RichModelSummary(max_depth=2)]).fit(_Net())
    out = capsys.readouterr().out
    assert "backbone.0" in out and "Total params: 49" in out


@pytest.mark.multiprocess
def test_callbacks_and_tuner_on_two_processes_match_one(tmp_path: Path) -> None:
    """EMA + accumulation schedule + finetuning (with the monitors), the tuner then SWA, and the
    exception checkpoint, under ddp, fsdp and fsdp2: the same weights as one process where the
    runs are equivalent; lr_find's suggestion (from rank 0's losses, as Lightning) the same
    under the three strategies."""
    results = {}
    for name in ("single", "ddp", "fsdp", "fsdp2"):
        check_ok(run_script("callbacks_job.py", name, str(tmp_path), timeout=240))
        results[name] = json.loads((tmp_path / f"{name}.json").read_text())
    reference = results.pop("single")
    assert reference["ema_resumed"] == reference["ema_straight"]
    for name, got in results.items():
        assert got["averaged"] == pytest.approx(reference["averaged"], abs=1e-4), name
        assert got["groups"] == pytest.approx(reference["groups"]), name
        assert got["steps"] == reference["steps"] == 20 and got["epochs_seen"] == [0, 1, 2, 3], name
        assert got["throughput_logged"] and got["device_stats_logged"], name
        assert got["left_as_it_was"] and got["lr_points"] == 20, name
        assert got["lr_suggested"] == pytest.approx(results["ddp"]["lr_suggested"]), name
        assert got["swa"] == pytest.approx(results["ddp"]["swa"], abs=1e-4), name
        assert got["exception_checkpoint_step"] == 4 and got["skipped_batches"] == [2, 3], (
            name
        )  # after step 4
        assert got["rich_bar"], name
        assert got["ema_resumed"] == pytest.approx(reference["ema_straight"], abs=1e-4), name
        assert got["batch_size"] == got["batch_size_on_model"] == 8 and got["batch_size_left_as_it_was"], name
    text = (tmp_path / "rich-fsdp2.txt").read_text()
    assert "Epoch 3" in text and "Validation" not in text  # rank 0 drew the bars; no validation data
    for name, got in results.items():  # torch.nn.utils.prune on one process and DDP, shard masks under FSDP
        assert got["pruned"] == pytest.approx(reference["pruned"], abs=1e-4), name
        assert got["zeros"] == reference["zeros"] > 0, name
        assert got["pruned_per_parameter"] == pytest.approx(reference["pruned_per_parameter"], abs=1e-4), name

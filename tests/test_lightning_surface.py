"""The Lightning-shaped surface in one process: hooks, test/predict, DataModule, sanity run,
Trainer options, metric timing, errors found before any process starts."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import fullshard
from conftest import SCRIPTS, check_ok, quiet_trainer, run_script
from fullshard.errors import MisconfigurationError
from fullshard.loggers import CSVLogger

sys.path.insert(0, str(SCRIPTS))
from train_mlp import MLP, make_data


class Recorder(MLP):
    """Records the hooks called on the module and what was logged in epoch-end hooks."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.calls: list[str] = []

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{stage}")

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown:{stage}")

    def on_train_start(self) -> None:
        self.calls.append("on_train_start")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.calls.append("on_train_batch_start")

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.calls.append("on_before_backward")

    def on_after_backward(self) -> None:
        self.calls.append("on_after_backward")

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.calls.append("on_before_optimizer_step")

    def on_before_zero_grad(self, optimizer: Any) -> None:
        self.calls.append("on_before_zero_grad")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert set(outputs) == {"loss"} and outputs["loss"].requires_grad is False
        self.calls.append("on_train_batch_end")

    def on_validation_epoch_end(self) -> None:
        self.log("val_epoch_end_step", float(self.global_step))

    def on_train_epoch_end(self) -> None:
        self.log("train_epoch_end_epoch", float(self.current_epoch))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.mse_loss(self.net(x).squeeze(-1), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).squeeze(-1)


def test_module_hooks_are_called_in_lightnings_order(tmp_path: Path) -> None:
    model = Recorder(hidden=16)
    trainer = quiet_trainer(tmp_path, max_steps=2, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    per_step = [
        "on_train_batch_start",
        "on_before_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
    ]
    assert model.calls == ["setup:fit", "on_train_start", *per_step, *per_step, "teardown:fit"]
    assert model.hparams.hidden == 16 and model.global_step == 2 and model.global_rank == 0


def test_epoch_end_logs_reach_monitors_and_loggers_at_once(tmp_path: Path) -> None:
    seen: list[float] = []

    class Monitor(fullshard.Callback):
        def on_validation_end(self, trainer: Any, module: Any) -> None:
            seen.append(float(trainer.callback_metrics["val_epoch_end_step"]))

    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(tmp_path, max_epochs=2, callbacks=[Monitor()], logger=logger)
    loader = DataLoader(make_data(), batch_size=16)
    trainer.fit(Recorder(), loader, DataLoader(make_data(), batch_size=32))
    assert seen == [0.0, 6.0, 12.0]  # sanity run, then after each epoch of 6 steps: never one behind
    assert trainer.logged_metrics["train_epoch_end_epoch"] == 1.0  # the last epoch's value arrives
    rows = list(csv.DictReader(next(tmp_path.glob("lightning_logs/version_0/metrics.csv")).open()))
    # logged at Lightning's steps (the epoch's last step, 0-based); the sanity run is not logged
    assert [
        (int(r["step"]), float(r["val_epoch_end_step"])) for r in rows if r.get("val_epoch_end_step")
    ] == [
        (5, 6.0),
        (11, 12.0),
    ]
    assert [int(r["step"]) for r in rows if r.get("train_epoch_end_epoch")] == [5, 11]


def test_test_and_predict(tmp_path: Path) -> None:
    model = Recorder()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    data = make_data()
    result = trainer.test(model, DataLoader(data, batch_size=40))
    with torch.no_grad():
        expected = F.mse_loss(model.net(data.tensors[0]).squeeze(-1), data.tensors[1])
    # batches of 40, 40 and 16 weighted by size: the mean over the whole dataset
    assert result == [{"test_loss": pytest.approx(float(expected), rel=1e-5)}]
    predictions = trainer.predict(model, DataLoader(data, batch_size=40))
    assert predictions is not None and [p.shape[0] for p in predictions] == [40, 40, 16]
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(predictions), model.net(data.tensors[0]).squeeze(-1))
    assert trainer.predict(model, DataLoader(data, batch_size=40), return_predictions=False) is None
    assert model.calls.count("setup:test") == 1 and model.calls[-1] == "teardown:predict"


def test_datamodule_and_module_dataloaders(tmp_path: Path) -> None:
    class Data(fullshard.LightningDataModule):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def prepare_data(self) -> None:
            self.calls.append("prepare_data")

        def setup(self, stage: str) -> None:
            self.calls.append(f"setup:{stage}")
            self.data = make_data()

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(self.data, batch_size=16)

        def val_dataloader(self) -> DataLoader[Any]:
            return DataLoader(self.data, batch_size=32)

        def test_dataloader(self) -> DataLoader[Any]:
            return DataLoader(self.data, batch_size=32)

    dm = Data()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    model = Recorder()
    trainer.fit(model, datamodule=dm)
    assert "val_loss" in trainer.callback_metrics and trainer.datamodule is dm
    trainer.test(datamodule=dm)
    assert dm.calls == ["prepare_data", "setup:fit", "prepare_data", "setup:test"]

    class OwnData(Recorder):
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(make_data(), batch_size=16)

    trainer = quiet_trainer(tmp_path, max_steps=3)
    trainer.fit(OwnData())
    assert trainer.global_step == 3


def test_sanity_run_fast_dev_run_and_validation_schedule(tmp_path: Path) -> None:
    class CountVal(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.val_batches = 0

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.val_batches += 1
            super().validation_step(batch, batch_idx)

    train, val = DataLoader(make_data(), batch_size=16), DataLoader(make_data(), batch_size=16)
    model = CountVal()
    quiet_trainer(tmp_path, max_epochs=1).fit(model, train, val)
    assert model.val_batches == 2 + 6  # num_sanity_val_steps=2, then a full validation
    model = CountVal()
    trainer = quiet_trainer(tmp_path, max_epochs=4, check_val_every_n_epoch=2, num_sanity_val_steps=0)
    trainer.fit(model, train, val)
    assert model.val_batches == 2 * 6
    model = CountVal()
    trainer = quiet_trainer(tmp_path, max_epochs=1, val_check_interval=0.5, num_sanity_val_steps=0)
    trainer.fit(model, train, val)
    assert model.val_batches == 2 * 6
    model = CountVal()
    trainer = quiet_trainer(tmp_path, fast_dev_run=2, logger=True, enable_checkpointing=True)
    trainer.fit(model, train, val)
    assert (trainer.global_step, model.val_batches) == (2, 2)
    assert not list(tmp_path.glob("**/*.ckpt")) and not list(tmp_path.glob("lightning_logs"))


def test_scheduler_forms_and_estimated_stepping_batches(tmp_path: Path) -> None:
    totals: list[float] = []

    class OneCycle(Recorder):
        def configure_optimizers(self) -> Any:
            total = self.trainer.estimated_stepping_batches
            totals.append(total)
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=int(total))]

    trainer = quiet_trainer(tmp_path, max_epochs=3, accumulate_grad_batches=4)
    trainer.fit(OneCycle(), DataLoader(make_data(), batch_size=16))  # 6 batches: 2 steps per epoch
    assert totals[-1] == 6 and trainer.global_step == 6

    class Plateau(Recorder):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
            return {"optimizer": opt, "lr_scheduler": sched, "monitor": "val_loss"}

    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(Plateau(), DataLoader(make_data(), batch_size=16), DataLoader(make_data(), batch_size=16))
    assert trainer.lr_scheduler_configs[0].monitor == "val_loss"


def test_batch_size_is_inferred_for_epoch_means(tmp_path: Path) -> None:
    class Sizes(Recorder):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("mean_size", float(batch[0].shape[0]))  # weighted by itself: sum(n^2) / sum(n)

    trainer = quiet_trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(Sizes(), DataLoader(make_data(), batch_size=16), DataLoader(make_data(n=40), batch_size=16))
    assert float(trainer.callback_metrics["mean_size"]) == pytest.approx((16 * 16 * 2 + 8 * 8) / 40)


def test_ckpt_path_best_and_last(tmp_path: Path) -> None:
    checkpoint = fullshard.ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val_loss", save_last=True)
    trainer = quiet_trainer(tmp_path, max_epochs=2, callbacks=[checkpoint])
    model = Recorder()
    train, val = DataLoader(make_data(), batch_size=16), DataLoader(make_data(), batch_size=32)
    trainer.fit(model, train, val)
    assert checkpoint.best_model_path
    best = trainer.validate(model, val, ckpt_path="best", verbose=False)
    assert best[0]["val_loss"] == pytest.approx(float(checkpoint.best_model_score), rel=1e-5)
    assert trainer.test(ckpt_path="last", dataloaders=val, verbose=False)[0]["test_loss"] > 0
    with pytest.raises(MisconfigurationError, match=r"ckpt_path='best'\) needs a best checkpoint"):
        quiet_trainer(tmp_path).validate(model, val, ckpt_path="best")


def test_trainer_properties(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=2)
    assert trainer.model is None
    model = Recorder()
    trainer.fit(model, DataLoader(make_data(), batch_size=16))
    assert trainer.lightning_module is model and trainer.model is model  # one process: not wrapped
    assert trainer.estimated_stepping_batches == 2
    assert model.all_gather(torch.tensor([1.0, 2.0])).shape == (1, 2)
    assert isinstance(model.optimizers(), torch.optim.Optimizer) and model.lr_schedulers() is None


def test_deterministic_sets_torch(tmp_path: Path) -> None:
    before = torch.are_deterministic_algorithms_enabled()
    try:
        quiet_trainer(tmp_path, max_steps=1, deterministic=True).fit(
            Recorder(), DataLoader(make_data(), batch_size=16)
        )
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


def test_errors_before_any_process_starts(tmp_path: Path) -> None:
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'max_epoch'. Did you mean 'max_epochs'"
    ):
        fullshard.Trainer(max_epoch=3)
    with pytest.raises(MisconfigurationError, match=r"Trainer\(model_registry='x'\) is a Lightning option"):
        fullshard.Trainer(model_registry="x")
    fullshard.Trainer(
        accelerator="cpu", model_registry=None, barebones=False
    )  # Lightning's "off" values pass
    trainer = fullshard.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)

    # a 2-process Trainer: each error below comes at once, with no process started
    with pytest.raises(
        MisconfigurationError,
        match=r"train_dataloaders must be a torch.utils.data.DataLoader, got TensorDataset",
    ):
        trainer.fit(Recorder(), make_data())
    with pytest.raises(MisconfigurationError, match=r"Trainer.test\(\) needs MLP.test_step"):
        trainer.test(MLP(), DataLoader(make_data()))
    with pytest.raises(MisconfigurationError, match=r"Trainer.fit\(\) got no train data"):
        trainer.fit(Recorder())

    class Manual(Recorder):
        automatic_optimization = False

    accumulating = fullshard.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", logger=False, accumulate_grad_batches=2
    )
    with pytest.raises(
        MisconfigurationError, match=r"accumulate_grad_batches=2\) accumulates in automatic optimization only"
    ):
        accumulating.fit(Manual(), DataLoader(make_data()))

    class CustomStep(Recorder):
        def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            pass  # forgets to run the closure

    with pytest.raises(MisconfigurationError, match=r"optimizer_step\(\) did not run the optimizer closure"):
        quiet_trainer(tmp_path, max_steps=1).fit(CustomStep(), DataLoader(make_data(), batch_size=16))


def test_log_in_epoch_hook_with_on_step_is_refused(tmp_path: Path) -> None:
    class Bad(Recorder):
        def on_train_epoch_end(self) -> None:
            self.log("x", 1.0, on_step=True)

    with pytest.raises(
        MisconfigurationError, match=r"log\('x', on_step=True\) was called in an epoch-level hook"
    ):
        quiet_trainer(tmp_path, max_epochs=1).fit(Bad(), DataLoader(make_data(), batch_size=16))
    assert math.isfinite(1.0)


@pytest.mark.multiprocess
def test_validation_loss_is_the_same_on_1_2_and_3_processes(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPTS))
    from val_weighting import Fixed
    from val_weighting import make_data as val_data

    data = val_data()
    with torch.no_grad():
        expected = float(F.mse_loss(Fixed().layer(data.tensors[0]).squeeze(-1), data.tensors[1]))
    for devices, strategy in ((1, "ddp"), (2, "fsdp"), (3, "ddp")):
        out = tmp_path / f"{devices}.json"
        check_ok(
            run_script(
                "val_weighting.py", "--out", str(out), "--devices", str(devices), "--strategy", strategy
            )
        )
        # each batch weighs its size (the short last batch less), so the mean is the dataset's
        assert json.loads(out.read_text())["val_loss"] == pytest.approx(expected, rel=1e-6), devices


def test_a_short_run_saves_a_checkpoint_and_writes_its_log_folder(tmp_path: Path) -> None:
    # 3 steps of a 6-batch epoch, fewer than log_every_n_steps: Lightning still ends the epoch
    # (checkpoint) and the run has its log folder
    trainer = quiet_trainer(tmp_path, max_steps=3, logger=True, enable_checkpointing=True)
    trainer.fit(Recorder(), DataLoader(make_data(), batch_size=16))
    assert (tmp_path / "lightning_logs" / "version_0").is_dir()
    assert [p.name for p in tmp_path.glob("**/*.ckpt")] == ["epoch=0-step=3.ckpt"]


class _NumpyNoise(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        import numpy as np

        return torch.tensor([float(np.random.rand())])


def test_seed_everything_workers_seeds_numpy_in_each_worker(tmp_path: Path) -> None:
    seen: list[list[float]] = []

    class Collect(Recorder):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen[-1].extend(batch.flatten().tolist())
            return self.net(torch.zeros(1, 8)).sum() * 0

    for _ in range(2):
        assert fullshard.seed_everything(5, workers=True) == 5
        seen.append([])
        loader = DataLoader(_NumpyNoise(), batch_size=2, num_workers=2)
        quiet_trainer(tmp_path, max_epochs=1).fit(Collect(), loader)
    fullshard.seed_everything(0)
    assert seen[0] == seen[1]  # reproducible
    assert len(set(seen[0])) == 8  # without per-worker seeding both workers draw the same numbers


@pytest.mark.multiprocess
def test_bad_configure_optimizers_ends_a_two_process_job_at_once(tmp_path: Path) -> None:
    """Checked by rank 0 before it joins the process group: one message, no waiting."""
    import time

    started = time.monotonic()
    result = run_script("launch_bad_optimizer.py", timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert result.stderr.count("configure_optimizers() returned None") == 1, result.stderr
    assert elapsed < 15, elapsed


# ----------------------------------------------- Lightning's module, Trainer and strategy surface
def test_module_trainer_and_strategy_surface_behave_as_lightnings(tmp_path: Path) -> None:
    """Steps without batch_idx, barebones, init_module, the dataloader views, storage_options,
    the strategies' kwargs/mixed_precision_config/device_mesh: tests/scripts/lightning_api_lightning.py
    measures both sides with one body, Lightning 2.6.6's in its own environment."""
    from lightning_api_lightning import behaviour

    from fullshard import strategies
    from lckpt_models import lightning_python

    python = lightning_python()
    script = SCRIPTS / "lightning_api_lightning.py"
    result = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lightning = json.loads(result.stdout.strip().splitlines()[-1])
    (tmp_path / "fs").mkdir()
    ours = json.loads(json.dumps(behaviour(fullshard, strategies, tmp_path / "fs")))
    # documented in docs/lightning.md: the views outlive the call (Lightning's are reset, but the
    # last predict's), and empty_init builds parameters on the meta device, initialised by their
    # layers when the strategy sets the model up (Lightning: uninitialised memory)
    assert lightning["no_batch_idx"].pop("dataloaders") == ["NoneType", "NoneType", "NoneType", "DataLoader"]
    assert ours["no_batch_idx"].pop("dataloaders") == ["DataLoader"] * 4
    assert (lightning.pop("init_module_empty_init_device"), ours.pop("init_module_empty_init_device")) == (
        "cpu",
        "meta",
    )
    assert ours == lightning


@pytest.mark.multiprocess
def test_module_trainer_and_strategy_surface_on_two_processes(tmp_path: Path) -> None:
    """The same script under ddp, fsdp and fsdp2 (2 CPU processes): steps without batch_idx,
    a model built in init_module, the dataloader views, and the strategy's state-dict,
    optimizer-state, reduce and checkpoint methods; every strategy trains the same weights."""
    results = {}
    for strategy in ("ddp", "fsdp", "fsdp2"):
        out = tmp_path / strategy
        out.mkdir()
        check_ok(run_script("lightning_api_job.py", "--out", str(out), "--strategy", strategy))
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert ranks[0] == ranks[1], strategy  # full states on every rank
        results[strategy] = seen = ranks[0]
        assert (seen["train_dataloader"], seen["distributed"], seen["val_dataloaders"]) == (
            "DataLoader",
            True,
            "DataLoader",
        )
        assert seen["global_step"] == 4 and seen["predictions"] == [[8, 1], [8, 1]]
        keys = ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
        assert seen["state_keys"] == keys and seen["optimizer_state_params"] == keys
        assert seen["optimizer_state_keys"] == ["param_groups", "state"]
        assert seen["reduce_sum"] == 2.0 and seen["precision_plugin"] == "32-true"
        assert seen["trainer_precision_plugin_is_strategys"]
        assert seen["hand_written"] == {"note": "by hand", "state_keys": keys}
        assert seen["loaded_rest"] == {"global_step": 4, "has_state_dict": False}
        assert seen["reloaded_sum"] == seen["state_sum"]
    assert {seen["built_on"] for seen in results.values()} == {"cpu"}
    # init_module(empty_init=True): built on the meta device, initialised when each strategy sets it up
    for strategy in ("ddp", "fsdp2"):
        out = tmp_path / f"{strategy}-empty"
        out.mkdir()
        check_ok(
            run_script("lightning_api_job.py", "--out", str(out), "--strategy", strategy, "--empty-init")
        )
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert ranks[0] == ranks[1] and ranks[0]["built_on"] == "meta" and ranks[0]["global_step"] == 4
        assert math.isfinite(ranks[0]["state_sum"]) and ranks[0]["reloaded_sum"] == ranks[0]["state_sum"]
    # DDPStrategy(ddp_comm_hook=): fp16 compression of the gradients, close to ddp's weights, not equal
    out = tmp_path / "ddp_fp16_hook"
    out.mkdir()
    check_ok(run_script("lightning_api_job.py", "--out", str(out), "--strategy", "ddp_fp16_hook"))
    compressed = json.loads((out / "rank0.json").read_text())["state_sum"]
    assert compressed == pytest.approx(results["ddp"]["state_sum"], rel=1e-4)
    assert compressed != results["ddp"]["state_sum"]
    assert results["fsdp"]["state_sum"] == pytest.approx(results["ddp"]["state_sum"], rel=1e-5)
    assert results["fsdp2"]["state_sum"] == pytest.approx(results["ddp"]["state_sum"], rel=1e-5)
    assert results["fsdp"]["val_loss"] == pytest.approx(results["ddp"]["val_loss"], rel=1e-5)


def test_lightning_plugin_arguments_are_refused_at_once() -> None:
    from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy

    FSDPStrategy(precision_plugin=None, checkpoint_io=None)  # Lightning's defaults pass
    with pytest.raises(
        MisconfigurationError,
        match=r"FSDPStrategy\(precision_plugin='bf16'\) is a Lightning plugin argument.*Trainer\(precision='bf16-mixed'\)"
        r".*mixed_precision=",
    ):
        FSDPStrategy(precision_plugin="bf16")
    with pytest.raises(MisconfigurationError, match=r"FSDP2Strategy\(precision_plugin=1\)"):
        FSDP2Strategy(precision_plugin=1)
    with pytest.raises(MisconfigurationError, match=r"DDPStrategy\(checkpoint_io='io'\).*state_dict_type="):
        DDPStrategy(checkpoint_io="io")
    with pytest.raises(MisconfigurationError, match=r"configure a communication hook: pass the hook too"):
        DDPStrategy(ddp_comm_state=object())
    with pytest.warns(DeprecationWarning, match=r"pass activation_checkpointing_policy=\{Linear\} instead"):
        assert (
            FSDPStrategy(activation_checkpointing=torch.nn.Linear).activation_checkpointing_policy is not None
        )
    with pytest.raises(
        MisconfigurationError,
        match=r"got both activation_checkpointing= and activation_checkpointing_policy=",
    ):
        FSDPStrategy(
            activation_checkpointing=[torch.nn.Linear], activation_checkpointing_policy={torch.nn.Linear}
        )


def test_strategy_precision_views_and_refusals(tmp_path: Path) -> None:
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    from fullshard.strategies import FSDP2Strategy, FSDPStrategy, ModelParallelStrategy

    # fullshard's "-mixed" under FSDP reduces gradients in float32 (Lightning: in the half dtype);
    # mixed_precision= gives Lightning's choice (docs/lightning.md)
    fsdp = fullshard.Trainer(accelerator="cpu", devices=2, strategy="fsdp", precision="bf16-mixed").strategy
    config = fsdp.mixed_precision_config
    assert (config.param_dtype, config.reduce_dtype) == (torch.bfloat16, torch.float32)
    lightnings = MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16)
    assert FSDPStrategy(mixed_precision=lightnings).mixed_precision_config is lightnings
    assert FSDPStrategy().mixed_precision_config.param_dtype == torch.float32  # before the Trainer: 32-true
    assert isinstance(FSDP2Strategy().mixed_precision_config, MixedPrecisionPolicy)
    assert FSDPStrategy(limit_all_gathers=True).kwargs == {"limit_all_gathers": True, "use_orig_params": True}
    assert fsdp.precision_plugin is fsdp.precision
    with pytest.raises(
        RuntimeError, match=r"ModelParallelStrategy.device_mesh is built once the processes started"
    ):
        ModelParallelStrategy().device_mesh  # noqa: B018
    single = quiet_trainer(tmp_path, max_steps=1)
    single.fit(Recorder(), DataLoader(make_data(), batch_size=16))
    with pytest.raises(MisconfigurationError, match=r"reduce\(reduce_op='prod'\) is not supported"):
        single.strategy.reduce(torch.ones(1), reduce_op="prod")
    with pytest.raises(TypeError, match=r"save_checkpoint\(storage_options=\{'a': 1\}\): fullshard writes"):
        single.strategy.save_checkpoint({}, tmp_path / "x.ckpt", {"a": 1})
    single.strategy.remove_checkpoint(tmp_path / "absent.ckpt")  # nothing there: nothing to do


def test_barebones_refusals_say_what_to_do(tmp_path: Path) -> None:
    for option, value, what in [
        ("logger", True, "Logging can slow the loop down"),
        ("enable_checkpointing", True, "Checkpointing can slow the loop down"),
        ("num_sanity_val_steps", 2, "Sanity checking can slow the loop down"),
        ("fast_dev_run", 1, "A development run is off in barebones mode"),
        ("profiler", "simple", "Profiling is off in barebones mode"),
    ]:
        with pytest.raises(
            ValueError,
            match=rf"Trainer\(barebones=True, {option}={value!r}\) was passed. {what}.*leave {option} out, or drop "
            r"barebones=True",
        ):
            fullshard.Trainer(accelerator="cpu", barebones=True, **{option: value})
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, barebones=True, max_steps=1, default_root_dir=tmp_path
    )
    assert (trainer.barebones, trainer.loggers, trainer.checkpoint_callback) == (True, [], None)

    class Logs(Recorder):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("dropped", 1.0)
            return super().training_step(batch, batch_idx)

    with pytest.warns(UserWarning, match=r"self.log\('dropped'\) was called with Trainer\(barebones=True\)"):
        trainer.fit(Logs(), DataLoader(make_data(), batch_size=16))
    assert trainer.callback_metrics == {} and not list(tmp_path.iterdir())


def test_step_signatures_decide_batch_idx() -> None:
    """Lightning's rule: batch_idx is passed to a step that names it, takes *args, or has two
    positional parameters (whatever their names)."""
    from fullshard.strategies.step_args import step_arguments

    class Steps:
        def training_step(self, batch: Any) -> None: ...
        def validation_step(self, batch: Any, idx: int) -> None: ...
        def test_step(self, *args: Any) -> None: ...
        def predict_step(self, batch: Any, *, batch_idx: int = 0) -> None: ...

    steps = Steps()
    assert step_arguments(steps, "training_step", "b", 3, ()) == ("b",)
    assert step_arguments(steps, "validation_step", "b", 3, (1,)) == ("b", 3, 1)
    assert step_arguments(steps, "test_step", "b", 3, ()) == ("b", 3)
    assert step_arguments(steps, "predict_step", "b", 3, ()) == ("b", 3)


def test_trainer_save_checkpoint_refuses_storage_options(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(Recorder(), DataLoader(make_data(), batch_size=16))
    with pytest.raises(
        TypeError, match=r"save_checkpoint\(storage_options=\{'bucket': 'b'\}\): fullshard writes"
    ):
        trainer.save_checkpoint(tmp_path / "x.ckpt", storage_options={"bucket": "b"})
    trainer.save_checkpoint(tmp_path / "x.ckpt", storage_options=None)
    assert (tmp_path / "x.ckpt").exists()


def test_single_device_strategy_takes_its_device(tmp_path: Path) -> None:
    from fullshard.strategies import SingleDeviceStrategy

    trainer = quiet_trainer(tmp_path, max_steps=1, strategy=SingleDeviceStrategy("cpu"))
    trainer.fit(Recorder(), DataLoader(make_data(), batch_size=16))
    assert trainer.strategy.root_device == torch.device("cpu") and trainer.global_step == 1
    with pytest.raises(
        MisconfigurationError,
        match=r"SingleDeviceStrategy\(device='cuda:1'\) runs on cuda, but the Trainer's accelerator is 'cpu': pass "
        r"Trainer\(accelerator='cuda'\)",
    ):
        fullshard.Trainer(accelerator="cpu", strategy=SingleDeviceStrategy(1))
    with pytest.raises(
        MisconfigurationError, match=r"SingleDeviceStrategy\(precision_plugin='p'\) is a Lightning plugin"
    ):
        SingleDeviceStrategy("cpu", precision_plugin="p")

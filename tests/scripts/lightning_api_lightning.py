"""What Lightning 2.6.6 does with the module, Trainer and strategy surface that
tests/test_lightning_surface.py checks fullshard against, in one CPU process; prints it as JSON.

/tmp/lvenv/bin/python tests/scripts/lightning_api_lightning.py   (a Python with lightning==2.6.6)

The same code runs under fullshard when given ``--fullshard`` (the test does that in its own
process through :func:`behaviour`), so both sides are measured by one script.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def behaviour(L: Any, strategies: Any, root: Path) -> dict[str, Any]:
    """What ``L`` (``lightning.pytorch`` or ``fullshard``) does; ``strategies``: its strategies module."""

    class NoBatchIdx(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch: Any) -> torch.Tensor:
            self.log("train_loss", 1.0)
            return F.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch: Any) -> None:
            self.log("val_loss", F.mse_loss(self.net(batch[0]), batch[1]))

        def test_step(self, batch: Any) -> None:
            self.log("test_loss", F.mse_loss(self.net(batch[0]), batch[1]))

        def predict_step(self, batch: Any) -> torch.Tensor:
            return self.net(batch[0])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    quiet = {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "enable_model_summary": False}
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    loader = DataLoader(data, batch_size=4)
    seen: dict[str, Any] = {}

    trainer = L.Trainer(max_steps=4, logger=False, enable_checkpointing=False, default_root_dir=root, **quiet)
    model = NoBatchIdx()
    seen["dataloaders_before_fit"] = [trainer.train_dataloader, trainer.val_dataloaders]
    trainer.fit(model, loader, loader)
    seen["no_batch_idx"] = {
        "global_step": trainer.global_step,
        "logged": sorted(trainer.callback_metrics),
        "test": sorted(trainer.test(model, loader, verbose=False)[0]),
        "predictions": [list(p.shape) for p in trainer.predict(model, loader)],
        "dataloaders": [
            type(trainer.train_dataloader).__name__,
            type(trainer.val_dataloaders).__name__,
            type(trainer.test_dataloaders).__name__,
            type(trainer.predict_dataloaders).__name__,
        ],
    }
    try:
        trainer.save_checkpoint(root / "x.ckpt", storage_options={"bucket": "b"})
        seen["save_checkpoint_storage_options"] = "accepted"
    except TypeError:
        seen["save_checkpoint_storage_options"] = "TypeError"

    # a call that raises: interrupted from the callbacks' on_exception on; no SIGTERM was received
    flags: list[bool] = []

    class Boom(NoBatchIdx):
        def training_step(self, batch: Any) -> torch.Tensor:
            raise RuntimeError("boom")

    class SeesIt(L.Callback):
        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            flags.append(trainer.interrupted)

    failing = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, callbacks=[SeesIt()], **quiet)
    with contextlib.suppress(RuntimeError):
        failing.fit(Boom(), loader)
    seen["interrupted"] = [flags, failing.interrupted, trainer.interrupted, trainer.received_sigterm]

    # barebones: what it turns off, what it refuses
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bare = L.Trainer(barebones=True, max_steps=2, default_root_dir=root, accelerator="cpu", devices=1)
        bare.fit(NoBatchIdx(), loader, loader)
    seen["barebones"] = {
        "loggers": len(bare.loggers),
        "checkpoint_callback": bare.checkpoint_callback is not None,
        "num_sanity_val_steps": bare.num_sanity_val_steps,
        "callback_metrics": sorted(bare.callback_metrics),
        "log_warned": any("barebones=True" in str(w.message) and "log" in str(w.message) for w in caught),
        "written": sorted(p.name for p in root.iterdir() if p.name != "x.ckpt"),
    }
    refused = {}
    for name, value in [
        ("enable_checkpointing", True),
        ("logger", True),
        ("enable_progress_bar", True),
        ("log_every_n_steps", 5),
        ("enable_model_summary", True),
        ("num_sanity_val_steps", 2),
        ("fast_dev_run", True),
        ("detect_anomaly", True),
        ("profiler", "simple"),
        ("enable_checkpointing", False),
        ("logger", False),
        ("num_sanity_val_steps", 0),
    ]:
        try:
            L.Trainer(barebones=True, accelerator="cpu", **{name: value})
            refused[f"{name}={value!r}"] = False
        except ValueError:
            refused[f"{name}={value!r}"] = True
    seen["barebones_refuses"] = refused

    # init_module: tensors made in the precision's dtype
    with L.Trainer(precision="bf16-true", logger=False, **quiet).init_module():
        seen["init_module_dtype"] = str(nn.Linear(2, 2).weight.dtype)
    with L.Trainer(logger=False, **quiet).init_module(empty_init=True):
        seen["init_module_empty_init_device"] = nn.Linear(2, 2).weight.device.type

    # the strategies
    try:
        strategies.ModelParallelStrategy().device_mesh  # noqa: B018  # the read is the check
        seen["model_parallel_mesh_before_setup"] = "returned"
    except RuntimeError:
        seen["model_parallel_mesh_before_setup"] = "RuntimeError"
    fsdp = strategies.FSDPStrategy()
    seen["fsdp_kwargs_use_orig_params"] = fsdp.kwargs.get("use_orig_params")
    seen["fsdp_mixed_precision_config"] = type(fsdp.mixed_precision_config).__name__

    # the module's and DataModule's smaller members
    class Hyper(L.LightningModule):
        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    hyper = Hyper()
    hyper.hparams.lr = 0.5
    hyper.freeze()
    frozen = (hyper.training, any(p.requires_grad for p in hyper.parameters()))
    hyper.unfreeze()
    seen["module"] = {
        "hparams_initial": dict(hyper.hparams_initial),
        "frozen": frozen,
        "unfrozen": (hyper.training, all(p.requires_grad for p in hyper.parameters())),
        "dtype": str(hyper.dtype),
        "on_gpu": hyper.on_gpu,
        "example_input_array": hyper.example_input_array,
    }
    with torch.no_grad():
        x = torch.ones(3, 2)
        scripted = hyper.to_torchscript(file_path=root / "scripted.pt")
        traced = hyper.to_torchscript(method="trace", example_inputs=x)
        seen["to_torchscript"] = [
            torch.equal(scripted(x), hyper(x)),
            torch.equal(torch.jit.load(str(root / "scripted.pt"))(x), hyper(x)),
            torch.equal(traced(x), hyper(x)),
            hyper.training,
        ]
    hyper.remove_ignored_hparams(["lr", "absent"])
    seen["remove_ignored_hparams"] = [dict(hyper.hparams), dict(hyper.hparams_initial)]
    dm = L.LightningDataModule.from_datasets(data, val_dataset=[data, data], batch_size=8)
    seen["from_datasets"] = [len(dm.train_dataloader()), [len(d) for d in dm.val_dataloader()], dm.name]

    # LightningDataModule.load_from_checkpoint: its hyperparameters and state from a checkpoint
    class Data(L.LightningDataModule):
        def __init__(self, batch_size: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.loaded: Any = None

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(data, batch_size=self.hparams.batch_size)

        def state_dict(self) -> dict[str, Any]:
            return {"seen": 3}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.loaded = state_dict

    dm_trainer = L.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, default_root_dir=root, **quiet
    )
    dm_trainer.fit(NoBatchIdx(), datamodule=Data(batch_size=2))
    dm_trainer.save_checkpoint(root / "dm" / "data.ckpt")
    restored = Data.load_from_checkpoint(root / "dm" / "data.ckpt")
    overridden = Data.load_from_checkpoint(root / "dm" / "data.ckpt", batch_size=8)
    seen["datamodule_from_checkpoint"] = [
        dict(restored.hparams),
        restored.loaded,
        overridden.hparams.batch_size,
    ]

    # lightning.pytorch.utilities
    utilities = importlib.import_module(f"{L.__name__}.utilities")
    layer = nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(6.0).reshape(2, 3))
        layer.bias.copy_(torch.tensor([1.0, -1.0]))
    layer(torch.ones(1, 3)).pow(2).sum().backward()
    seen["grad_norm"] = {k: round(float(v), 4) for k, v in utilities.grad_norm(layer, 2).items()}
    seen["grad_norm_inf"] = sorted(utilities.grad_norm(layer, "inf"))
    seen["utilities"] = {
        "clip_norm_is_norm": utilities.GradClipAlgorithmType.NORM == "norm",
        "picklable": [utilities.is_picklable(1), utilities.is_picklable(lambda: 1)],
        "moved": str(utilities.move_data_to_device({"x": torch.ones(1)}, "cpu")["x"].device),
        "rank_zero_only": utilities.rank_zero_only(lambda: 3)(),
        "hparams": dict(utilities.AttributeDict(a=1)),
        "shared_filesystem": utilities.is_shared_filesystem(trainer.strategy),
    }
    return seen


def main() -> None:
    if "--fullshard" in sys.argv:
        import fullshard as L
        from fullshard import strategies
    else:
        import lightning.pytorch as L
        from lightning.pytorch import strategies
    with tempfile.TemporaryDirectory() as root:
        seen = behaviour(L, strategies, Path(root))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()

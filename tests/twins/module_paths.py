"""Twin cases for Lightning's module paths (tests/test_module_paths.py runs them under Lightning
2.6.6 and fullshard): the imports Lightning's own example scripts make, the plugin objects
``Trainer(plugins=)`` maps, and the demo classes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from twin import imp, main

# What examples/pytorch of Lightning's repository import (serve aside: fullshard has not it).
EXAMPLE_IMPORTS = {
    "": [
        "LightningDataModule",
        "LightningModule",
        "Trainer",
        "callbacks",
        "cli_lightning_logo",
        "seed_everything",
    ],
    "callbacks": ["ModelCheckpoint", "TQDMProgressBar"],
    "callbacks.finetuning": ["BaseFinetuning"],
    "cli": ["LightningCLI"],
    "core": ["LightningModule"],
    "demos": ["Transformer", "WikiText2"],
    "demos.mnist_datamodule": ["MNIST", "MNISTDataModule"],
    "profilers.pytorch": ["PyTorchProfiler"],
    "strategies": ["ModelParallelStrategy", "ParallelStrategy"],
    "trainer": ["Trainer"],
    "utilities": ["rank_zero_info", "rank_zero_only"],
    "utilities.imports": ["_TORCHVISION_AVAILABLE"],
    "utilities.model_helpers": ["get_torchvision_model"],
}


def _trainer(**kwargs: Any) -> Any:
    return imp().Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, **kwargs)


def _fails(fn: Any) -> bool:
    try:
        fn()
    except Exception:
        return True
    return False


def case_example_imports(tmp: Path) -> dict[str, list[str]]:
    return {path: [n for n in names if hasattr(imp(path), n)] for path, names in EXAMPLE_IMPORTS.items()}


def case_precision_plugins(tmp: Path) -> dict[str, Any]:
    precision = imp("plugins.precision")
    return {
        "mixed": _trainer(plugins=[precision.MixedPrecision("bf16-mixed", "cpu")]).precision,
        "half": _trainer(plugins=precision.HalfPrecision("bf16-true")).precision,
        "with precision=": _fails(lambda: _trainer(precision="16-true", plugins=[precision.HalfPrecision()])),
        "two": _fails(lambda: _trainer(plugins=[precision.HalfPrecision(), precision.MixedPrecision("bf16-mixed", "cpu")])),
        "bad mixed": _fails(lambda: precision.MixedPrecision("16-true", "cpu")),
    }  # fmt: skip


def case_environment_plugin(tmp: Path) -> dict[str, bool]:
    environment = imp("plugins.environments").LightningEnvironment()
    trainer = _trainer(strategy="ddp", plugins=[environment])
    return {"the strategy's environment": trainer.strategy.cluster_environment is environment}


def case_wikitext2_from_a_local_file(tmp: Path) -> dict[str, Any]:
    (tmp / "wikitext-2.txt").write_text("the cat sat on the mat\nthe dog sat\n" * 20)
    data = imp("demos").WikiText2(data_dir=tmp, block_size=5, download=False)
    inputs, target = data[2]
    return {"vocab": data.vocab_size, "len": len(data), "inputs": inputs, "target": target}


def case_boring_model_trains(tmp: Path) -> dict[str, Any]:
    imp().seed_everything(7)
    model = imp("demos").BoringModel()
    # drawn here: when fit asks for the loaders the two frameworks have drawn different random numbers
    loader = model.train_dataloader()
    trainer = _trainer(
        max_steps=3, limit_val_batches=0, enable_checkpointing=False, enable_model_summary=False
    )
    trainer.fit(model, loader)
    return {"weight": model.layer.weight, "step": trainer.global_step}


if __name__ == "__main__":
    main()

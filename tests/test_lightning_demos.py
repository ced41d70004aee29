"""What Lightning's examples import besides the Trainer: the demos (``lightning.pytorch.demos``;
no downloads: synthetic data with one warning), ``cli_lightning_logo``,
``get_torchvision_model``, ``is_overridden``."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import fullshard
from conftest import quiet_trainer
from fullshard.demos import BoringModel, LightningTransformer, WikiText2
from fullshard.demos.mnist_datamodule import MNIST, MNISTDataModule


def _caught(make: object) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()  # type: ignore[operator]
    return [str(w.message) for w in caught]


def test_wikitext2_reads_a_local_copy(tmp_path: Path) -> None:
    (tmp_path / "wikitext-2.txt").write_text("the cat sat\n on the mat\n")
    data = WikiText2(data_dir=tmp_path, block_size=3)
    # "the cat sat <eos> on the mat <eos>": 8 ids, 7 words; blocks of 3 and the next token
    assert data.vocab_size == 6 and data.data.tolist() == [0, 1, 2, 3, 4, 0, 5, 3]
    assert len(data) == 1
    inputs, target = data[0]
    assert inputs.tolist() == [0, 1, 2] and target.tolist() == [1, 2, 3] and inputs.dtype == torch.int64


def test_wikitext2_without_the_file_is_synthetic_and_says_so_once(tmp_path: Path) -> None:
    messages = _caught(lambda: [WikiText2(data_dir=tmp_path / "none"), WikiText2(data_dir=tmp_path / "none")])
    assert len(messages) == 1 and "synthetic" in messages[0] and "downloads nothing" in messages[0]
    data = WikiText2(data_dir=tmp_path / "none", block_size=35)
    inputs, target = data[3]
    assert inputs.shape == target.shape == (35,) and inputs.dtype == torch.int64
    assert torch.equal(inputs[1:], target[:-1]) and data.vocab_size > 100 and len(data) > 1000


def test_mnist_without_files_is_synthetic_digits_with_lightnings_shapes(tmp_path: Path) -> None:
    root = str(tmp_path)
    messages = _caught(lambda: [MNIST(root, train=False), MNIST(root, train=False, download=True)])
    assert len(messages) == 1 and "synthetic digits" in messages[0]
    test = MNIST(root, train=False)
    image, label = test[0]
    assert len(test) == 10_000 and image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert isinstance(label, int) and 0 <= label < 10
    dm = MNISTDataModule(data_dir=root, num_workers=0, batch_size=32)
    dm.setup("fit")
    assert (len(dm.dataset_train), len(dm.dataset_val), dm.num_classes) == (55_000, 5_000, 10)
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (32, 1, 28, 28) and y.dtype == torch.int64


@pytest.mark.filterwarnings("ignore:WikiText2. there is no")  # prepare_data's WikiText2() in ./data
def test_lightnings_demo_modules_train(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=2)
    model = BoringModel()
    before = model.layer.weight.detach().clone()
    trainer.fit(model)
    assert trainer.global_step == 2 and not torch.equal(before, model.layer.weight)
    (tmp_path / "wikitext-2.txt").write_text("a b c d e f g h\n" * 40)  # a small vocabulary: fast
    dataset = WikiText2(data_dir=tmp_path)
    model = LightningTransformer(vocab_size=dataset.vocab_size)
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(model, DataLoader(dataset, batch_size=4))
    assert trainer.global_step == 1 and torch.isfinite(
        trainer.callback_metrics.get("loss", torch.tensor(0.0))
    )


def test_cli_lightning_logo_prints_a_banner(capsys: pytest.CaptureFixture[str]) -> None:
    fullshard.cli_lightning_logo()
    out = capsys.readouterr().out
    assert "\033[0;35m" in out and len(out.splitlines()) > 5


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
def test_get_torchvision_model_without_torchvision_says_what_to_install() -> None:
    from fullshard.utilities.model_helpers import get_torchvision_model

    with pytest.raises(
        ModuleNotFoundError,
        match=r"get_torchvision_model\('resnet18'\) needs torchvision.*pip install torchvision",
    ):
        get_torchvision_model("resnet18", weights=None)


def test_is_overridden() -> None:
    from fullshard.utilities.model_helpers import is_overridden

    assert is_overridden("training_step", BoringModel()) and not is_overridden("on_fit_start", BoringModel())
    assert not is_overridden("on_fit_start", None)
    with pytest.raises(
        ValueError, match=r"is_overridden\('forward'\): Linear is no LightningModule.*pass parent="
    ):
        is_overridden("forward", torch.nn.Linear(1, 1))


class _Servable:
    """A BoringModel made servable, as in Lightning's ServableModule docstring."""

    @staticmethod
    def make(response: list[int]) -> object:
        from fullshard.serve import ServableModule

        class ServableBoringModel(BoringModel, ServableModule):
            def configure_payload(self) -> dict[str, object]:
                return {"body": {"x": list(range(32))}}

            def configure_serialization(self) -> tuple[dict[str, object], dict[str, object]]:
                return {"x": lambda x: torch.tensor(x, dtype=torch.float).unsqueeze(0)}, {
                    "output": lambda y: y.tolist()
                }

            def serve_step(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
                assert not self.training and not torch.is_grad_enabled()
                return {"output": torch.tensor([0, 1])}

            def configure_response(self) -> dict[str, object]:
                return {"output": response}

        return ServableBoringModel()


@pytest.mark.parametrize("name", ["FSDPStrategy", "FSDP2Strategy", "ModelParallelStrategy"])
def test_servable_module_validator_refuses_sharded_parameters(tmp_path: Path, name: str) -> None:
    # asked of the Strategy contract (shards_parameters): one process holds no whole model
    import fullshard.strategies
    from fullshard.serve import ServableModuleValidator

    strategy = getattr(fullshard.strategies, name)()
    trainer = fullshard.Trainer(accelerator="cpu", devices=2, strategy=strategy, default_root_dir=tmp_path)
    with pytest.raises(
        fullshard.errors.MisconfigurationError,
        match=rf"ServableModuleValidator under {name}: the parameters are sharded across processes",
    ):
        ServableModuleValidator().on_train_start(trainer, _Servable.make([0, 1]))


def test_servable_module_validator_answers_the_payload(tmp_path: Path) -> None:
    from fullshard.serve import ServableModuleValidator

    validator = ServableModuleValidator()
    trainer = quiet_trainer(tmp_path, max_steps=1, limit_val_batches=0, callbacks=[validator])
    trainer.fit(_Servable.make([0, 1]))
    assert validator.successful and validator.resp is not None
    assert validator.resp.json() == {"output": [0, 1]} and validator.resp.status_code == 200
    bad = quiet_trainer(tmp_path, max_steps=1, limit_val_batches=0, callbacks=[ServableModuleValidator()])
    with pytest.raises(
        fullshard.errors.MisconfigurationError,
        match=r"expected response \{'output': \[1, 1\]\} is not the one served",
    ):
        bad.fit(_Servable.make([1, 1]))
    with pytest.raises(
        fullshard.errors.MisconfigurationError, match=r"optimization='onnx'.*leave optimization out"
    ):
        ServableModuleValidator(optimization="onnx")

"""The compile= option: checking it, where it compiles, parity with eager, recompiles, checkpoints.

The training runs happen in two jobs (tests/scripts/compile_job.py): one process with the default
inductor backend (the suite's one real inductor build: a one-Block model, so few kernels to
build), and two processes (FSDP with a unit per block, and DDP) with ``aot_eager``, which
traces the same graphs without building C++ kernels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fullshard
from conftest import check_ok, quiet_trainer, run_script
from fullshard.compile import (
    CompileConfig,
    CompileUnit,
    _call_for,
    _holding_grads,
    apply_compile,
    parse_compile,
)
from fullshard.errors import MisconfigurationError
from fullshard.strategies import FSDPStrategy

FP32_TOL = {"rtol": 1e-4, "atol": 1e-5}
BF16_TOL = {"rtol": 2e-2, "atol": 2e-3}


# ------------------------------------------------------------------------------ the option itself
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (False, CompileConfig(enabled=False)),
        (True, CompileConfig(enabled=True)),
        ({}, CompileConfig(enabled=True)),
        (
            {"backend": "aot_eager", "dynamic": False, "fullgraph": True},
            CompileConfig(
                enabled=True, options=(("backend", "aot_eager"), ("dynamic", False), ("fullgraph", True))
            ),
        ),
    ],
)
def test_accepted_values(value: Any, expected: CompileConfig | None) -> None:
    assert parse_compile(value) == expected


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (
            "yes",
            TypeError,
            r"Trainer\(compile='yes'\) \(str\) is not accepted\. Use True .*False or None .*dict",
        ),
        (1, TypeError, r"Trainer\(compile=1\) \(int\) is not accepted"),
        (
            {"mod": "max-autotune"},
            MisconfigurationError,
            r"key 'mod', which torch.compile does not take\. Did you mean 'mode'\?",
        ),
        ({"fullgraph": "yes"}, TypeError, r"fullgraph must be a bool"),
        ({"dynamic": 1}, TypeError, r"dynamic must be True, False or None"),
        ({"backend": 3}, TypeError, r"backend must be a backend name .*or a callable"),
        ({"backend": "nope"}, MisconfigurationError, r"rejected by torch.compile: Invalid backend: 'nope'"),
        ({"mode": "fastest"}, MisconfigurationError, r"rejected by torch.compile: Unrecognized mode=fastest"),
        (
            {"mode": "max-autotune", "options": {"max_autotune": True}},
            MisconfigurationError,
            r"Either mode or options can be specified",
        ),
    ],
)
def test_rejected_values(value: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        parse_compile(value)


def test_fsdp_without_orig_params_is_refused() -> None:
    root = nn.Module()
    root._use_orig_params = False  # what an FSDP root built with use_orig_params=False holds
    with pytest.raises(MisconfigurationError, match=r"compile=True needs FSDP's use_orig_params=True"):
        apply_compile(nn.Linear(2, 2), parse_compile(True), root=root)


def test_trainer_and_strategy_must_agree(tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 2,
        "logger": False,
        "default_root_dir": tmp_path,
    }
    with pytest.raises(
        MisconfigurationError, match=r"Trainer\(compile=True\) and FSDPStrategy\(compile=False\) disagree"
    ):
        fullshard.Trainer(strategy=FSDPStrategy(compile=False), compile=True, **kwargs)
    with pytest.raises(TypeError, match=r"FSDPStrategy\(compile='max-autotune'\) \(str\) is not accepted"):
        FSDPStrategy(compile="max-autotune")
    aot = {"backend": "aot_eager"}
    from_strategy = fullshard.Trainer(strategy=FSDPStrategy(compile=aot), **kwargs)
    both = fullshard.Trainer(
        strategy=FSDPStrategy(compile={"dynamic": None, **aot}), compile={**aot, "dynamic": None}, **kwargs
    )
    from_trainer = fullshard.Trainer(strategy="fsdp", compile=aot, **kwargs)
    assert from_strategy.strategy.compile == from_trainer.strategy.compile == parse_compile(aot)
    assert both.strategy.compile == parse_compile({**aot, "dynamic": None})
    off = fullshard.Trainer(strategy="ddp", **kwargs)
    assert off.strategy.compile is None


def test_misspelt_trainer_argument_points_at_compile(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'compiled'\. Did you mean 'compile'\?"):
        quiet_trainer(tmp_path, compiled=True)


# ----------------------------------------------------------------- how and where it is applied
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()


def test_whole_module_forward_is_compiled_in_place_and_reversibly() -> None:
    net = Net()
    keys = list(net.state_dict())
    eager = parse_compile({"backend": "eager"})
    apply_compile(net, eager)
    compiled = net.forward
    assert "forward" in net.__dict__ and list(net.state_dict()) == keys
    torch.testing.assert_close(net(torch.ones(2, 4)), Net.forward(net, torch.ones(2, 4)))
    apply_compile(net, parse_compile({"backend": "eager"}))  # the same setting again: kept as it is
    assert net.forward == compiled
    apply_compile(net, parse_compile({"backend": "aot_eager"}))  # another one: compiled afresh, not twice
    assert net.forward != compiled
    apply_compile(net, None)  # off: the class's forward again
    assert "forward" not in net.__dict__


def test_torch_nn_layers_are_compiled_in_place() -> None:
    """nn.Module.compile() leaves a torch.nn TransformerEncoderLayer eager (pytorch#150915); units
    compiled by fullshard are traced."""
    from torch._dynamo.utils import counters

    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(2, 3, 8)
    expected = layer(x)
    counters.clear()
    apply_compile(layer, parse_compile({"backend": "eager"}), [CompileUnit(layer)])
    torch.testing.assert_close(layer(x), expected)
    assert counters["frames"]["ok"] >= 1 and counters["stats"]["unique_graphs"] >= 1
    assert list(layer.state_dict()) == list(nn.TransformerEncoderLayer(8, 2, 16).state_dict())


def test_each_module_class_has_its_own_compiled_entry_point() -> None:
    """Graphs are shared by the blocks of one class and kept apart for other classes, as with
    module.compile(): dynamo's recompile limit (8) counts per code object, so 12 classes through
    one shared entry point would leave some eager."""
    from torch._dynamo.utils import counters

    assert _call_for(nn.Linear) is _call_for(nn.Linear)
    classes = [type(f"Block{i}", (Net,), {}) for i in range(12)]
    blocks = [cls() for cls in classes] + [classes[0]()]
    counters.clear()
    apply_compile(nn.Module(), parse_compile({"backend": "eager"}), [CompileUnit(b) for b in blocks])
    for block in blocks:
        block(torch.ones(2, 4))
    assert counters["stats"]["unique_graphs"] == 12 and counters["frames"]["ok"] == 12


class StepOnly(fullshard.Module):
    """A LightningModule without forward: training_step calls its layer directly."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()
        self.loss = nn.L1Loss()  # no parameters: left alone

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.loss(self.net(batch[0]), batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_compiles_only_when_the_model_is_set_up(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    model = StepOnly()
    trainer = quiet_trainer(tmp_path, compile={"backend": "eager"}, max_steps=1)
    assert model.net._compiled_call_impl is None  # nothing happens before fit (nor in a launching process)
    trainer.fit(model, DataLoader(TensorDataset(torch.ones(2, 4)), batch_size=2))
    assert model.net._compiled_call_impl is not None and model.loss._compiled_call_impl is None
    assert "forward" not in model.__dict__ and "_orig_mod" not in "".join(model.state_dict())
    apply_compile(model, None)  # what a later Trainer without compile= does: eager again
    assert model.net._compiled_call_impl is None


def test_nothing_to_compile_warns() -> None:
    class Empty(fullshard.Module):
        pass

    with pytest.warns(UserWarning, match=r"Empty defines no forward and has no layers with parameters"):
        apply_compile(Empty(), parse_compile(True))


def test_mismatched_flat_parameter_gradient_is_held_aside_and_put_back() -> None:
    """[Note: FSDP1 gradients and dynamo]: a parameter whose data was swapped for a bigger buffer
    while its gradient kept the old size, as FSDP1 leaves a unit during forward."""
    param = nn.Parameter(torch.zeros(4))
    grad = torch.ones(4)
    param.grad = grad
    param.data = torch.zeros(8)
    seen = []
    call = _holding_grads(lambda: seen.append(param.grad), (param,))
    call()
    assert seen == [None]
    assert param.grad is grad and param.shape == (8,)


# --------------------------------------------------------------------------------- training jobs
def _job(out: Path, suite: str, devices: int, env: dict[str, str] | None = None) -> Path:
    result = run_script(
        "compile_job.py", "--out", str(out), "--suite", suite, "--devices", str(devices), timeout=240, env=env
    )
    check_ok(result)
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # inductor's C++ builds in this process rather than a pool of worker processes that each
    # import torch first: the one inductor job builds a handful of kernels, and the pool costs
    # more than it saves on a small machine (what is compiled is the same)
    threads = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    return _job(tmp_path_factory.mktemp("compile_single"), "single", 1, threads)


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory.mktemp("compile_multi"), "multi", 2)


def _read(root: Path, name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return torch.load(root / name / "params.pt"), json.loads((root / name / "result.json").read_text())


def _assert_same_training(root: Path, name: str, reference: str, tol: dict[str, float]) -> None:
    params, result = _read(root, name)
    expected_params, expected = _read(root, reference)
    assert len(result["losses"]) == len(expected["losses"]) > 0
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(expected["losses"]), **tol)
    assert params.keys() == expected_params.keys()
    for key in params:
        torch.testing.assert_close(params[key], expected_params[key], msg=key, **tol)


def test_single_device_inductor_matches_eager(single: Path) -> None:
    _assert_same_training(single, "compiled", "eager", FP32_TOL)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("compiled", "eager"),  # Trainer(compile=...), a unit per Block
        ("compiled_ac", "eager"),  # FSDPStrategy(compile=...), Blocks also checkpointed
        ("whole", "eager"),  # no auto-wrap policy: the module's forward inside the root unit
        ("ragged", "ragged_eager"),  # a short last batch: recompiled with gradients in place
        ("accumulate", "accumulate_eager"),  # no_sync micro-batches
        ("shard_grad_op", "eager"),
        ("manual", "eager"),  # units made with wrap() in configure_model
        ("ddp", "ddp_eager"),
        ("fsdp2", "fsdp2_eager"),  # FSDP2: each fully_shard unit compiled in place
    ],
)
def test_multiprocess_matches_eager(multi: Path, name: str, reference: str) -> None:
    _assert_same_training(multi, name, reference, FP32_TOL)


@pytest.mark.multiprocess
def test_fsdp_bf16_mixed_trains_like_eager_bf16(multi: Path) -> None:
    _assert_same_training(multi, "bf16", "bf16_eager", BF16_TOL)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "name",
    ["compiled", "compiled_ac", "whole", "bf16", "accumulate", "shard_grad_op", "manual", "ddp", "fsdp2"],
)
def test_no_recompiles_after_the_first_step(multi: Path, name: str) -> None:
    result = _read(multi, name)[1]
    graphs = result["graphs"]  # dynamo's compiled graphs after each step
    assert graphs[0] > 0 and graphs == [graphs[0]] * len(graphs), graphs
    assert result["graphs_after_validate"] == result["graphs_after_fit"] + 1  # eval + no_grad: one graph


def test_single_device_no_recompiles(single: Path) -> None:
    result = _read(single, "compiled")[1]
    assert result["graphs"] == [1] * len(result["graphs"])


@pytest.mark.parametrize("job", ["single", pytest.param("multi", marks=pytest.mark.multiprocess)])
def test_checkpoints_keep_their_keys_and_load_across(job: str, request: pytest.FixtureRequest) -> None:
    root: Path = request.getfixturevalue(job)
    compiled = torch.load(root / "compiled.ckpt", weights_only=False)["state_dict"]
    eager = torch.load(root / "eager.ckpt", weights_only=False)["state_dict"]
    assert list(compiled) == list(eager)
    assert not any("_orig_mod" in key or "_checkpoint_wrapped" in key for key in compiled)
    for loader, saver in (("eager_loads_compiled", "compiled"), ("compiled_loads_eager", "eager")):
        loaded, saved = _read(root, loader)[0], _read(root, saver)[0]
        assert loaded.keys() == saved.keys()
        for key in saved:
            torch.testing.assert_close(loaded[key], saved[key], rtol=0, atol=0, msg=f"{loader}: {key}")

"""Exact fast initialisation (``empty_init=True``), tied parameters in the wrap plan, and the
flat-parameter restrictions the plan reports before torch does.

The model (tests/hf_patterns.py) reproduces the Hugging Face patterns: tied embeddings, a
rotary buffer computed in ``__init__``, norms and ``Conv1D`` without ``reset_parameters``, and
a model-level ``_init_weights``.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from torch.utils.data import DataLoader

from conftest import check_ok, quiet_trainer, run_script
from fullshard.errors import MisconfigurationError
from fullshard.policies import keep_tied_together, normalize_policy
from fullshard.strategies import FSDPStrategy
from fullshard.strategies.meta_init import MetaInit, ShardedMetaInit, parameters_on_meta
from hf_patterns import Block, LMModule, RMSNorm, TinyLM, token_data


def _assert_same_init(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Per tensor: constant tensors equal, random ones with mean and std within sampling error."""
    assert actual.keys() == expected.keys()
    for key, want in expected.items():
        got, want = actual[key].float(), want.float()
        if want.numel() < 2 or want.std() == 0:
            assert torch.equal(got, want), key
            continue
        n, sigma = want.numel(), float(want.std())
        assert abs(float(got.mean()) - float(want.mean())) < 6 * sigma / math.sqrt(n), key
        assert abs(float(got.std()) - sigma) < 6 * sigma / math.sqrt(2 * n), key


# ----------------------------------------------------------------------- one process, no FSDP
def _materialise(model: nn.Module) -> nn.Module:
    """What FSDP does with one unit: call the init function on its root."""
    MetaInit(torch.device("cpu"), model)(model)
    return model


def test_parameters_go_to_meta_and_buffers_stay_real() -> None:
    eager = TinyLM()
    with parameters_on_meta():
        lazy = TinyLM()
    assert all(p.is_meta for p in lazy.parameters())
    assert lazy.lm_head.weight is lazy.embed.weight
    for (name, buffer), (_, want) in zip(lazy.named_buffers(), eager.named_buffers(), strict=True):
        assert not buffer.is_meta and torch.equal(buffer, want), name
    assert nn.Linear.register_parameter is nn.Module.register_parameter  # the patch is undone


def test_materialised_model_matches_eager_init() -> None:
    torch.manual_seed(0)
    eager = TinyLM()
    with parameters_on_meta():
        lazy = TinyLM()
    _materialise(lazy)
    assert lazy.lm_head.weight is lazy.embed.weight  # one tensor, still shared
    assert not any(t.is_meta for t in [*lazy.parameters(), *lazy.buffers()])
    _assert_same_init(lazy.state_dict(), eager.state_dict())
    for block in lazy.blocks:  # the norms have no reset_parameters: _init_weights set them
        assert torch.equal(block.norm1.weight, torch.ones(block.norm1.weight.shape))


def test_children_are_initialised_before_parents() -> None:
    # nn.MultiheadAttention zeroes its out_proj bias after out_proj (an nn.Linear) initialised it
    with parameters_on_meta():
        attention = nn.MultiheadAttention(8, 2)
    _materialise(attention)
    assert torch.equal(attention.out_proj.bias, torch.zeros(8))


def test_uninitialised_parameters_are_named() -> None:
    class Bare(nn.Module):  # norms without reset_parameters and no model-level init
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.norm = RMSNorm(4)

    with parameters_on_meta():
        model = Bare()
    with pytest.raises(
        MisconfigurationError, match=r"nothing initialised norm\.weight \(RMSNorm\).*reset_parameters"
    ):
        _materialise(model)


def test_pretrained_weights_under_empty_init_are_refused() -> None:
    # transformers marks the parameters from_pretrained() loaded with _is_hf_initialized; moving
    # them to the meta device would drop them silently (issue found trying a real HF model)
    loaded = nn.Parameter(torch.ones(4))
    loaded._is_hf_initialized = True  # type: ignore[attr-defined]
    with parameters_on_meta():
        layer = nn.Linear(4, 4)  # built afresh: fine
        with pytest.raises(
            MisconfigurationError, match=r"loaded pretrained weights \(Linear\.weight.*Use empty_init=False"
        ):
            layer.weight = loaded
    assert layer.weight.is_meta


def test_meta_integer_buffer_is_refused() -> None:
    with torch.device("meta"):
        model = nn.BatchNorm1d(4)
    with pytest.raises(
        MisconfigurationError, match=r"num_batches_tracked \(torch\.int64\) is on the meta device"
    ):
        _materialise(model)


def test_init_weights_override_applies_without_empty_init(tmp_path: Path) -> None:
    module = LMModule(scaled_init=True)
    trainer = quiet_trainer(tmp_path, max_steps=0)
    trainer.fit(module, DataLoader(token_data(), batch_size=4))
    assert module.model is not None
    proj = module.model.blocks[0].proj.weight
    assert abs(float(proj.detach().std()) - 0.02 / math.sqrt(2 * 3)) < 0.002
    before = proj.detach().clone()
    quiet_trainer(tmp_path, max_steps=0).fit(module, DataLoader(token_data(), batch_size=4))
    assert torch.equal(module.model.blocks[0].proj.weight, before)  # built once, initialised once


# ---------------------------------------------------------------------------- the wrap plan
def _plan(model: nn.Module, **kwargs: object) -> object:
    return FSDPStrategy(**kwargs).plan_wrapping(model, world_size=2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "policy",
    [{Block, nn.Embedding}, functools.partial(size_based_auto_wrap_policy, min_num_params=1000)],
    ids=["classes", "size_based"],
)
def test_policy_splitting_tied_parameters_is_fixed(policy: object) -> None:
    model = TinyLM()
    plan = _plan(model, auto_wrap_policy=policy)
    units = [u.name for u in plan.units]  # type: ignore[attr-defined]
    assert "embed" not in units and "lm_head" not in units
    assert any(u.startswith("blocks.0") for u in units)
    assert plan.notes and "embed.weight, lm_head.weight" in plan.notes[0]  # type: ignore[attr-defined]
    assert not plan.errors  # type: ignore[attr-defined]
    assert "note: tied parameters" in plan.summary()  # type: ignore[attr-defined]


def test_policy_keeping_ties_together_is_unchanged() -> None:
    policy = normalize_policy({Block}, "auto_wrap_policy")
    assert keep_tied_together(policy, TinyLM()) == (policy, [])


def test_frozen_and_trainable_in_one_unit_without_orig_params() -> None:
    model = TinyLM()
    for block in model.blocks:
        block.qkv.requires_grad_(False)
    message = _plan(model, auto_wrap_policy={Block}, use_orig_params=False).errors  # type: ignore[attr-defined]
    assert len(message) == 3
    assert (
        "unit blocks.0 (Block) mixes frozen parameters (blocks.0.qkv.weight, blocks.0.qkv.bias)" in message[0]
    )
    assert "use_orig_params=True" in message[0]
    assert not _plan(model, auto_wrap_policy={Block}).errors  # type: ignore[attr-defined]


def test_mixed_dtypes_in_one_unit() -> None:
    model = TinyLM()
    model.norm.to(torch.bfloat16)
    errors = _plan(model, auto_wrap_policy={Block}).errors  # type: ignore[attr-defined]
    assert len(errors) == 1 and "unit (root) (TinyLM) holds parameters of 2 dtypes" in errors[0]
    assert "torch.bfloat16: norm.weight" in errors[0]


# ------------------------------------------ initialised after sharding (tensor parallelism): one process
# The sharded case runs in tests/test_model_parallel.py (2x2 mesh: weights bitwise equal to eager).
def _materialise_after_sharding(model: nn.Module) -> nn.Module:
    ShardedMetaInit(model, torch.device("cpu"), None, "ModelParallelStrategy")()
    return model


def test_initialised_after_sharding_equals_eager_bitwise() -> None:
    # children first, as the constructors ran: the same random numbers in the same order;
    # nn.MultiheadAttention's init writes into its child out_proj (bias zeroed) on the whole tensor
    build = lambda: nn.Sequential(nn.Linear(8, 8), nn.MultiheadAttention(8, 2), nn.LayerNorm(8))  # noqa: E731
    torch.manual_seed(3)
    eager = build()
    with torch.device("meta"):
        lazy = build()
    keep = nn.Linear(8, 8)  # built for real: left as it is
    lazy.append(keep)
    before = keep.weight.detach().clone()
    torch.manual_seed(3)
    _materialise_after_sharding(lazy)
    for (name, got), (_, want) in zip(lazy[:3].state_dict().items(), eager.state_dict().items(), strict=True):
        assert torch.equal(got, want), name
    assert torch.equal(keep.weight, before)


def test_initialised_after_sharding_keeps_ties_buffers_and_the_models_init() -> None:
    torch.manual_seed(0)
    eager = TinyLM()
    with parameters_on_meta():
        lazy = TinyLM()
    _materialise_after_sharding(lazy)
    assert lazy.lm_head.weight is lazy.embed.weight
    assert not any(t.is_meta for t in [*lazy.parameters(), *lazy.buffers()])
    _assert_same_init(lazy.state_dict(), eager.state_dict())  # HF-style _init_weights ran


def test_initialised_after_sharding_names_what_nothing_initialised() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), RMSNorm(4))
    with pytest.raises(
        MisconfigurationError,
        match=r"ModelParallelStrategy found the model on the meta device, and "
        r"nothing initialised 1\.weight\. .*reset_parameters",
    ):
        _materialise_after_sharding(model)
    with torch.device("meta"):
        model = nn.BatchNorm1d(4)
    with pytest.raises(
        MisconfigurationError, match=r"num_batches_tracked \(torch\.int64\) is on the meta device"
    ):
        _materialise_after_sharding(model)


# ---------------------------------------------------------------- two processes, FSDP, gloo
@pytest.fixture(scope="module")
def fast_init_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fast_init")
    check_ok(
        run_script("fast_init_job.py", "--out", str(out), "--policy", "blocks+embedding", "--scaled-init")
    )
    return out


def test_empty_init_gives_bitwise_equal_logits_from_a_checkpoint(fast_init_runs: Path) -> None:
    eager = torch.load(fast_init_runs / "eager" / "logits.pt")
    empty = torch.load(fast_init_runs / "empty" / "logits.pt")
    assert torch.equal(empty, eager)  # the rotary buffer is not in the checkpoint: it was kept


def test_empty_init_keeps_the_tie_on_every_rank(fast_init_runs: Path) -> None:
    for mode in ("eager", "empty"):
        result = json.loads((fast_init_runs / mode / "result.json").read_text())
        assert result["tied"] == [True, True], mode
        assert "model.embed" not in result["units"] and "tied parameters" in result["notes"][0]


def test_empty_init_matches_eager_init_statistics(fast_init_runs: Path) -> None:
    eager = torch.load(fast_init_runs / "eager" / "init.pt")
    empty = torch.load(fast_init_runs / "empty" / "init.pt")
    _assert_same_init(empty, eager)
    scaled = 0.02 / math.sqrt(2 * 3)  # the init_weights override ran in both
    assert abs(float(empty["model.blocks.1.out.weight"].std()) - scaled) < 0.002

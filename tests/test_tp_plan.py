"""Tensor-parallel plans (fullshard.strategies.tp_plan): resolving ``"auto"`` and user plans on
transformers-style models, every error, and a 2-process gloo job that trains by the plan and
matches one process.

Run: pytest tests/test_tp_plan.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from conftest import check_ok, run_script
from fullshard.errors import MisconfigurationError
from fullshard.strategies.tp_plan import ACCEPTED_STYLES, _split_attention, apply_tp_plan, resolve_tp_plan
from hf_llama import TinyLlamaConfig, TinyLlamaForCausalLM, TinyLlamaModel, lm_loss, token_batch
from hf_patterns import TinyLM
from tp_cases import build

LAYER_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
)
LAYER_KEYS = [f"layers.{i}.{m}" for i in range(2) for m in (*LAYER_MODULES, "mlp.up_proj", "mlp.down_proj")]
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _layouts(style: Any) -> tuple[Any, Any]:
    return tuple(style.input_layouts), tuple(style.output_layouts)  # type: ignore[return-value]


# ------------------------------------------------------------------------------ "auto"
def test_auto_merges_the_config_plan_under_the_base_model_prefix_and_the_head_plan() -> None:
    plan = resolve_tp_plan(TinyLlamaForCausalLM(TinyLlamaConfig()), "auto")
    assert sorted(plan) == sorted(["lm_head", "model.embed_tokens", *(f"model.{k}" for k in LAYER_KEYS)])
    embedding = plan["model.embed_tokens"]  # added as transformers 5 adds it: split by vocabulary
    assert isinstance(embedding, RowwiseParallel) and _layouts(embedding) == ((Replicate(),), (Replicate(),))
    head = plan["lm_head"]  # "colwise_gather_output": split the vocabulary, gather the logits
    assert isinstance(head, ColwiseParallel) and _layouts(head) == ((Replicate(),), (Replicate(),))
    q, o = plan["model.layers.1.self_attn.q_proj"], plan["model.layers.0.self_attn.o_proj"]
    assert isinstance(q, ColwiseParallel) and _layouts(q) == ((Replicate(),), (Shard(-1),))
    assert isinstance(o, RowwiseParallel) and _layouts(o) == ((Shard(-1),), (Replicate(),))


def test_auto_on_a_base_model_and_on_a_model_inside_another_module() -> None:
    assert sorted(resolve_tp_plan(TinyLlamaModel(TinyLlamaConfig()), "auto")) == sorted(
        ["embed_tokens", *LAYER_KEYS]
    )

    class Wrapper(nn.Module):  # a LightningModule-like owner: the plan sits under its attribute name
        def __init__(self) -> None:
            super().__init__()
            self.net = TinyLlamaForCausalLM(TinyLlamaConfig(num_hidden_layers=1))

    plan = resolve_tp_plan(Wrapper(), "auto")
    assert {"net.lm_head", "net.model.embed_tokens", "net.model.layers.0.mlp.down_proj"} <= set(plan)
    assert len(plan) == 9


def test_auto_refuses_a_model_without_a_plan_and_says_what_to_do() -> None:
    with pytest.raises(MisconfigurationError, match=r"TinyLM has none\. Pass the plan yourself") as info:
        resolve_tp_plan(TinyLM(), "auto")
    assert "tp_plan={'layers.*.self_attn.q_proj': 'colwise'" in str(info.value)
    assert "ModelParallelStrategy" in str(info.value) and "configure_model()" in str(info.value)


def test_auto_refuses_a_transformers_style_without_a_torch_equivalent() -> None:
    class FusedConfig(TinyLlamaConfig):
        base_model_tp_plan = {**TinyLlamaConfig.base_model_tp_plan, "layers.*.mlp.up_proj": "packed_colwise"}

    model = TinyLlamaModel(FusedConfig())
    with pytest.raises(
        MisconfigurationError,
        match=r"'layers\.\*\.mlp\.up_proj' has the transformers style 'packed_colwise'.*fused",
    ):
        resolve_tp_plan(model, "auto")


# ------------------------------------------------------------------------------ user plans
def test_user_plan_wildcards_strings_and_styles() -> None:
    mine = RowwiseParallel()
    plan = resolve_tp_plan(
        TinyLlamaForCausalLM(TinyLlamaConfig()),
        {
            "model.layers.*.self_attn.[qkv]_proj": "colwise",
            "model.layers.1.self_attn.o_proj": mine,
            "model.layers.0.self_attn.o_proj": "rowwise_rep",
            "model.embed_tokens": "embedding_rowwise",
            "lm_head": "replicate",  # kept whole: left out
        },
    )
    assert sorted(plan) == sorted(
        ["model.embed_tokens", "model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"]
        + [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkv"]
    )
    assert plan["model.layers.1.self_attn.o_proj"] is mine
    assert _layouts(plan["model.layers.0.self_attn.o_proj"]) == ((Replicate(),), (Replicate(),))
    assert isinstance(plan["model.embed_tokens"], RowwiseParallel)
    assert _layouts(plan["model.embed_tokens"]) == ((Replicate(),), (Replicate(),))


@pytest.mark.parametrize(
    ("name", "kind", "layouts"),
    [
        ("colwise", ColwiseParallel, ((Replicate(),), (Shard(-1),))),
        ("rowwise", RowwiseParallel, ((Shard(-1),), (Replicate(),))),
        ("colwise_rep", ColwiseParallel, ((Replicate(),), (Replicate(),))),
        ("colwise_gather_output", ColwiseParallel, ((Replicate(),), (Replicate(),))),
        ("rowwise_rep", RowwiseParallel, ((Replicate(),), (Replicate(),))),
        ("rowwise_split_input", RowwiseParallel, ((Replicate(),), (Replicate(),))),
    ],
)
def test_style_strings_become_torch_styles(name: str, kind: type, layouts: tuple[Any, Any]) -> None:
    style = resolve_tp_plan(TinyLlamaModel(TinyLlamaConfig()), {"layers.0.mlp.up_proj": name})[
        "layers.0.mlp.up_proj"
    ]
    assert type(style) is kind and _layouts(style) == layouts


def test_accepted_styles_are_all_mapped() -> None:
    model = TinyLlamaModel(TinyLlamaConfig())
    for name in ACCEPTED_STYLES:
        target = "embed_tokens" if name.startswith("embedding") else "layers.0.mlp.up_proj"
        resolve_tp_plan(model, {target: name})  # raises for a string listed but not mapped


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        ("colwise", r"tp_plan='colwise' is not understood: pass tp_plan='auto'"),
        (["lm_head"], r"tp_plan must be 'auto' or a dict .* got list"),
        ({}, r"tp_plan=\{\} splits nothing"),
        ({"lm_head": "colwize"}, r"'lm_head' has the style 'colwize', which is not one fullshard knows: accepted are the strings 'colwise', .*ParallelStyle.* Did you mean 'colwise'\?"),
        ({"lm_head": 3}, r"'lm_head' has the style 3, which is not one fullshard knows"),
        ({"lm_head": "local_colwise"}, r"'lm_head' has the transformers style 'local_colwise', which fullshard cannot apply: it is one of transformers 4's styles"),
        ({"model.layers.*.input_layernorm": "sequence_parallel"}, r"'sequence_parallel'.*sequence-sharded activations.*SequenceParallel\(\)"),
        ({"layers.*.self_attn.q_proj": "colwise"}, r"'layers\.\*\.self_attn\.q_proj' matches no module of TinyLlamaForCausalLM\..*'model\.layers\.\*\.self_attn\.q_proj'"),
        ({"model.norm": "colwise"}, r"'model\.norm' is a RMSNorm, but the style 'colwise' splits Linear or Embedding modules only"),
        ({"lm_head": "embedding_rowwise"}, r"'lm_head' is a Linear, but the style 'embedding_rowwise' splits Embedding modules only"),
        ({"model.layers.*.mlp.up_proj": "colwise", "model.layers.0.mlp.up_proj": "rowwise"}, r"'model\.layers\.\*\.mlp\.up_proj' and 'model\.layers\.0\.mlp\.up_proj' both match 'model\.layers\.0\.mlp\.up_proj' with different styles"),
    ],
)  # fmt: skip
def test_errors_say_what_was_given_and_how_to_fix_it(plan: Any, match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        resolve_tp_plan(TinyLlamaForCausalLM(TinyLlamaConfig()), plan)


def test_the_same_style_twice_is_no_conflict() -> None:
    plan = {"model.layers.*.mlp.up_proj": "colwise", "model.layers.0.mlp.up_proj": "colwise"}
    assert len(resolve_tp_plan(TinyLlamaForCausalLM(TinyLlamaConfig()), plan)) == 2


# ------------------------------------------------------------------------------ checks before sharding
class _Mesh:
    """What apply_tp_plan reads of a mesh before it shards anything (its checks need no process group)."""

    def __init__(self, size: int, ndim: int = 1) -> None:
        self._size, self.ndim, self.mesh_dim_names = size, ndim, ("tensor_parallel",)[:ndim] or None

    def size(self) -> int:
        return self._size


def _untouched(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(type(p) is nn.Parameter and torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_heads_that_do_not_divide_by_the_tp_size_raise_before_sharding() -> None:
    model = TinyLlamaForCausalLM(TinyLlamaConfig())  # 4 query heads, 2 key/value heads
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = resolve_tp_plan(model, "auto")
    with pytest.raises(
        MisconfigurationError,
        match=r"Tensor parallelism over 4 processes splits the attention heads of 'model\.layers\.0\.self_attn' "
        r"\(LlamaAttention\), but config\.num_key_value_heads=2 does not divide by 4: each process must hold "
        r"whole heads\. Use a tensor_parallel_size that divides every head count \(1, 2\)",
    ):
        apply_tp_plan(model, _Mesh(4), plan)  # type: ignore[arg-type]
    assert _untouched(model, before)


def test_only_attention_modules_count_heads() -> None:
    model = TinyLlamaForCausalLM(TinyLlamaConfig(legacy_attention=True))
    attention = _split_attention(dict(model.named_modules()), resolve_tp_plan(model, "auto"))
    # the MLPs hold the config too, but have no heads; lm_head's output is gathered, not split
    assert sorted(attention) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]


def test_tied_parameters_are_not_split_apart() -> None:
    model = TinyLlamaForCausalLM(TinyLlamaConfig(tie_word_embeddings=True))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = resolve_tp_plan(
        model, {"lm_head": "colwise_gather_output", "model.layers.*.mlp.up_proj": "colwise"}
    )
    with pytest.raises(
        MisconfigurationError,
        match=r"'model\.embed_tokens\.weight' and 'lm_head\.weight' are one tied parameter, and the plan splits "
        r"'lm_head' but not every module sharing it the same way.*'embedding_rowwise' and the head "
        r"'colwise_gather_output'.*config\.tie_word_embeddings=False",
    ):
        apply_tp_plan(model, _Mesh(2), plan)  # type: ignore[arg-type]
    assert _untouched(model, before)


def test_tied_parameters_split_along_different_dimensions_are_refused() -> None:
    model = TinyLlamaForCausalLM(TinyLlamaConfig(tie_word_embeddings=True))
    plan = resolve_tp_plan(
        model, {"model.embed_tokens": "embedding_colwise", "lm_head": "colwise_gather_output"}
    )
    with pytest.raises(
        MisconfigurationError,
        match=r"one tied parameter, and the plan splits 'model\.embed_tokens', 'lm_head' but not",
    ):
        apply_tp_plan(model, _Mesh(2), plan)  # type: ignore[arg-type]


def test_apply_takes_a_one_dimensional_mesh_and_a_plan_of_this_model() -> None:
    model = TinyLlamaForCausalLM(TinyLlamaConfig())
    with pytest.raises(MisconfigurationError, match=r"takes the 1-D tensor-parallel mesh, got a 2-D mesh"):
        apply_tp_plan(model, _Mesh(2, ndim=2), {})  # type: ignore[arg-type]
    with pytest.raises(
        MisconfigurationError,
        match=r"names \['layers\.0\.mlp\.up_proj'\] that TinyLlamaForCausalLM does not have",
    ):
        apply_tp_plan(model, _Mesh(2), {"layers.0.mlp.up_proj": ColwiseParallel()})  # type: ignore[arg-type]


def test_a_model_split_once_is_not_split_again(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tensor_parallel",))
        model = TinyLlamaForCausalLM(TinyLlamaConfig())
        apply_tp_plan(model, mesh, resolve_tp_plan(model, "auto"))
        assert isinstance(model.model.layers[0].mlp.up_proj.weight, DTensor)
        with pytest.raises(
            MisconfigurationError,
            match=r"'lm_head\.weight' is split already \(a DTensor over .*before fully_shard",
        ):
            apply_tp_plan(model, mesh, resolve_tp_plan(model, "auto"))
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ two processes
def _reference(name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Case ``name`` trained unsplit in this process, as the job trains it split."""
    model, _, _ = build(name)
    ids = token_batch(model.config.vocab_size)  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(3):
        output = model(ids[:, :-1])
        loss = lm_loss(output if isinstance(output, torch.Tensor) else output.logits, ids)
        losses.append(loss.item())
        if step < 2:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def _check_against_reference(result: dict[str, Any], name: str) -> None:
    losses, params = _reference(name)
    assert losses[2] < losses[0] - 0.5  # the steps changed the model: the comparison means something
    assert result["losses"] == pytest.approx(losses, rel=1e-5)
    assert result["params"].keys() == params.keys()
    for key, value in params.items():
        torch.testing.assert_close(result["params"][key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp_plan")
    check_ok(run_script("tp_plan_job.py", "--out", str(out), timeout=120))
    return out


@pytest.mark.multiprocess
def test_auto_plan_over_two_processes_trains_as_one(tp_runs: Path) -> None:
    result = torch.load(tp_runs / "auto.pt")
    _check_against_reference(result, "auto")
    assert result["split_shape"] == [8, 32]  # k_proj: 2 key/value heads of 8, one per rank
    assert len(result["plan"]) == 16 and "model.embed_tokens" in result["plan"]
    assert result["heads"] == {
        "model.layers.0.self_attn": {},
        "model.layers.1.self_attn": {},
    }  # views with -1


@pytest.mark.multiprocess
def test_user_plan_with_legacy_attention_over_two_processes_trains_as_one(tp_runs: Path) -> None:
    result = torch.load(tp_runs / "user.pt")
    _check_against_reference(result, "user")
    assert result["split_shape"] == [32, 32]  # the embedding's 64 rows (vocabulary), half per rank
    local = {"num_heads": 2, "num_key_value_heads": 1}  # of 4 and 2: what the legacy reshape needs
    assert result["heads"] == {"model.layers.0.self_attn": local, "model.layers.1.self_attn": local}


@pytest.mark.multiprocess
def test_tied_embedding_and_head_split_by_vocabulary_stay_tied_and_train_as_one(tp_runs: Path) -> None:
    result = torch.load(tp_runs / "tied.pt")
    _check_against_reference(result, "tied")
    assert result["tied"] and result["split_shape"] == [32, 32]
    assert "model.embed_tokens" in result["plan"] and "lm_head" in result["plan"]


@pytest.mark.multiprocess
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (it is no test dependency)")
def test_real_transformers_llama_with_auto_plan_trains_as_one(tmp_path: Path) -> None:
    check_ok(run_script("tp_plan_job.py", "--out", str(tmp_path), "--hf", timeout=120))
    result = torch.load(tmp_path / "hf_auto.pt")
    _check_against_reference(result, "hf_auto")
    assert result["split_shape"] == [8, 32]
    assert {"lm_head", "model.embed_tokens", "model.layers.1.mlp.down_proj"} <= set(result["plan"])

"""FSDPStrategy configuration and the wrap plan, checked without starting processes."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

import fullshard
from fullshard.errors import MisconfigurationError
from fullshard.policies import normalize_policy, resolve_policy
from fullshard.precision import FSDPPrecision
from fullshard.strategies import STRATEGY_REGISTRY, FSDPStrategy


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 10)  # 110 parameters
        self.norm = nn.LayerNorm(10)  # 20 parameters


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 10)  # 500 parameters, shared with head
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(10, 50, bias=False)
        self.head.weight = self.embed.weight


def test_registry_names() -> None:
    assert isinstance(STRATEGY_REGISTRY.get("fsdp"), FSDPStrategy)
    offload = STRATEGY_REGISTRY.get("fsdp_cpu_offload")
    assert isinstance(offload, FSDPStrategy) and offload.cpu_offload.offload_params


def test_plan_matches_a_hand_count() -> None:
    model = nn.Sequential(Block(), Block(), nn.Linear(10, 2))  # 130 + 130 + 22
    plan = FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}).plan_wrapping(
        model, world_size=8
    )
    assert [(u.name, u.numel) for u in plan.units] == [("", 22), ("0", 130), ("1", 130)]
    assert plan.total_numel == 282 and plan.root_numel == 22 and plan.largest.numel == 130
    assert plan.checkpointed == ["0", "1"] and plan.shard_size == 8
    # FULL_SHARD, float32, Adam (2 states), 8 ranks:
    #   params: 282*4/8 sharded + 2 units gathered (2*130*4) = 141 + 1040
    #   grads:  282*4/8 sharded + one unit's gradient gathered (130*4) = 141 + 520
    #   optimizer: 282*4*2/8 = 282
    assert (plan.estimate.params, plan.estimate.grads, plan.estimate.optimizer) == (1181, 661, 282)
    assert (
        plan.estimate_no_shard.params,
        plan.estimate_no_shard.grads,
        plan.estimate_no_shard.optimizer,
    ) == (1128, 1128, 2256)
    summary = plan.summary()
    assert "3 unit(s), 282 parameters, FULL_SHARD over 8 of 8 rank(s)" in summary
    assert "activation checkpointing: 2 module(s) (0, 1)" in summary


def test_plan_for_other_sharding_strategies() -> None:
    model = nn.Sequential(Block(), Block(), nn.Linear(10, 2))
    grad_op = FSDPStrategy(auto_wrap_policy={Block}, sharding_strategy="SHARD_GRAD_OP").plan_wrapping(
        model, world_size=2
    )
    assert grad_op.estimate.params == 282 * 4 // 2 + 282 * 4  # shards + a full gathered copy
    no_shard = FSDPStrategy(sharding_strategy="NO_SHARD").plan_wrapping(model, world_size=2)
    assert no_shard.shard_size == 1 and no_shard.estimate == no_shard.estimate_no_shard
    offload = FSDPStrategy(auto_wrap_policy={Block}, cpu_offload=True).plan_wrapping(model, world_size=2)
    assert offload.estimate.optimizer == 0 and offload.cpu_offload
    hybrid = FSDPStrategy(auto_wrap_policy={Block}, sharding_strategy="HYBRID_SHARD", device_mesh=(2, 4))
    assert hybrid.plan_wrapping(model, world_size=8).shard_size == 4
    bf16 = FSDPStrategy(auto_wrap_policy={Block}, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
    assert bf16.plan_wrapping(model, world_size=2).estimate.params == 282 * 4 // 2 + 2 * 130 * 2


@pytest.mark.parametrize("sharding", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_plan_for_one_gpu_says_fsdp1_runs_no_shard(sharding: str) -> None:
    """torch's FSDP1 shards over nothing with one process: it runs NO_SHARD, and the plan says so
    (FSDP2 still splits over its one rank)."""
    model = nn.Sequential(Block(), Block(), nn.Linear(10, 2))
    one = FSDPStrategy(auto_wrap_policy={Block}, sharding_strategy=sharding).plan_wrapping(
        model, world_size=1
    )
    assert one.sharding_strategy == "NO_SHARD" and one.estimate == one.estimate_no_shard
    assert one.notes == [
        f"sharding_strategy='{sharding}' runs as NO_SHARD with 1 process(es) to shard over "
        "(torch's FSDP1 has nothing to split)"
    ]
    assert "NO_SHARD over 1 of 1 rank(s)" in one.summary()
    two = FSDPStrategy(auto_wrap_policy={Block}, sharding_strategy=sharding).plan_wrapping(
        model, world_size=2
    )
    assert two.sharding_strategy == sharding and two.notes == []
    fsdp2 = fullshard.strategies.FSDP2Strategy(auto_wrap_policy={Block}).plan_wrapping(model, world_size=1)
    assert fsdp2.sharding_strategy == "FULL_SHARD" and fsdp2.notes == []


def test_plan_warns_about_unmatched_policy_and_tied_parameters() -> None:
    plan = FSDPStrategy(auto_wrap_policy={Block, nn.TransformerEncoderLayer}).plan_wrapping(
        Tied(), world_size=2
    )
    assert not plan.warnings  # one of the classes matches
    plan = FSDPStrategy(auto_wrap_policy={nn.TransformerEncoderLayer}).plan_wrapping(Tied(), world_size=2)
    assert any("auto_wrap_policy selects no submodule of Tied" in w for w in plan.warnings)
    plan = FSDPStrategy(auto_wrap_policy={nn.Embedding, Block}).plan_wrapping(Tied(), world_size=2)
    # the policy would split the tie: the plan keeps it in one unit and says so (not a warning)
    assert not plan.warnings
    assert any("tied parameters embed.weight, head.weight are kept in one unit" in n for n in plan.notes)
    assert not any(u.name == "embed" for u in plan.units)
    assert plan.total_numel == 500 + 3 * 130  # the shared weight counts once


def test_one_module_under_two_names_is_not_a_tie() -> None:
    from fullshard.policies import tied_parameter_groups

    inner = nn.Linear(4, 4)
    aliased = nn.Module()
    aliased.linear = inner
    aliased.seq = nn.Sequential(inner, nn.ReLU())  # the same Linear again: one owner, two names
    assert tied_parameter_groups(aliased) == []
    assert not FSDPStrategy(auto_wrap_policy={nn.Linear}).plan_wrapping(aliased, world_size=2).notes
    assert tied_parameter_groups(Tied()) == [["embed.weight", "head.weight"]]  # two modules: a tie
    both = nn.Module()
    both.tied, both.alias = Tied(), None
    both.alias = both.tied.embed  # an alias of one holder of a real tie: still one group of two
    assert tied_parameter_groups(both) == [["tied.embed.weight", "tied.head.weight"]]


def test_plan_on_the_meta_device_and_for_the_demo() -> None:
    from fullshard.demos import Transformer

    with torch.device("meta"):
        model = Transformer(nlayers=4, ninp=64, nhid=128, nhead=4)
    policy = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}
    plan = FSDPStrategy(auto_wrap_policy=policy).plan_wrapping(model, world_size=4)
    assert len(plan.units) == 9 and plan.total_numel == sum(p.numel() for p in model.parameters())


def test_policy_forms_select_the_same_modules() -> None:
    model = Tied()
    blocks = [model.blocks[0], model.blocks[1], model.blocks[2]]
    for form in (
        {Block},
        [Block],
        (Block,),
        Block,
        "Block",
        ["Block"],
        f"{__name__}.Block",
        ModuleWrapPolicy({Block}),
    ):
        policy = resolve_policy(normalize_policy(form, "auto_wrap_policy"), model)
        assert policy is not None and policy.selected(model) == blocks, form
    size_based = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    selected = resolve_policy(normalize_policy(size_based, "auto_wrap_policy"), model).selected(model)  # type: ignore[union-attr]
    assert selected == [model.embed, model.blocks[0].fc, model.blocks[1].fc, model.blocks[2].fc]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"sharding_strategy": "ZERO3"},
            MisconfigurationError,
            r"sharding_strategy='ZERO3' is not a sharding strategy\. Use one of 'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD', 'HYBRID_SHARD'",
        ),
        (
            {"state_dict_type": "local"},
            MisconfigurationError,
            r"state_dict_type='local' is not supported\. Use 'full'.*or 'sharded'",
        ),
        (
            {"auto_wrap_policy": 3},
            TypeError,
            r"auto_wrap_policy got int \(3\)\. Accepted: a set/list of nn\.Module classes",
        ),
        (
            {"activation_checkpointing_policy": [nn.Linear, 2]},
            TypeError,
            r"activation_checkpointing_policy got a list holding 2; a collection must hold nn\.Module subclasses or class names",
        ),
        (
            {"cpu_offload": "yes"},
            TypeError,
            r"cpu_offload='yes' \(str\) cannot be used: pass True, False, or torch\.distributed\.fsdp\.CPUOffload",
        ),
        (
            {"mixed_precision": "bf16"},
            TypeError,
            r"mixed_precision must be a torch\.distributed\.fsdp\.MixedPrecision, got str",
        ),
        (
            {"device_mesh": (2,)},
            MisconfigurationError,
            r"device_mesh=\(2,\) must be a tuple of two positive ints",
        ),
        (
            {"device_mesh": [2, 2]},
            TypeError,
            r"device_mesh must be a \(replicas, shard_size\) tuple or a DeviceMesh, got list",
        ),
        ({"param_init_fn": print}, MisconfigurationError, r"param_init_fn is set by FSDPStrategy itself"),
        (
            {"cpu_mmap_threshold": 0},
            MisconfigurationError,
            r"cpu_mmap_threshold=0 is invalid: use a size in bytes",
        ),
        (
            {"backward_prefetch": "sometimes"},
            MisconfigurationError,
            r"backward_prefetch='sometimes' is invalid: use 'BACKWARD_PRE'",
        ),
    ],
)
def test_bad_options(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        FSDPStrategy(**kwargs)


def test_accepted_option_forms() -> None:
    strategy = FSDPStrategy(
        sharding_strategy="hybrid_shard",
        cpu_offload=CPUOffload(offload_params=True),
        backward_prefetch="backward_post",
        limit_all_gathers=True,
    )
    assert strategy.sharding_strategy == ShardingStrategy.HYBRID_SHARD and strategy.cpu_offload.offload_params
    assert (
        strategy.fsdp_kwargs["use_orig_params"] is True and strategy.fsdp_kwargs["limit_all_gathers"] is True
    )
    assert (
        FSDPStrategy(sharding_strategy=ShardingStrategy.NO_SHARD).sharding_strategy
        == ShardingStrategy.NO_SHARD
    )
    assert FSDPStrategy(use_orig_params=False).fsdp_kwargs["use_orig_params"] is False


def test_class_name_that_matches_no_module() -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"auto_wrap_policy names the class 'Blok', but no module of that class is in the model\. Classes in the model: Block, Embedding",
    ):
        FSDPStrategy(auto_wrap_policy=["Blok"]).plan_wrapping(Tied(), world_size=2)


def test_trainer_level_errors(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError, match=r"strategy='fsdp' with a single CPU process shards nothing"
    ):
        fullshard.Trainer(accelerator="cpu", devices=1, strategy="fsdp", default_root_dir=tmp_path)
    with pytest.raises(
        MisconfigurationError,
        match=r"device_mesh=\(2, 2\) covers 4 processes, but the job has 2 \(num_nodes=1 x devices=2\)",
    ):
        fullshard.Trainer(
            accelerator="cpu",
            devices=2,
            default_root_dir=tmp_path,
            strategy=FSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 2)),
        )


def test_precision_mapping() -> None:
    expected = {
        "32-true": (torch.float32, torch.float32, torch.float32),
        "16-mixed": (torch.float16, torch.float32, torch.float32),
        "bf16-mixed": (torch.bfloat16, torch.float32, torch.float32),
        "16-true": (torch.float16, torch.float16, torch.float16),
        "bf16-true": (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    }
    for precision, dtypes in expected.items():
        config = FSDPPrecision(precision).mixed_precision_config
        assert (config.param_dtype, config.reduce_dtype, config.buffer_dtype) == dtypes, precision
    assert type(FSDPPrecision("16-mixed").scaler).__name__ == "ShardedGradScaler"
    own = MixedPrecision(param_dtype=torch.float16)
    assert FSDPPrecision("bf16-mixed", mixed_precision=own).mixed_precision_config is own


def test_fixed_mmap_threshold_on_glibc() -> None:
    import platform

    from fullshard.strategies.cpu_memory import fix_malloc_mmap_threshold

    changed = fix_malloc_mmap_threshold(128 * 1024)
    assert changed == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    assert (
        FSDPStrategy().cpu_mmap_threshold == 128 * 1024
        and FSDPStrategy(cpu_mmap_threshold=None).cpu_mmap_threshold is None
    )

"""The memory planner on steps that read tensor values ([Note: data-dependent steps] in
fullshard/planner/data_dependent.py), on steps the Trainer refuses, and on Hugging Face's SDPA
attention ([Note: a library's path on fake tensors]).

The routed predictions are checked against a twin of static shapes doing the same work (the
measured runs are benchmarks/planner.py's mixtral and qwen2moe cases)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullshard
from fullshard.errors import MisconfigurationError
from fullshard.planner import Candidate, plan

EXPERTS, WIDTH, TOKENS = 4, 64, 512


class Experts(nn.Module):
    """Experts a token is routed to by its id (expert ``id % EXPERTS``): ``torch.where`` per expert,
    an expert with no token skipped (``.item()``), as Hugging Face's eager experts do."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(WIDTH, 4 * WIDTH) for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor, route: Any) -> torch.Tensor:
        out = torch.zeros(x.shape[0], 4 * WIDTH)
        for e, expert in enumerate(self.experts):
            if isinstance(route, list):  # the static twin: each expert's tokens given
                tokens = route[e]
            else:
                if not bool((route == e).any()):
                    continue
                (tokens,) = torch.where(route == e)
            if tokens.numel():
                out = out.index_add(0, tokens, F.gelu(expert(x[tokens])))
        return out


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = Experts()
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, route: Any) -> torch.Tensor:
        return x + self.down(self.experts(x, route))


class MoE(fullshard.Module):
    """Batch: (x, y, route): ``route`` a token's expert (the data-dependent model) or each expert's
    tokens (a list: the static twin)."""

    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, route = batch
        for block in self.blocks:
            x = block(x, route)
        return F.mse_loss(x, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), foreach=False)


def moe_batches() -> tuple[Any, Any]:
    """A batch routed unevenly (expert 3 gets nothing), and its static twin."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(TOKENS, WIDTH, generator=generator), torch.randn(TOKENS, WIDTH, generator=generator)
    route = torch.tensor([0] * 300 + [1] * 150 + [2] * 62)
    static = [torch.where(route == e)[0] for e in range(EXPERTS)]
    return (x, y, route), (x, y, static)


def planned(
    module: nn.Module,
    batch: Any,
    devices: int = 1,
    checkpoint_every: int = 0,
    wrap: str = "Block",
    engine: str = "fsdp2",
) -> Any:
    candidate = Candidate(engine, "FULL_SHARD", (wrap,), checkpoint_every, False)
    return plan(
        module, batch, devices=devices, device_memory="1TiB", device_type="cpu", candidates=[candidate]
    )


def peak_of(
    module: nn.Module,
    batch: Any,
    devices: int = 1,
    checkpoint_every: int = 0,
    wrap: str = "Block",
    engine: str = "fsdp2",
) -> int:
    return int(planned(module, batch, devices, checkpoint_every, wrap, engine).rows[0].peak)


@pytest.mark.parametrize(("engine", "checkpoint_every"), [("fsdp2", 0), ("fsdp2", 1), ("fsdp", 0)])
def test_a_step_with_torch_where_routing_plans_as_its_static_twin(engine: str, checkpoint_every: int) -> None:
    dynamic, static = moe_batches()
    routed = planned(MoE(), dynamic, devices=2, checkpoint_every=checkpoint_every, engine=engine)
    predicted = routed.rows[0].peak
    twin_plan = planned(MoE(), static, devices=2, checkpoint_every=checkpoint_every, engine=engine)
    twin = twin_plan.rows[0].peak
    assert any("replayed from one real forward" in note for note in routed.notes)
    assert not any("replayed" in note for note in twin_plan.notes)
    # the twin's batch holds each expert's token indices, the routed step makes them: the same bytes
    # but for the route tensor and its comparisons (a few KiB); every token sent to every expert
    # would be 300 KiB more a block
    assert abs(predicted - twin) <= 16 * 1024, (predicted, twin)


class ReadsValues(MoE):
    """``.item()`` in the step itself: a loss scale read from the batch."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, route = batch
        scale = float(y.abs().max().item())
        for block in self.blocks:
            x = block(x, route)
        return F.mse_loss(x, y) / scale


def test_item_in_a_step_plans() -> None:
    _, static = moe_batches()
    assert abs(peak_of(ReadsValues(), static) - peak_of(MoE(), static)) <= 4096


class CountsSteps(MoE):
    """Routes only from its second call: the recorded forward (its first) routes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls += 1
        x, y, route = batch
        x = self.blocks[0](x, [torch.arange(8)] * EXPERTS)  # static routing
        if self.calls > 1:
            (first,) = torch.where(route == 0)
            x = x + x[first].sum()
        return F.mse_loss(x, y)


def test_control_flow_the_recording_does_not_show_is_refused_naming_the_op_and_module() -> None:
    dynamic, _ = moe_batches()
    with pytest.raises(
        MisconfigurationError, match=r"cannot simulate aten\.nonzero\.default in the root module"
    ):
        peak_of(CountsSteps(), dynamic)


class VectorLoss(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        for block in self.blocks:
            batch = block(batch)
        return batch.sum(0)  # a vector, not a loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp"])
def test_a_step_the_trainer_refuses_gets_the_trainers_error_not_a_plan(engine: str) -> None:
    data = torch.randn(4, 8)
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.raises(RuntimeError) as by_trainer:
        trainer.fit(VectorLoss(), torch.utils.data.DataLoader([data], batch_size=None))
    with pytest.raises(RuntimeError) as by_planner:
        peak_of(VectorLoss(), data, wrap="Linear", engine=engine)
    assert type(by_planner.value) is type(by_trainer.value)
    assert str(by_planner.value) == str(by_trainer.value)
    assert "only for scalar outputs" in str(by_planner.value)


class DictWithoutLoss(VectorLoss):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
        return {"out": super().training_step(batch, batch_idx)}


def test_a_result_without_a_loss_gets_the_trainers_message() -> None:
    with pytest.raises(
        MisconfigurationError, match=r"training_step returned dict; return the loss tensor, a dict"
    ):
        peak_of(DictWithoutLoss(), torch.randn(4, 8), wrap="Linear")


class TinyLlama(fullshard.Module):
    def __init__(self, attention: str) -> None:
        super().__init__()
        from transformers import LlamaConfig

        config = LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, use_cache=False,
        )  # fmt: skip
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.model(input_ids=batch, labels=batch).loss
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), foreach=False)


def test_hugging_face_sdpa_keeps_what_eager_keeps_less_the_attention_probabilities() -> None:
    """Eager attention keeps each layer's softmax probabilities (batch x heads x seq x seq) for
    backward and one additive mask; SDPA keeps neither (measured on a tiny Llama, 2 processes:
    39.36 MiB eager, 35.39 MiB SDPA, both as predicted now). Before the fix the SDPA prediction
    had a mask and an attention-sized tensor Hugging Face makes only on fake tensors (1 MiB here)."""
    pytest.importorskip("transformers")
    ids = torch.randint(0, 256, (4, 128), generator=torch.Generator().manual_seed(0))
    eager = peak_of(TinyLlama("eager"), ids, devices=2, wrap="LlamaDecoderLayer")
    sdpa = peak_of(TinyLlama("sdpa"), ids, devices=2, wrap="LlamaDecoderLayer")
    probabilities = 2 * 4 * 4 * 128 * 128 * 4  # layers x batch x heads x seq x seq x fp32
    mask = 4 * 128 * 128 * 4  # eager's additive mask, batch x 1 x seq x seq (SDPA: is_causal, none)
    assert abs((eager - sdpa) - (probabilities + mask)) <= 0.05 * probabilities, (eager, sdpa)


def test_grouped_mm_on_float32_runs_on_fake_tensors_with_the_cpu_kernels_shapes() -> None:
    """Hugging Face's default experts call ``torch._grouped_mm`` in float32 on CPU; torch's fake
    kernel refused that ([Note: a fake kernel stricter than the CPU's])."""
    from fullshard.planner import torch_tools

    offs = torch.tensor([3, 5, 9], dtype=torch.int32)
    cases = [
        (torch.randn(9, 8), torch.randn(3, 8, 4), offs),  # tokens x experts' weights (the MoE case)
        (torch.randn(3, 5, 8), torch.randn(3, 8, 4), None),  # batched
    ]
    for a, b, o in cases:
        real = torch._grouped_mm(a, b, offs=o)
        mode = torch_tools.fake_tensor_mode()
        with torch_tools.float_grouped_mm(), mode:
            fake = torch._grouped_mm(
                mode.from_tensor(a), mode.from_tensor(b), offs=None if o is None else mode.from_tensor(o)
            )
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype)
    with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):  # outside it, torch's own check
        mode = torch_tools.fake_tensor_mode()
        with mode:
            torch._grouped_mm(
                mode.from_tensor(cases[0][0]), mode.from_tensor(cases[0][1]), offs=mode.from_tensor(offs)
            )


class GroupedExperts(MoE):
    """Experts as one (experts, in, out) weight, applied with ``torch._grouped_mm`` in float32."""

    def __init__(self) -> None:
        super().__init__(depth=1)
        self.weight = nn.Parameter(torch.randn(EXPERTS, WIDTH, WIDTH))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        counts = torch.tensor([300, 150, 62, 0]).cumsum(0).to(torch.int32)
        x = self.blocks[0](x, [torch.arange(8)] * EXPERTS) + torch._grouped_mm(x, self.weight, offs=counts)
        return F.mse_loss(x, y)


def test_a_float32_grouped_mm_step_plans() -> None:
    dynamic, _ = moe_batches()
    assert peak_of(GroupedExperts(), dynamic) > 0

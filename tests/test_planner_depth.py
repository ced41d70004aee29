"""The memory planner on models it must not take for a stack of identical blocks, its extension
to depth (no negative byte in any row of the 7B and 70B tables), the blocks it wraps (a ResNet by
its BasicBlock), plan="auto" over every sharding and host_memory=, and sizes it refuses
(issue 40 items 3 and 7)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullshard
from fullshard.errors import MisconfigurationError
from fullshard.planner import Candidate, plan
from fullshard.planner.candidates import MAX_UNITS, depth_and_reason, repeated_blocks
from fullshard.planner.simulate import simulate
from proc_helpers import clean_env

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


class Resize(nn.Module):
    """A block of its own inner width between two projections (blocks of several widths)."""

    def __init__(self, width: int, inner: int, index: int) -> None:
        super().__init__()
        self.layer_idx = index  # the block's position: names it, changes no memory
        self.into, self.out = nn.Linear(width, inner), nn.Linear(inner, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(F.relu(self.into(x)))


class Stack(fullshard.Module):
    def __init__(self, inner: list[int], width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Resize(width, w, i) for i, w in enumerate(inner))
        self.head = nn.Linear(width, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        for block in self.blocks:
            x = block(x)
        return F.mse_loss(self.head(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters())


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 8, 16), torch.randn(4, 8, 16)


FULL = Candidate("fsdp2", "FULL_SHARD", ("Resize",), 0, False)


def _whole(model: nn.Module) -> int:
    return simulate(
        model, _batch(), FULL, layout=FULL.layout(2, 1), precision="32-true", device_type="cpu"
    ).peak


@pytest.mark.parametrize(
    ("widths", "extended"),
    [
        ([8 * (1 + i) for i in range(12)], False),  # every block wider than the one before
        ([8, 32] * 6, True),  # a pattern of period 2: each cut of 4 and 8 blocks holds whole periods
    ],
    ids=["widening", "alternating"],
)
def test_blocks_that_differ_are_extended_only_where_exact(widths: list[int], extended: bool) -> None:
    """Blocks of one class with different widths were extended as if identical (issue 40: -26% on
    the peak, the note saying "identical"); now they are simulated whole, or extended per period, and equal the whole
    simulation either way; the note says which was done."""
    model = Stack(widths)
    result = plan(
        model, _batch(), devices=2, device_memory="1GiB", device_type="cpu", candidates=[FULL], workers=1
    )
    assert result.rows[0].peak == _whole(model)
    note = result.notes[0]
    if extended:
        assert "extended to 12 (the model's blocks are identical every 2 (the pattern repeats)" in note
    else:
        assert note.startswith(
            "simulated whole: its 12 blocks are not identical (block 1's tensor into.weight"
        )


def test_what_makes_blocks_identical() -> None:
    """Shapes, dtypes, trainability and plain attributes count; a position index does not."""
    same = Stack([8] * 16)
    assert depth_and_reason(same, ("Resize",))[0] == 16  # layer_idx 0..15 differ, and do not count
    frozen = Stack([8] * 16)
    frozen.blocks[5].into.weight.requires_grad_(False)  # no gradient, no optimizer state
    flagged = Stack([8] * 16)
    flagged.blocks[3].sliding = True  # a flag a forward may read (local attention)
    for model in (frozen, flagged):
        depth, note = depth_and_reason(model, ("Resize",))
        assert depth is None and "are not identical" in note


# -- a torchvision-shaped ResNet (torchvision is not installed): stem, four stages of blocks, head
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn3(self.conv3(F.relu(self.bn2(self.conv2(out)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, block: Any, layers: list[int], width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * width * block.expansion, classes)

    def _make_layer(self, block: Any, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def test_a_resnet_is_wrapped_by_its_blocks_and_a_transformer_by_its_layers() -> None:
    """[Note: the finest repeated block]: a stage that only holds blocks is looked through, while
    the units stay at most MAX_UNITS; a Transformer layer (norms beside attention and MLP) is kept."""
    from fullshard.demos import Transformer

    assert repeated_blocks(ResNet(BasicBlock, [2, 2, 2, 2])) == ("BasicBlock",)  # resnet18's shape
    assert repeated_blocks(ResNet(Bottleneck, [3, 4, 6, 3])) == ("Bottleneck",)  # resnet50's
    many = ResNet(BasicBlock, [2, 2, 2, 2])
    many.layer1 = nn.Sequential(*(BasicBlock(8, 8) for _ in range(MAX_UNITS)))  # 106 blocks: too many units
    assert repeated_blocks(many) == ("Sequential",)
    assert repeated_blocks(Transformer(nlayers=2)) == ("TransformerDecoderLayer", "TransformerEncoderLayer")


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, -1, 0, 0.5, True, "lots", "0GiB", "1e400GiB"]
)
@pytest.mark.parametrize(
    "setting", ["device_memory", "host_memory", "plan_device_memory", "plan_host_memory"]
)
def test_bad_sizes_name_the_setting_what_was_given_and_what_is_accepted(setting: str, value: Any) -> None:
    from fullshard.strategies import FSDP2Strategy, FSDPStrategy

    shown = repr(value).replace("(", r"\(").replace(")", r"\)")
    accepted = r"(a positive number of bytes, or a string such as '80GiB'|Write a number and a unit)"
    with pytest.raises(MisconfigurationError, match=rf"{setting}={shown}.*{accepted}"):
        if setting.startswith("plan_"):
            (FSDPStrategy if setting == "plan_host_memory" else FSDP2Strategy)(
                plan="auto", **{setting: value}
            )
        else:
            kwargs = {"device_memory": "1GiB", setting: value}
            plan(Stack([8] * 2), _batch(), devices=2, device_type="cpu", **kwargs)


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp"])
def test_plan_auto_lays_the_job_out_again_for_the_sharding_it_chooses(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HYBRID_SHARD and NO_SHARD lay the processes out otherwise than FULL_SHARD, which the job
    was laid out for before the model was seen: applying the choice lays it out as the planner
    simulated it (Candidate.layout), with the same data split."""
    from fullshard.launch.environments import LocalEnvironment
    from fullshard.strategies import FSDP2Strategy, FSDPStrategy

    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"), ("NODE_RANK", "0")):
        monkeypatch.setenv(name, value)  # node 0 of 2, configured only: no process group is made
    for sharding, shape in (("HYBRID_SHARD", (2, 2)), ("NO_SHARD", (4, 1)), ("SHARD_GRAD_OP", (1, 4))):
        strategy = (FSDP2Strategy if engine == "fsdp2" else FSDPStrategy)(plan="auto")
        strategy.configure(
            devices=[torch.device("cpu")] * 2,
            num_nodes=2,
            cluster_environment=LocalEnvironment(),
            precision="32-true",
        )
        assert (strategy.layout.replicas, strategy.layout.shards) == (1, 4)
        candidate = Candidate(engine, sharding, ("Resize",), 1, False)
        strategy._apply_candidate(candidate)
        assert (strategy.layout.replicas, strategy.layout.shards) == shape
        assert strategy.layout == candidate.layout(2, 2) and strategy.data_parallel_size == 4
    assert strategy._plannable_shardings() is None
    fixed = FSDP2Strategy(plan="auto", device_mesh=(2, 2))  # a layout by hand: kept
    assert fixed._plannable_shardings() == ("FULL_SHARD", "SHARD_GRAD_OP")


@pytest.mark.parametrize(
    ("factory", "devices", "probes"),
    [
        ("llama_7b", 8, [("FULL_SHARD", 1)]),
        # a probe whose peak changes phase between the cuts and 80 layers: a line through the two
        # overall peaks gave it 717 GiB, 746 GiB per phase
        ("llama_70b", 8, [("FULL_SHARD", 0)]),
    ],
)
def test_no_row_of_the_7b_and_70b_tables_holds_a_negative_byte(
    factory: str, devices: int, probes: list[tuple[str, int]]
) -> None:
    """Each phase extended on its own line ([Note: a peak per phase]): every figure of every row
    (its offload twin included) is a byte count of at least 0, and the peak is its split's sum."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _planner_models as models
    finally:
        sys.path.remove(str(BENCHMARKS))
    module, tokens = getattr(models, factory)()
    candidates = [
        Candidate("fsdp2", sharding, ("LlamaDecoderLayer",), every, offload)
        for sharding, every in probes
        for offload in (False, True)
    ]
    result = plan(
        module, tokens, devices=devices, device_memory="80GiB", device_type="cuda", precision="bf16-mixed",
        candidates=candidates,
    )  # fmt: skip
    assert "blocks per list and extended to" in result.notes[0]
    for row in result.rows:
        figures = [row.peak, *row.split.values(), row.comm_bytes, row.host_bytes, row.host_peak]
        assert min(figures) >= 0, (row.candidate.label(), row.split)
        assert row.peak == sum(row.split.values())
    if factory == "llama_70b":  # what simulating all 80 layers gives (12.5 CPU-seconds: too slow here)
        kept = next(row for row in result.rows if not row.candidate.cpu_offload)
        assert kept.peak == pytest.approx(745.632 * 2**30, rel=0.005)  # one line through the peaks: 717


def test_each_phase_is_extended_on_its_own_line_and_the_highest_is_the_peak() -> None:
    """[Note: a peak per phase], on made-up figures: at 4 and 8 blocks backward holds the peak (a
    line through those overall peaks says 80 blocks need 430), but the optimizer step grows faster
    and at 80 blocks holds it (486); a phase whose figure would come out negative is no line to
    extend (None: simulate whole)."""
    from fullshard.planner.candidates import extend_to_depth
    from fullshard.planner.simulate import Simulated
    from fullshard.planner.torch_tools import Phase

    def phase(activations: int, optimizer: int) -> Phase:
        split = {"params": 10, "grads": 0, "optimizer": optimizer, "activations": activations, "comm": 0}
        host = {"params": 10, "grads": 0, "optimizer": optimizer}
        return Phase(sum(split.values()), split, host, activations, {**split, "params": 0, "optimizer": 0})

    def sim(*phases: Phase) -> Simulated:
        top = max(phases, key=lambda p: p.peak)
        return Simulated(top.peak, top.split, top.offloadable, 0, 0, 1, phases=phases)

    low, high = sim(phase(40, 0), phase(0, 20)), sim(phase(60, 0), phase(0, 44))  # 4 and 8 blocks
    assert low.peak == 50 and high.peak == 70  # backward's, at both cuts
    extended = extend_to_depth(low, high, (4, 8), 80)
    assert extended is not None and extended.extended_from == (4, 8)
    assert extended.peak == 486 and extended.split["optimizer"] == 476 and extended.split["activations"] == 0
    assert [p.peak for p in extended.phases] == [430, 486] and extended.phases[0].resident == 420
    shrinking = sim(phase(50, 0), phase(0, 20)), sim(phase(30, 0), phase(0, 40))  # activations fall
    assert extend_to_depth(*shrinking, (4, 8), 80) is None


def test_a_probe_whose_line_fails_is_simulated_whole_and_the_note_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fullshard.planner.api as api

    monkeypatch.setattr(api, "extend_to_depth", lambda *args: None)  # as when a figure would be negative
    model = Stack([8] * 12)
    result = plan(
        model, _batch(), devices=2, device_memory="1GiB", device_type="cpu", candidates=[FULL], workers=1
    )
    assert result.rows[0].peak == _whole(model)
    assert "extended to 12 (the model's blocks are identical" in result.notes[0]
    assert (
        "; except fsdp2 FULL_SHARD AC none: simulated whole, as a phase's peak moved within the phase"
        in result.notes[0]
    )


def test_a_forked_planner_forgets_a_group_no_mesh_holds_and_returns(tmp_path: Path) -> None:
    """plan="auto" plans in a forked child that forgets the job's group ([Note: planning inside a
    running job]); a group no device mesh holds (FSDPStrategy's FULL_SHARD) had its destructor run
    there, joining gloo threads a fork does not copy: FSDPStrategy(plan="auto") hung for ever."""
    script = tmp_path / "forget.py"
    script.write_text(
        textwrap.dedent(
            """
            import socket
            import torch.distributed as dist
            from fullshard.planner.forked import run_forked

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
            print(run_forked([lambda: 7], 1, forget_group=True))
            dist.destroy_process_group()
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "[7]", done.stderr[-2000:]

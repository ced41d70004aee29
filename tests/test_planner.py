"""The memory planner (fullshard.planner): arguments, the choice of blocks, simulations against
their own arithmetic, the fewer-layer extension against a whole simulation, torch's tools behind
one module, the command line, and plan="auto" in a real 2-process job on CPU."""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullshard
from conftest import check_ok, run_script
from fullshard.errors import MisconfigurationError
from fullshard.planner import Candidate, PlannerUnavailableError, parse_bytes, plan, torch_tools
from fullshard.planner.candidates import repeated_blocks
from fullshard.planner.overhead import cpu_process_overhead
from fullshard.strategies.auto_plan import check_plan_setting
from proc_helpers import clean_env


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.relu(self.up(x)))


class Net(fullshard.Module):
    def __init__(self, depth: int = 2, width: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        for block in self.blocks:
            x = block(x)
        self.log("loss", 1.0)  # logging does nothing while planning
        return F.mse_loss(self.head(self.norm(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters())


def batch(rows: int = 8, width: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, 16, width), torch.randn(rows, 16, width)


def test_sizes_parse_and_bad_ones_say_the_form() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes(1024) == 1024
    with pytest.raises(MisconfigurationError, match=r"device_memory='80 gigs' is not a size.*'80GiB'"):
        parse_bytes("80 gigs")
    with pytest.raises(MisconfigurationError, match="must be a positive size"):
        parse_bytes(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"devices": 0}, r"devices=0 must be an int of at least 1"),
        ({"precision": "bf16"}, r"precision='bf16' is not one the planner knows; accepted: 32-true"),
        ({"headroom": 1.5}, r"headroom=1.5 must be a fraction in \[0, 1\)"),
        ({"engines": ("fsdp3",)}, r"engines=\('fsdp3',\) must name 'fsdp2' and/or 'fsdp'"),
        ({"device_memory": None}, r"device_memory is needed to plan for cpu devices"),
        (
            {"wrap": ("Decoder",)},
            r"wrap=\['Decoder'\] names \['Decoder'\], which Net does not contain.*\['Block'\]",
        ),
        ({"device_type": "tpu"}, r"device_type='tpu' must be 'cuda' or 'cpu'"),
        ({"workers": 0}, r"workers=0 must be an int of at least 1 \(processes to simulate in\)"),
        (
            {"shardings": ("HYBRID_SHARD",)},
            r"shardings=\('HYBRID_SHARD',\) leaves no candidate to weigh for 1 node\(s\) of 2 process\(es\)",
        ),
    ],
)
def test_bad_arguments_say_what_is_accepted(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"devices": 2, "device_memory": "1GiB", "device_type": "cpu", **kwargs}
    with pytest.raises(MisconfigurationError, match=message):
        plan(Net(), batch(), **arguments)


def test_one_process_plans_too() -> None:
    """FSDP on one device (a single-GPU run): nothing is sharded, so every sharding holds it all."""
    result = plan(
        Net(depth=4), batch(), devices=1, device_memory="1GiB", device_type="cpu", engines=("fsdp2",)
    )
    numel = sum(p.numel() for p in Net(depth=4).parameters())
    assert {r.split["params"] for r in result.rows if r.candidate.checkpoint_every == 0} == {numel * 4}
    assert result.choice is not None and result.choice.comm_bytes == 0


class CallsItself(Net):
    """A training_step that runs the model through ``self(x)``, as most LightningModules do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)


def test_a_training_step_calling_self_runs_the_modules_forward() -> None:
    kwargs: dict[str, Any] = dict(
        devices=2, device_memory="1GiB", device_type="cpu", engines=("fsdp2",), workers=1
    )
    torch.manual_seed(0)
    itself, direct = plan(CallsItself(depth=4), batch(), **kwargs), plan(Net(depth=4), batch(), **kwargs)
    assert [(r.candidate, r.peak) for r in itself.rows] == [(r.candidate, r.peak) for r in direct.rows]


def test_a_model_without_repeated_blocks_asks_for_wrap() -> None:
    with pytest.raises(MisconfigurationError, match=r"has no repeated blocks.*Pass wrap=\('MyBlock',\)"):
        plan(
            nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
            torch.randn(2, 4),
            devices=2,
            device_memory="1GiB",
            device_type="cpu",
        )


def test_repeated_blocks_are_the_outer_ones_not_a_lone_head_or_a_norm() -> None:
    from fullshard.demos import Transformer

    class InSequential(nn.Module):  # blocks in an nn.Sequential, whose own blocks hold a Sequential
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(
                *(nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)) for _ in range(3))
            )
            self.head = nn.Linear(8, 1)

    assert repeated_blocks(InSequential()) == ("Sequential",)  # the three inner ones, not the holder
    stacked = nn.Sequential(*(Block(8) for _ in range(3)), nn.Linear(8, 1))
    assert repeated_blocks(nn.Sequential(stacked, nn.Linear(1, 1))) == ("Block",)

    assert repeated_blocks(Net(depth=3)) == ("Block",)  # not Linear (inside blocks, one head), not LayerNorm
    assert repeated_blocks(Transformer(nlayers=2)) == ("TransformerDecoderLayer", "TransformerEncoderLayer")


def test_the_plan_shards_state_checkpointing_saves_activations_and_the_choice_fits() -> None:
    module = Net(depth=4, width=64)
    numel = sum(p.numel() for p in module.parameters())
    # 1.8 MiB for tensors beside what is not a tensor ([Note: memory that is not tensors])
    memory = int((1.8 * 2**20 + cpu_process_overhead(2)) / 0.95)
    result = plan(
        module, batch(16, 64), devices=2, device_memory=memory, device_type="cpu", engines=("fsdp2",)
    )
    rows = {(r.candidate.sharding, r.candidate.checkpoint_every): r for r in result.rows}
    assert len(rows) == 9  # 3 shardings x (none, every block, every 2nd)
    full, replicated = rows[("FULL_SHARD", 0)], rows[("NO_SHARD", 0)]
    # each rank holds half of the float32 parameters and Adam's two states (chunks pad a little)
    assert numel * 4 / 2 <= full.split["params"] <= numel * 4 / 2 * 1.05
    assert full.split["optimizer"] == pytest.approx(2 * full.split["params"], rel=0.01)
    assert replicated.split["params"] == numel * 4
    assert rows[("FULL_SHARD", 1)].split["activations"] < full.split["activations"]
    assert rows[("FULL_SHARD", 1)].flops > full.flops  # the recomputed forward
    assert result.choice is not None and result.choice.fits and result.choice.process_peak <= result.budget
    assert all(r.process_peak > result.budget for r in result.rows if r.seconds < result.choice.seconds)
    assert any(r.seconds < result.choice.seconds for r in result.rows)  # the budget decided
    table = result.table()
    assert "* fsdp2" in table and "FSDP plan: 2 process(es)" in table


def test_simulations_on_several_cores_give_the_plan_of_one() -> None:
    """[Note: simulating on several cores]: forked workers return each simulation in order, and a
    failing simulation's error comes back here. In a fresh single-threaded process: this pytest
    worker runs other threads, so the planner does not fork in it (the next test)."""
    result = run_script("planner_forked_job.py", fresh_python=True, timeout=240)
    check_ok(result)
    assert "forked planning ok" in result.stdout


@pytest.mark.parametrize("start", ["threading", "_thread"])
def test_a_process_with_other_threads_plans_without_forking(
    monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    """Also beside a thread ``threading`` does not know (``_thread.start_new_thread``, as
    pytest-xdist's receiver thread is started): a planner test hung forked beside one."""

    def no_fork() -> int:
        raise AssertionError("the planner forked beside another thread")

    monkeypatch.setattr(os, "fork", no_fork)
    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def wait() -> None:
        started.set()
        release.wait()
        done.set()

    if start == "threading":
        threading.Thread(target=wait).start()
    else:
        _thread.start_new_thread(wait, ())
    started.wait(10)  # running Python code: a thread not yet started holds no lock a fork could copy
    try:
        result = plan(Net(depth=4), batch(), devices=2, device_memory="4MiB", device_type="cpu", workers=3)
    finally:
        release.set()
        done.wait(10)
    assert result.rows


class TiedNet(Net):
    """Net with an embedding tied to its output head (as GPT-2's)."""

    def __init__(self) -> None:
        super().__init__(depth=2, width=32)
        self.embed = nn.Embedding(512, 32)
        self.out = nn.Linear(32, 512, bias=False)
        self.out.weight = self.embed.weight

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = self.embed(batch)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.out(x).flatten(0, 1), batch.flatten())


def test_a_tied_weight_is_one_parameter_with_one_gradient_and_one_state() -> None:
    module = TiedNet()
    numel = sum(p.numel() for p in module.parameters())  # the tied weight once
    result = plan(
        module,
        torch.randint(0, 512, (4, 16)),
        devices=2,
        device_memory="1GiB",
        device_type="cpu",
        engines=("fsdp2",),
        candidates=[Candidate("fsdp2", "NO_SHARD", ("Block",), 0, False)],
    )
    row = result.rows[0]
    assert row.split["params"] == numel * 4
    steps = 4 * len(list(module.parameters()))  # AdamW's float32 step count per parameter
    assert row.split["optimizer"] == 2 * numel * 4 + steps


def test_a_given_candidate_is_simulated_with_its_own_blocks() -> None:
    """Wrapping fewer classes than the model's repeated ones changes what is gathered at once."""
    kwargs: dict[str, Any] = dict(devices=2, device_memory="1GiB", device_type="cpu", workers=1)
    module = Net(depth=4)
    assert repeated_blocks(module) == ("Block",)
    whole = plan(module, batch(), candidates=[Candidate("fsdp2", "FULL_SHARD", ("Net",), 0, False)], **kwargs)
    blocks = plan(
        module, batch(), candidates=[Candidate("fsdp2", "FULL_SHARD", ("Block",), 0, False)], **kwargs
    )
    # one unit (the root) gathers every parameter for the whole step; per-block units one block at a time
    assert whole.rows[0].split["comm"] > blocks.rows[0].split["comm"]


def test_fewer_layers_extended_match_the_whole_simulation() -> None:
    """[Note: simulating fewer layers]: 12 blocks simulated as 4 and 8, against all 12."""
    from fullshard.planner import api
    from fullshard.planner.simulate import meta_copy, simulate

    module, data = Net(depth=12, width=32), batch(8, 32)
    candidate = Candidate("fsdp2", "FULL_SHARD", ("Block",), 0, False)
    whole = simulate(meta_copy(module), data, candidate, layout=candidate.layout(2, 1), precision="32-true")
    extended = api._simulate(meta_copy(module), data, candidate, 12, 2, 1, "32-true", False)
    assert extended.peak == pytest.approx(whole.peak, rel=0.05)
    assert extended.split["params"] == pytest.approx(whole.split["params"], rel=0.02)


def test_a_candidate_builds_the_strategy_that_runs_it_and_lays_out_the_job_as_it_does() -> None:
    """A Candidate is frozen; its strategy() is the strategy configured as it says, and layout()
    that strategy's ParallelLayout of the job (the planner's meshes and step costs read it)."""
    import dataclasses

    from fullshard.strategies import FSDP2Strategy, FSDPStrategy

    grad_op = Candidate("fsdp2", "SHARD_GRAD_OP", ("Block",), 2, False)
    strategy = grad_op.strategy()
    assert isinstance(strategy, FSDP2Strategy) and strategy.reshard_after_forward is False
    assert not strategy.offloads_params and strategy.activation_checkpointing_policy is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        grad_op.sharding = "FULL_SHARD"  # type: ignore[misc]
    hybrid = Candidate("fsdp", "HYBRID_SHARD", ("Block",), 0, True)
    assert isinstance(hybrid.strategy(), FSDPStrategy) and hybrid.strategy().offloads_params
    layout = hybrid.layout(4, 2)  # a replica per node, sharded over its 4 processes
    assert (layout.replicas, layout.shards, layout.mesh_dims) == (2, 4, ("replicate", "shard"))
    assert Candidate("fsdp2", "NO_SHARD", ("Block",), 0, False).layout(4, 2).mesh_shape == (8, 1)
    assert Candidate("fsdp2", "FULL_SHARD", ("Block",), 0, False).layout(4, 2).mesh_shape == (8,)
    # the names of the plans: MemoryPlan (Plan, its older name), the wrap plan (plan is plan_wrapping's)
    assert fullshard.planner.Plan is fullshard.planner.MemoryPlan
    assert fullshard.planner.PlanRow is fullshard.planner.MemoryPlanRow
    assert FSDP2Strategy.plan is FSDP2Strategy.plan_wrapping


def test_the_simulation_shards_through_the_strategys_own_wrapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """One implementation of wrapping: simulate() calls fully_shard_model, the function
    FSDP2Strategy._wrap calls, with the strategy's reshard setting; an FSDP1 candidate goes through
    FSDP1's own wrapping instead (tests/test_planner_fsdp1.py)."""
    from fullshard.planner.simulate import meta_copy, simulate
    from fullshard.strategies import wrapping

    calls: list[dict[str, Any]] = []
    real = wrapping.fully_shard_model

    def spy(*args: Any, **kwargs: Any) -> list[nn.Module]:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(wrapping, "fully_shard_model", spy)
    module, data = Net(depth=2, width=16), batch(4, 16)
    candidate = Candidate("fsdp2", "SHARD_GRAD_OP", ("Block",), 1, False)
    simulate(meta_copy(module), data, candidate, layout=candidate.layout(2, 1), precision="32-true")
    assert len(calls) == 1 and calls[0]["reshard_after_forward"] is False
    assert calls[0]["auto_wrap"] is not None and calls[0]["checkpointing"] is not None
    fsdp1 = Candidate("fsdp", "FULL_SHARD", ("Block",), 0, False)
    simulate(meta_copy(module), data, fsdp1, layout=fsdp1.layout(2, 1), precision="32-true")
    assert len(calls) == 1


def test_torch_without_the_tracker_raises_rather_than_guessing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.fsdp2_mem_tracker", None)
    with pytest.raises(
        PlannerUnavailableError, match=r"needs torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker"
    ):
        torch_tools.memory_tracker(nn.Linear(2, 2), None)

    class Tracker:
        def get_tracker_snapshot(self, kind: str) -> dict[Any, dict[str, int]]:
            return {torch.device("cpu"): {"Total": 1, "Something New": 1}}

    with pytest.raises(PlannerUnavailableError, match=r"category 'Something New' the planner does not know"):
        torch_tools.peak_by_category(Tracker(), torch.device("cpu"))


def test_plan_auto_refuses_the_settings_it_chooses() -> None:
    from fullshard.strategies import FSDP2Strategy, FSDPStrategy

    with pytest.raises(
        MisconfigurationError, match=r"plan='auto' chooses sharding_strategy, auto_wrap_policy itself"
    ):
        FSDP2Strategy(plan="auto", sharding_strategy="SHARD_GRAD_OP", auto_wrap_policy={Block})
    with pytest.raises(MisconfigurationError, match=r"plan='fast' is not accepted: pass plan='auto'"):
        FSDPStrategy(plan="fast")
    with pytest.raises(
        MisconfigurationError,
        match=r"plan_batch=, plan_device_memory= and plan_host_memory= are for plan='auto'",
    ):
        check_plan_setting(None, batch(), None, given={})
    strategy = fullshard.strategies.STRATEGY_REGISTRY.get("fsdp_auto")
    assert isinstance(strategy, FSDP2Strategy) and strategy._auto_plan is not None


def test_the_command_prints_the_table_and_the_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fullshard.cli import main

    script = tmp_path / "make.py"
    script.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make(batch=4):\n"
        "    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2)])\n"
        "    return model, torch.randn(batch, 8)\n"
    )
    status = main(["plan", f"{script}:make", "--devices", "2", "--device-memory", "128MiB", "--device-type", "cpu",
                   "--engine", "fsdp2", "--batch", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert (
        status == 0
        and "FSDP plan: 2 process(es)" in out
        and "choice: FSDP2Strategy(sharding_strategy=" in out
    )
    assert main(["plan", f"{script}:nothing", "--devices", "2", "--device-memory", "1MiB"]) == 1
    assert "has no function 'nothing'. Its functions and classes: make" in capsys.readouterr().err


def test_plan_auto_in_a_two_process_job(tmp_path: Path) -> None:
    """Rank 0 plans beside the job's gloo group (forked), both ranks apply the same choice and train."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            import torch
            import fullshard
            from fullshard.strategies import FSDP2Strategy
            from test_planner import Net, batch

            def status(key):  # KiB
                return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":"))

            data = [batch(4, 32) for _ in range(4)]
            before = status("VmRSS")  # no tensor of the model yet
            strategy = FSDP2Strategy(plan="auto", plan_batch=data[0], plan_device_memory="128MiB",
                                     plan_host_memory="64GiB")
            trainer = fullshard.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=2, logger=False,
                                        enable_checkpointing=False, enable_progress_bar=False,
                                        enable_model_summary=False)
            trainer.fit(Net(depth=2), torch.utils.data.DataLoader(data, batch_size=None))
            growth = (status("VmHWM") - before) * 1024
            predicted = strategy.memory_plan.choice.process_peak if strategy.memory_plan else 0
            with open({str(tmp_path)!r} + f"/rank{{trainer.global_rank}}.txt", "w") as out:  # not stdout: both ranks write there
                out.write(f"{{strategy._sharding_name}} {{strategy.activation_checkpointing_policy is not None}}")
                out.write(f" {{growth}} {{predicted}} {{tuple(strategy.device_mesh.shape)}}")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=clean_env(), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = [(tmp_path / f"rank{rank}.txt").read_text().split(" ", 4) for rank in (0, 1)]
    # any sharding may be chosen (the fastest that fits); the job is laid out again for it
    meshes = {"FULL_SHARD": "(2,)", "SHARD_GRAD_OP": "(2,)", "NO_SHARD": "(2, 1)"}
    assert chosen[0][:2] == chosen[1][:2] and chosen[0][4] == chosen[1][4] == meshes[chosen[0][0]]
    assert "planner chose fsdp2" in done.stderr and "FSDP plan: 2 process(es)" in done.stderr
    # [Note: memory that is not tensors]: each process's RSS growth (peak less its size before
    # the Trainer) within the planned process peak, tensors and what is not a tensor
    predicted = int(chosen[0][3])
    for rank in (0, 1):
        assert 0.8 * predicted < int(chosen[rank][2]) <= 1.05 * predicted, (rank, chosen[rank], predicted)


def test_the_step_cost_counts_ring_volumes_and_offload() -> None:
    """[Note: the step-time model]: FULL_SHARD gathers twice, SHARD_GRAD_OP once, NO_SHARD all-reduces."""
    from fullshard.planner import DeviceSpec
    from fullshard.planner.cost import step_cost

    device = DeviceSpec.for_type("cuda", 80 * 2**30)
    common: dict[str, Any] = dict(numel=1000, flops=0, compute_bytes=2, reduce_bytes=4, param_bytes=4, num_nodes=1, device=device)  # fmt: skip

    def cost(sharding: str, offload: bool = False) -> Any:
        candidate = Candidate("fsdp2", sharding, ("B",), 0, offload)
        return step_cost(candidate, layout=candidate.layout(4, 1), **common)

    assert cost("FULL_SHARD").comm_bytes == (2 * 2000 + 4000) * 3 // 4
    assert cost("SHARD_GRAD_OP").comm_bytes == (2000 + 4000) * 3 // 4
    assert cost("NO_SHARD").comm_bytes == 2 * 4000 * 3 // 4
    assert cost("FULL_SHARD", offload=True).host_bytes == 250 * (2 * 4 + 4)
    assert cost("FULL_SHARD", offload=True).seconds > cost("FULL_SHARD").seconds
    with pytest.raises(MisconfigurationError, match=r"DeviceSpec got unknown field\(s\) \['flop'\]"):
        DeviceSpec.for_type("cuda", 1, flop=1.0)


def test_the_step_time_overlaps_on_cuda_adds_up_on_cpu_and_counts_each_collective() -> None:
    """[Note: the step-time model]: longer of compute and communication with overlap, their sum
    without; a fixed latency per collective, three per unit for FULL_SHARD, two for SHARD_GRAD_OP."""
    from fullshard.planner import DeviceSpec
    from fullshard.planner.cost import step_cost

    def seconds(sharding: str, device: DeviceSpec, units: int = 1) -> float:
        candidate = Candidate("fsdp2", sharding, ("B",), 0, False)
        return step_cost(
            candidate,
            numel=10**6, flops=10**9, compute_bytes=4, reduce_bytes=4, param_bytes=4, layout=candidate.layout(2, 1),
            num_nodes=1, device=device, units=units,
        ).seconds  # fmt: skip

    # 1 s of compute; FULL_SHARD sends (2 x 4 MB + 4 MB) / 2 = 6 MB a step: 0.75 s at 8 MB/s
    quiet: dict[str, Any] = dict(flops=1e9, intra_node_bandwidth=8e6, collective_latency=0.0)
    overlapped = DeviceSpec.for_type("cuda", 2**30, **quiet)
    serial = DeviceSpec.for_type("cpu", 2**30, **quiet)
    assert serial.overlap is False and overlapped.overlap is True
    assert seconds("FULL_SHARD", overlapped) == pytest.approx(1.0)  # the 0.75 s hidden under compute
    assert seconds("FULL_SHARD", serial) == pytest.approx(1.0 + 0.75)
    slow = DeviceSpec.for_type("cpu", 2**30, **{**quiet, "collective_latency": 0.01})
    extra = seconds("FULL_SHARD", slow, units=5) - seconds("FULL_SHARD", serial, units=5)
    assert extra == pytest.approx(3 * 5 * 0.01)
    extra = seconds("SHARD_GRAD_OP", slow, units=5) - seconds("SHARD_GRAD_OP", serial, units=5)
    assert extra == pytest.approx(2 * 5 * 0.01)


def test_offload_rows_keep_the_state_in_host_memory_which_a_node_must_hold() -> None:
    """A CUDA plan (made here on fake tensors: no GPU needed) whose device budget only offload
    rows meet; given a node's host memory, they fit only when its processes' state fits it."""
    kwargs: dict[str, Any] = dict(
        devices=2, device_type="cuda", engines=("fsdp2",), workers=1, shardings=("FULL_SHARD",)
    )
    roomy = plan(Net(depth=4, width=64), batch(16, 64), device_memory="1GiB", **kwargs)
    rows = {(r.candidate.checkpoint_every, r.candidate.cpu_offload): r for r in roomy.rows}
    kept, offloaded = rows[(1, False)], rows[(1, True)]
    shards = kept.split["params"]
    assert offloaded.host_peak == shards + shards + kept.split["optimizer"] and kept.host_peak == 0
    assert offloaded.peak < kept.peak and "host" in roomy.table()
    # between the two process peaks (tensors and what is not a tensor): only offload rows fit
    tight = int((offloaded.process_peak + kept.process_peak) / 2 / (1 - roomy.headroom))
    enough = plan(Net(depth=4, width=64), batch(16, 64), device_memory=tight, host_memory="1GiB", **kwargs)
    assert enough.choice is not None and enough.choice.candidate.cpu_offload
    # the node's 2 processes' state does not fit
    short = int(offloaded.host_peak * 2 * 0.9 * (1 - roomy.headroom))
    starved = plan(Net(depth=4, width=64), batch(16, 64), device_memory=tight, host_memory=short, **kwargs)
    assert not any(r.fits for r in starved.rows if r.candidate.cpu_offload)
    assert (
        starved.choice is None and "fits the device, but its node's 2 process(es) keep 2 x" in starved.table()
    )

"""python benchmarks/planner_choice.py --write-docs

Does the memory planner choose the fastest configuration that fits? Its choice against every candidate run for real on 2 CPU processes.

Run it from the repository root; without ``--write-docs`` it prints the table and leaves
docs/fsdp/plan.md alone. It takes about 20 minutes on 2 cores and must have them to itself (it
times steps).

For each model (an MLP, the demo Transformer, a tiny Llama), every FSDP2 candidate the planner
weighs (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD x no checkpointing, every block, every 2nd block) is
trained for real with ``fullshard.Trainer(devices=2)`` on CPU with gloo: rank 0's peak tensor
memory is measured over the first 3 steps as benchmarks/planner.py measures it, and the step
time is the median of steps 5 to 30 (the collectives back to gloo's own), the lower of 2 runs made in
rotated order. Each case is the model
with a memory budget per process; the configurations that fit are those whose *measured* peak
is within the budget less the planner's 10% headroom and its overhead (what is not a tensor,
the same for every candidate: fullshard/planner/overhead.py), and the case passes when the planner's
choice is among them and its measured step time is within 5% of the fastest of them (closer
than that is the run-to-run noise of this machine). Budgets are placed 2.5% above a candidate's
predicted peak where the next candidate's is at least 5% higher (``budgets_for``: a budget
within a prediction's stated accuracy of a candidate's peak is a coin toss for any 5%-accurate
planner), spread from the tightest to the loosest. ``--runs FILE`` keeps the measurements, and
judges from them again when the file exists.

The step-time model needs the device's numbers (docs/fsdp/plan.md, "Reading the table"); they
are measured here first, on neither of the models, and given as
``device=DeviceSpec.for_type("cpu", ...)``: gloo's bandwidth from a 2-process all-gather of 1 KiB
and 8 MiB; the cost of one collective as FSDP2 issues it (launch, copies in and out, and the wait
for the other process), from a toy model of 8 small Linear units trained with FULL_SHARD and with
SHARD_GRAD_OP, which gather each unit once more and once less; and each model's FLOP/s from its
forward and backward on one process (FLOPs counted by torch's FlopCounterMode).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import (
    REPO,
    make_parser,
    markers,
    parse_args,
    provenance,
    rotations,
    run_or_report,
    table,
    worker_env,
    write_marked,
)
from planner import Case, Probe, build, candidate_of, collectives_complete_on_this_thread, measure

DOC = REPO / "docs" / "fsdp" / "plan.md"
HEADROOM = 0.1
TOLERANCE = 0.05
STEPS = 30
UNITS = 8  # the calibration's toy model: this many Linear units
REPEATS = 2  # runs of each candidate, in rotated order; the faster median counts
GAP = 0.05  # budgets sit in gaps this wide between predicted peaks (see budgets_for)
#: model -> how many budgets to try (10 cases in all)
BUDGETS = {"mlp": 3, "demo": 3, "llama": 4}


def candidates_of(model: str) -> list[Case]:
    return [
        Case(model, "fsdp2", sharding, every, "32-true", 4, 2)
        for sharding in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
        for every in (0, 1, 2)
    ]


# ------------------------------------------------------------------------------------ the worker
class TimedProbe(Probe):
    """Probe's peak over the first 3 steps, then step times with gloo's collectives as they are."""

    def __init__(self, restore: Any) -> None:
        super().__init__()
        self._restore = restore

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 3:
            self._restore()
            self.restored = True
        super().on_train_batch_start(trainer, module, batch, batch_idx)


def run_worker(case: Case, out_dir: Path) -> None:
    import torch.distributed as dist

    import fullshard
    from fullshard.strategies import FSDP2Strategy

    module, batch, block = build(case)
    strategy = FSDP2Strategy(**candidate_of(case, block).strategy_kwargs())
    names = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor")
    originals = {name: getattr(dist, name) for name in names}
    collectives_complete_on_this_thread()

    def restore() -> None:
        for name, call in originals.items():
            setattr(dist, name, call)

    probe = TimedProbe(restore)
    with tempfile.TemporaryDirectory() as root:
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=case.devices,
            strategy=strategy,
            max_steps=STEPS,
            callbacks=[probe],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(module, torch.utils.data.DataLoader([batch] * (STEPS * case.devices), batch_size=None))
    if not getattr(probe, "restored", False):
        raise RuntimeError("the timed steps ran with the waited collectives: TimedProbe's hook did not run")
    result = {"measured": probe.baseline + probe.peak_delta, "step_s": statistics.median(probe.step_s[4:])}
    (out_dir / f"{case.name}-rank{trainer.global_rank}.json").write_text(json.dumps(result))


def calibrate_comm(out: Path) -> None:
    """Rank 0 of 2 (this process starts rank 1): gloo all-gather latency and bandwidth."""
    import torch.multiprocessing as mp

    mp.spawn(_comm_rank, args=(str(out),), nprocs=2, join=True)


def _comm_rank(rank: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=2)
    times = {}
    for nbytes in (1024, 8 * 2**20):
        shard = torch.zeros(nbytes // 8, dtype=torch.float32)
        gathered = torch.empty(2 * shard.numel())
        for _ in range(3):
            dist.all_gather_single(gathered, shard)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(20):
            dist.all_gather_single(gathered, shard)
        times[nbytes] = (time.perf_counter() - started) / 20
    # FSDP2's own cost of a collective: FULL_SHARD gathers each unit once more than SHARD_GRAD_OP
    mesh = init_device_mesh("cpu", (2,))
    steps = {}
    for reshard in (True, False):
        torch.manual_seed(0)
        toy = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(UNITS)))
        for layer in toy:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(toy, mesh=mesh, reshard_after_forward=reshard)
        optimizer = torch.optim.AdamW(toy.parameters())
        x = torch.randn(8, 32)
        samples = []
        for step in range(40):
            dist.barrier()
            started = time.perf_counter()
            toy(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step >= 10:
                samples.append(time.perf_counter() - started)
        steps[reshard] = statistics.median(samples)
    if rank == 0:
        small, large = times[1024], times[8 * 2**20]
        bandwidth = (8 * 2**20 / 2 - 1024 / 2) / max(large - small, 1e-9)  # each process sends half
        fsdp_latency = max(steps[True] - steps[False], 0.0) / UNITS
        Path(out).write_text(
            json.dumps({"latency": small, "bandwidth": bandwidth, "fsdp_latency": fsdp_latency})
        )
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------ the driver
def model_flops_per_second(model: str) -> float:
    """One process's forward and backward of ``model``: FLOPs counted over seconds taken."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)
    case = candidates_of(model)[0]
    module, batch, _ = build(case)
    configure = getattr(module, "configure_model", None)
    if callable(configure):
        configure()
    module.log = module.log_dict = lambda *args, **kwargs: None  # no Trainer to log to

    def step() -> None:
        loss = module.training_step(batch, 0)
        loss.backward()

    step()
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    started = time.perf_counter()
    for _ in range(5):
        step()
    return counter.get_total_flops() * 5 / (time.perf_counter() - started)


def plan_for(model: str, memory: int, spec: Any) -> Any:
    import fullshard

    case = candidates_of(model)[0]
    module, batch, block = build(case)
    candidates = [candidate_of(c, block) for c in candidates_of(model)]
    return fullshard.plan(
        module,
        batch,
        devices=2,
        device_memory=memory,
        device_type="cpu",
        headroom=HEADROOM,
        candidates=candidates,
        device=spec,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs="the choice block of docs/fsdp/plan.md")
    parser.add_argument("--only", help="run the models whose name contains this")
    parser.add_argument(
        "--runs",
        help="a JSON file of the measurements: written after measuring; when it exists, read instead of "
        "measuring again (the planner is asked again)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--calibrate", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    if args.worker:
        run_worker(Case(**json.loads(args.worker)), Path(args.out))
        return
    if args.calibrate:
        calibrate_comm(Path(args.calibrate))
        return
    result = run_or_report(args, __file__, lambda: judge_all(args))
    body = render(result)
    print(body)
    if args.write_docs:
        write_marked(body, DOC, *markers("planner_choice.py"))


def runs_saved_on(path: str) -> str:
    """The date of the commit that last changed the runs file ``path`` (when it was measured)."""
    done = subprocess.run(
        ["git", "log", "-1", "--format=%ad %h", "--date=short", "--", path],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "not committed"


def judge_all(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every candidate (or read ``--runs``), ask the planner under each budget, judge."""
    from fullshard.planner import DeviceSpec

    saved = json.loads(Path(args.runs).read_text()) if args.runs and Path(args.runs).exists() else None
    all_flops: dict[str, float] = {}
    all_runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        comm_file = Path(tmp) / "comm.json"
        if saved is None:
            subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--calibrate", str(comm_file)],
                env=worker_env(1),
                cwd=REPO,
                check=True,
                timeout=300,
            )
        comm = saved["comm"] if saved else json.loads(comm_file.read_text())
        print(
            f"gloo: latency {comm['latency'] * 1e6:.0f} us, bandwidth {comm['bandwidth'] / 1e9:.2f} GB/s",
            flush=True,
        )
        results = []
        for model in BUDGETS:
            if args.only and args.only not in model:
                continue
            flops = saved["flops"][model] if saved else model_flops_per_second(model)
            all_flops[model] = flops
            spec = DeviceSpec.for_type(
                "cpu",
                2**40,
                flops=flops,
                intra_node_bandwidth=comm["bandwidth"],
                collective_latency=comm["fsdp_latency"],
            )
            print(f"{model}: {flops / 1e9:.1f} GFLOP/s", flush=True)
            loose = plan_for(model, 2**40, spec)
            runs: dict[str, Any] = {}
            if saved:
                runs = {case.name: saved["runs"][case.name] for case in candidates_of(model)}
            else:
                for order in rotations(candidates_of(model), REPEATS):
                    for case in order:
                        run = measure(case, Path(tmp), Path(__file__))
                        kept = runs.setdefault(case.name, run)
                        kept["step_s"] = min(kept["step_s"], run["step_s"])
                        kept["measured"] = max(kept["measured"], run["measured"])
                        print(f"  {case.name}: {run}", flush=True)
            all_runs.update(runs)
            by_candidate = {(c.sharding, c.checkpoint_every): runs[c.name] for c in candidates_of(model)}
            default = DeviceSpec.for_type("cpu", 2**40)
            for memory in budgets_for(loose, BUDGETS[model]):
                result = plan_for(model, memory, spec)
                results.append(judge(model, memory, result, by_candidate))
                results[-1]["default_ok"] = judge(
                    model, memory, plan_for(model, memory, default), by_candidate
                )["ok"]
                print(f"  budget {memory / 2**20:.2f} MiB: {results[-1]}", flush=True)
        if args.runs and saved is None:  # measured now: keep the runs (a saved file stays as it is)
            Path(args.runs).write_text(
                json.dumps({"comm": comm, "flops": all_flops, "runs": all_runs}, indent=1)
            )
    return {
        "results": results,
        "tolerance": TOLERANCE,
        "comm": comm,
        "runs_file": args.runs if saved else None,
        "runs_saved": runs_saved_on(args.runs) if saved else None,
    }


def budgets_for(loose: Any, wanted: int) -> list[int]:
    """Up to ``wanted`` budgets per process, each 2.5% above a candidate's predicted peak (with the
    overhead and the headroom added) and at least 2.5% below the next one's: only where the predicted peaks are 5%
    or more apart (the accuracy the planner is held to), so that each budget is one a 5%-accurate
    prediction can decide. Spread from the tightest to the loosest."""
    peaks = sorted(r.peak for r in loose.rows)
    overhead = loose.rows[0].overhead  # what is not a tensor: the same for every row of a CPU plan
    gaps = [
        (peaks[k] * (1 + GAP / 2) + overhead) / (1 - HEADROOM)
        for k in range(len(peaks))
        if k == len(peaks) - 1 or peaks[k + 1] >= peaks[k] * (1 + GAP)
    ]
    if len(gaps) <= wanted:
        return [int(g) for g in gaps]
    step = (len(gaps) - 1) / (wanted - 1)
    return [int(gaps[round(i * step)]) for i in range(wanted)]


def judge(
    model: str, memory: int, result: Any, runs: dict[tuple[str, int], dict[str, Any]]
) -> dict[str, Any]:
    budget = memory * (1 - HEADROOM) - result.rows[0].overhead  # for tensors: what is not one is the plan's
    fits = {key: run for key, run in runs.items() if run["measured"] <= budget}
    fastest = min(fits, key=lambda key: fits[key]["step_s"]) if fits else None
    choice = result.choice
    chosen = (choice.candidate.sharding, choice.candidate.checkpoint_every) if choice else None
    ok = (
        chosen is None
        if fastest is None
        else chosen in fits and fits[chosen]["step_s"] <= fits[fastest]["step_s"] * (1 + TOLERANCE)
    )
    return {
        "model": model,
        "budget": memory,
        "fits": len(fits),
        "chosen": chosen,
        "chosen_s": fits[chosen]["step_s"] if chosen in fits else None,
        "fastest": fastest,
        "fastest_s": fits[fastest]["step_s"] if fastest else None,
        "ok": ok,
    }


def _name(key: tuple[str, int] | None) -> str:
    if key is None:
        return "none"
    sharding, every = key
    return f"{sharding}, {({0: 'no checkpointing', 1: 'every block'}).get(every, f'every {every}nd block')}"


def render(result: dict[str, Any]) -> str:
    """The choice block of docs/fsdp/plan.md, from a result (the judged cases, saved)."""
    results, comm = result["figures"]["results"], result["figures"]["comm"]
    runs_file, runs_saved = result["figures"]["runs_file"], result["figures"]["runs_saved"]
    measured = (
        f"Judged {result['date']} from the runs saved in `{runs_file}` (committed {runs_saved}), "
        if runs_file
        else f"Measured {result['date']} "
    )
    rows = [
        [
            r["model"],
            f"{r['budget'] / 2**20:.1f}",
            str(r["fits"]),
            _name(r["chosen"]),
            f"{r['chosen_s'] * 1e3:.1f}" if r["chosen_s"] else "-",
            _name(r["fastest"]),
            f"{r['fastest_s'] * 1e3:.1f}" if r["fastest_s"] else "-",
            "yes" if r["ok"] else "**no**",
        ]
        for r in results
    ]
    passed = sum(r["ok"] for r in results)
    return "\n".join(
        [
            f"{measured}with `{result['command']}` (torch {result['torch']}, 2 CPU processes, gloo: "
            f"{comm['bandwidth'] / 1e9:.2f} GB/s, {comm['fsdp_latency'] * 1e3:.2f} ms a collective as FSDP2 "
            "issues it, measured first).",
            "",
            provenance(result, __file__, timed=not runs_file),
            "",
            table(
                [
                    "model",
                    "budget MiB",
                    "fit (measured)",
                    "planner's choice",
                    "its step ms",
                    "fastest that fits (measured)",
                    "its step ms",
                    "chosen is fastest (5%)",
                ],
                rows,
            ),
            "",
            f"The choice is the fastest measured configuration that fits in {passed} of {len(results)} cases; "
            f'with `DeviceSpec.for_type("cpu")`\'s numbers instead of the measured ones, in '
            f"{sum(r['default_ok'] for r in results)} of {len(results)}.",
        ]
    )


if __name__ == "__main__":
    main()

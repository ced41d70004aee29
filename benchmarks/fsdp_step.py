"""python benchmarks/fsdp_step.py --pairs 12 --pair-steps 150 --write-docs

FSDP step cost: fullshard's training step against the same hand-written loop under the same
wrapper (DDP, FSDP, FSDP2) and the same allocator setting, as paired ratios inside one job.

Run it from the repository root; without ``--write-docs`` it prints the table and leaves
docs/benchmarks.md ("FSDP step cost") alone. It takes about 6 minutes on 2 cores. A smaller run::

    python benchmarks/fsdp_step.py --jobs fsdp fsdp2 --pairs 6 --pair-steps 100

Every job trains overhead.py's workload (an MLP ``--in-features -> --hidden -> --hidden -> 10``,
SGD, batch 64 per process, one FSDP unit) in 2 processes on CPU (gloo, one intra-op thread each),
started by fullshard's launcher. Within a job the two sides run by turns on the same process
group, each segment with a fresh model: ``fullshard.Trainer.fit`` with the job's strategy, and
the loop (``DistributedDataParallel``, ``FullyShardedDataParallel(use_orig_params=True)`` or
``fully_shard`` on a 1-D CPU mesh; forward, loss, backward, step, ``zero_grad``). Neighbouring
segments see about the same load, so the median of their step-time ratios is the figure to
compare with the 1.03x target (see [Note: paired segments] in ``run_worker``).

Jobs:

``ddp``
    ``strategy="ddp"`` against the DDP loop.
``fsdp``, ``fsdp2``
    ``strategy="fsdp"`` / ``"fsdp2"`` with their defaults. On CPU those set glibc's malloc as
    ``cpu_mmap_threshold`` says (docs/fsdp/cpu.md); that setting is process-wide, so the loop segments
    of the job run under it too: the job compares the step with the same allocator setting.
``fsdp-glibc``, ``fsdp2-glibc``
    The same with ``cpu_mmap_threshold=None``: glibc as it comes on both sides.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    abba,
    heading_target,
    make_parser,
    parse_args,
    provenance,
    ratio_summary,
    run_or_report,
    table,
    worker_env,
    write_section,
)
from overhead import PAIRED_WARMUP, PER_STEP_TARGET, WORLD_SIZE, Workload, build_net, make_dataset

SECTION = "## FSDP step cost"
JOBS = {
    "ddp": ("ddp", "glibc's default (DDP sets nothing)", "ddp"),
    "fsdp": ("fsdp", "fullshard's default", "fsdp"),
    "fsdp-glibc": ("fsdp", "`cpu_mmap_threshold=None` on both sides", "fsdp"),
    "fsdp2": ("fsdp2", "fullshard's default", "fsdp2"),
    "fsdp2-glibc": ("fsdp2", "`cpu_mmap_threshold=None` on both sides", "fsdp2"),
}
RUN_TIMEOUT_S = 600


def run_worker(args: argparse.Namespace) -> None:
    """Both sides of one job by turns, in the 2 processes fullshard's launcher starts; with
    ``--profile``, one more fullshard segment under cProfile.

    [Note: paired segments]
    Separate runs of each configuration are tens of seconds apart, and on a shared 2-core
    machine the load changes in between. Here one job (started by fullshard's launcher) trains
    ``Trainer.fit`` and the hand-written loop by turns, on the same process group, each segment
    with a fresh model (a second wrapper on the same parameters would reduce their
    gradients twice). Neighbouring segments see about the same load, so the ratio of their
    step times is less noisy than the ratio of separate runs. Start-up is not measured here.
    """
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    import fullshard
    from fullshard.strategies import FSDP2Strategy, FSDPStrategy

    wrapper = JOBS[args.job][0]
    work = Workload(
        steps=args.steps, batch_size=args.batch_size, hidden=args.hidden, in_features=args.in_features
    )
    dataset = make_dataset(work)
    marks: list[float] = []

    class Model(fullshard.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = build_net(work)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            marks.append(time.perf_counter())
            inputs, labels = batch
            return F.cross_entropy(self.net(inputs), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=work.lr)

    def strategy() -> Any:
        if args.job.endswith("-glibc"):
            return (FSDP2Strategy if wrapper == "fsdp2" else FSDPStrategy)(cpu_mmap_threshold=None)
        return wrapper

    def fullshard_segment() -> int:
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=WORLD_SIZE,
            strategy=strategy(),
            max_steps=work.steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=args.root,
        )
        trainer.fit(Model(), DataLoader(dataset, batch_size=work.batch_size, shuffle=True))
        return trainer.global_rank

    def wrap(net: torch.nn.Module) -> torch.nn.Module:
        if wrapper == "fsdp":
            from torch.distributed.fsdp import FullyShardedDataParallel

            return FullyShardedDataParallel(net, use_orig_params=True, device_id=torch.device("cpu"))
        if wrapper == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            return fully_shard(net, mesh=init_device_mesh("cpu", (WORLD_SIZE,)))  # type: ignore[no-any-return]
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(net)

    def loop_segment() -> None:
        rank = torch.distributed.get_rank()
        model = wrap(build_net(work))
        optimizer = torch.optim.SGD(model.parameters(), lr=work.lr)
        sampler = DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=rank, shuffle=True, seed=0)
        model.train()
        for step, (inputs, labels) in enumerate(
            DataLoader(dataset, batch_size=work.batch_size, sampler=sampler)
        ):
            if step == work.steps:
                break
            marks.append(time.perf_counter())
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    def timed(segment: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            marks.clear()
            segment()
            return statistics.median(b - a for a, b in itertools.pairwise(marks[PAIRED_WARMUP:]))

        return run

    rank = fullshard_segment()  # starts rank 1, the process group and the allocator setting; not counted
    pairs = abba(args.segments, timed(fullshard_segment), timed(loop_segment))
    own = profile_own_code(fullshard_segment, work.steps) if args.profile else {}
    if rank == 0:
        Path(args.out).write_text(json.dumps({"pairs": pairs, "own": own, "torch": torch.__version__}))


def profile_own_code(segment: Callable[[], object], steps: int) -> dict[str, float]:
    """Seconds per step spent in fullshard's own Python functions (their own time, not what they
    call) during one more segment under ``cProfile``, by ``file:function``; ``"step"`` is the
    segment's wall time per step under the profiler, which inflates every Python call alike."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(segment)
    per_step = {"step": (time.perf_counter() - started) / steps}
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (filename, _, function), (_, _, own_time, _, _) in stats.items():
        if "/fullshard/" in filename and "/benchmarks/" not in filename:
            name = f"{filename.split('/fullshard/', 1)[1]}:{function}"
            per_step[name] = per_step.get(name, 0.0) + own_time / steps
    return per_step


def run_job(job: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One job's (fullshard, loop) median step times pair by pair, and fullshard's own time per step."""
    import subprocess

    out = workdir / f"{job}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--job", job, "--out", str(out)]
    command += ["--root", str(workdir / job), "--steps", str(args.pair_steps), "--segments", str(args.pairs)]
    command += ["--batch-size", str(args.batch_size), "--hidden", str(args.hidden)]
    command += ["--in-features", str(args.in_features)]
    done = subprocess.run(
        command, env=worker_env(threads=1), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"job {job} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(out.read_text())
    ratios = " ".join(f"{ours / loop:.3f}" for ours, loop in result["pairs"])
    print(f"{job:<12} fullshard/loop per pair: {ratios}", flush=True)
    return result


def render(saved: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (each job's figures, saved)."""
    results: dict[str, dict[str, Any]] = saved["figures"]
    args = argparse.Namespace(**saved["arguments"])
    rows, own_rows = [], []
    for job, result in results.items():
        _, setting, strategy = JOBS[job]
        pairs = result["pairs"]
        ratios = [ours / loop for ours, loop in pairs]
        loop_step = statistics.median(p[1] for p in pairs)
        rows.append(
            [
                f'`strategy="{strategy}"`',
                setting,
                f"{loop_step * 1e3:.2f}",
                f"{statistics.median(p[0] for p in pairs) * 1e3:.2f}",
                ratio_summary(ratios),
                "ok" if statistics.median(ratios) <= PER_STEP_TARGET else "MISSED",
            ]
        )
        own = dict(result["own"])
        profiled_step = own.pop("step")
        total = sum(own.values())
        top = sorted(own.items(), key=lambda item: -item[1])[:4]
        own_rows.append(
            [
                f'`strategy="{strategy}"`, {setting}',
                f"{total * 1e6:.0f} µs ({total / profiled_step:.1%})",
                "; ".join(f"`{name}` {seconds * 1e6:.0f} µs" for name, seconds in top),
            ]
        )
    work = Workload(
        steps=args.pair_steps, batch_size=args.batch_size, hidden=args.hidden, in_features=args.in_features
    )
    torch_version = next(iter(results.values()))["torch"]
    lines = [
        SECTION,
        "",
        "fullshard's step against the hand-written loop under the same wrapper and the same allocator",
        f"setting, as paired ratios inside one job per row (target: at most {PER_STEP_TARGET}x). Reproduce (rewrites",
        "this section):",
        "",
        "```",
        saved["command"],
        "```",
        "",
        provenance(saved, __file__),
        "",
        f"- Workload: {work.describe()}, in one FSDP unit; {args.pairs} pairs of segments per job, the",
        f"  first {PAIRED_WARMUP} steps of each segment not timed.",
        f"- Machine: {saved['cpu']}; 2 processes with one intra-op thread each; torch {torch_version};"
        f" {saved['date']}.",
        "",
        table(
            [
                "strategy",
                "allocator (both sides)",
                "loop per step (ms)",
                "fullshard per step (ms)",
                "fullshard / loop, paired",
                "target",
            ],
            rows,
        ),
        "",
        "What fullshard's own code costs per step: one more segment of each job under `cProfile`, the",
        "time spent inside fullshard's functions themselves (not in torch or the model they call), per",
        "step, with the share of the profiled step (the profiler slows every Python call alike, so the",
        "share is the figure to read) and the four largest. The segment includes `fit`'s set-up, spread",
        "over its steps: `cpu_memory.py:_thp_eligible` is the one read of /proc/self/smaps at set-up that",
        "checks huge pages (about 13 ms once per `fit`), not a per-step cost.",
        "",
        table(["job", "fullshard's own Python per step", "largest"], own_rows, align="lrl"),
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument(
        "--jobs", nargs="+", choices=list(JOBS), default=list(JOBS), help="the jobs (rows) to run"
    )
    parser.add_argument("--pairs", type=int, default=12, help="paired segments per job")
    parser.add_argument("--pair-steps", type=int, default=150, help="training steps per segment")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size per process")
    parser.add_argument("--hidden", type=int, default=512, help="width of the two hidden layers")
    parser.add_argument("--in-features", type=int, default=512, help="width of the input")
    return parser


def worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fsdp_step.py --worker")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--job", choices=list(JOBS), required=True)
    for flag in ("--steps", "--segments", "--batch-size", "--hidden", "--in-features"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument(
        "--profile", action=argparse.BooleanOptionalAction, default=True, help="profile one more segment"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.pair_steps <= PAIRED_WARMUP + 1:
        parser.error(f"--pair-steps must exceed {PAIRED_WARMUP + 1}")

    def measure() -> dict[str, dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix="fullshard-fsdp-step-") as tmp:
            return {job: run_job(job, args, Path(tmp)) for job in args.jobs}

    section = render(run_or_report(args, __file__, measure))
    print()
    print(section)
    if args.write_docs:
        write_section(section)


if __name__ == "__main__":
    if "--worker" in sys.argv[1:2]:
        run_worker(worker_parser().parse_args())
    else:
        main()

"""python benchmarks/overhead.py --steps 300 --repeats 5 --pairs 12 --pair-steps 150 --write-docs

Trainer overhead: ``fullshard.Trainer.fit`` against a hand-written DDP loop, and Lightning.

Run it from the repository root; without ``--write-docs`` it prints the tables and leaves
docs/benchmarks.md ("Trainer overhead") alone. It takes about 4 minutes on 2 cores. The figures
of "FSDP start-up" in docs/benchmarks.md come from a run of only the FSDP configurations, copied
by hand (with ``--write-docs`` such a run would replace the "Trainer overhead" table)::

    python benchmarks/overhead.py --steps 200 --repeats 3 --pairs 0 --only fullshard-fsdp loop-fsdp

Every configuration trains the same MLP (512 -> 512 -> 512 -> 10, ReLU, SGD, cross entropy)
on the same in-memory random data (batch 64 per process) for the same number of steps, in 2
processes on CPU with gloo, one intra-op thread each (``OMP_NUM_THREADS=1``; 2 processes on 2
cores). Every configuration starts its second process the same way: rank 0 runs the same
command again with ``LOCAL_RANK=1`` once its model and data exist, as fullshard's and
Lightning's ``ddp`` launchers do, so start-up differences are the frameworks' own.

Configurations:

``loop``
    The reference: ``init_process_group("gloo")``, ``DistributedDataParallel``, a
    ``DistributedSampler`` DataLoader, then forward, loss, backward, step, ``zero_grad``.
``fullshard``
    ``Trainer(strategy="ddp", devices=2)`` with logger, checkpointing, progress bar and model
    summary off (as in the Lightning row).
``fullshard (defaults)``
    The same with the progress bar and the CSV logger on, and ``self.log("loss",
    prog_bar=True)`` in every step (checkpointing stays off).
``lightning``
    Lightning's ``Trainer(strategy="ddp", devices=2)`` with logger, checkpointing, progress
    bar and model summary off and ``num_sanity_val_steps=0``. It runs from its own virtual
    environment (``_lightning_overhead.py``); the row is skipped with a note when that is
    missing. Create it with::

        python3 -m venv benchmarks/.venv-lightning
        benchmarks/.venv-lightning/bin/pip install torch==2.13.0      # first: the CPU build
        echo "torch==2.13.0" > /tmp/torch-pin.txt
        benchmarks/.venv-lightning/bin/pip install lightning==2.6.6 -c /tmp/torch-pin.txt

``loop-fsdp``, ``fullshard-fsdp``
    The loop with the whole MLP in one ``FullyShardedDataParallel`` unit (``use_orig_params=
    True``), and ``Trainer(strategy="fsdp")``, which wraps it the same way.
``loop-fsdp-fixed-mmap``, ``fullshard-fsdp-glibc-mmap`` (run only when named in ``--only``)
    The one difference between those two that is not per-step Python: on CPU, FSDPStrategy
    fixes glibc's mmap threshold at 128 KiB (``cpu_mmap_threshold``, [Note: CPU memory under
    FSDP]), so that each gathered unit is mapped afresh. The first is the loop with that
    setting, the second the Trainer without it; the pair of pairs tells the setting's cost
    from fullshard's own.
``loop-fsdp2``, ``fullshard-fsdp2`` and their ``-fixed-mmap`` / ``-glibc-mmap`` variants (``--only``)
    The same four under FSDP2: ``fully_shard(net)`` on a 1-D CPU mesh, ``strategy="fsdp2"``.

What is measured, on rank 0:

per step
    The time between the starts of consecutive training steps (taken at the top of
    ``training_step``, or just before the forward in the loop), after ``--warmup`` steps;
    the median over the steps of a run, then the median over the repeats. The mean is shown
    too, because costs paid every n-th step (logging) move the mean but not the median.
CPU per step
    CPU time of rank 0's main thread (the one running the loop: Python, forward, backward,
    optimizer; gloo's transfers run on other threads) per timed step. Other work on the
    machine stretches wall times much more than CPU times, so this column stays more
    comparable on a busy machine.
per step, paired
    fullshard's time per step over the loop's, both run by turns in the same job (see
    [Note: paired segments] in fsdp_step.py); the median over ``--pairs`` neighbouring pairs of segments.
    The least noisy per-step number on a shared machine.
start-up
    Wall time from just before the command is started (before its interpreter imports
    anything) to the start of the first training step on rank 0. Median over the repeats.

Runs are interleaved (each repeat runs every configuration, in a rotated order) because a
2-core machine drifts. A first, discarded round with few steps warms the file cache. Each
run also reports how many cores other processes kept busy meanwhile (from /proc/stat, less
this benchmark's own processes); above about 0.2 of the 2 cores the wall times are noisy.
Contention from outside the machine's view (a shared host) does not show there, but it
does show as a wide spread of the paired ratios and of the CPU times across repeats.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import (
    HERE,
    REPO,
    heading_target,
    make_parser,
    parse_args,
    provenance,
    ratio_summary,
    rotations,
    run_or_report,
    table,
    worker_env,
    wrap,
    write_section,
)

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import TensorDataset

# Nothing heavy is imported at module level: the workers (and _lightning_overhead.py, which
# imports this file) measure their start-up from before `import torch`.

LIGHTNING_PYTHON = HERE / ".venv-lightning" / "bin" / "python"
LIGHTNING_WORKER = HERE / "_lightning_overhead.py"
SECTION = "## Trainer overhead"
WORLD_SIZE = 2
PER_STEP_TARGET = 1.03  # at most this times the loop's time per step
START_UP_TARGET_S = 1.0  # at most this many seconds more start-up than the loop
FSDP_MMAP_THRESHOLD = 128 * 1024  # FSDPStrategy's default cpu_mmap_threshold
FSDP_START_UP_TARGET_S = 0.2  # strategy="fsdp": at most this much more than the same loop under FSDP
RUN_TIMEOUT_S = 300
PAIRED_WARMUP = 10  # steps of each paired segment not timed (see [Note: paired segments] in fsdp_step.py)


# ---------------------------------------------------------------------------------------------
# The workload, shared by every worker (including _lightning_overhead.py).


@dataclass(frozen=True)
class Workload:
    """The model, the data and the step count every configuration trains with."""

    steps: int
    batch_size: int
    hidden: int
    in_features: int = 512
    classes: int = 10
    lr: float = 0.01

    @property
    def samples(self) -> int:
        """One epoch holds exactly ``steps`` batches per process."""
        return self.steps * self.batch_size * WORLD_SIZE

    def describe(self) -> str:
        return (
            f"MLP {self.in_features} -> {self.hidden} -> {self.hidden} -> {self.classes} (ReLU), SGD lr "
            f"{self.lr}, cross entropy, batch {self.batch_size} per process, {self.steps} steps"
        )


def build_net(work: Workload) -> nn.Module:
    """The MLP, with weights from seed 0."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(work.in_features, work.hidden),
        nn.ReLU(),
        nn.Linear(work.hidden, work.hidden),
        nn.ReLU(),
        nn.Linear(work.hidden, work.classes),
    )


def make_dataset(work: Workload) -> TensorDataset:
    """Random inputs and labels, made in memory from seed 1."""
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(work.samples, work.in_features, generator=generator)
    labels = torch.randint(work.classes, (work.samples,), generator=generator)
    return TensorDataset(inputs, labels)


class StepClock:
    """Timestamps on rank 0: named start-up events (wall clock) and the start of every step."""

    def __init__(self) -> None:
        self.events: dict[str, float] = {"worker_start": time.time()}
        self.marks: list[float] = []
        self.cpu_marks: list[float] = []

    def event(self, name: str) -> None:
        self.events[name] = time.time()

    def mark(self) -> None:
        """Call at the start of every training step."""
        if not self.marks:
            self.events["first_step"] = time.time()
        self.marks.append(time.perf_counter())
        self.cpu_marks.append(time.thread_time())

    def write(self, path: str, rank: int, **extra: Any) -> None:
        """Rank 0 writes ``path``; other ranks write their start-up events next to it."""
        if rank != 0:
            path, extra = f"{path}.rank{rank}", {}
        record = {"events": self.events, "marks": self.marks, "cpu_marks": self.cpu_marks, **extra}
        Path(path).write_text(json.dumps(record))


def worker_parser(prog: str) -> argparse.ArgumentParser:
    """The arguments the driver passes to every worker."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes its timestamps to")
    parser.add_argument("--root", required=True, help="the run's directory (logs)")
    parser.add_argument("--segments", type=int, default=1, help="paired worker: segments of each kind")
    return parser


def workload_from(args: argparse.Namespace) -> Workload:
    return Workload(steps=args.steps, batch_size=args.batch_size, hidden=args.hidden)


# ---------------------------------------------------------------------------------------------
# Workers: each is one `python benchmarks/overhead.py --worker NAME ...` command.


def _find_free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_rank_1() -> subprocess.Popen[bytes]:
    """Run this command again as rank 1, as the Trainers' ``ddp`` launchers do."""
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_find_free_port()), "WORLD_SIZE": str(WORLD_SIZE)}
    )
    return subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "LOCAL_RANK": "1"})


def run_loop_worker(
    args: argparse.Namespace, clock: StepClock, wrapper: str = "ddp", fixed_mmap: bool = False
) -> None:
    """The hand-written reference loop under ``wrapper``: ``"ddp"`` (DistributedDataParallel),
    ``"fsdp"`` (FullyShardedDataParallel) or ``"fsdp2"`` (``fully_shard``); ``fixed_mmap``: with
    glibc's mmap threshold fixed as fullshard's FSDP strategies do on CPU."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    clock.event("imports")
    work = workload_from(args)
    net = build_net(work)
    dataset = make_dataset(work)
    clock.event("fit")
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    child = _start_rank_1() if rank == 0 else None
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    if fixed_mmap:
        from fullshard.strategies.cpu_memory import fix_malloc_mmap_threshold

        fix_malloc_mmap_threshold(FSDP_MMAP_THRESHOLD)
    model: Any
    if wrapper == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(net, use_orig_params=True, device_id=torch.device("cpu"))
    elif wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(net, mesh=init_device_mesh("cpu", (WORLD_SIZE,)))
    else:
        model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=work.lr)
    sampler = DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=work.batch_size, sampler=sampler)
    model.train()
    for step, (inputs, labels) in enumerate(loader):
        if step == work.steps:
            break
        clock.mark()
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    clock.write(args.out, rank, versions={"torch": torch.__version__})
    dist.barrier()
    # Rank 0 hosts the rendezvous store: it tears down only after rank 1 is gone (on gloo, a
    # rank destroying its group while the store's host is already gone can abort).
    if child is not None and child.wait() != 0:
        raise SystemExit(f"rank 1 exited with code {child.returncode}")
    dist.destroy_process_group()


def run_fullshard_worker(
    args: argparse.Namespace,
    clock: StepClock,
    defaults: bool,
    strategy: str = "ddp",
    glibc_mmap: bool = False,
) -> None:
    """``fullshard.Trainer.fit``; ``defaults`` turns the progress bar and the CSV logger on;
    ``glibc_mmap`` (``strategy="fsdp"`` or ``"fsdp2"``): that strategy with ``cpu_mmap_threshold=None``."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    import fullshard

    clock.event("imports")
    work = workload_from(args)

    class Model(fullshard.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = build_net(work)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            clock.mark()
            inputs, labels = batch
            loss = F.cross_entropy(self.net(inputs), labels)
            if defaults:
                self.log("loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=work.lr)

    model = Model()
    loader = DataLoader(make_dataset(work), batch_size=work.batch_size, shuffle=True)
    switches: dict[str, Any] = (
        {} if defaults else {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    )
    chosen: Any = strategy
    if glibc_mmap:
        from fullshard.strategies import FSDP2Strategy, FSDPStrategy

        chosen = (FSDP2Strategy if strategy == "fsdp2" else FSDPStrategy)(cpu_mmap_threshold=None)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy=chosen,
        max_steps=work.steps,
        enable_checkpointing=False,
        default_root_dir=args.root,
        **switches,
    )
    clock.event("fit")
    trainer.fit(model, loader)
    clock.write(
        args.out,
        trainer.global_rank,
        versions={"torch": torch.__version__, "fullshard": fullshard.__version__},
    )


# ---------------------------------------------------------------------------------------------
# The driver.


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    command: list[str]
    skip_reason: str | None = None
    diagnostic: bool = False  # run only when named in --only


@dataclass(frozen=True)
class Run:
    """What one run of one configuration measured on rank 0 (seconds)."""

    step: float  # median wall time per step
    step_mean: float  # mean wall time per step
    cpu: float  # mean CPU time per step of rank 0's main thread
    start_up: float
    other_load: float  # cores used on average by other processes during the run
    phases: dict[str, float]
    versions: dict[str, str]


Results = dict[str, list[Run]]


def _configs() -> list[Config]:
    here = [sys.executable, str(Path(__file__).resolve())]
    lightning_command = [str(LIGHTNING_PYTHON), str(LIGHTNING_WORKER)]
    missing = None
    if not LIGHTNING_PYTHON.exists():
        missing = (
            f"{LIGHTNING_PYTHON.relative_to(REPO)} is missing; create it as the docstring of "
            "benchmarks/overhead.py says (python3 -m venv, pip install torch==2.13.0, then lightning==2.6.6 "
            "with torch pinned)"
        )
    return [
        Config("loop", "hand-written loop (reference)", [*here, "--worker", "loop"]),
        Config("fullshard", "fullshard Trainer, logger/ckpt/bar off", [*here, "--worker", "fullshard"]),
        Config(
            "fullshard-defaults",
            "fullshard Trainer, progress bar + CSVLogger + `self.log` per step",
            [*here, "--worker", "fullshard-defaults"],
        ),
        Config("lightning", "Lightning 2.6.6 Trainer, logger/ckpt/bar off", lightning_command, missing),
        # start-up of the FSDP path: torch's FSDP imported after the launch, not before
        Config(
            "loop-fsdp", "hand-written loop under FullyShardedDataParallel", [*here, "--worker", "loop-fsdp"]
        ),
        Config(
            "fullshard-fsdp",
            "fullshard Trainer, strategy='fsdp', logger/ckpt/bar off",
            [*here, "--worker", "fullshard-fsdp"],
        ),
        # diagnostics (--only): the glibc mmap threshold fullshard fixes on CPU by default, FSDP2
        *(
            Config(name, label, [*here, "--worker", name], diagnostic=True)
            for name, label in (
                (
                    "loop-fsdp-fixed-mmap",
                    "hand-written loop under FullyShardedDataParallel, mmap threshold fixed at 128 KiB as fullshard's",
                ),
                (
                    "fullshard-fsdp-glibc-mmap",
                    "fullshard Trainer, FSDPStrategy(cpu_mmap_threshold=None): glibc's own threshold, as the loop",
                ),
                ("loop-fsdp2", "hand-written loop under fully_shard (FSDP2)"),
                ("fullshard-fsdp2", "fullshard Trainer, strategy='fsdp2', logger/ckpt/bar off"),
                (
                    "loop-fsdp2-fixed-mmap",
                    "hand-written loop under fully_shard, mmap threshold fixed at 128 KiB as fullshard's",
                ),
                ("fullshard-fsdp2-glibc-mmap", "fullshard Trainer, FSDP2Strategy(cpu_mmap_threshold=None)"),
            )
        ),
    ]


@dataclass(frozen=True)
class _Finished:
    result: dict[str, Any]  # what rank 0 wrote
    launched: float  # wall clock just before the command started
    other_load: float  # cores other processes kept busy meanwhile


def _start_and_wait(name: str, command: list[str], threads: int, workdir: Path) -> _Finished:
    """Run ``command`` (plus ``--out`` and ``--root``) in a fresh directory and read its result."""
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    out = root / "result.json"
    log_path = root / "output.log"
    busy, ours = _busy_cpu_seconds(), _children_cpu_seconds()
    with log_path.open("wb") as log:
        launched = time.time()
        process = subprocess.run(
            [*command, "--out", str(out), "--root", str(root)],
            env=worker_env(threads),
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        elapsed = time.time() - launched
    others = (_busy_cpu_seconds() - busy) - (_children_cpu_seconds() - ours)
    if process.returncode != 0 or not out.exists():
        tail = log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{name} failed (exit code {process.returncode}); its output ends with:\n{tail}")
    result = json.loads(out.read_text())
    rank1 = out.with_name(out.name + ".rank1")
    if rank1.exists():  # written when rank 1 finished cleanly
        result["rank1_events"] = json.loads(rank1.read_text())["events"]
    return _Finished(result, launched, max(others, 0.0) / elapsed)


def _workload_args(work: Workload) -> list[str]:
    return ["--steps", str(work.steps), "--batch-size", str(work.batch_size), "--hidden", str(work.hidden)]


def _run_once(config: Config, work: Workload, warmup: int, threads: int, workdir: Path) -> Run:
    """Start ``config``'s command and read what its ranks measured."""
    finished = _start_and_wait(config.name, [*config.command, *_workload_args(work)], threads, workdir)
    result = finished.result
    marks, cpu_marks, events = result["marks"], result["cpu_marks"], result["events"]
    if len(marks) != work.steps:
        raise RuntimeError(f"{config.name} ran {len(marks)} steps, expected {work.steps}")
    steps = [b - a for a, b in itertools.pairwise(marks[warmup:])]
    return Run(
        step=statistics.median(steps),
        step_mean=statistics.fmean(steps),
        cpu=(cpu_marks[-1] - cpu_marks[warmup]) / len(steps),
        start_up=events["first_step"] - finished.launched,
        other_load=finished.other_load,
        phases=_start_up_phases(finished.launched, events, result.get("rank1_events")),
        versions=result.get("versions", {}),
    )


def run_paired(args: argparse.Namespace, workdir: Path) -> list[float]:
    """fullshard/loop step-time ratios of neighbouring segments; see [Note: paired segments] in fsdp_step.py."""
    work = Workload(steps=args.pair_steps, batch_size=args.batch_size, hidden=args.hidden)
    # fsdp_step.py's job "ddp" is this comparison: strategy="ddp" against the DDP loop.
    job = [sys.executable, str(Path(__file__).with_name("fsdp_step.py")), "--worker", "--job", "ddp"]
    command = [*job, *_workload_args(work), "--segments", str(args.pairs)]
    command += ["--in-features", str(work.in_features), "--no-profile"]
    print(f"paired: {args.pairs} pairs of {args.pair_steps}-step segments in one job", flush=True)
    finished = _start_and_wait("paired", command, args.threads, workdir)
    ratios = [ours / loop for ours, loop in finished.result["pairs"]]
    print(
        "paired fullshard/loop ratios: "
        + " ".join(f"{r:.3f}" for r in ratios)
        + f"  other {finished.other_load:.2f}",
        flush=True,
    )
    return ratios


def _busy_cpu_seconds() -> float:
    """CPU seconds all processes on this machine used so far (0 where /proc/stat is missing)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    """CPU seconds used by this process's finished children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


PHASES = ("rank 0 to fit", "rank 1 to fit", "rank 1 fit to step", "rank 0 waits")


def _start_up_phases(
    launched: float, events: dict[str, float], rank1: dict[str, float] | None
) -> dict[str, float]:
    """Split the start-up into consecutive phases (seconds).

    ``rank 0 to fit``: interpreter, imports, model, data (and Trainer) up to ``fit``, where
    rank 1 is started. ``rank 1 to fit``: the same again in rank 1. ``rank 1 fit to step``:
    process group, model wrapping and loader set-up in rank 1. ``rank 0 waits``: from rank 1's
    first step to rank 0's (about zero: the ranks meet in the process group set-up).
    """
    phases = {"rank 0 to fit": events["fit"] - launched}
    if rank1 is not None:
        phases["rank 1 to fit"] = rank1["fit"] - events["fit"]
        phases["rank 1 fit to step"] = rank1["first_step"] - rank1["fit"]
        phases["rank 0 waits"] = events["first_step"] - rank1["first_step"]
    return phases


def run_benchmark(args: argparse.Namespace, configs: list[Config]) -> tuple[Results, list[float]]:
    """Run every runnable configuration ``args.repeats`` times, interleaved, then the paired job."""
    work = Workload(steps=args.steps, batch_size=args.batch_size, hidden=args.hidden)
    runnable = [c for c in configs if c.skip_reason is None]
    for config in configs:
        if config.skip_reason:
            print(f"skipping {config.name}: {config.skip_reason}", flush=True)
    results: Results = {c.name: [] for c in runnable}
    print("'other': cores that other processes kept busy meanwhile; above ~0.2 the wall times are noisy")
    with tempfile.TemporaryDirectory(prefix="fullshard-overhead-") as tmp:
        workdir = Path(tmp)
        if args.warmup_round:
            short = Workload(steps=args.warmup + 10, batch_size=work.batch_size, hidden=work.hidden)
            for config in runnable:
                print(f"warm-up round (not counted): {config.name}", flush=True)
                _run_once(config, short, args.warmup, args.threads, workdir)
        for repeat, order in enumerate(rotations(runnable, args.repeats)):
            for config in order:
                run = _run_once(config, work, args.warmup, args.threads, workdir)
                results[config.name].append(run)
                phases = " ".join(f"{k} {v:.2f}" for k, v in run.phases.items())
                print(
                    f"repeat {repeat + 1}/{args.repeats} {config.name:<19} step {run.step * 1e3:7.3f} ms"
                    f" (mean {run.step_mean * 1e3:7.3f}, cpu {run.cpu * 1e3:7.3f})"
                    f"  start-up {run.start_up:5.2f} s ({phases})  other {run.other_load:.2f}",
                    flush=True,
                )
        ratios = run_paired(args, workdir) if args.pairs and "fullshard" in results else []
    return results, ratios


# ---------------------------------------------------------------------------------------------
# Reporting.


def _median(runs: list[Run], attribute: str) -> float:
    return statistics.median(getattr(run, attribute) for run in runs)


def render_table(configs: list[Config], results: Results) -> str:
    """The markdown table: medians over the repeats, and each against the loop's."""
    reference = results["loop"]
    header = ["configuration", "per step (ms)", "vs loop", "mean per step (ms)", "vs loop"]
    header += ["CPU per step (ms)", "vs loop", "start-up (s)", "vs loop"]
    rows = []
    for config in configs:
        runs = results.get(config.name)
        if not runs:
            rows.append([config.label, "skipped", *[""] * 7])
            continue
        cells = []
        for attribute in ("step", "step_mean", "cpu"):
            value, base = _median(runs, attribute), _median(reference, attribute)
            cells += [f"{value * 1e3:.3f}", f"{value / base:.3f}x"]
        start, base = _median(runs, "start_up"), _median(reference, "start_up")
        cells += [f"{start:.2f}", f"{start - base:+.2f} s"]
        rows.append([config.label, *cells])
    return table(header, rows)


def render_phases(configs: list[Config], results: Results) -> str:
    """Start-up split into consecutive phases (medians over the repeats)."""
    rows = []
    for config in configs:
        runs = results.get(config.name)
        if not runs:
            continue
        cells = []
        for name in PHASES:
            values = [run.phases[name] for run in runs if name in run.phases]
            cells.append(f"{statistics.median(values):.2f}" if values else "n/a")
        rows.append([config.label, *cells])
    return table(["configuration", *PHASES], rows)


def start_up_pairs(results: Results) -> dict[str, list[float]]:
    """For each fullshard configuration with its loop measured too: fullshard's start-up minus the
    loop's, round by round of the interleaved repeats (runs of one round are minutes apart at
    most, runs of different rounds much more)."""
    pairs = {}
    for name, runs in results.items():
        if not name.startswith("fullshard"):
            continue
        wrapper = name.removeprefix("fullshard").removesuffix("-glibc-mmap").removesuffix("-defaults")
        loop = results.get(f"loop{wrapper}")
        if loop:
            pairs[name] = [ours.start_up - base.start_up for ours, base in zip(runs, loop, strict=False)]
    return pairs


def render_start_up_pairs(configs: list[Config], results: Results) -> str:
    labels = {c.name: c.label for c in configs}
    parts = [
        f"{labels[name]} {statistics.median(diffs):+.2f} s ({min(diffs):+.2f} to {max(diffs):+.2f})"
        for name, diffs in start_up_pairs(results).items()
    ]
    return "; ".join(parts)


def render_paired(ratios: list[float], steps: int) -> str:
    return ratio_summary(ratios, f"pairs of {steps}-step segments")


def figures_of(configs: list[Config], results: Results, ratios: list[float]) -> dict[str, Any]:
    """What a run measured, as its result file keeps it."""
    return {
        "configs": [{"name": c.name, "label": c.label, "skip_reason": c.skip_reason} for c in configs],
        "runs": {name: [asdict(run) for run in runs] for name, runs in results.items()},
        "ratios": ratios,
        "python": platform.python_version(),
    }


def from_figures(figures: dict[str, Any]) -> tuple[list[Config], Results, list[float]]:
    """``figures_of``'s inverse."""
    configs = [Config(c["name"], c["label"], [], c["skip_reason"]) for c in figures["configs"]]
    results = {name: [Run(**run) for run in runs] for name, runs in figures["runs"].items()}
    return configs, results, figures["ratios"]


def render(result: dict[str, Any]) -> str:
    """The ``## Trainer overhead`` section of docs/benchmarks.md, from a result (saved figures)."""
    args = argparse.Namespace(**result["arguments"])
    configs, results, ratios = from_figures(result["figures"])
    work = Workload(steps=args.steps, batch_size=args.batch_size, hidden=args.hidden)
    versions: dict[str, str] = {}
    others = []
    for runs in results.values():
        for run in runs:
            versions.update(run.versions)
            others.append(run.other_load)
    bullets = [
        f"Workload: {work.describe()}; random data in memory, one epoch.",
        f"Machine: {result['cores']} CPU cores ({result['cpu']}); 2 processes with one intra-op thread each"
        f" (`OMP_NUM_THREADS=1`); Python {result['figures']['python']}, torch {versions.get('torch', '?')},"
        f" fullshard {versions.get('fullshard', '?')}, Lightning {versions.get('lightning', 'not measured')}.",
        f"{result['date']}: {args.repeats} interleaved repeats, medians shown; the first"
        f" {args.warmup} steps of each run are not timed. Other processes on the machine kept"
        f" {statistics.median(others):.2f} cores busy during a run (median; {min(others):.2f} to"
        f" {max(others):.2f}); contention from a shared host does not show in that number but in the spread"
        " of the paired ratios.",
        "Per step: wall time between the starts of consecutive training steps on rank 0, median over the"
        " steps of a run (mean: the mean, which also counts work done every n-th step). CPU per step: CPU"
        " time of rank 0's main thread per step (Python, forward, backward, optimizer), less sensitive than"
        " wall time to other work on the machine.",
        "Start-up: from just before the command starts (before `import torch`) to the first step on rank 0."
        " Every configuration starts rank 1 the same way: rank 0 runs the command again with `LOCAL_RANK=1`"
        " when it reaches `fit` (as fullshard's and Lightning's `ddp` launchers do).",
        *(f"{c.label}: skipped, {c.skip_reason}." for c in configs if c.skip_reason),
    ]
    parts = [
        SECTION,
        wrap(
            "How much time `Trainer.fit` adds to a hand-written DDP loop over the same model, data and ranks"
            f" (2 processes, CPU, gloo). Targets: at most {PER_STEP_TARGET:.2f}x the loop's time per step and"
            f" at most {START_UP_TARGET_S:.0f} s more start-up. Reproduce (rewrites this section):"
        ),
        f"```\n{result['command']}\n```",
        provenance(result, __file__),
        "\n".join(wrap(b, bullet=True) for b in bullets),
        render_table(configs, results),
        wrap(
            "Per step, paired: fullshard's time per step over the loop's when both run by turns in the same"
            " 2 processes (one job, alternating segments with fresh models, so neighbouring segments see"
            f" about the same load): {render_paired(ratios, args.pair_steps)}. On a shared 2-core machine the"
            " ratios of separate runs move by 10% and more from one invocation to the next; the paired ratio"
            " is the per-step figure to compare with the target."
        ),
        wrap(
            "Start-up by phase (s; consecutive, they add up to the start-up): rank 0 runs the script up to"
            " `fit` (interpreter, imports, model, data, Trainer) and starts rank 1 there; rank 1 does the"
            " same; rank 1 then sets up the process group, the wrapped model and the loader; rank 0's first"
            " step follows rank 1's."
        ),
        render_phases(configs, results),
        wrap(
            "Start-up, paired: each fullshard run's start-up minus that of the loop under the same wrapper"
            " in the same round of repeats, median (min to max): "
            + render_start_up_pairs(configs, results)
            + ". Less moved by the machine's load than the difference of the medians above."
        ),
    ]
    return "\n\n".join(parts) + "\n"


def _verdict(results: Results, ratios: list[float]) -> str:
    if "fullshard" not in results:
        return ""
    # The paired ratio, where measured, is the less noisy one; see [Note: paired segments] in fsdp_step.py.
    if ratios:
        ratio = statistics.median(ratios)
    else:
        ratio = _median(results["fullshard"], "step") / _median(results["loop"], "step")
    extra = _median(results["fullshard"], "start_up") - _median(results["loop"], "start_up")
    step_ok = "ok" if ratio <= PER_STEP_TARGET else "MISSED"
    start_ok = "ok" if extra <= START_UP_TARGET_S else "MISSED"
    verdict = (
        f"fullshard: {ratio:.3f}x per step (target <= {PER_STEP_TARGET}x): {step_ok}; "
        f"start-up {extra:+.2f} s (target <= +{START_UP_TARGET_S:.0f} s): {start_ok}"
    )
    if "fullshard-fsdp" in results and "loop-fsdp" in results:
        fsdp_extra = _median(results["fullshard-fsdp"], "start_up") - _median(
            results["loop-fsdp"], "start_up"
        )
        fsdp_ok = "ok" if fsdp_extra <= FSDP_START_UP_TARGET_S else "MISSED"
        verdict += (
            f"; FSDP start-up {fsdp_extra:+.2f} s against the FSDP loop (target <= +{FSDP_START_UP_TARGET_S} s): "
            f"{fsdp_ok}"
        )
    return verdict


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved runs of every configuration")
    parser.add_argument("--warmup", type=int, default=20, help="steps at the start of a run not timed")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size per process")
    parser.add_argument("--hidden", type=int, default=512, help="width of the two hidden layers")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process")
    parser.add_argument(
        "--only", nargs="+", choices=[c.name for c in _configs()], help="run only these (loop always runs)"
    )
    parser.add_argument(
        "--pairs", type=int, default=12, help="paired fullshard/loop segments in one job (0: skip that job)"
    )
    parser.add_argument("--pair-steps", type=int, default=150, help="training steps per paired segment")
    parser.add_argument("--no-warmup-round", dest="warmup_round", action="store_false")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.steps <= args.warmup + 1:
        parser.error(f"--steps must exceed --warmup + 1 ({args.warmup + 1})")
    if args.pairs and args.pair_steps <= PAIRED_WARMUP + 1:
        parser.error(f"--pair-steps must exceed {PAIRED_WARMUP + 1}")
    configs = [c for c in _configs() if (c.name in {"loop", *args.only} if args.only else not c.diagnostic)]
    result = run_or_report(args, __file__, lambda: figures_of(configs, *run_benchmark(args, configs)))
    configs, results, ratios = from_figures(result["figures"])
    print()
    print(render_table(configs, results))
    print()
    print("paired per-step ratio, fullshard/loop:", render_paired(ratios, args.pair_steps))
    print()
    print(render_phases(configs, results))
    print()
    print("start-up, paired round by round:", render_start_up_pairs(configs, results))
    print()
    print(_verdict(results, ratios))
    if args.write_docs:
        write_section(render(result))


def _worker_main(name: str, argv: list[str]) -> None:
    clock = StepClock()
    args = worker_parser(f"overhead.py --worker {name}").parse_args(argv)
    if name == "loop" or name.startswith("loop-fsdp"):
        wrapper = "ddp" if name == "loop" else name.removesuffix("-fixed-mmap").removeprefix("loop-")
        run_loop_worker(args, clock, wrapper=wrapper, fixed_mmap=name.endswith("-fixed-mmap"))
    elif name in ("fullshard", "fullshard-defaults"):
        run_fullshard_worker(args, clock, defaults=name == "fullshard-defaults")
    elif name.startswith("fullshard-fsdp"):
        strategy = name.removesuffix("-glibc-mmap").removeprefix("fullshard-")
        run_fullshard_worker(
            args, clock, defaults=False, strategy=strategy, glibc_mmap=name.endswith("-glibc-mmap")
        )
    else:
        raise SystemExit(f"unknown worker {name!r}; use one of {', '.join(c.name for c in _configs())}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2], sys.argv[3:])
    else:
        main()

"""python benchmarks/memory.py --write-docs

FSDP memory and speed: per-rank peak memory and step time of DDP and the FSDP sharding strategies.

Run it from the repository root; without ``--write-docs`` it prints the tables and leaves
docs/benchmarks.md ("FSDP memory and speed") alone. Other ways to run it::

    python benchmarks/memory.py --main-only      # only the main table (7 runs instead of 10)
    python benchmarks/memory.py --config full_shard --out /tmp/fsdp-mem   # one run, both ranks

It takes about 6 minutes on 2 idle cores and needs about 5 GB of memory.

Every configuration trains the same parameter-dominated model: 24 blocks of
``Linear(2048, 2048)`` + ReLU (100.7M parameters, 384 MiB in float32), AdamW, batch 8 per
process, so activations are a few MiB and parameters, gradients and optimizer state are
nearly all of the memory. Each runs as its own command (``--config``), in 2 processes on CPU
with gloo and one intra-op thread each: the Trainer re-runs that command for rank 1. Every
rank writes its numbers to a JSON file in ``--out``, which the driver reads.

Configurations (columns): ``ddp`` (``strategy="ddp"``); ``no_shard``, ``shard_grad_op``,
``full_shard`` (``FSDPStrategy`` with that ``sharding_strategy``, every block its own unit,
``empty_init=True``); ``full_shard_offload`` (FULL_SHARD with ``cpu_offload=True``, which
changes nothing on CPU: the parameters are in host memory already); ``fsdp2_shard_grad_op`` and
``fsdp2_full_shard`` (``FSDP2Strategy``, ``fully_shard`` per block, the same arguments). DDP builds its layers in
``configure_model`` too, so every configuration starts from the same point.

The main table runs every configuration with fullshard's defaults; on CPU those include
``FSDPStrategy(cpu_mmap_threshold=128 * 1024)``, which holds glibc's mmap threshold fixed (see
[Note: CPU memory under FSDP] in ``fullshard/strategies/cpu_memory.py``), and transparent huge
pages for torch's large CPU tensors (``THP_MEM_ALLOC_ENABLE=1``, which the FSDP strategies set).
A second table compares, for DDP and FULL_SHARD, the defaults with ``cpu_mmap_threshold=None``
(glibc as it comes) and with ``THP_MEM_ALLOC_ENABLE=0`` (no huge pages: the default before).

What is measured:

peak memory
    Each process's peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``) at the end of
    ``fit``, minus its resident set size when ``configure_model`` starts (after imports and
    the process group). So it is what building, wrapping and training the model added at its
    highest, with the allocator's retained memory included. The tables show the larger of the
    two ranks, both ranks, and the same peak before the first step and after it.
iterations per second
    1 / the median wall time of an optimizer step on rank 0 (from ``on_train_batch_start`` to
    ``on_train_batch_end``: forward, backward, gradient communication, AdamW), over the steps
    after ``--warmup``; and rank 0's process CPU time per step, which other work on the
    machine disturbs less.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _common import (
    REPO,
    heading_target,
    load_average,
    make_parser,
    parse_args,
    peak_rss_kib,
    provenance,
    rss_kib,
    run_or_report,
    table,
    worker_env,
    write_section,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import FSDP2Strategy, FSDPStrategy

SECTION = "## FSDP memory and speed"
WORLD_SIZE = 2
TARGET = 0.55  # FULL_SHARD's per-rank peak at most this times DDP's
LEAN_TARGET = (0.42, 1.3)  # issue 18: FULL_SHARD's peak and CPU time per step at most these times DDP's
RUN_TIMEOUT_S = 300
MIB = 1024 * 1024
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class Config:
    """One column of the table."""

    name: str
    label: str
    sharding: str | None  # None: DDP
    cpu_offload: bool = False
    fsdp2: bool = False  # FSDP2Strategy (fully_shard) instead of FSDPStrategy


CONFIGS = (
    Config("ddp", "DDP", None),
    Config("no_shard", "NO_SHARD", "NO_SHARD"),
    Config("shard_grad_op", "SHARD_GRAD_OP", "SHARD_GRAD_OP"),
    Config("full_shard", "FULL_SHARD", "FULL_SHARD"),
    Config("full_shard_offload", "FULL_SHARD + CPU offload", "FULL_SHARD", cpu_offload=True),
    Config("fsdp2_shard_grad_op", "fsdp2 SHARD_GRAD_OP", "SHARD_GRAD_OP", fsdp2=True),
    Config("fsdp2_full_shard", "fsdp2 FULL_SHARD", "FULL_SHARD", fsdp2=True),
)
BY_NAME = {c.name: c for c in CONFIGS}


@dataclass(frozen=True)
class Variant:
    """A set of runs under one memory setting: extra environment, extra FSDPStrategy arguments."""

    name: str
    title: str
    configs: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    fsdp_kwargs: dict[str, Any] = field(default_factory=dict)


DEFAULTS = Variant("defaults", "fullshard's defaults", tuple(BY_NAME))
VARIANTS = (
    DEFAULTS,
    # DDP does not touch malloc: its "glibc as it comes" run is the defaults' run.
    Variant(
        "glibc",
        "`cpu_mmap_threshold=None`: glibc as it comes",
        ("full_shard",),
        fsdp_kwargs={"cpu_mmap_threshold": None},
    ),
    Variant(
        "no-huge-pages",
        "defaults with `THP_MEM_ALLOC_ENABLE=0`: no transparent huge pages (fullshard's default before issue 18)",
        ("ddp", "full_shard"),
        env=(("THP_MEM_ALLOC_ENABLE", "0"),),
    ),
)
VARIANT_BY_NAME = {v.name: v for v in VARIANTS}


# ---------------------------------------------------------------------------------------------
# Measurements inside one process.


# ---------------------------------------------------------------------------------------------
# The worker: one configuration, one rank (the Trainer starts rank 1 from the same command).


class Block(nn.Module):
    """One FSDP unit: ``Linear(width, width)`` then ReLU."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Model(fullshard.Module):
    """``depth`` blocks, built in ``configure_model``; notes the resident memory just before."""

    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.depth, self.width = depth, width
        self.baseline_kib = 0
        self.blocks = nn.Sequential()

    def configure_model(self) -> None:
        self.baseline_kib = rss_kib()
        self.blocks = nn.Sequential(*(Block(self.width) for _ in range(self.depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.blocks(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out: torch.Tensor = self(batch[0])
        return out.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Probe(fullshard.Callback):
    """Peak memory after setup and after each step; each step's wall and CPU time."""

    def __init__(self) -> None:
        self.setup_peak_kib = 0
        self.step_s: list[float] = []
        self.step_cpu_s: list[float] = []  # this process's CPU time, all threads, user + system
        self.step_peak_kib: list[int] = []  # peak so far, at the end of each step
        self.step_end_kib: list[int] = []  # resident at the end of each step
        self._start = self._start_cpu = 0.0

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        self.setup_peak_kib = peak_rss_kib()

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self._start = time.perf_counter()
        self._start_cpu = time.process_time()

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_s.append(time.perf_counter() - self._start)
        self.step_cpu_s.append(time.process_time() - self._start_cpu)
        self.step_peak_kib.append(peak_rss_kib())
        self.step_end_kib.append(rss_kib())


def run_worker(config: Config, variant: Variant, out_dir: Path, args: argparse.Namespace) -> None:
    """Train ``config`` on this rank (rank 0 also starts rank 1) and write this rank's JSON file."""
    if config.sharding is None:
        strategy: Any = "ddp"
    else:
        strategy = (FSDP2Strategy if config.fsdp2 else FSDPStrategy)(
            auto_wrap_policy={Block},
            sharding_strategy=config.sharding,
            cpu_offload=config.cpu_offload,
            empty_init=True,
            **variant.fsdp_kwargs,
        )
    steps = args.warmup + args.steps
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(steps * args.batch_size * WORLD_SIZE, args.width, generator=generator))
    model = Model(args.depth, args.width)
    probe = Probe()
    with tempfile.TemporaryDirectory() as root:
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=WORLD_SIZE,
            strategy=strategy,
            max_steps=steps,
            callbacks=[probe],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            default_root_dir=root,
        )
        trainer.fit(model, DataLoader(data, batch_size=args.batch_size))
    peak_kib = peak_rss_kib()
    plan = getattr(trainer.strategy, "wrap_plan", None)
    result = {
        "config": config.name,
        "variant": variant.name,
        "rank": trainer.global_rank,
        "baseline_kib": model.baseline_kib,
        "setup_peak_kib": probe.setup_peak_kib,
        "peak_kib": peak_kib,
        "end_kib": rss_kib(),
        "step_s": probe.step_s,
        "step_cpu_s": probe.step_cpu_s,
        "step_peak_kib": probe.step_peak_kib,
        "step_end_kib": probe.step_end_kib,
        "warmup": args.warmup,
        # FSDP's parameters are shard views by now: take the full count from its wrap plan.
        "numel": sum(p.numel() for p in model.parameters()) if plan is None else plan.total_numel,
        "estimate_bytes": None if plan is None else plan.estimate.total,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    path = out_dir / f"{config.name}-rank{trainer.global_rank}.json"
    path.write_text(json.dumps(result))
    added = (peak_kib - model.baseline_kib) / 1024
    median = statistics.median(probe.step_s[args.warmup :])
    print(
        f"{config.label} ({variant.name}) rank {trainer.global_rank}: peak +{added:.0f} MiB "
        f"(after setup +{(probe.setup_peak_kib - model.baseline_kib) / 1024:.0f} MiB), "
        f"median step {median:.3f} s -> {path}",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# The driver: every run as its own command, then the tables.


@dataclass(frozen=True)
class Result:
    """One run's numbers, read from its ranks' JSON files."""

    config: Config
    ranks: list[dict[str, Any]]  # by rank
    load: float

    def mib(self, key: str, rank: int) -> float:
        run = self.ranks[rank]
        return float(run[key] - run["baseline_kib"]) / 1024

    @property
    def peak_mib(self) -> float:
        return max(self.mib("peak_kib", r) for r in range(len(self.ranks)))

    @property
    def setup_peak_mib(self) -> float:
        return max(self.mib("setup_peak_kib", r) for r in range(len(self.ranks)))

    @property
    def first_step_peak_mib(self) -> float:
        return max(float(run["step_peak_kib"][0] - run["baseline_kib"]) / 1024 for run in self.ranks)

    @property
    def step_s(self) -> float:
        run = self.ranks[0]
        return float(statistics.median(run["step_s"][run["warmup"] :]))

    @property
    def cpu_s(self) -> float:
        run = self.ranks[0]
        return float(statistics.median(run["step_cpu_s"][run["warmup"] :]))

    @property
    def estimate_mib(self) -> float | None:
        est = self.ranks[0]["estimate_bytes"]
        return None if est is None else est / MIB


Results = dict[str, dict[str, Result]]  # variant name -> config name -> result


def run_one(config: Config, variant: Variant, args: argparse.Namespace, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--config", config.name, "--out", str(out_dir)]
    command += ["--variant", variant.name]
    for flag in ("warmup", "steps", "batch_size", "depth", "width"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    # 2 processes on 2 cores: one intra-op thread each, so the ranks do not compete for cores.
    # Rank 1 inherits this environment from rank 0.
    env = worker_env(threads=1, **dict(variant.env))
    load = load_average()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(
            f"{config.name} ({variant.name}) failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    ranks = [json.loads((out_dir / f"{config.name}-rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    result = Result(config, ranks, load)
    print(
        f"{variant.name:<10} {config.label:<25} peak {result.peak_mib:6.0f} MB  {1 / result.step_s:5.2f} it/s  "
        f"{result.cpu_s:5.2f} CPU s/step  (load {load:.2f}, {time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    return result


def run_all(variants: list[Variant], args: argparse.Namespace) -> Results:
    results: Results = {}
    with tempfile.TemporaryDirectory(prefix="fullshard-memory-") as tmp:
        for variant in variants:
            results[variant.name] = {
                name: run_one(BY_NAME[name], variant, args, Path(tmp) / variant.name)
                for name in variant.configs
            }
    return results


def render_table(results: list[Result]) -> str:
    ddp = next(r for r in results if r.config.sharding is None)
    rows = {
        "Memory (MB)": [f"{r.peak_mib:.0f}" for r in results],
        "Memory vs DDP": [f"{r.peak_mib / ddp.peak_mib:.2f}x" for r in results],
        "Memory, rank 0 / rank 1 (MB)": [
            " / ".join(f"{r.mib('peak_kib', k):.0f}" for k in range(len(r.ranks))) for r in results
        ],
        "Memory after setup (MB)": [f"{r.setup_peak_mib:.0f}" for r in results],
        "Memory after the first step (MB)": [f"{r.first_step_peak_mib:.0f}" for r in results],
        "Wrap plan estimate (MB)": [
            "-" if r.estimate_mib is None else f"{r.estimate_mib:.0f}" for r in results
        ],
        "Iterations per second": [f"{1 / r.step_s:.2f}" for r in results],
        "CPU seconds per step, rank 0": [f"{r.cpu_s:.2f}" for r in results],
    }
    return table(["", *(r.config.label for r in results)], [[name, *cells] for name, cells in rows.items()])


def target_line(results: list[Result]) -> str:
    by = {r.config.name: r for r in results}
    ratio = by["full_shard"].peak_mib / by["ddp"].peak_mib
    verdict = "met" if ratio <= TARGET else "missed"
    line = f"Target, FULL_SHARD's per-rank peak at most {TARGET}x DDP's: {ratio:.2f}x, {verdict}."
    cpu_ratio = by["full_shard"].cpu_s / by["ddp"].cpu_s
    lean = "met" if ratio <= LEAN_TARGET[0] and cpu_ratio <= LEAN_TARGET[1] else "missed"
    line += (
        f" Lean and fast at once, at most {LEAN_TARGET[0]}x DDP's peak at at most {LEAN_TARGET[1]}x its CPU "
        f"seconds per step: {ratio:.2f}x at {cpu_ratio:.2f}x, {lean}."
    )
    if "fsdp2_full_shard" in by:
        fsdp2 = by["fsdp2_full_shard"]
        ratio2 = fsdp2.peak_mib / by["ddp"].peak_mib
        line += (
            f" FSDP2 (fsdp2 FULL_SHARD): {ratio2:.2f}x, {'met' if ratio2 <= TARGET else 'missed'}; "
            f"its step time {fsdp2.step_s / by['full_shard'].step_s:.2f}x FSDP1's at the same settings."
        )
    return line


def render_variants(results: Results) -> str:
    """DDP and FULL_SHARD under each memory setting (DDP's glibc run is the defaults' run)."""
    header = [
        "",
        "DDP memory (MB)",
        "FULL_SHARD memory (MB)",
        "FULL_SHARD vs DDP",
        "DDP it/s",
        "FULL_SHARD it/s",
        "DDP CPU s/step",
        "FULL_SHARD CPU s/step",
    ]
    rows = []
    for variant in VARIANTS:
        runs = results.get(variant.name, {})
        if "full_shard" not in runs:
            continue
        ddp, fsdp = runs.get("ddp", results[DEFAULTS.name]["ddp"]), runs["full_shard"]
        cells = [
            f"{ddp.peak_mib:.0f}",
            f"{fsdp.peak_mib:.0f}",
            f"{fsdp.peak_mib / ddp.peak_mib:.2f}x",
            f"{1 / ddp.step_s:.2f}",
            f"{1 / fsdp.step_s:.2f}",
            f"{ddp.cpu_s:.2f}",
            f"{fsdp.cpu_s:.2f}",
        ]
        rows.append([variant.title, *cells])
    return table(header, rows)


def figures_of(results: Results) -> dict[str, Any]:
    """What the runs measured, as the result file keeps it (and the machine's THP setting)."""
    thp = "absent"  # the file reads like "always [madvise] never", the bracketed one chosen
    if THP_SETTING.exists():
        thp = next((w[1:-1] for w in THP_SETTING.read_text().split() if w.startswith("[")), "unknown")
    runs = {
        variant: {name: {"ranks": r.ranks, "load": r.load} for name, r in by_config.items()}
        for variant, by_config in results.items()
    }
    return {"runs": runs, "thp": thp}


def results_of(figures: dict[str, Any]) -> Results:
    """``figures_of``'s inverse."""
    return {
        variant: {name: Result(BY_NAME[name], r["ranks"], r["load"]) for name, r in by_config.items()}
        for variant, by_config in figures["runs"].items()
    }


def render(saved: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (every run's figures, saved)."""
    args = argparse.Namespace(**saved["arguments"])
    results = results_of(saved["figures"])
    thp = saved["figures"]["thp"]
    every = [r for runs in results.values() for r in runs.values()]
    main = [results[DEFAULTS.name][c.name] for c in CONFIGS]
    first = main[0].ranks[0]
    numel = max(r.ranks[0]["numel"] for r in main)
    loads = [r.load for r in every]
    variants = ""
    if len(results) > 1:
        variants = f"""
Memory settings, DDP and FULL_SHARD (same measurements; DDP does not touch malloc, so its
`cpu_mmap_threshold=None` numbers are the defaults' run):

{render_variants(results)}
"""
    return f"""{SECTION}

Per-rank peak memory and speed of DDP and FSDP's sharding strategies, in 2 CPU processes
(gloo), on a model whose memory is almost all parameters, gradients and AdamW state.

```bash
{saved["command"]}
```

{provenance(saved, __file__)}

- Model: {args.depth} blocks of `Linear({args.width}, {args.width})` + ReLU, {numel / 1e6:.1f}M
  parameters ({numel * 4 / MIB:.0f} MB in float32); AdamW; batch {args.batch_size} per process, so
  activations are a few MB. FSDP makes every block a unit and builds the model with
  `empty_init=True`; DDP builds it in `configure_model` as well.
- Machine: {saved["cores"]} cores ({saved["machine"]}), torch {first["torch"]}, {WORLD_SIZE} processes
  with {first["threads"]} intra-op thread each; 1-minute load average at the starts of the runs
  {min(loads):.2f} to {max(loads):.2f} (the benchmark's own 2 processes make up to about 2 of it;
  more means other work competed for the cores and the wall times are noisy);
  {saved["date"]}.

{render_table(main)}

{target_line(main)}
{variants}
- Memory: each process's peak resident set size (`getrusage` `ru_maxrss`) at the end of `fit`
  ({args.warmup + args.steps} steps), minus its resident set size when `configure_model` starts
  (after imports and the process group): what building, wrapping and training the model added
  at its highest, memory that the allocator holds on to included. The larger of the two ranks;
  MB = 2^20 bytes. "After setup" and "after the first step" are the same peak taken earlier:
  before the first step (model wrapped, optimizer built, AdamW's state not made yet) and at the
  end of the first. "Wrap plan estimate" is `FSDPStrategy.wrap_plan.estimate.total`: parameters,
  gradients and optimizer state, no activations, no allocator overhead.
- Iterations per second: 1 / the median wall time of an optimizer step on rank 0 (forward,
  backward, gradient communication, AdamW), over {args.steps} steps after {args.warmup} warm-up steps.
  "CPU seconds per step" is rank 0's process CPU time (all threads, user and system) over the
  same steps, median; other work on the machine moves it much less than the wall time.
- DDP holds a second copy of the gradients in its communication buckets
  (`gradient_as_bucket_view=False`, torch's default), hence the parameters' size more than NO_SHARD.
- FULL_SHARD + CPU offload: on CPU `cpu_offload=True` changes nothing, because the parameters
  are in host memory already (torch's offload path needs an accelerator); the column is there
  to show that. Its wrap plan estimate counts only the accelerator memory an offloaded run
  would use, and on CPU there is none.
- Memory settings: glibc's malloc gives a request of at least its mmap threshold its own
  mapping, returned to the system on `free`, but raises the threshold to the size of each such
  block freed (up to 32 MiB). FSDP gathers a 16 MB unit, frees it, gathers the next; after the
  first free these buffers come from the heap, between long-lived shards and AdamW state, and
  the holes they leave stay resident, so with `cpu_mmap_threshold=None` the heap grows step
  after step. fullshard's default on CPU holds the threshold at 128 KiB, so every gathered
  unit is a fresh mapping that the kernel faults in and zeroes. The FSDP strategies set
  `THP_MEM_ALLOC_ENABLE=1` (torch reads it at its first tensor of 2 MiB or more), so torch asks
  for transparent huge pages for such tensors and a unit takes a few dozen faults instead of
  thousands; with `THP_MEM_ALLOC_ENABLE=0` every 4 KiB is a fault (it needs
  `{THP_SETTING}` at `madvise` or `always`; here: `{thp}`).
- Speed on CPU says little about GPUs: gloo over loopback and 1-thread matmuls, not NCCL.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--config", choices=list(BY_NAME), help="run only this configuration (as a worker)")
    parser.add_argument(
        "--variant", choices=list(VARIANT_BY_NAME), default=DEFAULTS.name, help="with --config"
    )
    parser.add_argument("--out", type=Path, help="with --config: directory for the per-rank JSON files")
    parser.add_argument("--main-only", action="store_true", help="skip the memory-settings runs")
    parser.add_argument("--warmup", type=int, default=3, help="steps before timing")
    parser.add_argument("--steps", type=int, default=6, help="timed steps")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per process and step")
    parser.add_argument("--depth", type=int, default=24, help="number of blocks")
    parser.add_argument("--width", type=int, default=2048, help="features of each Linear")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    if args.config is not None:  # rank 0 here; its Trainer runs the same command for rank 1
        if args.out is None:
            parser.error("--config needs --out DIR (both ranks write their JSON file there)")
        args.out.mkdir(parents=True, exist_ok=True)
        run_worker(BY_NAME[args.config], VARIANT_BY_NAME[args.variant], args.out, args)
        return
    saved = run_or_report(
        args, __file__, lambda: figures_of(run_all([DEFAULTS] if args.main_only else list(VARIANTS), args))
    )
    results = results_of(saved["figures"])
    main_results = [results[DEFAULTS.name][c.name] for c in CONFIGS]
    print(f"\n{render_table(main_results)}\n\n{target_line(main_results)}")
    if len(results) > 1:
        print(f"\n{render_variants(results)}")
    if args.write_docs:
        write_section(render(saved))


if __name__ == "__main__":
    main()

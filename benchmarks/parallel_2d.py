"""python benchmarks/parallel_2d.py --write-docs

2D parallel: per-process peak memory and step time of FSDP2 alone (4 x 1) against tensor parallel + FSDP2 (2 x 2, both ways of asking for it) on the same 4 CPU processes.

Run it from the repository root; without ``--write-docs`` it prints the table and leaves
docs/benchmarks.md ("2D parallel") alone. One run alone::

    python benchmarks/parallel_2d.py --config tp2x2 --out /tmp/fullshard-2d

It takes about 4 minutes on 2 idle cores and needs about 2 GB of memory.

Both configurations train the same Llama-style model (``--dim`` wide, ``--layers`` blocks of
attention and a SwiGLU MLP 4 x as wide, RMSNorms, an embedding and an output layer over
``--vocab`` tokens), AdamW, sequences of ``--seq`` tokens, the same global batch of
``--global-batch`` sequences per step, on 4 processes on CPU with gloo and one intra-op thread
each. ``fsdp2``: ``FSDP2Strategy`` with a unit per block (every process its own data replica,
``--global-batch / 4`` sequences each). ``tp2x2``: ``ModelParallelStrategy(2, 2)``; its
``configure_model`` applies torchtitan's Llama plan (column-wise q/k/v/w1/w3, row-wise o/w2,
sequence parallel norms, a vocabulary-parallel embedding) over the tensor-parallel pairs, then
``fully_shard`` per block and on the root over the data-parallel pairs (2 replicas of
``--global-batch / 2`` sequences, each computed by a pair of processes). ``fsdp2_tp2``:
``FSDP2Strategy(tensor_parallel_size=2, tp_plan=...)`` with the same plan, which the strategy
applies before its usual FSDP2 wrapping (a unit per block): the same 2 x 2 layout, with a wrap
plan. Each configuration runs
as its own command (``--config``); the Trainer re-runs it for ranks 1-3; each rank writes its
numbers to a JSON file in ``--out``.

What is measured:

peak memory
    Each process's peak resident set size at the end of ``fit``, minus its resident set size
    when ``configure_model`` starts (after imports and the process group), as in "FSDP memory
    and speed"; the table shows the largest of the 4 processes. Every configuration imports
    ``torch.distributed.tensor`` before that baseline: the import alone adds about 40 MB (sympy,
    through DTensor's shape propagation), and a configuration that happened to import it later
    (``ModelParallelStrategy``'s ``configure_model``) would count it as the model's.
estimate
    The wrap plan's per-process estimate (parameters, gradients, optimizer state and the largest
    gathered unit; under tensor parallelism each split as the plan splits it): made ahead by
    FSDP2Strategy, and by ModelParallelStrategy from the layout ``configure_model`` made. The
    table also shows each process's share of the model state as it is after setup: its local
    parameter elements x 16 bytes (float32 parameter, gradient and AdamW's two moments).
step time
    The median wall time of an optimizer step on rank 0 (``on_train_batch_start`` to
    ``on_train_batch_end``) after ``--warmup`` steps, and rank 0's CPU time per step.
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
import torch.nn.functional as F
from _common import (
    REPO,
    heading_target,
    make_parser,
    parse_args,
    peak_rss_kib,
    provenance,
    rss_kib,
    run_or_report,
    table,
    worker_env,
    wrap,
    write_section,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard

SECTION = "## 2D parallel"
WORLD_SIZE = 4
CONFIGS = {
    "fsdp2": "FSDP2 alone (4 x 1)",
    "tp2x2": "model_parallel (2 x 2)",
    "fsdp2_tp2": "fsdp2, tensor_parallel_size=2",
}
RUN_TIMEOUT_S = 600
MIB = 1024 * 1024
STATE_BYTES = 16  # float32 parameter + gradient + AdamW's exp_avg and exp_avg_sq


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(dim, 4 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(dim), Attention(dim, heads)
        self.ffn_norm, self.feed_forward = nn.RMSNorm(dim), FeedForward(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Model(fullshard.Module):
    """The Llama-style model; ``parallel``: apply TP and FSDP2 over ``self.device_mesh``."""

    def __init__(self, args: argparse.Namespace, parallel: bool) -> None:
        super().__init__()
        self.vocab, self.parallel = args.vocab, parallel
        self.embed = nn.Embedding(args.vocab, args.dim)
        self.blocks = nn.ModuleList(Block(args.dim, args.heads) for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab, bias=False)
        self.baseline_kib = 0
        self.state_bytes = 0

    def configure_model(self) -> None:
        self.baseline_kib = rss_kib()
        if self.parallel:
            _parallelize(self, self.device_mesh)

    def on_fit_start(self) -> None:
        from fullshard.strategies.dtensor_ops import dtensor_parameter_sizes

        self.state_bytes = sum(size.local_numel for size in dtensor_parameter_sizes(self)) * STATE_BYTES

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (tokens,) = batch
        h = self.embed(tokens[:, :-1])
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.reshape(-1, self.vocab), tokens[:, 1:].reshape(-1))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def tp_plan() -> dict[str, Any]:
    """torchtitan's Llama plan for :class:`Model`: column-wise q/k/v/w1/w3, row-wise o/w2,
    sequence parallel norms, a vocabulary-parallel embedding."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan: dict[str, Any] = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "blocks.*.attention_norm": SequenceParallel(),
        "blocks.*.ffn_norm": SequenceParallel(),
        "blocks.*.attention": gather,
        "blocks.*.feed_forward": gather,
        "blocks.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "blocks.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    plan.update({f"blocks.*.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")})
    plan.update({f"blocks.*.feed_forward.{w}": ColwiseParallel() for w in ("w1", "w3")})
    return plan


def _parallelize(model: Model, mesh: Any) -> None:
    """:func:`tp_plan` over ``mesh["tensor_parallel"]``, then FSDP2 over ``mesh["data_parallel"]``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh["tensor_parallel"], tp_plan())
    for block in model.blocks:
        fully_shard(block, mesh=mesh["data_parallel"])
    fully_shard(model, mesh=mesh["data_parallel"])


class Probe(fullshard.Callback):
    def __init__(self) -> None:
        self.step_s: list[float] = []
        self.step_cpu_s: list[float] = []
        self.setup_peak_kib = 0
        self.first_step_peak_kib = 0

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        self.setup_peak_kib = peak_rss_kib()

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self._start, self._start_cpu = time.perf_counter(), time.process_time()

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_s.append(time.perf_counter() - self._start)
        self.step_cpu_s.append(time.process_time() - self._start_cpu)
        if len(self.step_s) == 1:
            self.first_step_peak_kib = peak_rss_kib()


def run_worker(args: argparse.Namespace) -> None:
    """Train ``args.config`` on this rank (rank 0 also starts ranks 1-3) and write its JSON file."""
    import torch.distributed.tensor  # before the baseline in every configuration: see "peak memory"

    from fullshard.strategies import FSDP2Strategy, ModelParallelStrategy

    parallel = args.config == "tp2x2"
    strategy: Any = {
        "fsdp2": lambda: FSDP2Strategy(auto_wrap_policy={Block}),
        "tp2x2": lambda: ModelParallelStrategy(2, 2),
        "fsdp2_tp2": lambda: FSDP2Strategy(
            auto_wrap_policy={Block}, tensor_parallel_size=2, tp_plan=tp_plan()
        ),
    }[args.config]()
    replicas = WORLD_SIZE if args.config == "fsdp2" else 2
    steps = args.warmup + args.steps
    tokens = torch.randint(
        0, args.vocab, (steps * args.global_batch, args.seq + 1), generator=torch.Generator().manual_seed(0)
    )
    fullshard.seed_everything(0)
    model, probe = Model(args, parallel), Probe()
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
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(model, DataLoader(TensorDataset(tokens), batch_size=args.global_batch // replicas))
    plan = getattr(trainer.strategy, "wrap_plan", None)
    result = {
        "config": args.config,
        "rank": trainer.global_rank,
        "added_peak_kib": peak_rss_kib() - model.baseline_kib,
        "setup_peak_kib": probe.setup_peak_kib - model.baseline_kib,
        "first_step_peak_kib": probe.first_step_peak_kib - model.baseline_kib,
        "state_bytes": model.state_bytes,
        "estimate_bytes": None if plan is None else plan.estimate.total,
        "numel": sum(p.numel() for p in model.parameters()),
        "step_s": probe.step_s,
        "step_cpu_s": probe.step_cpu_s,
        "warmup": args.warmup,
    }
    (Path(args.out) / f"{args.config}-rank{trainer.global_rank}.json").write_text(json.dumps(result))


def run_one(config: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--config", config, "--out", str(out)]
    for flag in ("warmup", "steps", "dim", "heads", "layers", "vocab", "seq", "global_batch"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    started = time.perf_counter()
    done = subprocess.run(
        command, env=worker_env(threads=1), cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"{config} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    ranks = [json.loads((out / f"{config}-rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    print(f"{CONFIGS[config]}: {time.perf_counter() - started:.0f} s", flush=True)
    return ranks


def _median_after_warmup(rank: dict[str, Any], key: str) -> float:
    return float(statistics.median(rank[key][rank["warmup"] :]))


def render(saved: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (every rank's figures per configuration, saved)."""
    results: dict[str, list[dict[str, Any]]] = saved["figures"]["runs"]
    args = argparse.Namespace(**saved["arguments"])
    load = saved["load_average_start"]
    names = list(results)
    peak = {n: max(r["added_peak_kib"] for r in results[n]) / 1024 for n in names}
    step = {n: _median_after_warmup(results[n][0], "step_s") for n in names}
    rows = [
        ["Peak memory per process (MB)", *(f"{peak[n]:.0f}" for n in names)],
        ["Peak memory, ranks 0-3 (MB)", *(" / ".join(f"{r['added_peak_kib'] / 1024:.0f}" for r in results[n]) for n in names)],
        ["Peak after setup / after the first step (MB)", *(f"{max(r['setup_peak_kib'] for r in results[n]) / 1024:.0f} / {max(r['first_step_peak_kib'] for r in results[n]) / 1024:.0f}" for n in names)],
        ["Model state per process after setup (MB)", *(f"{results[n][0]['state_bytes'] / MIB:.0f}" for n in names)],
        ["Wrap plan estimate (MB)", *("-" if results[n][0]["estimate_bytes"] is None else f"{results[n][0]['estimate_bytes'] / MIB:.0f}" for n in names)],
        ["Step time, rank 0 (s)", *(f"{step[n]:.2f}" for n in names)],
        ["CPU seconds per step, rank 0", *(f"{_median_after_warmup(results[n][0], 'step_cpu_s'):.2f}" for n in names)],
    ]  # fmt: skip
    numel = results[names[0]][0]["numel"]
    setup = (
        f"{saved['date']}, torch {saved['figures']['torch']}, {saved['cores']} cores ({saved['machine']}), load average"
        f" {load:.2f} at the start; 4 processes, one "
        f"intra-op thread each. Model: {args.layers} blocks of width {args.dim} ({args.heads} heads, MLP "
        f"{4 * args.dim}), vocabulary {args.vocab}, {numel / 1e6:.1f}M parameters; sequences of {args.seq} "
        f"tokens, {args.global_batch} per step; AdamW; median of {args.steps} steps after {args.warmup}."
    )
    reading = (
        f"2 x 2 (model_parallel) against FSDP2 alone: peak memory {peak['tp2x2'] / peak['fsdp2']:.2f}x, step "
        f"time {step['tp2x2'] / step['fsdp2']:.2f}x."
    )
    return "\n\n".join(
        [
            SECTION,
            wrap(f"Command: `{saved['command']}`. {setup}"),
            provenance(saved, __file__),
            table(["", *(CONFIGS[n] for n in names)], rows),
            wrap(reading),
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--config", choices=sorted(CONFIGS), help="run one configuration (a worker)")
    parser.add_argument("--out", help="where a worker writes its JSON files")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=8)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.config is not None:
        if args.out is None:
            parser.error("--config needs --out")
        run_worker(args)
        return

    def measure() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="fullshard-2d-") as tmp:
            runs = {config: run_one(config, args, Path(tmp) / config) for config in CONFIGS}
        return {"runs": runs, "torch": torch.__version__}

    section = render(run_or_report(args, __file__, measure))
    print(section)
    if args.write_docs:
        write_section(section)


if __name__ == "__main__":
    main()

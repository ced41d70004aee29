"""python benchmarks/clip_norm.py --write-docs

Gradient clipping under FSDP2: torch's clip_grad_norm_ on DTensor gradients against fullshard's norm over the mesh.

Run it from the repository root (under a minute on 2 cores); without ``--write-docs`` it prints
the section and leaves docs/benchmarks.md ("Gradient clipping under FSDP2") alone.

2 processes on CPU (gloo, one intra-op thread each) shard a stack of ``--layers`` sizes of
``Linear(256, 256)`` layers with ``fully_shard`` (a unit per layer, then the root), run one
forward and backward, and then clip the same gradients, by turns (``abba``: pairs run in
alternating order), ``--pairs`` pairs of ``--repeats`` clips each, with ``max_norm`` just below the
norm, so that every clip scales every gradient (when nothing is to be scaled, fullshard skips the
scaling on CPU):

torch
    ``torch.nn.utils.clip_grad_norm_(params, max_norm)``, then ``full_tensor()`` of the norm: what
    ``FSDP2Strategy`` did before, and what a hand-written FSDP2 loop does.
fullshard
    ``fullshard.strategies.dtensor_ops.clip_grad_norm_over_meshes``, what ``FSDP2Strategy`` and
    ``ModelParallelStrategy`` clip with ([Note: a norm over several meshes] in that module): each
    process's norm of its local shards, one all-reduce per mesh dimension the gradients are split
    along and group of gradients split alike.

The table gives the median time of a clip of each, per size, and the ratio within each pair.
Both norms must agree to 1e-5 (relative), or the script fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import (
    abba,
    heading_target,
    make_parser,
    parse_args,
    provenance,
    ratio_summary,
    run_or_report,
    table,
    write_section,
)
from torch import nn

SECTION = "## Gradient clipping under FSDP2"
WORLD = 2


def clip_torch(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_fullshard(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    from fullshard.strategies.dtensor_ops import clip_grad_norm_over_meshes

    return clip_grad_norm_over_meshes(params, max_norm)


def worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120))
    rows = []
    for layers in args.layers:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(256, 256) for _ in range(layers)))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        model(torch.randn(8, 256)).square().mean().backward()
        params = list(model.parameters())
        norms = (float(clip_torch(params, 1e9)), float(clip_fullshard(params, 1e9)))
        if abs(norms[0] - norms[1]) > 1e-5 * abs(norms[0]):
            raise RuntimeError(
                f"the norms differ with {layers} layers: torch {norms[0]}, fullshard {norms[1]}"
            )
        max_norm = 0.9999 * norms[0]  # clipping: every clip scales the gradients, a little

        def timed(clip: Any, params: list[nn.Parameter] = params, max_norm: float = max_norm) -> float:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.repeats):
                clip(params, max_norm)
            dist.barrier()
            return (time.perf_counter() - start) / args.repeats

        pairs = abba(args.pairs, lambda: timed(clip_torch), lambda: timed(clip_fullshard))
        rows.append(
            {
                "layers": layers,
                "params": len(params),
                "torch_ms": statistics.median(a for a, _ in pairs) * 1e3,
                "fullshard_ms": statistics.median(b for _, b in pairs) * 1e3,
                "ratios": [b / a for a, b in pairs],
            }
        )
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def render(result: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (the workers' rows, saved)."""
    rows, args = result["figures"], argparse.Namespace(**result["arguments"])
    lines = [
        SECTION,
        "",
        f"Command: `{result['command']}`. {result['date']}, torch {result['torch']}, {result['cores']} cores "
        f"({result['machine']}, {result['cpu']}), load average {result['load_average_start']:.2f} at the start; "
        f"{WORLD} processes, one intra-op thread each, gloo. "
        f"{args.pairs} pairs of {args.repeats} clips each, by turns; medians.",
        "",
        provenance(result, __file__),
        "",
        table(
            [
                "layers",
                "parameters",
                "torch `clip_grad_norm_` (ms)",
                "fullshard (ms)",
                "fullshard / torch, paired",
            ],
            [
                [
                    str(row["layers"]),
                    str(row["params"]),
                    f"{row['torch_ms']:.2f}",
                    f"{row['fullshard_ms']:.2f}",
                    ratio_summary(row["ratios"], digits=2),
                ]
                for row in rows
            ],
            align="rrrrl",
        ),
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--layers", type=int, nargs="+", default=[10, 50, 200], help="model sizes, in layers")
    parser.add_argument("--pairs", type=int, default=10, help="pairs of timings per size")
    parser.add_argument("--repeats", type=int, default=20, help="clips per timing")
    parser.add_argument("--port", type=int, default=29517)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)

    def measure() -> list[dict[str, Any]]:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "rows.txt")
            mp.spawn(worker, args=(args.port, args, out), nprocs=WORLD)
            rows: list[dict[str, Any]] = json.loads(Path(out).read_text())
        return rows

    section = render(run_or_report(args, __file__, measure))
    print(section)
    if args.write_docs:
        write_section(section)


if __name__ == "__main__":
    main()

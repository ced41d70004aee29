"""python benchmarks/cpu_allocator.py --write-docs

FSDP on CPU and the memory allocator: torch-only loops (no fullshard) under DDP, FSDP1 and FSDP2
with each allocator setting, counting what a step costs in fresh memory pages.

Run it from the repository root; without ``--write-docs`` it prints the table and leaves
docs/benchmarks.md ("CPU allocator settings") alone. It takes about 10 minutes on 2 idle cores
and about 5 GB of memory. A smaller run::

    python benchmarks/cpu_allocator.py --wrappers fsdp fsdp2 --settings fixed glibc

Every run trains the memory benchmark's model (24 blocks of ``Linear(2048, 2048)`` + ReLU, 100.7M
parameters, AdamW, batch 8 per process) with a hand-written loop in 2 processes on CPU (gloo, one
intra-op thread each; rank 0 starts rank 1 with the same command and environment):
``DistributedDataParallel``, ``FullyShardedDataParallel`` (every block a unit, FULL_SHARD,
``use_orig_params=True``) or ``fully_shard`` (every block, then the root). It uses no fullshard
code, so what it shows is torch's and glibc's behaviour, which fullshard's defaults choose between.

Allocator settings (``--settings``):

``glibc``
    glibc's malloc as it comes: its mmap threshold adapts upward after a large block is freed,
    so later large blocks come from the heap.
``fixed``
    ``mallopt(M_MMAP_THRESHOLD, 128 KiB)``, what ``FSDPStrategy``/``FSDP2Strategy`` set on CPU by
    default (``cpu_mmap_threshold``): every block of 128 KiB or more is its own mapping,
    returned to the system when freed.
``fixed-thp``
    ``fixed``, with ``THP_MEM_ALLOC_ENABLE=1`` in the environment from the start: torch aligns
    tensors of 2 MiB or more to 2 MiB and asks for transparent huge pages (``madvise``).
``fixed-hugetlb``
    ``fixed``, with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` from the start: glibc asks for
    transparent huge pages for its own mappings (glibc 2.35 and later).
``glibc-thp``
    ``glibc`` with ``THP_MEM_ALLOC_ENABLE=1``.

Measured on rank 0 over the steps after ``--warmup``, medians: the CPU time of the process per
step (all threads, user and system: gloo's transfers run on their own threads), the minor page
faults per step (each is a page the kernel had to find and zero: 4 KiB, or 2 MiB with huge pages),
and the peak resident set size minus the resident size before the model was built. Page faults do
not depend on the load of the machine; CPU and wall times do.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    heading_target,
    make_parser,
    parse_args,
    provenance,
    run_or_report,
    table,
    worker_env,
    write_section,
)

SECTION = "## CPU allocator settings"
WRAPPERS = {"ddp": "DDP", "fsdp": "FSDP1 FULL_SHARD", "fsdp2": "FSDP2 FULL_SHARD"}
SETTINGS: dict[str, tuple[bool, dict[str, str]]] = {  # name: (fixed threshold, environment)
    "glibc": (False, {}),
    "fixed": (True, {}),
    "fixed-thp": (True, {"THP_MEM_ALLOC_ENABLE": "1"}),
    "fixed-hugetlb": (True, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}),
    "glibc-thp": (False, {"THP_MEM_ALLOC_ENABLE": "1"}),
}
THRESHOLD = 128 * 1024
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
RUN_TIMEOUT_S = 600


def _rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def run_worker(wrapper: str, setting: str, args: argparse.Namespace) -> None:
    """One rank of one run; rank 0 starts rank 1 and writes the result."""
    import ctypes
    import socket

    import torch
    import torch.distributed as dist
    from torch import nn

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    child = None
    if rank == 0:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
        child = subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "LOCAL_RANK": "1"})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if SETTINGS[setting][0]:
        ctypes.CDLL("libc.so.6").mallopt(-3, THRESHOLD)  # M_MMAP_THRESHOLD

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(args.width, args.width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    baseline = _rss_kib()
    torch.manual_seed(0)
    net = nn.Sequential(*(Block() for _ in range(args.depth)))
    model: Any
    if wrapper == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FullyShardedDataParallel(
            net,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            use_orig_params=True,
            device_id=torch.device("cpu"),
        )
    elif wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2,))
        for block in net:
            fully_shard(block, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    else:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randn(args.batch_size, args.width, generator=torch.Generator().manual_seed(rank))
    cpu, wall, faults = [], [], []
    for _ in range(args.warmup + args.steps):
        started, started_cpu = time.perf_counter(), time.process_time()
        started_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - started_faults)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if rank == 0:
        timed = slice(args.warmup, None)
        result = {
            "cpu_s": statistics.median(cpu[timed]),
            "wall_s": statistics.median(wall[timed]),
            "faults": statistics.median(faults[timed]),
            "peak_mib": (peak - baseline) / 1024,
            "torch": torch.__version__,
        }
        Path(args.out).write_text(json.dumps(result))
    dist.barrier()
    if child is not None and child.wait() != 0:
        raise SystemExit(f"rank 1 exited with code {child.returncode}")
    dist.destroy_process_group()


def run_one(wrapper: str, setting: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out = workdir / f"{wrapper}-{setting}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", wrapper, setting, "--out", str(out)]
    for flag in ("steps", "warmup", "depth", "width", "batch_size"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    env = worker_env(threads=1, **SETTINGS[setting][1])
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{wrapper} {setting} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(out.read_text())
    print(
        f"{wrapper:<6} {setting:<14} peak {result['peak_mib']:6.0f} MiB  cpu {result['cpu_s']:5.2f} s/step  "
        f"faults {result['faults']:8.0f}/step  wall {result['wall_s']:5.2f} s/step",
        flush=True,
    )
    return result


def thp_setting() -> str:
    """The machine's transparent huge pages setting (the bracketed word of the file)."""
    if not THP_SETTING.exists():
        return "absent"
    return next((w[1:-1] for w in THP_SETTING.read_text().split() if w.startswith("[")), "unknown")


def render(saved: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (every run's figures, saved)."""
    args = argparse.Namespace(**saved["arguments"])
    results = {(wrapper, setting): result for wrapper, setting, result in saved["figures"]["runs"]}
    thp = saved["figures"]["thp"]
    base = results.get(("ddp", "glibc"))
    rows = []
    for (wrapper, setting), result in results.items():
        vs_memory = f"{result['peak_mib'] / base['peak_mib']:.2f}x" if base else "-"
        vs_cpu = f"{result['cpu_s'] / base['cpu_s']:.2f}x" if base else "-"
        rows.append(
            [
                WRAPPERS[wrapper],
                f"`{setting}`",
                f"{result['peak_mib']:.0f}",
                vs_memory,
                f"{result['cpu_s']:.2f}",
                vs_cpu,
                f"{result['faults']:,.0f}",
                f"{result['wall_s']:.2f}",
            ]
        )
    torch_version = next(iter(results.values()))["torch"]
    lines = [
        SECTION,
        "",
        "Peak memory and CPU time per step of torch-only loops (no fullshard) under each glibc/torch",
        "allocator setting on the memory benchmark's model; the settings are described in the script's",
        "docstring. Reproduce (rewrites this section):",
        "",
        "```",
        saved["command"],
        "```",
        "",
        provenance(saved, __file__),
        "",
        f"- Model: {args.depth} blocks of `Linear({args.width}, {args.width})` + ReLU, AdamW, batch"
        f" {args.batch_size} per process; 2 processes, one intra-op thread each; medians over {args.steps}"
        f" steps after {args.warmup}.",
        f"- Machine: {saved['cpu']}; torch {torch_version}; transparent huge pages `{thp}`; {saved['date']}.",
        '- "vs DDP": against DDP with glibc as it comes. Page faults per step do not depend on the load of',
        "  the machine; CPU and wall times do.",
        "",
        table(
            [
                "wrapper",
                "setting",
                "peak (MiB)",
                "vs DDP",
                "CPU s/step",
                "vs DDP",
                "page faults/step",
                "wall s/step",
            ],
            rows,
            align="llrrrrrr",
        ),
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--wrappers", nargs="+", choices=list(WRAPPERS), default=list(WRAPPERS))
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the timed ones")
    parser.add_argument("--depth", type=int, default=24, help="number of blocks")
    parser.add_argument("--width", type=int, default=2048, help="width of each block")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size per process")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)

    def measure() -> dict[str, Any]:
        runs = []
        with tempfile.TemporaryDirectory(prefix="fullshard-cpu-allocator-") as tmp:
            for wrapper in args.wrappers:
                for setting in args.settings:
                    if wrapper == "ddp" and setting not in ("glibc", "fixed", "glibc-thp", "fixed-thp"):
                        continue  # DDP is the reference: glibc, the fixed threshold, and both with huge pages
                    runs.append([wrapper, setting, run_one(wrapper, setting, args, Path(tmp))])
        return {"runs": runs, "thp": thp_setting()}

    section = render(run_or_report(args, __file__, measure))
    print()
    print(section)
    if args.write_docs:
        write_section(section)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_args = build_parser()
        worker_args.add_argument("--out", required=True)
        wrapper_name, setting_name = sys.argv[2], sys.argv[3]
        run_worker(wrapper_name, setting_name, worker_args.parse_args(sys.argv[4:]))
    else:
        main()

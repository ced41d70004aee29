"""Checkpoint save and load: fullshard's full and sharded checkpoints against the plain torch calls.

Run from the repository root::

    python benchmarks/checkpoint.py                  # measure, print the tables
    python benchmarks/checkpoint.py --write-docs     # also rewrite its section of docs/benchmarks.md

It takes about 2 minutes on 2 cores, needs about 4 GB of memory and 1 GB of disk.

One job of 2 processes (CPU, gloo, one intra-op thread each) builds a parameter-dominated
model (8 blocks of ``Linear(2048, 2048)``: 33.6M parameters, 134 MB in float32) under
``FSDPStrategy(auto_wrap_policy={Block}, empty_init=True)`` (FULL_SHARD), trains one AdamW step
so that the optimizer has its state (268 MB more), and then saves and loads that same state,
``--repeats`` times, with fullshard and with the torch calls fullshard is built on:

full save
    fullshard: ``trainer.save_checkpoint(path)`` with ``state_dict_type="full"``.
    plain: ``get_model_state_dict`` and ``get_optimizer_state_dict`` (``full_state_dict=True``,
    ``cpu_offload=False``) on every rank, ``torch.save`` on rank 0 (no fsync).
full load
    fullshard: ``trainer.strategy.load_checkpoint(path, trainer.optimizers)``.
    plain: ``torch.load`` on rank 0, then ``set_model_state_dict`` / ``set_optimizer_state_dict``
    with ``full_state_dict=True, broadcast_from_rank0=True``.
sharded save
    fullshard: ``trainer.save_checkpoint(path)`` with ``state_dict_type="sharded"``.
    plain: the sharded state dicts (``full_state_dict=False``) and
    ``torch.distributed.checkpoint.save(state, checkpoint_id=dir)`` with its default writer.
sharded load
    fullshard: ``trainer.strategy.load_checkpoint(path, trainer.optimizers)``.
    plain: the sharded state dicts, ``torch.distributed.checkpoint.load``, then
    ``set_model_state_dict`` / ``set_optimizer_state_dict``.

Every timing starts and ends with a barrier and is taken on rank 0. Each repeat runs every
operation once, plain and fullshard in alternating order; before every timing all written
data is flushed to disk (``os.sync``) so that no save pays for the previous one's writeback.
Checkpoints go to a temporary directory (``--dir``) and are deleted after each repeat. The page
cache is not dropped: loads read the files the repeat just wrote, from memory. The tables show
medians over the repeats.

The costs of crash safety and checksums are measured on their own too, on rank 0: an fsync
of a just-written full checkpoint file, CRC-32 of one rank's tensor files of a sharded
checkpoint, and ``fullshard.checkpoint.layout.verify`` of each format (which reads every byte).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DOCS = REPO / "docs" / "benchmarks.md"
SECTION = "## Checkpoint save and load"
WORLD_SIZE = 2
TARGET = 1.10  # fullshard's time at most this times the plain torch calls'
RUN_TIMEOUT_S = 600
MB = 1e6

# (key, label) of the compared operations, in table order
OPERATIONS = (
    ("full_save", "Full save"),
    ("full_load", "Full load"),
    ("sharded_save", "Sharded save"),
    ("sharded_load", "Sharded load"),
)


# ---------------------------------------------------------------------------------------------
# The worker: both ranks of one job (the Trainer starts rank 1 from the same command).


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.utils.data import DataLoader, TensorDataset

    import fullshard
    from fullshard.checkpoint.layout import crc32_of, fsync_file, verify
    from fullshard.strategies import FSDPStrategy

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.linear = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    class Model(fullshard.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks: nn.Sequential | None = None

        def configure_model(self) -> None:
            self.blocks = nn.Sequential(*(Block(args.width) for _ in range(args.depth)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert self.blocks is not None
            return self.blocks(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    root = Path(args.dir)
    strategy = FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="full", empty_init=True)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy=strategy,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=root,
    )
    data = TensorDataset(torch.randn(4 * WORLD_SIZE, args.width, generator=torch.Generator().manual_seed(0)))
    trainer.fit(Model(), DataLoader(data, batch_size=4))
    rank = trainer.global_rank
    model = strategy.model
    assert model is not None
    (optimizer,) = trainer.optimizers
    full = StateDictOptions(full_state_dict=True, cpu_offload=False)
    sharded = StateDictOptions(full_state_dict=False, cpu_offload=False)
    from_rank0 = StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=True)
    paths = {
        (who, fmt): root / (f"{who}.ckpt" if fmt == "full" else f"{who}-sharded")
        for who in ("plain", "fullshard")
        for fmt in ("full", "sharded")
    }

    def path(who: str, fmt: str) -> Path:
        return paths[(who, fmt)]

    # ------------------------------------------------------------------ the plain torch calls
    def plain_full_save() -> None:
        state = {
            "model": get_model_state_dict(model, options=full),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=full),
        }
        if rank == 0:
            torch.save(state, path("plain", "full"))

    def plain_full_load() -> None:
        state: dict[str, Any] = {"model": {}, "optimizer": {}}
        if rank == 0:
            state = torch.load(path("plain", "full"), map_location="cpu")
        set_model_state_dict(model, state["model"], options=from_rank0)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=from_rank0)

    def plain_sharded_state() -> dict[str, Any]:
        return {
            "model": get_model_state_dict(model, options=sharded),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=sharded),
        }

    def plain_sharded_save() -> None:
        dcp.save(plain_sharded_state(), checkpoint_id=path("plain", "sharded"))

    def plain_sharded_load() -> None:
        state = plain_sharded_state()
        dcp.load(state, checkpoint_id=path("plain", "sharded"))
        set_model_state_dict(model, state["model"], options=sharded)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=sharded)

    # ------------------------------------------------------------------------------ fullshard
    def fullshard_save(fmt: str) -> Callable[[], None]:
        def save() -> None:
            # one job, both formats: the format is read from the strategy at every save
            strategy.state_dict_type = fmt
            trainer.save_checkpoint(path("fullshard", fmt))

        return save

    def fullshard_load(fmt: str) -> Callable[[], None]:
        def load() -> None:
            strategy.load_checkpoint(path("fullshard", fmt), trainer.optimizers)

        return load

    calls = {
        ("full_save", "plain"): plain_full_save,
        ("full_save", "fullshard"): fullshard_save("full"),
        ("full_load", "plain"): plain_full_load,
        ("full_load", "fullshard"): fullshard_load("full"),
        ("sharded_save", "plain"): plain_sharded_save,
        ("sharded_save", "fullshard"): fullshard_save("sharded"),
        ("sharded_load", "plain"): plain_sharded_load,
        ("sharded_load", "fullshard"): fullshard_load("sharded"),
    }

    def settle() -> None:
        """Write back what earlier operations left dirty, so that it is not charged to the next one."""
        os.sync()
        dist.barrier()

    def timed(fn: Callable[[], Any]) -> float:
        settle()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    def timed_here(fn: Callable[[], Any]) -> float:
        """Time ``fn`` in this process alone (no barrier inside the timing)."""
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def clean() -> None:
        dist.barrier()
        if rank == 0:
            for p in paths.values():
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
        dist.barrier()

    times: dict[str, list[float]] = {
        f"{op}/{who}": [] for op, _ in OPERATIONS for who in ("plain", "fullshard")
    }
    parts: dict[str, list[float]] = {
        "fsync_full": [],
        "crc32_shards": [],
        "verify_full": [],
        "verify_sharded": [],
    }
    for repeat in range(args.repeats):
        order = ("plain", "fullshard") if repeat % 2 == 0 else ("fullshard", "plain")
        for fmt in ("full", "sharded"):
            for who in order:
                times[f"{fmt}_save/{who}"].append(timed(calls[(f"{fmt}_save", who)]))
                if fmt == "full" and who == "plain" and rank == 0:
                    # the plain save leaves its file unsynced: what an fsync of it costs
                    parts["fsync_full"].append(timed_here(lambda: fsync_file(path("plain", "full"))))
            for who in order:
                times[f"{fmt}_load/{who}"].append(timed(calls[(f"{fmt}_load", who)]))
        settle()
        shards = sorted(path("fullshard", "sharded").glob(f"data-*/__{rank}_*.distcp"))
        parts["crc32_shards"].append(timed_here(lambda: [crc32_of(f) for f in shards]))  # noqa: B023
        dist.barrier()
        if rank == 0:
            parts["verify_full"].append(timed_here(lambda: verify(path("fullshard", "full"))))
            parts["verify_sharded"].append(timed_here(lambda: verify(path("fullshard", "sharded"))))
        sizes = {f"{who}/{fmt}": _size(p) for (who, fmt), p in paths.items()}
        clean()
        if rank == 0:
            line = "  ".join(f"{key} {values[-1]:.2f}" for key, values in times.items())
            print(f"repeat {repeat + 1}/{args.repeats}: {line}", flush=True)

    if rank == 0:
        plan = strategy.wrap_plan
        assert plan is not None
        result = {
            "times": times,
            "parts": parts,
            "sizes": sizes,
            "numel": plan.total_numel,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        }
        Path(args.out).write_text(json.dumps(result))


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size if path.exists() else 0


# ---------------------------------------------------------------------------------------------
# The driver: one job, then the tables.


def run_job(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / "result.json"
    ckpts = work / "checkpoints"
    ckpts.mkdir()
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--out",
        str(out),
        "--dir",
        str(ckpts),
    ]
    for flag in ("repeats", "depth", "width"):
        command += [f"--{flag}", str(getattr(args, flag))]
    # 2 processes on 2 cores: one intra-op thread each. Rank 1 inherits this environment.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the benchmark job failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    print(done.stdout, end="", flush=True)
    result: dict[str, Any] = json.loads(out.read_text())
    result["load"] = load
    result["wall_s"] = time.perf_counter() - started
    return result


def _median(values: list[float]) -> float:
    return statistics.median(values)


def render_table(result: dict[str, Any]) -> str:
    times = result["times"]
    lines = [
        "| Operation | plain torch (s) | fullshard (s) | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, label in OPERATIONS:
        plain, ours = _median(times[f"{key}/plain"]), _median(times[f"{key}/fullshard"])
        lines.append(f"| {label} | {plain:.2f} | {ours:.2f} | {ours / plain:.2f}x |")
    return "\n".join(lines)


def render_parts(result: dict[str, Any]) -> str:
    times, parts, sizes = result["times"], result["parts"], result["sizes"]
    full_mb = sizes["plain/full"] / MB
    shard_mb = sizes["fullshard/sharded"] / WORLD_SIZE / MB
    rows = [
        (
            f"fsync of a just-written full checkpoint file ({full_mb:.0f} MB), rank 0",
            _median(parts["fsync_full"]),
            "plain full save",
            _median(times["full_save/plain"]),
        ),
        (
            f"CRC-32 of one rank's tensor files (about {shard_mb:.0f} MB), every sharded save",
            _median(parts["crc32_shards"]),
            "plain sharded save",
            _median(times["sharded_save/plain"]),
        ),
        (
            "`layout.verify` of the full checkpoint (zip CRC-32 of every entry), rank 0",
            _median(parts["verify_full"]),
            "fullshard full load",
            _median(times["full_load/fullshard"]),
        ),
        (
            "`layout.verify` of the sharded checkpoint (CRC-32 of every file), rank 0",
            _median(parts["verify_sharded"]),
            "fullshard sharded load",
            _median(times["sharded_load/fullshard"]),
        ),
    ]
    lines = ["| Step | time (s) | share of |", "| --- | ---: | --- |"]
    lines += [f"| {step} | {s:.2f} | {s / base:.0%} of a {what} |" for step, s, what, base in rows]
    return "\n".join(lines)


def target_line(result: dict[str, Any]) -> str:
    times = result["times"]
    ratios = {
        label: _median(times[f"{key}/fullshard"]) / _median(times[f"{key}/plain"])
        for key, label in OPERATIONS
    }
    missed = [f"{label.lower()} {ratio:.2f}x" for label, ratio in ratios.items() if ratio > TARGET]
    if not missed:
        return f"Target, fullshard at most {TARGET:.2f}x the plain torch calls: met for every operation."
    return f"Target, fullshard at most {TARGET:.2f}x the plain torch calls: missed for {', '.join(missed)}."


def render_section(args: argparse.Namespace, result: dict[str, Any]) -> str:
    numel = result["numel"]
    state_mb = result["sizes"]["plain/full"] / MB
    return f"""{SECTION}

Save and load times of fullshard's full and sharded checkpoints against the torch calls they
are built on, for the same state in the same 2 CPU processes (gloo, FSDP FULL_SHARD).

```bash
python benchmarks/checkpoint.py --write-docs
```

- State: {args.depth} blocks of `Linear({args.width}, {args.width})`, {numel / 1e6:.1f}M parameters
  ({numel * 4 / MB:.0f} MB in float32) and AdamW's two moments ({numel * 8 / MB:.0f} MB), after one
  training step: a {state_mb:.0f} MB full checkpoint, half of it on each rank when sharded.
- Machine: {os.cpu_count()} cores ({platform.machine()}), torch {result["torch"]}, {WORLD_SIZE} processes
  with {result["threads"]} intra-op thread each; checkpoints on the local disk; 1-minute load average
  {result["load"]:.2f} at the start; {datetime.date.today().isoformat()}.
- Medians of {args.repeats} repeats; each timing starts and ends with a barrier, on rank 0. Before
  each one, everything written earlier is flushed (`os.sync`). The page cache is not dropped:
  loads read files just written, from memory.

{render_table(result)}

{target_line(result)}

- Plain full save: `get_model_state_dict` / `get_optimizer_state_dict` (`full_state_dict=True`,
  `cpu_offload=False`) on every rank, `torch.save` on rank 0, no fsync. fullshard:
  `trainer.save_checkpoint(path)` (`state_dict_type="full"`): the same gather, then the
  [atomic commit](checkpoints.md): a temporary file, fsync, rename, fsync of the directory.
- Plain full load: `torch.load` on rank 0, `set_model_state_dict` / `set_optimizer_state_dict`
  with `broadcast_from_rank0=True`. fullshard: `trainer.strategy.load_checkpoint(path,
  optimizers)`, what `fit(ckpt_path=...)` calls: the same, after checking the file's keys and
  shapes against the model.
- Plain sharded save: the sharded state dicts and `torch.distributed.checkpoint.save` with its
  default writer (one file per rank, fsynced). fullshard adds the CRC-32 of every file, `meta.pt`
  and the commit record, each written atomically.
- Plain sharded load: the sharded state dicts, `torch.distributed.checkpoint.load`, then
  `set_model_state_dict` / `set_optimizer_state_dict`. fullshard first checks the commit record,
  every file's size and the saved shapes.

Where the crash safety and the checksums cost:

{render_parts(result)}

- Checksums are verified by `fullshard checkpoint inspect --verify` (`layout.verify`), not on
  every load: a load checks that every file is there with the size it was written with, and
  `torch.load` / DCP fail on a truncated or malformed file, but reading every byte once more
  would make each resume slower by the share above, more when the files are not in the page
  cache.
"""


def write_docs(section: str) -> None:
    """Insert or replace this benchmark's section of docs/benchmarks.md; other sections stay."""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"  # read just before writing
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is None:
        updated = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        rest = "".join(lines[end:])
        updated = "".join(lines[:start]) + section + ("\n" + rest if rest else "")
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(updated)
    print(f"updated {DOCS.relative_to(REPO)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="times every operation is timed")
    parser.add_argument("--depth", type=int, default=8, help="number of blocks")
    parser.add_argument("--width", type=int, default=2048, help="features of each Linear")
    parser.add_argument(
        "--dir", type=Path, help="where to write the checkpoints (default: a temporary directory)"
    )
    parser.add_argument(
        "--write-docs", action="store_true", help=f"rewrite '{SECTION}' in docs/benchmarks.md"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.worker:  # rank 0 here; its Trainer runs the same command for rank 1
        if args.out is None or args.dir is None:
            parser.error("--worker needs --out FILE and --dir DIR")
        run_worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="fullshard-checkpoint-", dir=args.dir) as work:
        result = run_job(args, Path(work))
    print(f"\n{render_table(result)}\n\n{target_line(result)}\n\n{render_parts(result)}")
    print(f"\n(job {result['wall_s']:.0f} s, load average {result['load']:.2f} at the start)")
    if args.write_docs:
        write_docs(render_section(args, result))


if __name__ == "__main__":
    main()

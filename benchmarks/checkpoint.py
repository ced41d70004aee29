"""python benchmarks/checkpoint.py --write-docs

Checkpoint save and load: fullshard's full and sharded checkpoints against the plain torch calls.

Run it from the repository root; without ``--write-docs`` it prints the tables and leaves
docs/benchmarks.md ("Checkpoint save and load") alone. It takes about 4 minutes on 2 cores and needs about 4 GB of memory and 2 GB of disk. Run it
alone: other work on the machine, on its disk above all, moves the numbers a lot; when it sees
other benchmarks or test runs meanwhile it says so, and does not write the docs.

One job of 2 processes (CPU, gloo, one intra-op thread each) builds a parameter-dominated
model (8 blocks of ``Linear(2048, 2048)``: 33.6M parameters, 134 MB in float32) under
``FSDPStrategy(auto_wrap_policy={Block}, empty_init=True)`` (FULL_SHARD), trains one AdamW step
so that the optimizer has its state (269 MB more), and then saves and loads that same state,
``--repeats`` times, with fullshard and with the torch calls fullshard is built on:

full save
    fullshard: ``trainer.save_checkpoint(path)`` with ``state_dict_type="full"``.
    plain: ``get_model_state_dict`` and ``get_optimizer_state_dict`` (``full_state_dict=True``,
    ``cpu_offload=False``) on every rank, ``torch.save`` on rank 0; once without and once with
    an fsync of the file.
full load
    fullshard: ``trainer.strategy.load_checkpoint(path, trainer.optimizers)``, which checks the
    CRC-32s of the file first, and the same with ``verify=False``.
    plain: ``torch.load`` on rank 0, then ``set_model_state_dict`` / ``set_optimizer_state_dict``
    with ``full_state_dict=True, broadcast_from_rank0=True``.
sharded save
    fullshard: ``trainer.save_checkpoint(path)`` with ``state_dict_type="sharded"``.
    plain: the sharded state dicts (``full_state_dict=False``) and
    ``torch.distributed.checkpoint.save(state, checkpoint_id=dir)`` with its default writer.
sharded load
    fullshard: ``trainer.strategy.load_checkpoint(path, trainer.optimizers)`` (each rank checks
    the CRC-32s of its share of the files first), and the same with ``verify=False``.
    plain: the sharded state dicts, ``torch.distributed.checkpoint.load``, then
    ``set_model_state_dict`` / ``set_optimizer_state_dict``.

Every timing starts and ends with a barrier and is taken on rank 0. Each repeat runs every
operation once, plain and fullshard in an order that alternates between repeats; before every
timing all written data is flushed to disk (``os.sync``) so that no operation pays for an
earlier one's writeback. Checkpoints go to a temporary directory (under ``--dir``) and are
deleted after each repeat. The page cache is not dropped: loads read the files the repeat just
wrote, from memory. The tables show medians over the repeats.

Steps inside the plain calls are timed too (the gather, ``torch.save``, the fsync; the sharded
state dicts, ``dcp.save``), and the checksums on their own: CRC-32 of one rank's files of the
sharded checkpoint (what each rank computes at a save), and ``fullshard.checkpoint.archive.verify``
of each checkpoint (which reads every byte) in a process of its own, as ``fullshard checkpoint
inspect --verify`` runs it.

``FSDPStrategy`` fixes glibc's mmap threshold on CPU (``cpu_mmap_threshold``, see [Note: CPU
memory under FSDP]), which makes every large allocation a fresh mapping: it slows the gathers
and loads of both columns alike. So the job runs twice, with the strategy's default and with
``cpu_mmap_threshold=None`` (glibc's adaptive threshold); ``--cpu-mmap-threshold`` picks one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _common import (
    DOCS,
    REPO,
    heading_target,
    load_average,
    make_parser,
    parse_args,
    provenance,
    run_or_report,
    table,
    worker_env,
    write_section,
)
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
from fullshard.checkpoint.layout import crc32_of
from fullshard.strategies import FSDP2Strategy, FSDPStrategy

SECTION = "## Checkpoint save and load"
WORLD_SIZE = 2
TARGET = 1.10  # fullshard's time at most this times the plain torch calls'
RUN_TIMEOUT_S = 600
FSDP2_SAVE_TARGET = 0.5  # an FSDP2 sharded save at most this times FSDP1's
ASYNC_BLOCKED_TARGET = 0.10  # an async save blocks training at most this times a sync FSDP2 save
ASYNC_STEPS = 20  # training steps timed with and without a background save
MB = 1e6
FORMATS = ("full", "sharded")

# The compared operations: (key, label, key of the plain timing, key of fullshard's timing)
ROWS = (
    ("full_save", "Full save", "full_save/plain", "full_save/fullshard"),
    ("full_save_fsync", "Full save, plain + fsync", "full_save/plain_fsync", "full_save/fullshard"),
    ("full_load", "Full load", "full_load/plain", "full_load/fullshard"),
    ("sharded_save", "Sharded save", "sharded_save/plain", "sharded_save/fullshard"),
    ("sharded_load", "Sharded load", "sharded_load/plain", "sharded_load/fullshard"),
)
TARGET_ROWS = ("full_save", "full_load", "sharded_save", "sharded_load")  # the comparison
# The cost of the CRC-32 checks on load: (key, label, unverified load, verified load)
VERIFY_ROWS = (
    ("full", "Full load", "full_load/unverified", "full_load/fullshard"),
    ("sharded", "Sharded load", "sharded_load/unverified", "sharded_load/fullshard"),
)
VERIFY_TARGET = 1.10  # a verified load at most this times an unverified one
# times archive.verify(argv[1]) alone, without the interpreter's start and imports
VERIFY = (
    "import sys, time\n"
    "from fullshard.checkpoint.archive import verify\n"
    "start = time.perf_counter()\n"
    "verify(sys.argv[1])\n"
    "print(time.perf_counter() - start)\n"
)


# ---------------------------------------------------------------------------------------------
# The worker: both ranks of one job (the Trainer starts rank 1 from the same command).


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Model(fullshard.Module):
    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.depth, self.width = depth, width
        self.blocks: nn.Sequential | None = None

    def configure_model(self) -> None:
        self.blocks = nn.Sequential(*(Block(self.width) for _ in range(self.depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.blocks is not None
        return self.blocks(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


FULL = StateDictOptions(full_state_dict=True, cpu_offload=False)  # what fullshard uses
SHARDED = StateDictOptions(full_state_dict=False, cpu_offload=False)
FROM_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=True)


class Job:
    """One trained model in 2 processes, and every save and load of its state, timed."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.root = Path(args.dir)
        self.fsdp2 = args.strategy == "fsdp2"
        self.strategy = (FSDP2Strategy if self.fsdp2 else FSDPStrategy)(
            auto_wrap_policy={Block},
            state_dict_type="full",
            empty_init=True,
            **({} if args.cpu_mmap_threshold == "default" else {"cpu_mmap_threshold": _threshold(args)}),
        )
        self.trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=WORLD_SIZE,
            strategy=self.strategy,
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            default_root_dir=self.root,
        )
        data = torch.randn(4 * WORLD_SIZE, args.width, generator=torch.Generator().manual_seed(0))
        # one step, so that AdamW has its state
        self.trainer.fit(Model(args.depth, args.width), DataLoader(TensorDataset(data), batch_size=4))
        self.rank = self.trainer.global_rank
        assert self.strategy.model is not None
        self.model: nn.Module = self.strategy.model
        (self.optimizer,) = self.trainer.optimizers
        self.times: dict[str, list[float]] = {}
        self.parts: dict[str, list[float]] = {}
        self.sizes: dict[str, int] = {}  # bytes of each checkpoint, from the last repeat
        self.width = args.width

    def path(self, who: str, fmt: str) -> Path:
        return self.root / (f"{who}.ckpt" if fmt == "full" else f"{who}-sharded")

    def record(self, table: dict[str, list[float]], key: str, seconds: float) -> None:
        table.setdefault(key, []).append(seconds)

    # ---------------------------------------------------------------- the plain torch calls
    def plain_full_save(self, fsync: bool) -> None:
        start = time.perf_counter()
        state = {
            "model": get_model_state_dict(self.model, options=FULL),
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=FULL),
        }
        gathered = time.perf_counter()
        if self.rank == 0:
            # its own file for each variant: none overwrites (and frees the blocks of) another
            path = self.path("plain_fsync" if fsync else "plain", "full")
            torch.save(state, path)
            written = time.perf_counter()
            if fsync:
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                self.record(self.parts, "fsync", time.perf_counter() - written)
            else:
                self.record(self.parts, "gather", gathered - start)
                self.record(self.parts, "torch_save", written - gathered)

    def plain_full_load(self) -> None:
        state: dict[str, Any] = {"model": {}, "optimizer": {}}
        if self.rank == 0:
            state = torch.load(self.path("plain", "full"), map_location="cpu")
        set_model_state_dict(self.model, state["model"], options=FROM_RANK0)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=FROM_RANK0)

    def plain_sharded_state(self) -> dict[str, Any]:
        return {
            "model": get_model_state_dict(self.model, options=SHARDED),
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=SHARDED),
        }

    def plain_sharded_save(self) -> None:
        start = time.perf_counter()
        state = self.plain_sharded_state()
        got = time.perf_counter()
        dcp.save(state, checkpoint_id=self.path("plain", "sharded"))
        if self.rank == 0:
            self.record(self.parts, "sharded_state", got - start)
            self.record(self.parts, "dcp_save", time.perf_counter() - got)

    def plain_sharded_load(self) -> None:
        state = self.plain_sharded_state()
        dcp.load(state, checkpoint_id=self.path("plain", "sharded"))
        set_model_state_dict(self.model, state["model"], options=SHARDED)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=SHARDED)

    # ---------------------------------------------------------------------------- fullshard
    def fullshard_save(self, fmt: str) -> None:
        # one job, both formats: the strategy reads its format at every save
        self.strategy.state_dict_type = fmt
        self.trainer.save_checkpoint(self.path("fullshard", fmt))

    def fullshard_load(self, fmt: str, verify: bool = True) -> None:
        self.strategy.load_checkpoint(self.path("fullshard", fmt), self.trainer.optimizers, verify=verify)

    # ------------------------------------------------------------------------------ timing
    def timed(self, key: str, fn: Callable[[], Any]) -> None:
        os.sync()  # write back what earlier operations left dirty: not this one's cost
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        self.record(self.times, key, time.perf_counter() - start)

    def repeat(self, index: int) -> None:
        """Every operation once, plain and fullshard in an order that alternates between repeats."""
        calls: dict[str, Callable[[], None]] = {
            "full_save/plain": lambda: self.plain_full_save(fsync=False),
            "full_save/plain_fsync": lambda: self.plain_full_save(fsync=True),
            "full_save/fullshard": lambda: self.fullshard_save("full"),
            "full_load/plain": self.plain_full_load,
            "full_load/fullshard": lambda: self.fullshard_load("full"),
            "full_load/unverified": lambda: self.fullshard_load("full", verify=False),
            "sharded_save/plain": self.plain_sharded_save,
            "sharded_save/fullshard": lambda: self.fullshard_save("sharded"),
            "sharded_load/plain": self.plain_sharded_load,
            "sharded_load/fullshard": lambda: self.fullshard_load("sharded"),
            "sharded_load/unverified": lambda: self.fullshard_load("sharded", verify=False),
        }
        # FSDP2's job: the sharded format only, against FSDP1's job (see render_fsdp2)
        operations = (
            ("sharded_save", "sharded_load")
            if self.fsdp2
            else ("full_save", "full_load", "sharded_save", "sharded_load")
        )
        for operation in operations:
            keys = [key for key in calls if key.startswith(f"{operation}/")]
            for key in keys if index % 2 == 0 else keys[::-1]:
                self.timed(key, calls[key])
        if self.fsdp2:
            self.sizes = {"fullshard/sharded": _size(self.path("fullshard", "sharded"))}
            self.measure_async()
            self.clean()
            return
        self.measure_checksums()
        self.sizes = {
            f"{who}/{fmt}": _size(self.path(who, fmt)) for who in ("plain", "fullshard") for fmt in FORMATS
        }
        self.clean()

    def train_steps(self, count: int, pending: Any = None) -> list[tuple[float, bool]]:
        """``count`` training steps by hand (forward, backward, AdamW), each timed on this rank,
        with whether a background save was still writing when the step began."""
        data = torch.randn(4, self.width, generator=torch.Generator().manual_seed(1))
        steps = []
        for _ in range(count):
            writing = pending is not None and pending._thread.is_alive()
            start = time.perf_counter()
            self.model(data).pow(2).mean().backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            steps.append((time.perf_counter() - start, writing))
        return steps

    def measure_async(self) -> None:
        """FSDP2's asynchronous save: how long ``save_checkpoint`` blocks the training loop, and
        the step time of the steps that run while the files are written, against steps with no
        save in flight (the same number of steps on every rank: each has collectives)."""
        os.sync()
        dist.barrier()
        quiet = self.train_steps(ASYNC_STEPS)
        self.strategy.state_dict_type, self.strategy.async_save = "sharded", True
        os.sync()
        dist.barrier()
        start = time.perf_counter()
        self.trainer.save_checkpoint(self.path("async", "sharded"))
        blocked = time.perf_counter() - start
        pending = self.trainer.checkpoint_manager.pending
        staged = pending.staged_bytes if pending is not None else 0
        during = self.train_steps(ASYNC_STEPS, pending)
        if pending is not None:  # the first optimizer step waits for the background copy of the state
            blocked += pending.copy_wait_s
        self.trainer.checkpoint_manager.wait()
        total = time.perf_counter() - start
        self.strategy.async_save = False
        dist.barrier()
        if self.rank == 0:
            self.record(self.times, "async_save/blocked", blocked)
            self.record(self.times, "async_save/committed", total)
            self.record(self.parts, "staged_mb", staged / MB)
            self.record(self.parts, "step_quiet", statistics.median(t for t, _ in quiet))
            overlapped = [t for t, writing in during if writing]
            self.record(self.parts, "steps_overlapped", float(len(overlapped)))
            if overlapped:
                self.record(self.parts, "step_during_write", statistics.median(overlapped))

    def measure_checksums(self) -> None:
        """CRC-32 of this rank's files of the sharded checkpoint (what each rank computes at a
        save), and ``archive.verify`` of each checkpoint (all its bytes), from rank 0."""
        os.sync()
        dist.barrier()
        files = sorted(self.path("fullshard", "sharded").glob(f"data-*/__{self.rank}_*.distcp"))
        start = time.perf_counter()
        for file in files:
            crc32_of(file)
        crc_s = time.perf_counter() - start
        dist.barrier()
        if self.rank == 0:
            self.record(self.parts, "crc32", crc_s)
            for fmt in FORMATS:
                # in a process of its own, as `fullshard checkpoint inspect --verify` runs it: this
                # one has FSDP's malloc settings and threads, which make reading slower
                command = [sys.executable, "-c", VERIFY, str(self.path("fullshard", fmt))]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                self.record(self.parts, f"verify_{fmt}", float(done.stdout.split()[-1]))
        dist.barrier()

    def clean(self) -> None:
        dist.barrier()
        if self.rank == 0:
            for path in self.root.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        dist.barrier()


def _threshold(args: argparse.Namespace) -> int | None:
    return None if args.cpu_mmap_threshold == "none" else int(args.cpu_mmap_threshold)


def run_worker(args: argparse.Namespace) -> None:
    job = Job(args)
    for index in range(args.repeats):
        job.repeat(index)
        if job.rank == 0:
            line = "  ".join(f"{key} {values[-1]:.2f}" for key, values in job.times.items())
            print(f"repeat {index + 1}/{args.repeats}: {line}", flush=True)
    if job.rank == 0:
        plan = job.strategy.wrap_plan
        assert plan is not None
        result = {
            "times": job.times,
            "parts": job.parts,
            "sizes": job.sizes,
            "numel": plan.total_numel,
            "cpu_mmap_threshold": job.strategy.cpu_mmap_threshold,
            "strategy": args.strategy,
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


def other_work() -> set[str]:
    """Command lines of other benchmarks and test runs on this machine now (Linux only)."""
    found = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        if ("benchmarks/" in line or "pytest" in line) and "benchmarks/checkpoint.py" not in line:
            found.add(line[:100])
    return found


def run_job(args: argparse.Namespace, work: Path, threshold: str, strategy: str = "fsdp") -> dict[str, Any]:
    """Run the job with ``FSDPStrategy(cpu_mmap_threshold=...)`` as ``threshold`` says (or
    ``FSDP2Strategy``, for ``strategy="fsdp2"``)."""
    work.mkdir()
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
    command += ["--cpu-mmap-threshold", threshold, "--strategy", strategy]
    # 2 processes on 2 cores: one intra-op thread each. Rank 1 inherits this environment.
    env = worker_env(threads=1)
    load = load_average()
    started = time.perf_counter()
    others: set[str] = set()
    with open(work / "stdout", "w+") as stdout, open(work / "stderr", "w+") as stderr:
        job = subprocess.Popen(command, env=env, cwd=REPO, stdout=stdout, stderr=stderr)
        while job.poll() is None:  # watch for other work that would skew the timings
            others |= other_work()
            if time.perf_counter() - started > RUN_TIMEOUT_S:
                job.kill()
            time.sleep(1)
        stdout.seek(0)
        stderr.seek(0)
        if job.returncode != 0:
            raise RuntimeError(
                f"the benchmark job failed ({job.returncode}):\n{stdout.read()}\n{stderr.read()}"
            )
        print(stdout.read(), end="", flush=True)
    result: dict[str, Any] = json.loads(out.read_text())
    result["load"] = load
    result["wall_s"] = time.perf_counter() - started
    result["others"] = sorted(others)
    return result


def _median(result: dict[str, Any], table: str, key: str) -> float:
    return statistics.median(result[table][key])


def ratios(result: dict[str, Any]) -> dict[str, float]:
    return {
        key: _median(result, "times", ours) / _median(result, "times", plain) for key, _, plain, ours in ROWS
    }


def render_table(result: dict[str, Any]) -> str:
    ratio = ratios(result)
    rows = [
        [
            label,
            f"{_median(result, 'times', plain):.2f}",
            f"{_median(result, 'times', ours):.2f}",
            f"{ratio[key]:.2f}x",
        ]
        for key, label, plain, ours in ROWS
    ]
    return table(["Operation", "plain torch (s)", "fullshard (s)", "ratio"], rows)


def render_parts(result: dict[str, Any]) -> str:
    shard_mb = result["sizes"]["fullshard/sharded"] / WORLD_SIZE / MB
    full, sharded = ("full_save/plain", "plain full save"), ("sharded_save/plain", "plain sharded save")
    rows = (
        ("Full save: gather the full state dicts (every rank)", "gather", *full),
        ("Full save: `torch.save` of the file (rank 0)", "torch_save", *full),
        ("Full save: fsync of that file (rank 0; the plain call skips it)", "fsync", *full),
        ("Sharded save: get the sharded state dicts", "sharded_state", *sharded),
        ("Sharded save: `dcp.save`, files written and fsynced", "dcp_save", *sharded),
        (f"Sharded save: CRC-32 of one rank's files ({shard_mb:.0f} MB)", "crc32", *sharded),
        (
            "`archive.verify` of the full checkpoint",
            "verify_full",
            "full_load/fullshard",
            "fullshard full load",
        ),
        (
            "`archive.verify` of the sharded checkpoint (every rank's files)",
            "verify_sharded",
            "sharded_load/fullshard",
            "fullshard sharded load",
        ),
    )
    cells = []
    for step, part, base, base_label in rows:
        seconds = _median(result, "parts", part)
        share = seconds / _median(result, "times", base)
        cells.append([step, f"{seconds:.2f}", f"{share:.0%} of the {base_label}"])
    return table(["Step", "time (s)", "share"], cells, align="lrl")


def render_verify(result: dict[str, Any]) -> str:
    """The CRC-32 checks of every load: verified against ``verify=False``."""
    rows, missed = [], []
    for key, label, unverified, verified in VERIFY_ROWS:
        off, on = _median(result, "times", unverified), _median(result, "times", verified)
        rows.append([label, f"{off:.2f}", f"{on:.2f}", f"{on / off:.2f}x"])
        if on / off > VERIFY_TARGET:
            missed.append(f"{key} load {on / off:.2f}x")
    head = f"Target, a verified load at most {VERIFY_TARGET:.2f}x an unverified one:"
    verdict = f" missed for {', '.join(missed)}." if missed else " met for both formats."
    return table(["Operation", "verify=False (s)", "verified (s)", "ratio"], rows) + "\n\n" + head + verdict


def target_line(result: dict[str, Any]) -> str:
    ratio = ratios(result)
    labels = {key: label.lower() for key, label, _, _ in ROWS}
    missed = [f"{labels[key]} {ratio[key]:.2f}x" for key in TARGET_ROWS if ratio[key] > TARGET]
    head = f"Target, fullshard at most {TARGET:.2f}x the plain torch calls:"
    if not missed:
        return f"{head} met for every operation."
    return f"{head} missed for {', '.join(missed)}; met for the others."


def allocator(result: dict[str, Any]) -> str:
    threshold = result["cpu_mmap_threshold"]
    if threshold is None:
        return "`cpu_mmap_threshold=None`: glibc's adaptive mmap threshold"
    return f"`cpu_mmap_threshold={threshold}`: glibc's mmap threshold fixed at {threshold // 1024} KiB"


def render_result(result: dict[str, Any]) -> str:
    """One allocator setting: the comparison, the target, where the time goes."""
    times = {key: statistics.median(values) for key, values in result["times"].items()}
    gap = times["full_save/fullshard"] - times["full_save/plain"]
    fsync = statistics.median(result["parts"]["fsync"])
    return f"""### {allocator(result)}

1-minute load average {result["load"]:.2f} at the start.

{render_table(result)}

{target_line(result)}

The CRC-32 checks of every load ([verification on load](checkpoints.md#integrity-checksums-on-every-load)),
against the same load with `verify=False`:

{render_verify(result)}

fullshard's full save takes {gap:+.2f} s against the plain call; an fsync of the file alone
takes {fsync:.2f} s.

Where the time goes (steps timed inside the plain calls, and the checksums on their own):

{render_parts(result)}
"""


def render_fsdp2(fsdp1: dict[str, Any], fsdp2: dict[str, Any]) -> str:
    """FSDP2's sharded save and load against FSDP1's, same state, same allocator setting."""
    rows, ratio = [], {}
    for op, label in (("sharded_save", "Sharded save"), ("sharded_load", "Sharded load")):
        one, two = _median(fsdp1, "times", f"{op}/fullshard"), _median(fsdp2, "times", f"{op}/fullshard")
        ratio[op] = two / one
        plain = _median(fsdp2, "times", f"{op}/plain")
        rows.append([label, f"{one:.2f}", f"{two:.2f}", f"{ratio[op]:.2f}x", f"{plain:.2f}"])
    verdict = "met" if ratio["sharded_save"] <= FSDP2_SAVE_TARGET else "missed"
    sync = _median(fsdp2, "times", "sharded_save/fullshard")
    blocked = _median(fsdp2, "times", "async_save/blocked")
    committed = _median(fsdp2, "times", "async_save/committed")
    quiet = _median(fsdp2, "parts", "step_quiet")
    overlapped = fsdp2["parts"].get("step_during_write")
    during = statistics.median(overlapped) if overlapped else float("nan")
    count = _median(fsdp2, "parts", "steps_overlapped")
    staged = _median(fsdp2, "parts", "staged_mb")
    async_verdict = "met" if blocked / sync <= ASYNC_BLOCKED_TARGET else "missed"
    async_rows = [
        ["Sync sharded save (blocks training for all of it)", f"{sync:.3f} s"],
        [
            "Async: training blocked (in `save_checkpoint`, then the next step's wait for the copy)",
            f"{blocked:.3f} s ({blocked / sync:.2f}x the sync save)",
        ],
        [f"Async: committed, waited for after the {ASYNC_STEPS} timed steps", f"{committed:.3f} s"],
        ["Step time, no save in flight", f"{quiet * 1e3:.1f} ms"],
        [
            f"Step time while the files are written (median of {count:.0f} steps)",
            f"{during * 1e3:.1f} ms ({during / quiet:.2f}x)",
        ],
        ["Host memory staged per rank (its shard of model + AdamW state)", f"{staged:.0f} MB"],
    ]
    lines = [
        table(["Operation", "fsdp (s)", "fsdp2 (s)", "fsdp2 / fsdp", "plain torch under FSDP2 (s)"], rows),
        "",
        table(["Asynchronous save (fsdp2, `async_save=True`)", "time"], async_rows),
        "",
        f"Target, an FSDP2 sharded save at most {FSDP2_SAVE_TARGET}x FSDP1's: "
        f"{ratio['sharded_save']:.2f}x, {verdict}. Target, training blocked by an async save at most "
        f"{ASYNC_BLOCKED_TARGET}x a sync FSDP2 save: {blocked / sync:.2f}x, {async_verdict}.",
    ]
    return "\n".join(lines)


def render(saved: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (every job's figures, saved)."""
    args = argparse.Namespace(**saved["arguments"])
    results: list[dict[str, Any]] = saved["figures"]["jobs"]
    fsdp2: dict[str, Any] | None = saved["figures"]["fsdp2"]
    first = results[0]
    numel = first["numel"]
    full_mb = first["sizes"]["plain/full"] / MB
    parts = "\n".join(render_result(result) for result in results)
    if fsdp2 is not None:
        parts += f"""
### FSDP2 (`strategy="fsdp2"`), {allocator(fsdp2)}

The same state under `FSDP2Strategy(auto_wrap_policy={{Block}}, empty_init=True)`: FSDP2's
sharded state dicts are each rank's `DTensor` shards, read without communication, where FSDP1
first builds `ShardedTensor`s through collectives. Same files, same commit.

{render_fsdp2(first, fsdp2)}
"""
    return f"""{SECTION}

Save and load times of fullshard's full and sharded checkpoints against the torch calls they
are built on, for the same state in the same 2 CPU processes (gloo, FSDP FULL_SHARD).

```bash
{saved["command"]}
```

{provenance(saved, __file__)}

- State: {args.depth} blocks of `Linear({args.width}, {args.width})`, {numel / 1e6:.1f}M parameters ({numel * 4 / MB:.0f} MB
  in float32) and AdamW's two moments ({numel * 8 / MB:.0f} MB), after one training step: a
  {full_mb:.0f} MB full checkpoint; each rank holds half of it.
- Machine: {saved["cores"]} cores ({saved["machine"]}), torch {first["torch"]}, {WORLD_SIZE} processes with
  {first["threads"]} intra-op thread each; checkpoints on the local disk; {saved["date"]}.
- Memory allocator: on CPU, `FSDPStrategy` fixes glibc's mmap threshold by default
  (`cpu_mmap_threshold`, see [Note: CPU memory under FSDP]), so that every large tensor is
  mapped afresh and returned when freed. That slows the gathers, loads and reads of both
  columns alike; the job runs once with it and once with glibc's adaptive threshold.
- Medians of {args.repeats} repeats. Every timing starts and ends with a barrier and is taken on
  rank 0; before each, all data written earlier is flushed (`os.sync`), so no operation pays
  for the previous one's writeback. The page cache is not dropped: loads read the files the
  repeat just wrote, from memory.

{parts}
What is compared:

- Full save. Plain: `get_model_state_dict` / `get_optimizer_state_dict` (`full_state_dict=True`,
  `cpu_offload=False`) on every rank, `torch.save` on rank 0; "plain + fsync" adds an fsync of
  the file. fullshard: `trainer.save_checkpoint(path)` with `state_dict_type="full"`: the same
  gather, then the [atomic commit](checkpoints.md): a temporary file, fsync, rename, fsync of
  the directory. The plain call returns with its data still in the page cache, fullshard with
  it on disk. fullshard fsyncs in a thread while `torch.save` is still writing ([Note: early
  writeback] in `checkpoint/io.py`), so the disk works during the writing and only the rest of
  the fsync is added: the longer `torch.save` takes, the more of the fsync it hides.
- Full load. Plain: `torch.load` on rank 0 (`weights_only=True`, the default, as fullshard's own
  reads, with its allowlist: docs/checkpoints.md), then `set_model_state_dict` /
  `set_optimizer_state_dict` with `broadcast_from_rank0=True`. fullshard:
  `trainer.strategy.load_checkpoint(path, optimizers)`, what `fit(ckpt_path=...)` calls: the
  same, after checking the file's keys and shapes against the model, with the CRC-32 of every
  entry of the file checked on rank 0 (the pickle before `torch.load` reads it, the tensors
  in a thread while it does).
- Sharded save. Plain: the sharded state dicts (`full_state_dict=False`) and
  `torch.distributed.checkpoint.save` with its default writer, which fsyncs every file.
  fullshard writes the same files, fsyncs them while it computes their CRC-32s, then writes
  `meta.pt` and the commit record, each atomically.
- Sharded load. Plain: the sharded state dicts, `torch.distributed.checkpoint.load`, then
  `set_model_state_dict` / `set_optimizer_state_dict`. fullshard first checks the commit
  record, every file's size and the saved shapes on rank 0, and the CRC-32s: rank 0 those of
  `.metadata` and `meta.pt`, each rank those of its share of the tensor files.
- `archive.verify` runs in a process of its own, as `fullshard checkpoint inspect --verify` does:
  all of a checkpoint's bytes in one process.

Checksums are computed at every sharded save and checked at every load (`verify=False` turns
that off). A sharded load splits the files among the ranks, so each rank reads about its own
share once more; a full load checks the file on rank 0 while `torch.load` reads it. The loads
above read files the page cache holds; from a disk, the checks read each byte a second time.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--repeats", type=int, default=5, help="times every operation is timed")
    parser.add_argument("--depth", type=int, default=8, help="number of blocks")
    parser.add_argument("--width", type=int, default=2048, help="features of each Linear")
    parser.add_argument(
        "--cpu-mmap-threshold",
        help="run only with FSDPStrategy(cpu_mmap_threshold=...): bytes, 'none' (glibc's adaptive "
        "threshold) or 'default' (the strategy's default); without it, both 'default' and 'none'",
    )
    parser.add_argument(
        "--dir", type=Path, help="where to write the checkpoints (default: a temporary directory)"
    )
    parser.add_argument("--no-fsdp2", action="store_true", help="skip the FSDP2 job")
    parser.add_argument("--strategy", default="fsdp", choices=("fsdp", "fsdp2"), help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    thresholds = ["default", "none"] if args.cpu_mmap_threshold is None else [args.cpu_mmap_threshold]
    if not all(t in ("default", "none") or t.isdigit() for t in thresholds):
        parser.error(f"--cpu-mmap-threshold {args.cpu_mmap_threshold!r}: give bytes, 'none' or 'default'")
    if args.worker:  # rank 0 here; its Trainer runs the same command for rank 1
        if args.out is None or args.dir is None:
            parser.error("--worker needs --out FILE and --dir DIR")
        run_worker(args)
        return

    def measure() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="fullshard-checkpoint-", dir=args.dir) as work:
            jobs = [run_job(args, Path(work) / threshold, threshold) for threshold in thresholds]
            fsdp2 = None if args.no_fsdp2 else run_job(args, Path(work) / "fsdp2", thresholds[0], "fsdp2")
        others = sorted(
            {line for result in [*jobs, *([fsdp2] if fsdp2 else [])] for line in result["others"]}
        )
        if others:
            print("\nOther benchmarks or tests ran meanwhile; the timings are not reliable:")
            print("\n".join(f"  {line}" for line in others))
            if args.write_docs:  # before the result is saved: the docs and results stay as they were
                sys.exit(f"Not writing {DOCS.relative_to(REPO)}: run again when the machine is idle.")
        return {"jobs": jobs, "fsdp2": fsdp2}

    saved = run_or_report(args, __file__, measure)
    results, fsdp2 = saved["figures"]["jobs"], saved["figures"]["fsdp2"]
    for result in results:
        print(f"\n{allocator(result)}:\n\n{render_table(result)}\n\n{target_line(result)}")
        print(f"\n{render_verify(result)}")
        print(f"\n{render_parts(result)}")
        print(f"\n(job {result['wall_s']:.0f} s, load average {result['load']:.2f} at the start)")
    if fsdp2 is not None:
        print(f"\n{render_fsdp2(results[0], fsdp2)}")
    if args.write_docs:
        write_section(render(saved))


if __name__ == "__main__":
    main()

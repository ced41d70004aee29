"""python benchmarks/stuck_ranks.py --pairs 16 --write-docs

Cost of the stuck-rank watchdog (fullshard.launch.stuck_ranks) per training step.

Run it from the repository root (about a minute on 2 cores); without ``--write-docs`` it prints
its figures and leaves docs/benchmarks.md ("Stuck-rank watchdog") alone. docs/launching.md
("Stuck ranks") quotes them by hand.

Everything runs in this one process on CPU with one intra-op thread; the watchdog publishes its
heartbeats to a real ``TCPStore`` on the loopback interface, as in a job.

kick
    The call the training loop makes once per batch, ``stuck_ranks.kick("train", batch_idx)``,
    with a watchdog started and with none (timeit: the best of 7 repeats, per call).
watchdog thread
    What the thread does while nothing is stuck: a look at its own main thread every tick and a
    heartbeat (the main thread's frame, JSON, one ``store.set``) every heartbeat interval, each
    timed alone (best of 7), and what that adds up to per second: the time the thread holds the
    GIL, at most what it takes from the training thread. With the kick, per step of the
    Trainer's 9 ms (benchmarks/overhead.py's workload in 2 processes, docs/benchmarks.md), this
    is the cost the watchdog adds, as a factor.
step, paired
    A training step of benchmarks/overhead.py's workload (MLP 512 -> 512 -> 512 -> 10, ReLU,
    batch 64, SGD, cross entropy; one process, so no collective) plus one kick with the watchdog
    thread running, over the same step without the kick and with no watchdog (the Trainer before
    the watchdog existed). Segments of ``--steps`` steps alternate between the two (the first
    ``--warmup`` of each not timed) so that neighbouring segments see the same load; the figure
    is the median of the ``--pairs`` ratios of mean step times. An end-to-end check whose noise on
    a shared machine is far larger than the cost itself. Measured for the default timeout
    (5 minutes: the thread wakes every second and publishes every 10 s) and for the 3 s the
    tests use (it wakes every 0.15 s and publishes every 0.3 s).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import timeit
from collections.abc import Callable
from datetime import timedelta
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
from _common import (
    abba,
    heading_target,
    load_average,
    make_parser,
    parse_args,
    provenance,
    ratio_summary,
    run_or_report,
    wrap,
    write_section,
)
from torch import nn

from fullshard.launch import stuck_ranks

SECTION = "## Stuck-rank watchdog"
PER_STEP_TARGET = 1.03  # the Trainer's per-step overhead budget (docs/benchmarks.md)
TRAINER_STEP_S = 0.009  # the Trainer's time per step of this workload in 2 processes (docs/benchmarks.md)


def _watch(timeout: timedelta, store: dist.Store) -> stuck_ranks.StuckRankWatchdog:
    return stuck_ranks.watch(
        rank=0,
        world_size=1,
        timeout=timeout,
        store=store,
        untimed_first_batch=False,
        end_process=lambda status: None,
    )


def kick_ns(store: dist.Store, number: int = 200_000) -> tuple[float, float]:
    """Nanoseconds per ``kick`` call: (no watchdog, watchdog started)."""
    call = "kick('train', 3)"
    namespace = {"kick": stuck_ranks.kick}
    stuck_ranks.stop_watching()
    idle = min(timeit.repeat(call, globals=namespace, number=number, repeat=7)) / number * 1e9
    _watch(stuck_ranks.DEFAULT_STUCK_RANK_TIMEOUT, store)
    stuck_ranks.kick("train", 0)  # the first kick of a stage takes the slow path once
    try:
        active = min(timeit.repeat(call, globals=namespace, number=number, repeat=7)) / number * 1e9
    finally:
        stuck_ranks.stop_watching()
    return idle, active


def thread_cost_us(store: dist.Store) -> tuple[float, float]:
    """Microseconds per (look at the main thread, heartbeat) of a started watchdog."""
    watchdog = _watch(stuck_ranks.DEFAULT_STUCK_RANK_TIMEOUT, store)
    watchdog.kick("train", 0)
    try:
        look = min(timeit.repeat(watchdog.overdue, number=20_000, repeat=7)) / 20_000 * 1e6
        beat = min(timeit.repeat(watchdog.publish, number=500, repeat=7)) / 500 * 1e6
    finally:
        stuck_ranks.stop_watching()
    return look, beat


def _step_function() -> Callable[[int], None]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    inputs, labels = torch.randn(64, 512), torch.randint(10, (64,))

    def step(_: int) -> None:
        loss = nn.functional.cross_entropy(net(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _segment(step: Callable[[int], None], steps: int, warmup: int, kick: bool) -> float:
    """Mean seconds per timed step of one segment."""
    for i in range(warmup):
        if kick:
            stuck_ranks.kick("train", i)
        step(i)
    start = time.perf_counter()
    for i in range(warmup, steps):
        if kick:
            stuck_ranks.kick("train", i)
        step(i)
    return (time.perf_counter() - start) / (steps - warmup)


def paired_ratio(
    timeout: timedelta, store: dist.Store, pairs: int, steps: int, warmup: int
) -> tuple[list[float], float]:
    """(ratios, median ms per step without): mean step times with the watchdog over those
    without, in alternating segments."""
    step = _step_function()
    _segment(step, steps, warmup, kick=False)  # warm up the allocator and caches

    def watched() -> float:
        _watch(timeout, store)
        try:
            return _segment(step, steps, warmup, kick=True)
        finally:
            stuck_ranks.stop_watching()

    timed = abba(pairs, watched, lambda: _segment(step, steps, warmup, kick=False))
    return [a / b for a, b in timed], statistics.median(b for _, b in timed) * 1e3


def _ns(ns: float) -> str:
    return f"{ns:.0f} ns" if ns < 1000 else f"{ns / 1000:.1f} µs"


def _factor(extra: float) -> str:
    """``1 + extra`` with the first digit of ``extra`` that is not 0: ``1.00002x``."""
    decimals = max(2, -math.floor(math.log10(extra))) if extra > 0 else 2
    return f"{1 + extra:.{decimals}f}x"


def _every(seconds: float) -> str:
    return "every second" if seconds == 1 else f"every {seconds:g} s"


def render(result: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (``measure``'s figures, saved)."""
    m, args = result["figures"], argparse.Namespace(**result["arguments"])
    default, short = m["settings"]
    loaded = m["load"] > 1.5  # this benchmark keeps one core busy
    ratios = default["ratios"] + short["ratios"]
    step_ms = TRAINER_STEP_S * 1e3
    bullets = [
        f"{result['date']}, {m['cores']} CPU cores (load average {m['load']:.1f}"
        f"{': other jobs were running' if loaded else ''}), torch {m['torch']}, one thread.",
        f"The call the loops make per batch: {m['active_ns']:.0f} ns with a watchdog started"
        f" ({m['idle_ns']:.0f} ns without one).",
        f"The watchdog thread while nothing is stuck: {m['look_us']:.1f} µs per look at its main thread,"
        f" {m['beat_us']:.0f} µs per heartbeat (its main thread's frame, JSON, one `set` on a loopback"
        f" `TCPStore`). At the default `stuck_rank_timeout` ({default['label']}: a look {_every(default['tick'])},"
        f" a heartbeat {_every(default['heartbeat'])}) that is {default['thread_us']:.0f} µs per second;"
        f" at {short['label']} (a look {_every(short['tick'])}, a heartbeat {_every(short['heartbeat'])}),"
        f" {short['thread_us']:.0f} µs per second.",
        f"Per step of the Trainer overhead workload ({step_ms:g} ms per step, above):"
        f" {_ns(default['step_ns'])}, {_factor(default['step_ns'] / (step_ms * 1e6))}, at the default;"
        f" {_ns(short['step_ns'])}, {_factor(short['step_ns'] / (step_ms * 1e6))}, at {short['label']}."
        f" The budget is {PER_STEP_TARGET}x.",
        f"The script also runs the step with and without the watchdog by turns ({args.pairs} pairs of"
        f" {args.steps}-step segments, one process): medians of {statistics.median(default['ratios']):.2f}x"
        f" and {statistics.median(short['ratios']):.2f}x with ratios from {min(ratios):.2f}x to"
        f" {max(ratios):.2f}x{' on this loaded machine' if loaded else ''}, noise far above the cost itself.",
    ]
    body = "\n".join(wrap(b, bullet=True) for b in bullets)
    return f"""{SECTION}

What the stuck-rank watchdog (docs/launching.md, "Stuck ranks") adds to a training step:

```
{result["command"]}
```

{provenance(result, __file__)}

{body}
"""


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure, printed as it comes."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    load = load_average()
    idle, active = kick_ns(store)
    look, beat = thread_cost_us(store)
    cores = f"{os.cpu_count()} cores, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    print(f"torch {torch.__version__}, {cores}, load average {load:.2f}")
    print(f"kick: {idle:.0f} ns per call with no watchdog, {active:.0f} ns with one started")
    print(f"watchdog thread: {look:.2f} us per look at the main thread, {beat:.0f} us per heartbeat")
    default_minutes = stuck_ranks.DEFAULT_STUCK_RANK_TIMEOUT.total_seconds() / 60
    settings = (
        (f"{default_minutes:g} minutes", stuck_ranks.DEFAULT_STUCK_RANK_TIMEOUT),
        ("3 s", timedelta(seconds=3)),
    )
    measured: list[dict[str, Any]] = []
    for label, timeout in settings:
        timing = stuck_ranks.Timing(timeout.total_seconds())
        thread_us = look / timing.tick + beat / timing.heartbeat  # per second
        per_step_ns = active + thread_us * TRAINER_STEP_S * 1e3
        print(
            f"timeout {label}: the thread looks every {timing.tick:g} s and publishes every {timing.heartbeat:g} s,"
            f" {thread_us:.0f} us per second; per {TRAINER_STEP_S * 1e3:g} ms Trainer step: {per_step_ns:.0f} ns"
            f" = {1 + per_step_ns / (TRAINER_STEP_S * 1e9):.5f}x"
        )
        measured.append(
            {"label": label, "tick": timing.tick, "heartbeat": timing.heartbeat, "thread_us": thread_us,
             "step_ns": per_step_ns}
        )  # fmt: skip
    for (label, timeout), entry in zip(settings, measured, strict=True):
        ratios, base_ms = paired_ratio(timeout, store, args.pairs, args.steps, args.warmup)
        entry["ratios"] = ratios
        verdict = "within" if statistics.median(ratios) <= PER_STEP_TARGET else "above"
        print(
            f"paired steps with/without the watchdog, timeout {label}: {ratio_summary(ratios, digits=4)},"
            f" {base_ms:.2f} ms per step; {verdict} the {PER_STEP_TARGET}x budget"
        )
    return {
        "load": load, "cores": os.cpu_count(), "torch": torch.__version__, "idle_ns": idle, "active_ns": active,
        "look_us": look, "beat_us": beat, "settings": measured,
    }  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--pairs", type=int, default=12, help="pairs of segments per timeout")
    parser.add_argument("--steps", type=int, default=200, help="steps per segment")
    parser.add_argument("--warmup", type=int, default=10, help="steps of each segment not timed")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    result = run_or_report(args, __file__, lambda: measure(args))
    if args.write_docs:
        write_section(render(result))
    elif args.report:
        print(render(result), end="")


if __name__ == "__main__":
    main()

"""The speed parts of benchmarks/gpu_check.py (issue 41): the seed guide's Transformer under
fullshard and Lightning run by turns, fullshard with one suspect changed at a time, a profile of
one step of each, the Llama with ``torch.compile`` per block, and the peak memory of saves. Each
worker runs as ``python benchmarks/gpu_check.py --worker NAME ...``; not a benchmark itself.

[Note: paired runs]
One run of each Trainer says little: the H100 run of 2026-11-27 had steps of 368-630 ms within
one run, and two processes differ in where the allocator put things and in the GPU's clocks. So
the ``paired`` worker runs the Transformer in a fresh process per run, by turns (fullshard, then
Lightning, then one fullshard variant; ``rounds`` times), with the same process settings, and
reports each run's median step, the medians over runs, and the median of the per-round ratios
fullshard/Lightning. A variant changes one thing of fullshard's baseline (:data:`VARIANTS`);
its figure is held against the median of the baseline runs. The last round also profiles one
step of each Trainer after its timed steps (:func:`profile_summary`).

The Lightning runs import Lightning and torch only (its environment may lack fullshard); the
others import fullshard.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _gpu_parts import (
    TINY_LLAMA,
    TINY_TRANSFORMER,
    GuideTransformer,
    LlamaSize,
    RandomTokens,
    TransformerSize,
    bf16_peak,
    device_figures,
    fsdp_devices,
    llama_module,
    make_timer,
    meta_numel,
    model_flops_per_token,
    on_cuda,
    quiet,
    step_figures,
)
from torch import nn
from torch.utils.data import DataLoader

# fullshard's baseline with one thing changed ([Note: paired runs]); "baseline" changes nothing
VARIANTS = {
    "baseline": "fullshard as the seed guide runs it",
    "mp-lightning": "FSDP1 MixedPrecision as Lightning 2.6.6 sets it for bf16-mixed (parameters, reduction and "
    "buffers in bf16; fullshard reduces and keeps buffers in float32)",
    "mp-fp32-params": "float32 parameters in FSDP1 (MixedPrecision all float32), bf16 by autocast only",
    "nonfinite-off": "Trainer(on_nonfinite_loss=None): no non-finite check",
}
SPEED_SIZE = replace(TransformerSize(), warmup=3, timed=10)  # per run: rounds of runs make the figure
TINY_SPEED = replace(TINY_TRANSFORMER, warmup=1, timed=3)
ROUNDS, TINY_ROUNDS = 3, 1
TOP_KERNELS = 12


# ---------------------------------------------------------------------------------------------
# One run of the seed guide's Transformer, optionally with a variant and a profiled step.


def _strategy_and_options(
    args: argparse.Namespace, layers: set[type[nn.Module]]
) -> tuple[Any, dict[str, Any]]:
    """The strategy and extra Trainer arguments of ``args.framework`` and ``args.variant``."""
    lightning_on_cpu = args.framework == "lightning" and not on_cuda(args)
    if args.framework == "lightning":
        from lightning.pytorch.strategies import FSDPStrategy

        return ("single_device" if lightning_on_cpu else FSDPStrategy(auto_wrap_policy=layers)), {}
    from torch.distributed.fsdp import MixedPrecision

    from fullshard.strategies import FSDPStrategy as OurFSDP

    options: dict[str, Any] = {}
    kwargs: dict[str, Any] = {"auto_wrap_policy": layers}
    if args.variant == "mp-lightning":
        kwargs["mixed_precision"] = MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16)
    elif args.variant == "mp-fp32-params":
        kwargs["mixed_precision"] = MixedPrecision(torch.float32, torch.float32, torch.float32)
    elif args.variant == "nonfinite-off":
        options["on_nonfinite_loss"] = None
    return OurFSDP(**kwargs), options


def speed_transformer(args: argparse.Namespace) -> dict[str, Any]:
    """The seed guide's Transformer under ``args.framework`` (fullshard's with ``args.variant``):
    the median step of its timed steps, peak memory and, with ``--profile``, one more step
    profiled."""
    started = time.perf_counter()
    if args.framework == "lightning":
        import lightning.pytorch as L
    else:
        import fullshard as L  # type: ignore[no-redef]
    size = TINY_SPEED if args.tiny else SPEED_SIZE

    class LanguageModel(L.LightningModule):  # type: ignore[name-defined, misc]
        def __init__(self) -> None:
            super().__init__()
            self.model: GuideTransformer | None = None

        def configure_model(self) -> None:
            if self.model is None:
                self.model = GuideTransformer(size)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, target = batch
            assert self.model is not None
            return F.nll_loss(self.model(inputs, target), target.reshape(-1))

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    strategy, options = _strategy_and_options(args, {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})
    timer = make_timer(L.Callback, on_cuda(args))
    steps = size.warmup + size.timed + 1
    profiler = make_step_profiler(L.Callback, on_cuda(args), steps) if args.profile else None
    L.seed_everything(42)
    lightning_on_cpu = args.framework == "lightning" and not on_cuda(args)
    trainer = L.Trainer(
        **quiet(
            accelerator=args.accelerator,
            devices=1 if lightning_on_cpu else fsdp_devices(args),
            strategy=strategy,
            precision="bf16-mixed",
            max_steps=steps + (1 if profiler else 0),
            callbacks=[timer] + ([profiler] if profiler else []),
            **options,
        )
    )
    data = DataLoader(RandomTokens(size.vocab, size.seq, (steps + 1) * size.batch), batch_size=size.batch)
    trainer.fit(LanguageModel(), data)
    times = timer.times[:steps]  # the profiled step is not timed
    return {
        "framework": args.framework,
        "variant": args.variant,
        "strategy": type(trainer.strategy).__name__,
        "params": meta_numel(size),
        "setup_s": timer.train_start - started,
        **step_figures(times, size.warmup, size.batch * size.seq * trainer.world_size),
        **device_figures(args),
        "profile": profiler.summary if profiler else None,
        "world_size": trainer.world_size,
        "rank": trainer.global_rank,
    }


def make_step_profiler(callback_base: type, cuda: bool, step: int) -> Any:
    """A callback of the Trainer's own ``Callback`` class that profiles the batch after ``step``
    optimizer steps (from its start to its end, after ``torch.cuda.synchronize()``; counted by
    ``global_step``: with 2 CPU processes an epoch ends before) and keeps :func:`profile_summary`."""
    from torch.profiler import ProfilerActivity, profile

    class StepProfiler(callback_base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.summary: dict[str, Any] | None = None
            self._profile: Any = None

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == step and self._profile is None and self.summary is None:
                if cuda:
                    torch.cuda.synchronize()
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                self._profile = profile(activities=activities)
                self._profile.__enter__()

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if self._profile is not None:
                if cuda:
                    torch.cuda.synchronize()
                self._profile.__exit__(None, None, None)
                self.summary = profile_summary(self._profile, cuda)
                self._profile = None

    return StepProfiler()


def profile_summary(prof: Any, cuda: bool) -> dict[str, Any]:
    """One profiled step: the top kernels (CPU ops without a GPU) by their own time, the reads
    that wait for the device, and the GPU's idle time with its longest gaps between kernels and
    the host operations running then (what kept the GPU waiting)."""
    averages = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ranked = sorted(averages, key=lambda e: getattr(e, key, 0), reverse=True)
    top = [
        {"name": e.key[:120], "calls": e.count, "ms": getattr(e, key, 0) / 1e3}
        for e in ranked[:TOP_KERNELS]
        if getattr(e, key, 0) > 0
    ]
    waits = (
        "aten::_local_scalar_dense",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
    )
    syncs = {e.key: e.count for e in averages if e.key in waits}
    summary: dict[str, Any] = {"top": top, "syncs": syncs}
    if cuda:
        try:  # a summary that fails must not cost the run its timings
            summary.update(gaps(prof.events()))
        except Exception as err:
            summary["gaps_error"] = f"{type(err).__name__}: {err}"
    return summary


def gaps(events: Any) -> dict[str, Any]:
    """The GPU's busy and idle time over the step, and the 5 longest gaps between kernels, each
    with the top-level host operations running at its middle (times in µs, as the profiler's
    events give them)."""
    from torch.autograd import DeviceType

    kernels = sorted(
        (e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA
    )
    if not kernels:
        return {}
    busy, holes, end = 0.0, [], kernels[0][0]
    for start, stop in kernels:
        if start > end:
            holes.append((start - end, end))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    host = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    longest = []
    for length, at in sorted(holes, reverse=True)[:5]:
        middle = at + length / 2
        running = [e.name for e in host if e.time_range.start <= middle <= e.time_range.end]
        longest.append({"at_ms": (at - kernels[0][0]) / 1e3, "ms": length / 1e3, "host": running[:3]})
    span = end - kernels[0][0]
    return {
        "gpu_span_ms": span / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "gpu_idle_ms": (span - busy) / 1e3,
        "gaps": longest,
    }


# ---------------------------------------------------------------------------------------------
# Paired runs, by turns ([Note: paired runs]).


def paired(args: argparse.Namespace) -> dict[str, Any]:
    """``rounds`` rounds of: fullshard, Lightning, one fullshard variant; each run a process of its
    own; the last round's fullshard and Lightning runs profile one step. Stops starting runs when
    less than a run's time is left of ``--part-timeout``."""
    deadline = time.monotonic() + float(args.part_timeout) - 15
    rounds = TINY_ROUNDS if args.tiny else ROUNDS
    variants = [v for v in VARIANTS if v != "baseline"]
    plan: list[tuple[int, str, str, bool]] = []
    for index in range(rounds):  # the variants spread over the rounds, all of them in one
        last = index == rounds - 1
        plan += [(index, "fullshard", "baseline", last), (index, "lightning", "baseline", last)]
        plan += [(index, "fullshard", variant, False) for variant in variants[index::rounds]]
    runs: list[dict[str, Any]] = []
    for index, framework, variant, profile in plan:
        longest = max((r["seconds"] for r in runs if "seconds" in r), default=60.0)
        if time.monotonic() + longest > deadline:
            run: dict[str, Any] = {"status": "not run: the part's time was spent"}
        else:
            run = _one_run(args, framework, variant, profile, deadline - time.monotonic())
        runs.append({**run, "round": index, "framework": framework, "variant": variant})
    return {"rank": 0, "runs": runs, **paired_figures(runs)}


def _one_run(
    args: argparse.Namespace, framework: str, variant: str, profile: bool, timeout: float
) -> dict[str, Any]:
    python = args.lightning_python if framework == "lightning" else sys.executable
    result = Path(args.work) / f"run-{time.monotonic_ns()}.json"
    command = [str(python), str(Path(__file__).with_name("gpu_check.py")), "--worker", "speed_transformer"]
    command += ["--framework", framework, "--variant", variant, "--accelerator", args.accelerator]
    command += ["--result", str(result), "--work", str(args.work)] + (["--tiny"] if args.tiny else [])
    command += ["--profile"] if profile else []
    # on CPU one thread a process, as fullshard's launcher sets for its processes: a Lightning
    # process with a thread per core competes with its own threads on a busy machine
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if not on_cuda(args) else None
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
        tail = (done.stdout + done.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        status, tail = "timed out", ""
    run: dict[str, Any] = {"framework": framework, "variant": variant, "status": status}
    run["seconds"] = time.monotonic() - start
    if status == "ok":
        run.update(json.loads(result.read_text()))
    else:
        run["output_tail"] = tail
    return run


def paired_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs, the median of the rounds' ratios fullshard/Lightning (rounds where both
    ran), each variant's step against the median of the baseline's."""
    done = [r for r in runs if r["status"] == "ok"]

    def of(framework: str, variant: str = "baseline") -> list[dict[str, Any]]:
        return [r for r in done if r["framework"] == framework and r["variant"] == variant]

    ours, theirs = of("fullshard"), of("lightning")
    figures: dict[str, Any] = {
        "fullshard_steps_s": [r["step_s"] for r in ours],
        "lightning_steps_s": [r["step_s"] for r in theirs],
    }
    by_round = {r["round"]: r for r in theirs}
    pairs = [(r, by_round[r["round"]]) for r in ours if r["round"] in by_round]
    if not pairs:
        return figures
    speed = [o["tokens_per_s"] / t["tokens_per_s"] for o, t in pairs]  # fullshard/Lightning
    memory = [o["peak_memory_mb"] / t["peak_memory_mb"] for o, t in pairs]
    figures.update(
        tokens_per_s_ratio=statistics.median(speed),
        tokens_per_s_ratio_range=[min(speed), max(speed)],
        peak_memory_ratio=statistics.median(memory),
        fullshard_step_s=statistics.median(figures["fullshard_steps_s"]),
        lightning_step_s=statistics.median(figures["lightning_steps_s"]),
    )
    figures["variants"] = {
        v: {
            "step_s": statistics.median(r["step_s"] for r in of("fullshard", v)),
            "vs_baseline": statistics.median(r["step_s"] for r in of("fullshard", v))
            / figures["fullshard_step_s"],
            "what": VARIANTS[v],
        }
        for v in VARIANTS
        if v != "baseline" and of("fullshard", v)
    }
    figures["profiles"] = {r["framework"]: r["profile"] for r in done if r.get("profile")}
    return figures


# ---------------------------------------------------------------------------------------------
# The Llama with torch.compile per block; the peak memory of saves.


def llama_compiled(args: argparse.Namespace) -> dict[str, Any]:
    """The Llama of the ``llama-fsdp2`` part with ``Trainer(compile=...)``: each decoder layer
    (an FSDP2 unit, with its activation checkpointing) compiled in place ([Note: where compile
    happens] in fullshard/compile.py); on CPU with the ``aot_eager`` backend (no C++ build)."""
    import fullshard
    from fullshard.strategies import FSDP2Strategy

    size = replace(TINY_LLAMA, steps=4, warmup=1) if args.tiny else LlamaSize()
    fullshard.seed_everything(0)
    timer = make_timer(fullshard.Callback, on_cuda(args))
    strategy = FSDP2Strategy(
        auto_wrap_policy={"LlamaDecoderLayer"},
        activation_checkpointing_policy={"LlamaDecoderLayer"},
        empty_init=True,
    )
    trainer = fullshard.Trainer(
        **quiet(
            accelerator=args.accelerator,
            devices=fsdp_devices(args),
            strategy=strategy,
            precision="bf16-mixed",
            max_steps=size.steps,
            callbacks=[timer],
            default_root_dir=args.work,
            compile=True if on_cuda(args) else {"backend": "aot_eager"},
        )
    )
    module = llama_module(size)
    trainer.fit(
        module, DataLoader(RandomTokens(size.vocab, size.seq, size.steps * size.batch), batch_size=size.batch)
    )
    result: dict[str, Any] = {
        "params": sum(p.numel() for p in module.parameters()),
        "size": asdict(size),
        "first_step_s": timer.times[0] - timer.train_start if timer.times else None,  # compiling, mostly
        **step_figures(timer.times, size.warmup, size.batch * size.seq * trainer.world_size),
        **device_figures(args),
        "world_size": trainer.world_size,
        "rank": trainer.global_rank,
    }
    flops, peak = model_flops_per_token(module, size), bf16_peak(result["device"])
    result["model_tflops_per_s"] = flops * result["tokens_per_s"] / 1e12
    result["mfu"] = flops * result["tokens_per_s"] / peak if peak else None
    return result


def save_peaks(args: argparse.Namespace) -> dict[str, Any]:
    """The seed guide's model (8 layers a stack on CUDA, to keep the files small) under FSDP1:
    the peak memory of training steps, then of a full save and of a sharded save, each measured
    from a reset of the peak; on CPU the peak resident set size, which only grows."""
    import fullshard
    from fullshard.strategies import FSDPStrategy

    size = TINY_TRANSFORMER if args.tiny else replace(TransformerSize(), nlayers=8)
    layers = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}
    fullshard.seed_everything(0)
    trainer = fullshard.Trainer(
        **quiet(
            accelerator=args.accelerator,
            devices=fsdp_devices(args),
            strategy=FSDPStrategy(auto_wrap_policy=layers),
            precision="bf16-mixed",
            max_steps=3,
            default_root_dir=args.work,
        )
    )

    class Guide(fullshard.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GuideTransformer(size)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, target = batch
            return F.nll_loss(self.model(inputs, target), target.reshape(-1))

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    trainer.fit(
        Guide(), DataLoader(RandomTokens(size.vocab, size.seq, 3 * size.batch), batch_size=size.batch)
    )
    result: dict[str, Any] = {"params": meta_numel(size), "training_peak_mb": _peak_mb(args, reset=True)}
    for fmt in ("full", "sharded"):
        trainer.strategy.state_dict_type = fmt  # type: ignore[attr-defined]
        path = Path(args.work) / f"{fmt}.ckpt"
        start = time.perf_counter()
        trainer.save_checkpoint(path)
        result[f"{fmt}_save_s"] = time.perf_counter() - start
        result[f"{fmt}_save_peak_mb"] = _peak_mb(args, reset=True)
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        result[f"{fmt}_mb"] = sum(f.stat().st_size for f in files) / 1e6
        trainer.strategy.barrier()
        if trainer.is_global_zero and path.is_dir():  # the device's disk holds the check's other files too
            shutil.rmtree(path)
        elif trainer.is_global_zero:
            path.unlink()
    return {**result, **device_figures(args), "world_size": trainer.world_size, "rank": trainer.global_rank}


def _peak_mb(args: argparse.Namespace, reset: bool) -> float:
    if not on_cuda(args):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    peak = torch.cuda.max_memory_allocated() / 1e6
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peak


WORKERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "speed_transformer": speed_transformer,
    "paired": paired,
    "llama_compiled": llama_compiled,
    "save_peaks": save_peaks,
}

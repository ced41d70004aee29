"""The workers of benchmarks/gpu_check.py: each part of the check that trains, run as
``python benchmarks/gpu_check.py --worker PART ...`` in a process of its own. Not a benchmark itself.

A worker writes one JSON object of figures to ``--result``; the driver reads it. The Lightning
worker imports Lightning and torch only (it runs in Lightning's environment, where fullshard may
not be installed); the others import fullshard.

[Note: what a step's time is]
Every training part times steps the same way under both Trainers: a callback records the clock at
each ``on_train_batch_end``, after ``torch.cuda.synchronize()`` on CUDA, so an interval is
everything the loop does for one batch (fetching it, the hooks, forward, backward, the optimizer
step). The first ``warmup`` intervals (and the time to the first batch: CUDA's and NCCL's
start-up, compilation of kernels) are left out; the figure is the median of the rest.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

# bf16 dense tensor-core peak (FLOP/s) by the device's name, for model FLOPs utilisation.
BF16_PEAK = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12}


@dataclass(frozen=True)
class TransformerSize:
    """The seed guide's Transformer: ``lightning.pytorch.demos.Transformer(vocab_size=33278,
    nlayers=32, nhid=4096, ninp=1024, nhead=64)``, trained on ``batch`` sequences of ``seq``."""

    vocab: int = 33278
    ninp: int = 1024
    nhead: int = 64
    nhid: int = 4096
    nlayers: int = 32
    batch: int = 8
    seq: int = 128
    warmup: int = 5
    timed: int = 20


@dataclass(frozen=True)
class LlamaSize:
    """A Llama of about 1.1B parameters (Llama 3.2 1B's layer shapes, a 32,000-token vocabulary,
    untied head), trained on ``batch`` sequences of ``seq``."""

    vocab: int = 32000
    hidden: int = 2048
    intermediate: int = 8192
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    batch: int = 8
    seq: int = 2048
    steps: int = 20
    warmup: int = 4


TINY_TRANSFORMER = TransformerSize(
    vocab=512, ninp=32, nhead=4, nhid=64, nlayers=2, batch=4, seq=16, warmup=2, timed=5
)
TINY_LLAMA = LlamaSize(
    vocab=256, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, batch=2, seq=64, steps=6, warmup=2
)


# ---------------------------------------------------------------------------------------------
# Data and the seed guide's model (plain torch: both Trainers train the same module).


class RandomTokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``count`` sequences of random tokens in place of WikiText2: ``(input, target)`` with the
    target the input shifted by one, as WikiText2's items are."""

    def __init__(self, vocab: int, seq: int, count: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (count, seq + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[index]
        return row[:-1], row[1:]


def positions(seq: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Sine/cosine position codes ``(seq, dim)``, made in ``forward`` (no buffer to initialise)."""
    pos = torch.arange(seq, device=device, dtype=torch.float32).unsqueeze(1)
    freqs = torch.exp(
        torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim)
    )
    return torch.stack(((pos * freqs).sin(), (pos * freqs).cos()), dim=-1).flatten(1)[:, :dim].to(dtype)


class GuideTransformer(nn.Module):
    """The shape of Lightning's demo Transformer: an embedding, ``nn.Transformer`` (encoder and
    decoder stacks of ``nlayers`` each, batch first), a linear decoder to the vocabulary and a
    log-softmax; ``forward(input, target)`` returns ``(batch * seq, vocab)`` log-probabilities."""

    def __init__(self, size: TransformerSize, dropout: float = 0.2) -> None:
        super().__init__()
        self.vocab = size.vocab
        self.embedding = nn.Embedding(size.vocab, size.ninp)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model=size.ninp,
            nhead=size.nhead,
            num_encoder_layers=size.nlayers,
            num_decoder_layers=size.nlayers,
            dim_feedforward=size.nhid,
            dropout=dropout,
            batch_first=True,
        )
        self.decoder = nn.Linear(size.ninp, size.vocab)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        out: torch.Tensor = self.dropout(x + positions(x.shape[1], x.shape[2], x.device, x.dtype))
        return out

    def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1], device=target.device)
        out = self.transformer(self.embed(inputs), self.embed(target), tgt_mask=mask)
        return F.log_softmax(self.decoder(out), dim=-1).view(-1, self.vocab)


# ---------------------------------------------------------------------------------------------
# Shared by the workers.


def on_cuda(args: argparse.Namespace) -> bool:
    return bool(args.accelerator == "cuda")


def fsdp_devices(args: argparse.Namespace) -> int:
    """One GPU; on CPU 2 processes (fullshard refuses FSDP on one CPU process: it shards nothing)."""
    return 1 if on_cuda(args) else 2


def device_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The device's name and the process's peak memory: ``torch.cuda.max_memory_allocated`` on
    CUDA, the peak resident set size on CPU."""
    if on_cuda(args):
        return {
            "device": torch.cuda.get_device_name(),
            "peak_memory_mb": torch.cuda.max_memory_allocated() / 1e6,
            "peak_reserved_mb": torch.cuda.max_memory_reserved() / 1e6,
        }
    import resource

    return {"device": "cpu", "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}


def memory_before(args: argparse.Namespace) -> dict[str, int]:
    """What a process holds before the Trainer (its non-tensor baseline): on CUDA the device
    bytes in use once the context exists (this process's context on a device it has alone), on
    CPU the resident set size."""
    if on_cuda(args):
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the context made
        free, total = torch.cuda.mem_get_info()
        return {"used": total - free - torch.cuda.memory_reserved()}
    return {"rss": _status_kib("VmRSS") * 1024}


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    return 0


def non_tensor_figures(args: argparse.Namespace, before: dict[str, int]) -> dict[str, Any]:
    """Memory that is not tensors, after training (the planner's overhead model is held against
    it: [Note: memory that is not tensors] in fullshard/planner/overhead.py). On CUDA: the
    context (``before``), everything else outside the caching allocator at the end (NCCL's
    buffers, cuBLAS's and other libraries' workspaces), the allocator's reserve at its peak
    (``max_memory_reserved - max_memory_allocated``), and the process's peak (outside the
    allocator + ``max_memory_reserved``) over ``max_memory_allocated``. On CPU: the growth of the
    resident set (peak ``VmHWM`` less the size before the Trainer), in MB."""
    if on_cuda(args):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        outside = total - free - torch.cuda.memory_reserved()
        allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        return {
            "context_mb": before["used"] / 1e6,
            "outside_allocator_mb": outside / 1e6,
            "nccl_and_libraries_mb": (outside - before["used"]) / 1e6,
            "allocator_reserve_mb": (reserved - allocated) / 1e6,
            "non_tensor_mb": (outside + reserved - allocated) / 1e6,
            "process_peak_mb": (outside + reserved) / 1e6,
        }
    growth = _status_kib("VmHWM") * 1024 - before["rss"]
    return {"rss_before_mb": before["rss"] / 1e6, "process_peak_mb": growth / 1e6}


def bf16_peak(device: str) -> float | None:
    """The device's bf16 dense peak in FLOP/s, where it is known."""
    for name, peak in BF16_PEAK.items():
        if name in device:
            return peak
    return None


def step_figures(times: list[float], warmup: int, tokens_per_step: int) -> dict[str, Any]:
    """The median step time and tokens/s of the intervals after ``warmup`` ([Note: what a step's
    time is])."""
    intervals = [b - a for a, b in itertools.pairwise(times)][warmup:]
    if not intervals:
        raise RuntimeError(f"{len(times)} steps timed, {warmup} of them warm-up: nothing left to measure")
    median = statistics.median(intervals)
    return {
        "step_s": median,
        "step_s_range": [min(intervals), max(intervals)],
        "timed_steps": len(intervals),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / median,
    }


def make_timer(callback_base: type, cuda: bool) -> Any:
    """A callback of the Trainer's own ``Callback`` class that records the clock at each batch's
    end ([Note: what a step's time is]) and at the start of training."""

    class StepTimer(callback_base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.times: list[float] = []
            self.train_start = 0.0

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            self.train_start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())

    return StepTimer()


def quiet(**kwargs: Any) -> dict[str, Any]:
    """The Trainer arguments both Trainers share: no logger, checkpoints, progress bar or summary."""
    return dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def estimate_figures(strategy: Any) -> dict[str, Any]:
    """fullshard's wrap-plan estimate (parameters, gradients, optimizer state) in MB."""
    plan = strategy.wrap_plan
    if plan is None:
        return {}
    est = plan.estimate
    return {
        "estimate_mb": est.total / 1e6,
        "estimate_parts_mb": {
            "params": est.params / 1e6,
            "grads": est.grads / 1e6,
            "optimizer": est.optimizer / 1e6,
        },
        "units": len(plan.units),
        "checkpointed": len(plan.checkpointed),
    }


def planner_figures(module: Any, batch: Any, devices: int, args: argparse.Namespace) -> dict[str, Any]:
    """The memory planner's prediction of this run's peak (FSDP2 FULL_SHARD, the decoder layers
    wrapped and checkpointed, bf16-mixed), in MB: on CUDA, to hold against
    ``torch.cuda.max_memory_allocated``."""
    from fullshard.planner import Candidate, plan

    cuda = on_cuda(args)
    result = plan(
        module,
        batch,
        devices=devices,
        device_memory=torch.cuda.get_device_properties(0).total_memory if cuda else "1TiB",
        device_type="cuda" if cuda else "cpu",
        precision="bf16-mixed",
        candidates=[Candidate("fsdp2", "FULL_SHARD", ("LlamaDecoderLayer",), 1, False)],
    )
    row = result.rows[0]
    return {
        "planner_peak_mb": row.peak / 1e6,
        "planner_overhead_mb": row.overhead / 1e6,
        "planner_process_mb": row.process_peak / 1e6,
        "planner_parts_mb": {kind: value / 1e6 for kind, value in row.split.items()},
        "planner_s": result.seconds,
    }


# ---------------------------------------------------------------------------------------------
# The seed guide's model under fullshard or Lightning.


def transformer(args: argparse.Namespace) -> dict[str, Any]:
    """The seed guide's script under ``args.framework``'s names: ``strategy=FSDPStrategy`` with
    the encoder and decoder layers auto-wrapped, bf16-mixed, one device; on CPU Lightning runs
    its single-device strategy (it refuses FSDP there)."""
    started = time.perf_counter()
    if args.framework == "lightning":
        import lightning.pytorch as L
        from lightning.pytorch.strategies import FSDPStrategy
    else:
        import fullshard as L  # type: ignore[no-redef]
        from fullshard.strategies import FSDPStrategy  # type: ignore[assignment]
    size = TINY_TRANSFORMER if args.tiny else TransformerSize()

    class LanguageModel(L.LightningModule):  # type: ignore[name-defined, misc]
        def __init__(self) -> None:
            super().__init__()
            self.model: GuideTransformer | None = None
            self.losses: list[torch.Tensor] = []

        def configure_model(self) -> None:
            if self.model is None:
                self.model = GuideTransformer(size)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, target = batch
            assert self.model is not None
            loss = F.nll_loss(self.model(inputs, target), target.reshape(-1))
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    layers = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}
    lightning_on_cpu = args.framework == "lightning" and not on_cuda(args)
    strategy: Any = "single_device" if lightning_on_cpu else FSDPStrategy(auto_wrap_policy=layers)
    timer = make_timer(L.Callback, on_cuda(args))
    L.seed_everything(42)
    steps = size.warmup + size.timed + 1
    trainer = L.Trainer(
        **quiet(
            accelerator=args.accelerator,
            devices=1 if lightning_on_cpu else fsdp_devices(args),
            strategy=strategy,
            precision="bf16-mixed",
            max_steps=steps,
            callbacks=[timer],
        )
    )
    module = LanguageModel()
    data = DataLoader(RandomTokens(size.vocab, size.seq, steps * size.batch), batch_size=size.batch)
    trainer.fit(module, data)
    result = {
        "framework": args.framework,
        "strategy": type(trainer.strategy).__name__,
        "params": meta_numel(size),
        "size": asdict(size),
        "setup_s": timer.train_start - started,
        "loss_first_last": [float(module.losses[0]), float(module.losses[-1])],
        **step_figures(timer.times, size.warmup, size.batch * size.seq * trainer.world_size),
        **device_figures(args),
        "world_size": trainer.world_size,
        "rank": trainer.global_rank,
    }
    if args.framework == "fullshard":
        result.update(estimate_figures(trainer.strategy))
    return result


def meta_numel(size: TransformerSize) -> int:
    """The guide model's parameter count, built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in GuideTransformer(size).parameters())


# ---------------------------------------------------------------------------------------------
# A Llama of about 1B parameters under FSDP2: training, then saving.


def llama_module(size: LlamaSize) -> Any:
    """A ``fullshard.Module`` that builds a ``LlamaForCausalLM`` of ``size`` in ``configure_model``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import fullshard

    config = LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.seq,
        tie_word_embeddings=False,
        use_cache=False,
    )

    class LlamaLM(fullshard.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model: Any = None
            self.losses: list[torch.Tensor] = []

        def configure_model(self) -> None:
            if self.model is None:
                self.model = LlamaForCausalLM(config)  # on the meta device: empty_init=True

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids).logits  # type: ignore[no-any-return]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self(x)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return LlamaLM()


def llama_trainer(args: argparse.Namespace, steps: int, callbacks: list[Any], root: Path) -> Any:
    import fullshard
    from fullshard.strategies import FSDP2Strategy

    strategy = FSDP2Strategy(
        auto_wrap_policy={"LlamaDecoderLayer"},
        activation_checkpointing_policy={"LlamaDecoderLayer"},
        empty_init=True,
        state_dict_type="sharded",
    )
    return fullshard.Trainer(
        **quiet(
            accelerator=args.accelerator,
            devices=fsdp_devices(args),
            strategy=strategy,
            precision="bf16-mixed",
            max_steps=steps,
            callbacks=callbacks,
            default_root_dir=root,
        )
    )


def model_flops_per_token(module: Any, size: LlamaSize) -> float:
    """Training FLOPs a token by the usual count: 6 per parameter of every matrix product (all
    parameters but the input embedding's) plus 12 x layers x hidden x sequence for attention's
    two products; recomputation under activation checkpointing is not counted (model FLOPs)."""
    params = sum(p.numel() for p in module.parameters())
    embedding = size.vocab * size.hidden
    return 6.0 * (params - embedding) + 12.0 * size.layers * size.hidden * size.seq


def llama(args: argparse.Namespace) -> dict[str, Any]:
    """20 steps of the Llama under FSDP2, bf16-mixed, activation checkpointing on the decoder
    layers, empty_init: tokens/s, MFU, peak memory against the wrap plan's estimate and the
    memory planner's prediction."""
    import fullshard

    size = TINY_LLAMA if args.tiny else LlamaSize()
    fullshard.seed_everything(0)
    module = llama_module(size)  # transformers imported: not the run's memory
    before = memory_before(args)
    timer = make_timer(fullshard.Callback, on_cuda(args))
    trainer = llama_trainer(args, size.steps, [timer], Path(args.work))
    data = DataLoader(RandomTokens(size.vocab, size.seq, size.steps * size.batch), batch_size=size.batch)
    trainer.fit(module, data)
    result: dict[str, Any] = {
        "params": sum(p.numel() for p in module.parameters()),
        "size": asdict(size),
        "loss_first_last": [float(module.losses[0]), float(module.losses[-1])],
        **step_figures(timer.times, size.warmup, size.batch * size.seq * trainer.world_size),
        **device_figures(args),
        **estimate_figures(trainer.strategy),
        "world_size": trainer.world_size,
        "rank": trainer.global_rank,
        "non_tensor": non_tensor_figures(args, before),  # before the planner runs here
    }
    if trainer.global_rank == 0:  # a fresh module: this one is sharded now
        example = RandomTokens(size.vocab, size.seq, size.batch).tokens
        result.update(
            planner_figures(llama_module(size), (example[:, :-1], example[:, 1:]), trainer.world_size, args)
        )
    flops = model_flops_per_token(module, size)
    peak = bf16_peak(result["device"])
    result["model_tflops_per_s"] = flops * result["tokens_per_s"] / 1e12
    result["mfu"] = flops * result["tokens_per_s"] / peak if peak else None
    result["bf16_peak_tflops"] = peak / 1e12 if peak else None
    result["param_devices"] = sorted({str(p.device.type) for p in module.parameters()})
    return result


def llama_save(args: argparse.Namespace) -> dict[str, Any]:
    """The same Llama after 2 steps: how long a synchronous sharded save blocks training, against
    an asynchronous one (the time in ``save_checkpoint`` plus the wait of the next
    ``optimizer.step()`` for the background copy, ``PendingSave.copy_wait_s``)."""
    import fullshard

    size = TINY_LLAMA if args.tiny else LlamaSize()
    fullshard.seed_everything(0)
    root = Path(args.work)
    trainer = llama_trainer(args, 2, [], root)
    module = llama_module(size)
    trainer.fit(module, DataLoader(RandomTokens(size.vocab, size.seq, 2 * size.batch), batch_size=size.batch))
    strategy = trainer.strategy
    (optimizer,) = trainer.optimizers
    model = strategy.model  # type: ignore[attr-defined]
    assert model is not None
    device = next(p for p in module.parameters()).device
    ids = RandomTokens(size.vocab, size.seq, size.batch, seed=1).tokens.to(device)

    def sync() -> None:
        if on_cuda(args):
            torch.cuda.synchronize()

    def step() -> float:
        sync()
        start = time.perf_counter()
        logits = model(ids[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
        sync()
        return time.perf_counter() - start

    plain_step = step()
    strategy.async_save = False  # type: ignore[attr-defined]
    sync()
    start = time.perf_counter()
    trainer.save_checkpoint(root / "sync.ckpt")
    sync_s = time.perf_counter() - start
    written = sum(f.stat().st_size for f in (root / "sync.ckpt").rglob("*") if f.is_file())
    strategy.barrier()
    if trainer.is_global_zero:
        shutil.rmtree(root / "sync.ckpt")

    strategy.async_save = True  # type: ignore[attr-defined]
    sync()
    start = time.perf_counter()
    trainer.save_checkpoint(root / "async.ckpt")
    in_call = time.perf_counter() - start
    pending = trainer.checkpoint_manager.pending
    assert pending is not None, "async_save=True left no pending checkpoint"
    staged = pending.staged_bytes
    step_during = step()
    waited = pending.copy_wait_s
    trainer.checkpoint_manager.wait()
    until_written = time.perf_counter() - start
    committed = (root / "async.ckpt").is_dir()
    strategy.barrier()
    if trainer.is_global_zero:
        shutil.rmtree(root / "async.ckpt", ignore_errors=True)
    return {
        "params": sum(p.numel() for p in module.parameters()),
        "checkpoint_mb": written / 1e6,
        "staged_mb": staged / 1e6,
        "sync_blocked_s": sync_s,
        "async_blocked_s": in_call + waited,
        "async_in_call_s": in_call,
        "async_copy_wait_s": waited,
        "async_until_written_s": until_written,
        "async_committed": committed,
        "blocked_ratio": (in_call + waited) / sync_s,
        "step_s": plain_step,
        "step_during_async_s": step_during,
        **device_figures(args),
        "world_size": trainer.world_size,
        "rank": trainer.global_rank,
    }


WORKERS = {"transformer": transformer, "llama": llama, "llama_save": llama_save}


def run(args: argparse.Namespace) -> None:
    """Run the worker ``args.worker`` and write its figures to ``args.result``."""
    result = WORKERS[args.worker](args)
    if result["rank"] == 0:  # on CPU fullshard's parts run 2 processes: rank 0 reports
        result["torch"] = torch.__version__
        Path(args.result).write_text(json.dumps(result, indent=1))

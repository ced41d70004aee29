"""Train a small Llama-style model on a 2-D mesh (ModelParallelStrategy), and move its checkpoints
between layouts; used by tests/test_model_parallel.py.

python tests/scripts/model_parallel_job.py --devices 4 --runs RUNS.json

``--runs``: a JSON list of runs, each ``{"out": DIR, "strategy": "model_parallel", "dp": 2, "tp":
2, ...}`` (see :func:`run`), run one after the other in the job's processes (one launch and process
group for all; the Trainer of each has ``devices=--devices``).

The model: token embedding, blocks of attention (q/k/v colwise, o rowwise) and a SwiGLU MLP
(w1/w3 colwise, w2 rowwise) with RMSNorms before them, sequence parallel on the norms (the
residual stream is split along the sequence between the tensor-parallel ranks), a final norm and
an output layer; torchtitan's plan for Llama, shrunk.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: hf_llama

import fullshard
from fullshard.errors import MisconfigurationError
from fullshard.strategies import FSDP2Strategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from fullshard.strategies.dtensor_ops import total_grad_norm
from hf_llama import LlamaDecoderLayer, TinyLlamaConfig, TinyLlamaForCausalLM
from hf_patterns import RMSNorm

DIM, HEADS, HIDDEN, VOCAB, SEQ, LAYERS = 16, 4, 32, 32, 8, 2
GLOBAL_BATCH = 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1: under tensor parallelism each rank holds HEADS / tp of the heads
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def tp_plan(prefix: str = "") -> dict[str, Any]:
    """torchtitan's Llama plan for :class:`Transformer` (its module names after ``prefix``), with
    sequence parallel norms: the residual stream stays split along the sequence between blocks."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": gather,
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": gather,
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.feed_forward.w3": ColwiseParallel(),
    }
    return {prefix + name: style for name, style in plan.items()}


def tensor_parallel(model: Transformer, tp_mesh: Any) -> None:
    """:func:`tp_plan` over ``tp_mesh``: what a user writes in configure_model."""
    from torch.distributed.tensor.parallel import parallelize_module

    if tp_mesh.size() > 1:
        parallelize_module(model, tp_mesh, tp_plan())


def data_parallel(model: Transformer, dp_mesh: Any, shard_root: bool = True) -> None:
    """FSDP2 over ``dp_mesh``, a unit per block and the root (``shard_root=False``: the mistake of
    leaving the root's own parameters out of FSDP)."""
    from torch.distributed.fsdp import fully_shard

    if dp_mesh.size() > 1:
        for layer in model.layers:
            fully_shard(layer, mesh=dp_mesh)
        if shard_root:
            fully_shard(model, mesh=dp_mesh)


class LlamaModule(fullshard.Module):
    """``parallel``: parallelise over ``self.device_mesh`` in configure_model (model_parallel runs);
    ``shard_root``: as for :func:`data_parallel`; ``checkpointing``: every block recomputes its
    activations in backward."""

    def __init__(
        self,
        parallel: bool = False,
        shard_root: bool = True,
        checkpointing: bool = False,
        hf: bool = False,
        lazy: bool = False,
        meta_device: bool = False,
    ) -> None:
        super().__init__()
        self.hf, self.lazy, self.meta_device = hf, lazy, meta_device
        if not lazy:  # lazy: built in configure_model (meta_device: under torch.device("meta"))
            self.model: nn.Module = self._build()
        self.parallel, self.shard_root, self.checkpointing = parallel, shard_root, checkpointing
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.max_grads: list[float] = []
        self.batches: list[list[int]] = []

    def _build(self) -> nn.Module:
        # hf: tests/hf_llama.py's model, written as transformers writes it, with its own TP plan
        return TinyLlamaForCausalLM(TinyLlamaConfig()) if self.hf else Transformer()

    def configure_model(self) -> None:
        if self.lazy and not hasattr(self, "model"):
            with torch.device("meta") if self.meta_device else contextlib.nullcontext():
                self.model = self._build()
        mesh = self.device_mesh
        if self.parallel:
            tensor_parallel(self.model, mesh["tensor_parallel"])
        if self.checkpointing:  # after TP, before FSDP, as torchtitan orders them
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            for i, layer in enumerate(self.model.layers):
                self.model.layers[i] = checkpoint_wrapper(layer)
        if self.parallel:
            data_parallel(self.model, mesh["data_parallel"], self.shard_root)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        index, tokens = batch
        logits = self.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        self.losses.append(float(loss.detach()))
        self.batches.append(index.tolist())
        self.log("loss_mean", loss, sync_dist=True)  # the mean over data replicas
        self.log("samples", float(len(index)), reduce_fx="sum", sync_dist=True)  # the global batch
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.grad_norms.append(float(total_grad_norm(self.parameters())))
        self.max_grads.append(float(total_grad_norm(self.parameters(), float("inf"))))

    def init_weights(self, module: nn.Module) -> None:
        # the Trainer initialises layers configure_model builds, not those it parallelises: the
        # weights of every layer here come from __init__ (or, lazy, from the layers' own init)
        if (
            self.lazy
        ):  # what a user adds for the meta device: hf_llama's norms set their weight in __init__ only
            if isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            return
        raise AssertionError(f"init_weights ran on {type(module).__name__}, which configure_model only split")

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class Logged(fullshard.Callback):
    """The sync_dist-logged values of every step."""

    def __init__(self) -> None:
        self.values: list[dict[str, float]] = []

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.values.append({k: float(v) for k, v in trainer.callback_metrics.items()})


class Loaded(fullshard.Callback):
    """Rank 0 writes the full model and optimizer states to ``path`` when training starts: after a
    checkpoint given as ``ckpt_path`` is loaded (its optimizer states after ``on_fit_start``, as
    in Lightning), before any step (collective); or, when the checkpoint has reached ``max_steps``
    already (nothing to train: no ``on_train_start``, as in Lightning), when fit ends.
    ``model_only``: the model's alone (the optimizers have not stepped yet: there is no state to
    record)."""

    def __init__(self, path: Path, model_only: bool = False) -> None:
        self.path, self.model_only, self.written = path, model_only, False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._write(trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if not self.written:
            self._write(trainer)

    def _write(self, trainer: Any) -> None:
        self.written = True
        optimizers = [] if self.model_only else trainer.optimizers
        model_state, optimizer_states = trainer.strategy.get_state(optimizers, full=True)
        if trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model_state, "optimizers": optimizer_states}, self.path)


def make_data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    return TensorDataset(torch.arange(n), torch.randint(0, VOCAB, (n, SEQ + 1), generator=g))


def make_strategy(spec: dict[str, Any]) -> Any:
    name, fmt = spec["strategy"], spec.get("format", "sharded")
    if name == "model_parallel":
        return ModelParallelStrategy(
            spec["dp"],
            spec["tp"],
            save_distributed_checkpoint=fmt == "sharded",
            async_save=spec.get("async", False),
        )
    if name == "fsdp2":
        return FSDP2Strategy(
            auto_wrap_policy={Block}, state_dict_type=fmt, empty_init=spec.get("empty_init", False)
        )
    if name == "fsdp2_tp":  # the strategy applies the plan, then its usual FSDP2 wrapping
        hf = spec.get("model") == "hf"  # the Hugging Face model's own plan: tp_plan="auto"
        block = LlamaDecoderLayer if hf else Block
        return FSDP2Strategy(
            auto_wrap_policy={block},
            state_dict_type=fmt,
            tensor_parallel_size=spec["tp"],
            tp_plan="auto" if hf else tp_plan("model."),
            activation_checkpointing_policy={block} if spec.get("checkpointing") else None,
            empty_init=spec.get("empty_init", False),
        )
    if name == "fsdp":
        return FSDPStrategy(auto_wrap_policy={Block}, state_dict_type=fmt)
    return SingleDeviceStrategy(state_dict_type=fmt)


def run(spec: dict[str, Any], devices: int) -> fullshard.Trainer:
    """One fit: ``spec`` holds ``out``, ``strategy`` (with ``dp``/``tp`` for model_parallel),
    ``format``, ``max_steps``, ``resume``, ``save`` (a path written after fit), ``save_every``,
    ``async``, ``clip``, ``accelerator``, ``precision``, ``compile`` (``torch.compile`` keyword
    arguments), ``checkpointing`` (activation checkpointing of every block); ``mistake``: "unsharded" (configure_model parallelises
    nothing) or "root" (FSDP left off the root), whose error is written to ``out/error.txt``;
    ``model``: "hf" for tests/hf_llama.py's model (under fsdp2_tp: its own plan, ``tp_plan="auto"``);
    ``lazy``: the model is built in configure_model, ``meta_device``: under ``torch.device("meta")``,
    ``empty_init``: the fsdp2 strategies' option; ``record_init``: the full state at fit start to
    ``out/init.pt``."""
    fullshard.seed_everything(7)
    out = Path(spec["out"])
    mistake = spec.get("mistake")
    module = LlamaModule(
        parallel=spec["strategy"] == "model_parallel" and mistake != "unsharded",
        shard_root=mistake != "root",
        checkpointing=spec.get("checkpointing", False) and spec["strategy"] == "model_parallel",
        hf=spec.get("model") == "hf",
        lazy=spec.get("lazy", False),
        meta_device=spec.get("meta_device", False),
    )
    logged = Logged()
    callbacks: list[Any] = [logged]
    if spec.get("resume"):  # the state as loaded: out/loaded.pt
        callbacks.append(Loaded(out / "loaded.pt"))
    if spec.get("record_init"):  # the state training starts from: out/init.pt
        callbacks.append(Loaded(out / "init.pt", model_only=True))
    if spec.get("save_every"):
        callbacks.append(
            fullshard.ModelCheckpoint(
                dirpath=out / "ckpts", every_n_train_steps=spec["save_every"], save_top_k=-1
            )
        )
    dp = {"model_parallel": spec.get("dp"), "fsdp2_tp": devices // spec.get("tp", 1)}.get(
        spec["strategy"]
    ) or devices
    trainer = fullshard.Trainer(
        accelerator=spec.get("accelerator", "cpu"),
        devices=devices,
        strategy=make_strategy(spec),
        max_steps=spec.get("max_steps", 6),
        gradient_clip_val=spec.get("clip"),
        precision=spec.get("precision", "32-true"),
        compile=spec.get("compile"),
        logger=False,
        enable_checkpointing=bool(spec.get("save_every")),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=out,
    )
    loader = DataLoader(make_data(), batch_size=GLOBAL_BATCH // dp, shuffle=True)
    if spec["strategy"] == "single":
        # the one-process reference reads the order of the distributed runs: DistributedSampler's,
        # seeded by seed_everything (without a distributed strategy a shuffling loader's order
        # is drawn from the global generator, as Lightning's RandomSampler)
        order = DistributedSampler(make_data(), num_replicas=1, rank=0, shuffle=True, seed=7)
        loader = DataLoader(make_data(), batch_size=GLOBAL_BATCH, sampler=order)
    if mistake is not None:
        try:
            trainer.fit(module, loader)
        except MisconfigurationError as err:
            out.mkdir(parents=True, exist_ok=True)
            (out / "error.txt").write_text(str(err))
        return trainer
    trainer.fit(module, loader, ckpt_path=spec.get("resume"))
    if spec.get("save"):
        trainer.save_checkpoint(spec["save"])
    model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=True)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "losses": module.losses,
        "grad_norms": module.grad_norms,
        "max_grads": module.max_grads,
        "batches": module.batches,
        "logged": logged.values,
        "dp_rank": trainer.strategy.data_parallel_rank,
        "sampler": trainer.strategy.distributed_sampler_kwargs,
    }
    plan = getattr(trainer.strategy, "wrap_plan", None)
    if plan is not None:  # the layout's units and the per-process estimate
        units = {unit.name: unit.numel for unit in plan.units}
        record["plan"] = {"units": units, "checkpointed": plan.checkpointed, "estimate": plan.estimate.total}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
    if trainer.is_global_zero:
        torch.save({"model": model_state, "optimizers": optimizer_states}, out / "final.pt")
    return trainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--runs", required=True, help="a JSON file: a list of run specs")
    args = p.parse_args()
    for spec in json.loads(Path(args.runs).read_text()):
        run(spec, args.devices)


if __name__ == "__main__":
    main()

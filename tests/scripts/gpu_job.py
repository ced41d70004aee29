"""What tests/test_gpu.py checks on a CUDA device that train_fsdp.py does not record: where the
sharded parameters and gradients live, activation-checkpoint wrappers, meta-device init on the
device, torch.compile under the strategy, the grad scaler, and checkpoints saved from device
memory (full, sharded, and in the background from pinned host buffers). It runs on CPU as well
(gloo, 2 processes), which is how the test's commands are tried without a GPU.

python tests/scripts/gpu_job.py train --out DIR --accelerator cuda --devices 1 --strategy fsdp2 --offload
python tests/scripts/gpu_job.py train --out DIR --accelerator cuda --devices 1 --strategy single  # the reference
python tests/scripts/gpu_job.py resume --out DIR --accelerator cuda --devices 1 --strategy fsdp --format sharded
python tests/scripts/gpu_job.py async --out DIR --accelerator cuda --devices 1

Rank 0 writes ``DIR/result.json`` (what the test asserts on); ``train`` also ``DIR/init.pt`` and
``DIR/params.pt`` (the full state at the start of training and at the end), ``resume`` and
``async`` ``DIR/states.pt`` (the full states to compare bitwise). Every tensor written is on the CPU.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from ckpt_job import Net  # beside this script, on sys.path
from ckpt_job import make_data as ckpt_data
from ckpt_job import make_strategy as ckpt_strategy
from compile_job import GraphCounter
from torch import nn
from torch.utils.data import DataLoader
from train_fsdp import Block, BlockModel, actual_units, make_data

import fullshard
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.tools import inspect
from fullshard.nested import apply_to_collection
from fullshard.strategies import FSDP2Strategy, FSDPStrategy, SingleDeviceStrategy

_WRAPPER_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


class FloatLossBlockModel(BlockModel):
    """train_fsdp.py's model with its loss taken between float32 tensors. Under "bf16-true" the
    batch arrives in bfloat16, targets too; train_fsdp.py's loss compares the float32 output
    with them, which CUDA's mse_loss backward refuses ("Found dtype BFloat16 but expected
    Float"; CPU accepts it). In float32 nothing changes."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x).float(), y.float())
        self.losses.append(float(loss.detach()))
        return loss


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of ``tensor`` (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def on_cpu(obj: Any) -> Any:
    """``obj`` with every tensor copied to host memory (a DTensor must be gathered first)."""
    return apply_to_collection(obj, torch.Tensor, lambda t: t.detach().cpu().clone())


def clean(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def device_types(tensors: Any) -> list[str]:
    return sorted({local(t).device.type for t in tensors})


def write_result(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True)
    p.add_argument("--accelerator", default="cuda")
    p.add_argument("--devices", type=int, default=1)


# --------------------------------------------------------------------------------------- train
class Probe(fullshard.Callback):
    """Records where parameters and gradients are at each stage, and the grad scaler's scale."""

    def __init__(self, out: Path, watch: bool) -> None:
        self.out = out
        self.watch = watch  # not under compile: a hook inside a compiled region would be traced
        self.at_start: dict[str, Any] = {}
        self.grads: list[dict[str, Any]] = []
        self.scales: list[float] = []
        self.compute_devices: set[str] = set()
        self.lock = threading.Lock()

    def watch_compute(self, module: nn.Module) -> None:
        """Note the device of each Block's ``fc.weight`` while the block runs (FSDP's unsharded
        parameter, wherever the sharded one is kept)."""

        def hook(fc: nn.Module, args: Any) -> None:
            with self.lock:  # activation checkpointing reruns it in backward
                self.compute_devices.add(fc.weight.device.type)

        for block in (m for m in module.modules() if isinstance(m, Block)):
            block.fc.register_forward_pre_hook(hook)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        model = trainer.strategy.model
        if self.watch:
            self.watch_compute(model)
        tensors = [*model.parameters(), *model.buffers()]
        self.at_start = {
            "param_devices": device_types(model.parameters()),
            "buffer_devices": device_types(model.buffers()),
            "meta": any(local(t).is_meta for t in tensors),
        }
        state = trainer.strategy.module_state_dict()  # collective: every rank is here
        if trainer.is_global_zero:
            self.out.mkdir(parents=True, exist_ok=True)
            torch.save(on_cpu(state), self.out / "init.pt")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [local(p.grad) for p in params if p.grad is not None]
        self.grads.append(
            {  # in numbers of elements: under FSDP1 a parameter with no share on this rank has no grad
                "grad_numel": sum(g.numel() for g in grads),
                "param_numel": sum(local(p).numel() for p in params),
                "devices": sorted({g.device.type for g in grads}),
                "finite": all(bool(torch.isfinite(g).all()) for g in grads),
                "nonzero": any(bool(g.count_nonzero()) for g in grads),
            }
        )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        scaler = trainer.strategy.precision.scaler
        if scaler is not None:
            self.scales.append(float(scaler.get_scale()))


def train_strategy(args: argparse.Namespace) -> Any:
    if args.strategy == "single":
        return SingleDeviceStrategy()
    return (FSDP2Strategy if args.strategy == "fsdp2" else FSDPStrategy)(
        auto_wrap_policy={Block},
        activation_checkpointing_policy={Block} if args.ac else None,
        cpu_offload=args.offload,
        empty_init=args.empty_init,
    )


def build_trainer(args: argparse.Namespace, out: Path, strategy: Any, callbacks: list[Any]) -> Any:
    return fullshard.Trainer(
        accelerator=args.accelerator,
        devices=1 if args.strategy == "single" else args.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=args.max_steps,
        gradient_clip_val=args.clip,
        compile={"backend": args.compile} if args.compile else None,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )


def train(args: argparse.Namespace) -> None:
    """Train train_fsdp.py's BlockModel (same seed and data) and record where everything was."""
    out = Path(args.out)
    fullshard.seed_everything(5)
    model = FloatLossBlockModel()
    if not args.empty_init:
        model.configure_model()  # eager, as train_fsdp.py does: the same weights as its runs
    probe = Probe(out, watch=not args.compile)
    callbacks: list[Any] = [probe]
    counter = GraphCounter()
    if args.compile:
        callbacks.append(counter)
    trainer = build_trainer(args, out, train_strategy(args), callbacks)
    norms: list[float] = []
    if args.clip is not None:
        original = trainer.strategy.clip_gradients_norm

        def recording(optimizer: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
            norm = original(optimizer, max_norm, norm_type)
            norms.append(float(norm))
            return norm

        trainer.strategy.clip_gradients_norm = recording
    trainer.fit(model, DataLoader(make_data(), batch_size=args.batch_size))

    wrapped = trainer.strategy.model
    state = trainer.strategy.module_state_dict()  # collective
    scaler = trainer.strategy.precision.scaler
    result: dict[str, Any] = {
        "global_step": trainer.global_step,
        "losses": model.losses,
        "norms": norms,
        "at_start": probe.at_start,
        "param_devices": device_types(wrapped.parameters()),
        "param_dtypes": sorted({str(local(p).dtype) for p in wrapped.parameters()}),
        "compute_devices": sorted(probe.compute_devices),
        "grads": probe.grads,
        "local_numel": sum(local(p).numel() for p in wrapped.parameters()),
        "full_numel": sum(v.numel() for v in state.values()),
        "strategy": type(trainer.strategy).__name__,
        # the ShardingStrategy torch's FSDP1 applied (NO_SHARD with one process); None under FSDP2
        "torch_sharding": getattr(getattr(wrapped, "sharding_strategy", None), "name", None),
        "actual_units": actual_units(wrapped),
        "checkpointed": trainer.strategy.wrap_plan.checkpointed if args.strategy != "single" else None,
        "wrappers": checkpoint_wrappers(wrapped),
        "scales": probe.scales,
        "scaler": scaler_state(scaler),
        "graphs": counter.graphs,
    }
    if args.save:
        result.update(save_and_resume(args, out, trainer))
    if trainer.is_global_zero:
        torch.save({k: v.detach().float().cpu().clone() for k, v in state.items()}, out / "params.pt")
        write_result(out, result)


def checkpoint_wrappers(model: nn.Module) -> list[list[str]]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return [
        [clean(name), type(m._checkpoint_wrapped_module).__name__]
        for name, m in model.named_modules()
        if isinstance(m, CheckpointWrapper)
    ]


def scaler_state(scaler: Any) -> dict[str, Any] | None:
    if scaler is None:
        return None
    return {"class": type(scaler).__name__, "scale": float(scaler.state_dict()["scale"])}


def save_and_resume(args: argparse.Namespace, out: Path, trainer: Any) -> dict[str, Any]:
    """Save a full checkpoint, read its grad scaler entry back, and load it into a fresh Trainer."""
    path = out / "last.ckpt"
    trainer.save_checkpoint(path)
    locations: set[str] = set()

    def where(storage: Any, location: str) -> Any:
        locations.add(location.split(":")[0])
        return storage.cpu()

    saved = torch.load(path, map_location=where, weights_only=False)
    fullshard.seed_everything(5)
    model = FloatLossBlockModel()
    if not args.empty_init:
        model.configure_model()
    resumed = build_trainer(args, out / "resumed", train_strategy(args), [])
    resumed.fit(model, DataLoader(make_data(), batch_size=args.batch_size), ckpt_path=path)  # no step left
    scaler = resumed.strategy.precision.scaler
    return {
        "saved_grad_scaler": {
            k: float(v) if isinstance(v, int | float) else v for k, v in saved["grad_scaler"].items()
        },
        "saved_locations": sorted(locations),
        "resumed_step": resumed.global_step,
        "resumed_scale": float(scaler.get_scale()) if scaler is not None else None,
    }


# -------------------------------------------------------------------------------------- resume
def resume(args: argparse.Namespace) -> None:
    """ckpt_job.py's model on the device: ``--steps`` uninterrupted steps that save at
    ``--save-at``, then a fresh Trainer that resumes from that save to ``--steps``."""
    out = Path(args.out)
    ckpt = out / ("mid.ckpt" if args.format == "full" else "mid")
    straight, straight_losses, straight_step = ckpt_run(args, out / "straight", save=ckpt)
    resumed, resumed_losses, resumed_step = ckpt_run(args, out / "resumed", resume=ckpt)
    if straight is not None:  # rank 0 holds the states
        torch.save({"straight": straight, "resumed": resumed}, out / "states.pt")
        report = inspect(ckpt, verify_checksums=True)
        write_result(
            out,
            {
                "straight_losses": straight_losses,
                "resumed_losses": resumed_losses,
                "straight_step": straight_step,
                "resumed_step": resumed_step,
                "format": report.format,
                "complete": report.complete,
                "verified": report.verified,
                "saved_step": report.global_step,
            },
        )


class SaveAt(fullshard.Callback):
    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def ckpt_run(
    args: argparse.Namespace, out: Path, save: Path | None = None, resume: Path | None = None
) -> tuple[dict[str, Any] | None, list[float], int]:
    fullshard.seed_everything(11)
    model = Net()  # dropout: the device's random numbers must resume too
    trainer = fullshard.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=ckpt_strategy(args.strategy, args.format),
        max_steps=args.steps,
        deterministic=True,
        callbacks=[SaveAt(args.save_at, save)] if save is not None else [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )
    trainer.fit(model, DataLoader(ckpt_data(), batch_size=8, shuffle=True), ckpt_path=resume)
    model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=True)
    state = {"model": on_cpu(model_state), "optimizers": on_cpu(optimizer_states)}
    return (state if trainer.is_global_zero else None), model.losses, trainer.global_step


# --------------------------------------------------------------------------------------- async
class AsyncSaver(fullshard.Callback):
    """At ``step``: the full state as it is (the reference), then a background save to ``path``.
    In the writer thread, before it writes, whether the host copy it writes is pinned memory."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path
        self.reference: dict[str, Any] | None = None
        self.saved: dict[str, Any] = {}  # what save_checkpoint left behind when it returned
        self.written: dict[str, Any] = {}  # the host copy, as the writer thread found it
        self.trainer: Any = None
        set_event_hook(self.event)

    def event(self, point: str) -> None:
        if point != "async.writing" or self.trainer is None:
            return
        staging = self.trainer.checkpoint_manager.pending._staging  # the copy being written (private)
        tensors: list[torch.Tensor] = []
        apply_to_collection(staging.state, torch.Tensor, lambda t: tensors.append(local(t)))
        self.written = {
            "tensors": len(tensors),
            "devices": sorted({t.device.type for t in tensors}),
            # the optimizers' 0-dim step counts stay on the CPU in training: copied, not staged
            "pinned": sorted({t.is_pinned() for t in tensors if t.dim() > 0}),
        }

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != self.step:
            return
        self.trainer = trainer
        model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=True)
        self.reference = {"model": on_cpu(model_state), "optimizers": on_cpu(optimizer_states)}
        trainer.save_checkpoint(self.path)
        pending = trainer.checkpoint_manager.pending
        self.saved = {
            "pending": pending is not None,
            "staged_bytes": pending.staged_bytes if pending is not None else 0,
        }


def async_save(args: argparse.Namespace) -> None:
    """FSDP2 with ``async_save=True``: a sharded save at ``--save-at`` written while training
    goes on to ``--steps``; then a fresh Trainer loads it (no step left to take)."""
    out = Path(args.out)
    path = out / "async"
    fullshard.seed_everything(11)
    saver = AsyncSaver(args.save_at, path)
    trainer = async_trainer(args, out / "train", args.steps, [saver])
    trainer.fit(Net(), DataLoader(ckpt_data(), batch_size=8, shuffle=True))
    trainer.checkpoint_manager.wait()
    buffers = trainer.checkpoint_manager.checkpointer.background.buffers
    kept = [t for free in buffers._free.values() for t in free]  # private: the buffers kept for the next save
    report = inspect(path, verify_checksums=True)

    fullshard.seed_everything(11)
    loader = async_trainer(args, out / "load", args.save_at, [])
    loader.fit(Net(), DataLoader(ckpt_data(), batch_size=8, shuffle=True), ckpt_path=path)
    model_state, optimizer_states = loader.strategy.get_state(loader.optimizers, full=True)
    if trainer.is_global_zero:
        loaded = {"model": on_cpu(model_state), "optimizers": on_cpu(optimizer_states)}
        torch.save({"reference": saver.reference, "loaded": loaded}, out / "states.pt")
        write_result(
            out,
            {
                "global_step": trainer.global_step,
                "loaded_step": loader.global_step,
                "saved": saver.saved,
                "written": saver.written,
                "kept_bytes": buffers.kept_bytes(),
                "kept_pinned": sorted({t.is_pinned() for t in kept}),
                "complete": report.complete,
                "verified": report.verified,
                "saved_step": report.global_step,
                "param_devices": device_types(trainer.strategy.model.parameters()),
            },
        )


def async_trainer(args: argparse.Namespace, out: Path, steps: int, callbacks: list[Any]) -> Any:
    return fullshard.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=FSDP2Strategy(auto_wrap_policy={Block}, state_dict_type="sharded", async_save=True),
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )


# ---------------------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    jobs = p.add_subparsers(dest="job", required=True)

    t = jobs.add_parser("train", allow_abbrev=False)
    common_options(t)
    t.add_argument("--strategy", choices=["fsdp", "fsdp2", "single"], default="fsdp")
    t.add_argument("--offload", action="store_true")
    t.add_argument("--ac", action="store_true", help="activation checkpointing of every Block")
    t.add_argument("--empty-init", action="store_true")
    t.add_argument("--precision", default="32-true")
    t.add_argument("--clip", type=float, default=None)
    t.add_argument("--compile", default=None, help="a torch.compile backend (inductor, aot_eager)")
    t.add_argument("--max-steps", type=int, default=6)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--save", action="store_true", help="save a full checkpoint, read it back, resume from it")

    r = jobs.add_parser("resume", allow_abbrev=False)
    common_options(r)
    r.add_argument("--strategy", choices=["fsdp", "fsdp2"], default="fsdp")
    r.add_argument("--format", choices=["full", "sharded"], default="full")
    r.add_argument("--steps", type=int, default=8)
    r.add_argument("--save-at", type=int, default=4)

    a = jobs.add_parser("async", allow_abbrev=False)
    common_options(a)
    a.add_argument("--steps", type=int, default=8)
    a.add_argument("--save-at", type=int, default=4)

    args = p.parse_args()
    {"train": train, "resume": resume, "async": async_save}[args.job](args)


if __name__ == "__main__":
    main()

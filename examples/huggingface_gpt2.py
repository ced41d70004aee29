"""Train a Hugging Face GPT-2 with fullshard: FSDP on 2 CPU processes, resume, export, reload.

    pip install -e ".[hf]"                           # in the fullshard clone: transformers and safetensors
    python examples/huggingface_gpt2.py              # writes gpt2_run/ (about half a minute on CPU)
    python examples/huggingface_gpt2.py --strategy fsdp2 --root-dir gpt2_run_fsdp2

The model is a tiny ``GPT2LMHeadModel`` built from a config, with random weights (nothing is
downloaded), trained on bytes of the Python standard library's sources (vocabulary 256). The
script trains 10 steps and saves a sharded checkpoint, resumes from it in a new Trainer to step
20 and saves a full one, exports that with ``fullshard checkpoint export``'s function and loads
the export back twice: with ``from_pretrained`` and with ``fullshard.checkpoint.load_exported``.
Both must give the logits the trained, still sharded model gave. docs/huggingface.md explains
each step.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from transformers import GPT2Config, GPT2LMHeadModel

import fullshard
from fullshard.checkpoint import export_safetensors, load_exported
from fullshard.demos import StdlibText
from fullshard.strategies import FSDP2Strategy, FSDPStrategy


def gpt2_config(n_layer: int = 2, n_embd: int = 64, n_head: int = 4, block_size: int = 64) -> GPT2Config:
    return GPT2Config(
        vocab_size=256,  # one token per byte
        n_positions=block_size,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=0,  # GPT-2's default ids (50256) are outside a vocabulary of 256
        eos_token_id=0,
        use_cache=False,  # no key/value cache while training
    )


class GPT2LM(fullshard.Module):
    def __init__(
        self, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, block_size: int = 64, lr: float = 3e-3
    ) -> None:
        super().__init__()
        self.save_hyperparameters()  # load_from_checkpoint rebuilds the module from them
        self.config = gpt2_config(n_layer, n_embd, n_head, block_size)
        self.model: GPT2LMHeadModel | None = None
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.model is None:  # idempotent: predict after fit calls it again
            # with FSDPStrategy(empty_init=True) this allocates no parameter memory (meta device)
            self.model = GPT2LMHeadModel(self.config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch  # StdlibText gives the targets shifted already
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.losses.append(loss.item())
        return loss

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        return self(x)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["fsdp", "fsdp2"], default="fsdp")
    parser.add_argument("--devices", type=int, default=2, help="CPU processes, 2 or more")
    parser.add_argument("--root-dir", default="gpt2_run")
    args = parser.parse_args()
    root = Path(args.root_dir)
    start = time.perf_counter()

    fullshard.seed_everything(0)
    data = StdlibText(block_size=64, max_bytes=64 * 1024)  # 1023 samples of 64 bytes
    loader = DataLoader(data, batch_size=8, shuffle=True)

    def trainer(max_steps: int, state_dict_type: str) -> fullshard.Trainer:
        kind = FSDP2Strategy if args.strategy == "fsdp2" else FSDPStrategy
        strategy = kind(
            auto_wrap_policy={"GPT2Block"},  # each Transformer block its own FSDP unit
            activation_checkpointing_policy={"GPT2Block"},  # recompute each block in backward
            empty_init=True,  # parameters on the meta device, materialised unit by unit
            state_dict_type=state_dict_type,
        )
        return fullshard.Trainer(
            accelerator="cpu",
            devices=args.devices,
            strategy=strategy,
            max_steps=max_steps,
            default_root_dir=root,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    # 1. train 10 steps, save a sharded checkpoint (a directory, one file per process)
    first = trainer(max_steps=10, state_dict_type="sharded")
    first_module = GPT2LM()
    first.fit(first_module, loader)
    first.save_checkpoint(root / "step10")  # every process calls it

    # 2. resume in a new Trainer with a new module: weights, optimizer, position, RNG states
    second = trainer(max_steps=20, state_dict_type="full")
    module = GPT2LM()
    second.fit(module, loader, ckpt_path=root / "step10")
    second.save_checkpoint(root / "step20.ckpt")  # a full checkpoint: one file, written by rank 0
    probe = Subset(data, range(args.devices))  # one sample per process
    (sharded_logits,) = second.predict(module, DataLoader(probe, batch_size=1))  # rank 0's: sample 0
    if not second.is_global_zero:
        return  # the rest runs once, in rank 0 (this process; the others re-ran the script)

    # 3. export: `fullshard checkpoint export gpt2_run/step20.ckpt gpt2_run/hf --prefix model.`
    hf_dir = root / "hf"
    export_safetensors(root / "step20.ckpt", hf_dir, prefix="model.")
    module.config.save_pretrained(hf_dir)  # config.json, for from_pretrained

    # 4. load it back: Hugging Face re-ties lm_head to wte; load_exported gives every name
    ids = probe[0][0][None]
    reloaded = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    fresh = GPT2LMHeadModel(module.config).eval()  # random weights, replaced next
    fresh.load_state_dict(load_exported(hf_dir), strict=True)
    with torch.no_grad():
        diffs = [(m(input_ids=ids).logits - sharded_logits).abs().max().item() for m in (reloaded, fresh)]
    print(
        f"{args.strategy} on {args.devices} process(es): loss {first_module.losses[0]:.3f} (step 1) -> "
        f"{module.losses[-1]:.3f} (step {second.global_step}); exported logits differ from the trained "
        f"model's by {diffs[0]:.2e} (from_pretrained), {diffs[1]:.2e} (load_exported); "
        f"{time.perf_counter() - start:.1f} s"
    )
    assert max(diffs) < 1e-5, diffs


if __name__ == "__main__":
    main()

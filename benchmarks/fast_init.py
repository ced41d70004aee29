"""Peak memory while building a model bigger than one process's share: eager vs ``empty_init=True``.

Run from the repository root::

    python benchmarks/fast_init.py            # every mode, then the table (about a minute)

The model is the Hugging Face-style language model of the fast-init tests (tests/hf_patterns.py:
tied embeddings, a rotary buffer, norms and Conv1D without ``reset_parameters``, a model-level
``_init_weights``) scaled up: vocabulary 32,000, width 1024, 24 blocks, 234M parameters
(894 MiB in float32). It is built with ``FSDPStrategy(auto_wrap_policy={Block})`` in 2 processes
on CPU (gloo), FULL_SHARD, so each process's share is half the model and the largest unit is
the root (embeddings, tied head, final norm).

Each process records its resident set size when ``configure_model`` starts and its peak
resident set size (``ru_maxrss``) once ``fit(max_steps=0)`` has built and sharded the model;
the table shows the difference for the larger of the two ranks, next to the bound
"share + largest unit" that ``empty_init`` promises. Modes: ``eager`` and ``empty_init`` under
``FSDPStrategy`` (FSDP1), ``fsdp2_eager`` and ``fsdp2_empty_init`` under ``FSDP2Strategy`` with
the same arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fullshard  # noqa: E402
from fullshard.strategies import FSDP2Strategy, FSDPStrategy  # noqa: E402
from hf_patterns import Block, LMModule, TinyLM, token_data  # noqa: E402

VOCAB, DIM, LAYERS = 32_000, 1024, 24
MODES = ("eager", "empty_init", "fsdp2_eager", "fsdp2_empty_init")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS missing from /proc/self/status (the benchmark needs Linux)")


class Big(LMModule):
    def configure_model(self) -> None:
        if self.model is None:
            self.rss_before = rss_mib()
            self.model = TinyLM(VOCAB, DIM, LAYERS)


def worker(mode: str, out: Path) -> None:
    torch.set_num_threads(1)
    fullshard.seed_everything(0)
    module = Big()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=(FSDP2Strategy if mode.startswith("fsdp2") else FSDPStrategy)(
            auto_wrap_policy={Block}, empty_init=mode.endswith("empty_init")
        ),
        max_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(token_data(8), batch_size=4))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    plan = trainer.strategy.wrap_plan
    assert plan is not None
    result: dict[str, Any] = {
        "added_mib": peak - module.rss_before,
        "total_mib": plan.total_numel * 4 / 2**20,
        "share_mib": plan.total_numel * 4 / 2 / 2**20,
        "unit_mib": plan.largest.numel * 4 / 2**20,
        "params": plan.total_numel,
    }
    (out / f"{mode}-{trainer.global_rank}.json").write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, help="one run (used by the driver)")
    p.add_argument("--out", default="/tmp/fullshard-fast-init")
    args = p.parse_args()
    out = Path(args.out)
    if args.mode:
        worker(args.mode, out)
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in MODES:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, __file__, "--mode", mode, "--out", str(out)], check=True, env=env)
        ranks = [json.loads((out / f"{mode}-{r}.json").read_text()) for r in (0, 1)]
        rows.append((mode, max(r["added_mib"] for r in ranks), ranks[0]))
    info = rows[0][2]
    print(f"\nmodel: {info['params'] / 1e6:.1f}M parameters, {info['total_mib']:.0f} MiB; per-process share "
          f"{info['share_mib']:.0f} MiB; largest unit {info['unit_mib']:.0f} MiB; bound share + unit = "
          f"{info['share_mib'] + info['unit_mib']:.0f} MiB\n")
    print("| build | peak added per process (MiB, larger rank) | vs. whole model | vs. share + largest unit |")
    print("| --- | ---: | ---: | ---: |")
    for mode, added, _ in rows:
        print(f"| {mode} | {added:.0f} | {added / info['total_mib']:.2f}x | "
              f"{added / (info['share_mib'] + info['unit_mib']):.2f}x |")


if __name__ == "__main__":
    main()

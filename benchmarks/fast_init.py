"""python benchmarks/fast_init.py --write-docs

Peak memory while building a model bigger than one process's share: eager vs ``empty_init=True``.

Run it from the repository root (1 to 2 minutes on 2 cores); without ``--write-docs`` it
prints the table and leaves docs/benchmarks.md ("Fast init") alone. docs/fsdp/fast-init.md
("Memory") and docs/fsdp/fsdp2.md quote the figures by hand.

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
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from _common import (
    REPO,
    heading_target,
    make_parser,
    parse_args,
    peak_rss_kib,
    provenance,
    rss_kib,
    run_or_report,
    table,
    worker_env,
    wrap,
    write_section,
)
from torch.utils.data import DataLoader

sys.path.insert(0, str(REPO / "tests"))

import fullshard
from fullshard.strategies import FSDP2Strategy, FSDPStrategy
from hf_patterns import Block, LMModule, TinyLM, token_data

SECTION = "## Fast init"
VOCAB, DIM, LAYERS = 32_000, 1024, 24
MODES = ("eager", "empty_init", "fsdp2_eager", "fsdp2_empty_init")
LABELS = {
    "eager": "eager",
    "empty_init": "`empty_init=True`",
    "fsdp2_eager": "fsdp2, eager",
    "fsdp2_empty_init": "fsdp2, `empty_init=True`",
}


class Big(LMModule):
    def configure_model(self) -> None:
        if self.model is None:
            self.rss_before = rss_kib() / 1024
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
    peak = peak_rss_kib() / 1024
    plan = trainer.strategy.wrap_plan
    assert plan is not None
    result: dict[str, Any] = {
        "added_mib": peak - module.rss_before,
        "total_mib": plan.total_numel * 4 / 2**20,
        "share_mib": plan.total_numel * 4 / 2 / 2**20,
        "unit_mib": plan.largest.numel * 4 / 2**20,
        "params": plan.total_numel,
        "torch": torch.__version__,
    }
    (out / f"{mode}-{trainer.global_rank}.json").write_text(json.dumps(result))


def render_table(rows: list[Any]) -> str:
    info = rows[0][2]
    bound = info["share_mib"] + info["unit_mib"]
    header = [
        "build",
        "peak added per process (MiB, larger rank)",
        "vs. whole model",
        "vs. share + largest unit",
    ]
    cells = [
        [LABELS[mode], f"{added:.0f}", f"{added / info['total_mib']:.2f}x", f"{added / bound:.2f}x"]
        for mode, added, _ in rows
    ]
    return table(header, cells)


def render(result: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (the rows ``measure`` returned, saved)."""
    rows = result["figures"]
    info = rows[0][2]
    bullets = [
        "Model: the Hugging Face-style language model of the fast-init tests (tests/hf_patterns.py: tied"
        " embeddings, a rotary buffer, norms and `Conv1D` without `reset_parameters`, a model-level"
        f" `_init_weights`), vocabulary {VOCAB:,}, width {DIM}, {LAYERS} blocks: {info['params'] / 1e6:.0f}M"
        f" parameters ({info['total_mib']:.0f} MiB in float32). `FSDPStrategy(auto_wrap_policy={{Block}})`, or"
        " `FSDP2Strategy` with the same arguments, FULL_SHARD: each process's share is"
        f" {info['share_mib']:.0f} MiB, and the largest unit is the root (embeddings, tied head, final"
        f" norm: {info['unit_mib']:.0f} MiB).",
        f"Machine: {result['cores']} cores ({result['machine']}), torch {info['torch']}, 2 processes with 1"
        f" intra-op thread each; {result['date']}.",
        "Memory: each process's peak resident set size (`ru_maxrss`) once `fit(max_steps=0)` has built"
        " and sharded the model, minus its resident set size when `configure_model` starts; the larger"
        " of the two ranks. The last column compares it with the share plus the largest unit"
        f" ({info['share_mib'] + info['unit_mib']:.0f} MiB), what `empty_init` aims for; [fast init,"
        ' "Memory"](fsdp/fast-init.md#memory) explains the rest.',
    ]
    body = "\n".join(wrap(b, bullet=True) for b in bullets)
    return f"""{SECTION}

Peak memory added per process while a model larger than one process's share is built and sharded,
eagerly and with `empty_init=True`, in 2 CPU processes (gloo).

```bash
{result["command"]}
```

{provenance(result, __file__)}

{body}

{render_table(rows)}
"""


def measure(out: Path) -> list[list[Any]]:
    """``[mode, peak added (MiB, larger rank), rank 0's facts]`` for each mode, each run in 2 fresh processes."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[list[Any]] = []
    for mode in MODES:
        command = [sys.executable, __file__, "--mode", mode, "--out", str(out)]
        subprocess.run(command, check=True, env=worker_env(threads=1), cwd=REPO)
        ranks = [json.loads((out / f"{mode}-{r}.json").read_text()) for r in (0, 1)]
        rows.append([mode, max(r["added_mib"] for r in ranks), ranks[0]])
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    p.add_argument("--mode", choices=MODES, help="one run (used by the driver)")
    p.add_argument("--out", default="/tmp/fullshard-fast-init", help="directory for the per-rank JSON files")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    out = Path(args.out)
    if args.mode:
        worker(args.mode, out)
        return
    result = run_or_report(args, __file__, lambda: measure(out))
    rows = result["figures"]
    info = rows[0][2]
    print(
        f"\nmodel: {info['params'] / 1e6:.1f}M parameters, {info['total_mib']:.0f} MiB; per-process share "
        f"{info['share_mib']:.0f} MiB; largest unit {info['unit_mib']:.0f} MiB; bound share + unit = "
        f"{info['share_mib'] + info['unit_mib']:.0f} MiB\n"
    )
    print(render_table(rows))
    if args.write_docs:
        write_section(render(result))


if __name__ == "__main__":
    main()

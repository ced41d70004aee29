"""python benchmarks/compile.py --write-docs

compile=: compile time and step time of the demo Transformer, eager against torch.compile.

Run it from the repository root; it prints a markdown table, and with ``--write-docs`` puts it
into docs/compile.md ("Cost on CPU", between the ``benchmarks/compile.py`` marker comments),
not into docs/benchmarks.md. It takes about 6 minutes on 2 cores (most of it inductor compiling on an empty cache).

The model is ``fullshard.demos.Transformer`` (2 encoder and 2 decoder layers, width 128, 4 heads,
feed-forward 512, dropout 0.1) trained as a byte-level language model on random tokens (sequence
64, batch 16 per process, AdamW) for ``--steps`` steps, on CPU:

``single``
    one process, ``strategy="single_device"``: ``compile=`` compiles the Transformer (the
    LightningModule defines no forward, so its layer holding parameters is compiled in place);
``fsdp``
    two processes with gloo, ``FSDPStrategy(auto_wrap_policy={TransformerEncoderLayer,
    TransformerDecoderLayer})``: ``compile=`` compiles each of the 4 units.

Every process runs one intra-op thread (``OMP_NUM_THREADS=1``).

Each row runs in fresh processes. ``inductor, cold`` starts with an empty inductor cache
(``TORCHINDUCTOR_CACHE_DIR`` in a new temporary folder): what a first run on a machine pays.
``inductor, warm`` runs again with the cache the cold run filled, as every later run of the same
model does. On rank 0: first step = the time from the start of the first training step to the
start of the second (forward, backward and optimizer step, with all compiling); steady step = the
median step time after ``--warmup`` steps; compile overhead = first step - steady step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import (
    REPO,
    load_average,
    make_parser,
    markers,
    parse_args,
    provenance,
    run_or_report,
    table,
    worker_env,
    write_marked,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.demos import Transformer
from fullshard.strategies import FSDPStrategy

DOC = REPO / "docs" / "compile.md"
START, END = markers("compile.py")
SEQ, BATCH = 64, 16
ROWS = [  # (strategy, compile setting, inductor cache)
    ("single", "eager", None),
    ("single", "inductor", "cold"),
    ("single", "inductor", "warm"),
    ("single", "aot_eager", None),
    ("fsdp", "eager", None),
    ("fsdp", "inductor", "cold"),
    ("fsdp", "inductor", "warm"),
    ("fsdp", "aot_eager", None),
]
COMPILE = {"eager": None, "inductor": True, "aot_eager": {"backend": "aot_eager"}}


class LanguageModel(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Transformer(256, ninp=128, nhead=4, nhid=512, nlayers=2, dropout=0.1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (tokens,) = batch
        inputs, target = tokens[:, :-1], tokens[:, 1:]
        return F.nll_loss(self.model(inputs, target), target.reshape(-1))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class StepTimer(fullshard.Callback):
    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.starts.append(time.perf_counter())


def worker(strategy: str, setting: str, steps: int, out: Path) -> None:
    """One training run (re-run by the launcher in the second FSDP process)."""
    fullshard.seed_everything(0)
    devices = 2 if strategy == "fsdp" else 1
    layers = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}
    timer = StepTimer()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=FSDPStrategy(auto_wrap_policy=layers) if strategy == "fsdp" else "single_device",
        compile=COMPILE[setting],
        max_steps=steps,
        callbacks=[timer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    tokens = torch.randint(0, 256, (steps * BATCH * devices, SEQ + 1))
    trainer.fit(LanguageModel(), DataLoader(TensorDataset(tokens), batch_size=BATCH))
    if trainer.is_global_zero:
        from torch._dynamo.utils import counters  # private: the graph count dynamo's own tests read

        times = [b - a for a, b in zip(timer.starts, timer.starts[1:], strict=False)]
        out.write_text(json.dumps({"steps": times, "graphs": int(counters["stats"]["unique_graphs"])}))


def run_row(
    strategy: str, setting: str, cache: str | None, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    out = tmp / f"{strategy}-{setting}-{cache}.json"
    # one intra-op thread per process (2 threads thrash a busy 2-core machine); the inductor cache
    # cold at the first use of this folder
    env = worker_env(threads=1, TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor-{strategy}"))
    command = [
        sys.executable,
        __file__,
        "--worker",
        strategy,
        setting,
        "--steps",
        str(args.steps),
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL)
    times = json.loads(out.read_text())
    steady = statistics.median(times["steps"][args.warmup :])
    first = times["steps"][0]
    return {"first": first, "steady": steady, "graphs": times["graphs"]}


def render(saved: dict[str, Any]) -> str:
    """The block of docs/compile.md, from a result (every row's figures, saved)."""
    args = argparse.Namespace(**saved["arguments"])
    loads = saved["figures"]["loads"]
    results = [((row[0], row[1], row[2]), r) for row, r in saved["figures"]["rows"]]
    eager = {s: r["steady"] for (s, c, _), r in results if c == "eager"}
    machine = f"{saved['machine']}, {saved['cores']} cores"
    line = (
        f"- {args.steps} steps, steady step = median after the first {args.warmup}; "
        f"{machine}, Python {saved['python']}, "
        f"torch {saved['torch']}; one intra-op thread per process; {saved['date']}; "
        f"load average during the runs {min(loads):.1f} to {max(loads):.1f} ({saved['cores']} cores)."
    )
    header = ["processes", "compile=", "first step (s)", "steady step (ms)", "vs eager"]
    header += ["compile overhead (s)", "graphs"]
    rows = []
    for (strategy, setting, cache), r in results:
        name = {"eager": "off", "inductor": "True (inductor)", "aot_eager": '`{"backend": "aot_eager"}`'}[
            setting
        ]
        name += f", {cache} cache" if cache else ""
        where = "1 (single_device)" if strategy == "single" else "2 (fsdp, 4 units)"
        rows.append(
            [
                where,
                name,
                f"{r['first']:.2f}",
                f"{1000 * r['steady']:.1f}",
                f"{r['steady'] / eager[strategy]:.2f}x",
                f"{r['first'] - r['steady']:.2f}",
                str(r["graphs"]),
            ]
        )
    return f"{provenance(saved, __file__)}\n\n{line}\n\n{table(header, rows, align='ll' + 'r' * 5)}\n"


def build_parser() -> argparse.ArgumentParser:
    where = f"the block between the benchmarks/compile.py markers of {DOC.relative_to(REPO)}"
    parser = make_parser(__file__, __doc__, write_docs=where)
    parser.add_argument("--steps", type=int, default=30, help="training steps of every row")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the steady step is timed")
    parser.add_argument("--worker", nargs=2, metavar=("STRATEGY", "COMPILE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    if args.worker:
        worker(*args.worker, args.steps, args.out)
        return

    def measure() -> dict[str, Any]:
        loads = []  # 1-minute load average after each row: other work on the machine skews the times
        with tempfile.TemporaryDirectory() as tmp:
            rows = []
            for row in ROWS:
                rows.append([list(row), run_row(*row, args, Path(tmp))])
                loads.append(load_average())
                print(f"{row}: {rows[-1][1]}", flush=True)
        return {"rows": rows, "loads": loads}

    rendered = render(run_or_report(args, __file__, measure))
    print(rendered)
    if args.write_docs:
        write_marked(rendered, DOC, START, END)


if __name__ == "__main__":
    main()

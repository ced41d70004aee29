"""python benchmarks/process_overhead.py --write-docs

Memory that is not tensors: each process's resident set size under fullshard's Trainer (FSDP and FSDP2 on gloo, 1, 2 and 4 CPU processes) against the planner's predicted peak of tensor bytes, and the process peak the planner predicts with its overhead model.

Run it from the repository root; without ``--write-docs`` it prints the tables and leaves
docs/benchmarks.md ("Memory that is not tensors") alone. ``--only NAME`` runs the cases whose
name contains NAME; ``--repeats N`` runs each case N times (default 2). It takes about 50
minutes on 2 busy cores (2 repeats of 18 cases) and needs about 4 GB of memory.

Each case (a model, an engine, a number of processes) runs as its own command (``--worker``):
``fullshard.Trainer(accelerator="cpu", devices=N, strategy=FSDP2Strategy(...) or
FSDPStrategy(...))`` (FULL_SHARD, every block a unit, fullshard's CPU defaults:
``cpu_mmap_threshold=128 * 1024`` and transparent huge pages), 3 optimizer steps with AdamW;
one process runs the plain single-device Trainer with the same allocator settings, the
reference without a process group. The model is built in ``configure_model``, so no tensor of
it exists before the Trainer runs. Every rank reads its own resident set size (``VmRSS``, with
its anonymous and file-backed parts, from /proc/self/status):

- ``start``: before ``import torch``; ``imported``: after importing torch and fullshard (and
  transformers for the Llama), the batch made: before the Trainer exists;
- ``group``: in the callbacks' ``setup`` hook, after the process group is up and before
  ``configure_model``;
- ``peak``: the process's peak (``VmHWM``) at the end of ``fit``; and glibc's own account at
  the end (``mallinfo2``: bytes in use, free in its heaps, mapped).

The growth is ``peak - imported``: what the run added to the process at its highest, from
before the model's tensors exist to the end of ``fit``. Its part that is not tensors is the
growth less the planner's predicted tensor peak of rank 0 (``fullshard.plan(...,
candidates=[that one])``, whose own accuracy benchmarks/planner.py measures).
``fullshard.planner.overhead`` fits a model of it to these figures ([Note: memory that is not
tensors] there); the tables give each case's predicted process peak (tensors + that overhead)
against the measured growth.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    heading_target,
    make_parser,
    parse_args,
    provenance,
    run_or_report,
    table,
    worker_env,
    wrap,
    write_section,
)

SECTION = "## Memory that is not tensors"
MIB = 2**20
STEPS = 3
# the models: (kind, width, depth); the MLP's blocks are Linear(w, 4w) + Linear(4w, w)
MODELS = {
    "mlp-s": ("mlp", 256, 4),  # 2.1 MiB a block: the constant
    "mlp-m": ("mlp", 1024, 4),  # 32 MiB a block, 132 MiB of parameters
    "mlp-l": ("mlp", 1536, 4),  # 72 MiB a block, 297 MiB of parameters
    "llama": ("llama", 768, 4),  # a Llama with 32000 tokens: 110 MiB of embeddings, 296 MiB in all
}
FIT = ("mlp-s", "mlp-m")  # the cases the constants were fitted to; the others check them


@dataclass(frozen=True)
class Case:
    """One run: a model, an engine (``single``: one process, no process group), processes."""

    model: str
    engine: str
    devices: int

    @property
    def name(self) -> str:
        return f"{self.model}-{self.engine}-n{self.devices}"


def cases() -> list[Case]:
    out = [Case(model, "single", 1) for model in ("mlp-s", "mlp-m")]
    for model in MODELS:
        for devices in (2, 4):
            for engine in ("fsdp2", "fsdp"):
                out.append(Case(model, engine, devices))
    return out


# ------------------------------------------------------------------------------------ the worker
def status_kib() -> dict[str, int]:
    """``VmRSS`` (with its parts ``RssAnon`` and ``RssFile``) and its peak ``VmHWM``, in KiB.

    ``VmHWM``, not ``getrusage``'s ``ru_maxrss``: the latter carries over ``exec`` from the process
    that started this one (the driver, with the planner's work in it), so a small worker would
    report its parent's peak."""
    wanted = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    out: dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            key = line.split(":", 1)[0]
            if key in wanted:
                out[key] = int(line.split()[1])
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def mallinfo() -> dict[str, int]:
    """glibc's account of its heaps (every arena): bytes in use, free in them, and mapped."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"heap": info.arena, "in_use": info.uordblks, "free": info.fordblks, "mapped": info.hblkhd}


def build(case: Case) -> tuple[Any, Any, str]:
    """The module (layers made in ``configure_model``), one process's batch, the block class."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    kind, width, depth = MODELS[case.model]
    generator = torch.Generator().manual_seed(0)
    if kind == "llama":
        from _planner_models import CausalLM, tokens
        from transformers import LlamaConfig

        config = LlamaConfig(
            hidden_size=width,
            intermediate_size=2048,
            num_hidden_layers=depth,
            num_attention_heads=12,
            num_key_value_heads=12,
            vocab_size=32000,
            max_position_embeddings=256,
            use_cache=False,
        )
        return CausalLM(config), tokens(1, 128, 32000), "LlamaDecoderLayer"
    from _planner_models import MLP

    class LazyMLP(MLP):
        """The MLP of benchmarks/planner.py, its layers made in ``configure_model``."""

        def __init__(self) -> None:
            super(MLP, self).__init__()
            self.made = False

        def configure_model(self) -> None:
            if not self.made:
                MLP.__init__(self, width, depth)
                self.made = True

    x = torch.randn(2, 32, width, generator=generator)
    return LazyMLP(), (x, torch.randn(x.shape, generator=generator)), "Block"


def run_worker(case: Case, out_dir: Path) -> None:
    """Train ``case`` on this rank (rank 0 starts the others) and write what it read."""
    start = status_kib()
    import torch

    import fullshard
    from fullshard.strategies.cpu_memory import fix_malloc_mmap_threshold, request_huge_pages

    module, batch, block = build(case)
    imported = status_kib()
    readings: dict[str, Any] = {"start": start, "imported": imported}

    class Reader(fullshard.Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            readings["group"] = status_kib()

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            readings["wrapped"] = status_kib()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            readings.setdefault("steps", []).append(status_kib())

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            readings["end"] = status_kib()
            readings["malloc"] = mallinfo()

    if case.engine == "single":  # the same allocator settings as the FSDP strategies make
        request_huge_pages()
        fix_malloc_mmap_threshold(128 * 1024)
        strategy: Any = "single_device"
    else:
        strategy = candidate_of(case, block).strategy()
    with tempfile.TemporaryDirectory() as root:
        trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=case.devices,
            strategy=strategy,
            max_steps=STEPS,
            callbacks=[Reader()],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        data = [batch] * (STEPS * case.devices)
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
    readings["peak"] = status_kib()["VmHWM"]
    readings["rank"] = trainer.global_rank
    (out_dir / f"{case.name}-rank{trainer.global_rank}.json").write_text(json.dumps(readings))


def candidate_of(case: Case, block: str) -> Any:
    """The planner's candidate for ``case``: FULL_SHARD, every block a unit, no checkpointing."""
    from fullshard.planner import Candidate

    return Candidate(case.engine, "FULL_SHARD", (block,), 0, False)


def unit_bytes(module: Any, block: str) -> tuple[int, int]:
    """(the largest unit's parameter bytes, all parameter bytes) of the built ``module``: each
    block is a unit, the root holds the rest."""
    module.configure_model()
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    blocks = [
        sum(p.numel() * p.element_size() for p in m.parameters())
        for m in module.modules()
        if type(m).__name__ == block
    ]
    return max([*blocks, total - sum(blocks)]), total


# ------------------------------------------------------------------------------------ the driver
def predict(case: Case) -> dict[str, Any]:
    """The planner's tensor peak for rank 0 of ``case`` (FSDP2's simulation of the same units
    for the one-process reference) and the model's unit sizes."""
    import fullshard

    module, batch, block = build(case)
    largest, total = unit_bytes(build(case)[0], block)
    engine = "fsdp2" if case.engine == "single" else case.engine
    result = fullshard.plan(
        module,
        batch,
        devices=case.devices,
        device_memory="1TiB",
        device_type="cpu",
        candidates=[candidate_of(Case(case.model, engine, case.devices), block)],
    )
    row = result.rows[0]
    return {"tensors": row.peak, "split": row.split, "largest_unit": largest, "param_bytes": total}


def measure(case: Case, out_dir: Path) -> list[dict[str, Any]]:
    """Run ``case`` once; every rank's readings, rank 0 first."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(asdict(case)), "--out", str(out_dir)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(1), cwd=REPO, capture_output=True, text=True, timeout=900)
    paths = [out_dir / f"{case.name}-rank{rank}.json" for rank in range(case.devices)]
    if done.returncode != 0 or not all(p.exists() for p in paths):
        raise RuntimeError(f"{case.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    readings = [json.loads(p.read_text()) for p in paths]
    for p in paths:
        p.unlink()
    return readings


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every case (``--only``), ``--repeats`` times, the engines of a model and size by turns."""
    todo = [c for c in cases() if not args.only or args.only in c.name]
    runs: list[dict[str, Any]] = []
    predicted: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in todo:
            predicted[case.name] = predict(case)
        for repeat in range(args.repeats):
            order = todo if repeat % 2 == 0 else list(reversed(todo))  # the pairs in turn
            for case in order:
                started = time.perf_counter()
                readings = measure(case, Path(tmp))
                runs.append({"case": asdict(case), "repeat": repeat, "ranks": readings})
                got = (readings[0]["peak"] - readings[0]["imported"]["VmRSS"]) / 1024
                print(
                    f"{case.name} #{repeat}: growth {got:.0f} MiB, tensors "
                    f"{predicted[case.name]['tensors'] / MIB:.0f} MiB ({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
    return {"runs": runs, "predicted": predicted}


# ------------------------------------------------------------------------------------ the report
def growth(rank: dict[str, Any]) -> int:
    """Bytes the run added to a rank at its highest: peak RSS less RSS before the Trainer."""
    return int((rank["peak"] - rank["imported"]["VmRSS"]) * 1024)


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row a case: rank 0's readings (median over the repeats), the prediction, the largest
    rank's growth."""
    from fullshard.planner.overhead import cpu_process_overhead

    by_case: dict[str, list[dict[str, Any]]] = {}
    for run in result["figures"]["runs"]:
        by_case.setdefault(Case(**run["case"]).name, []).append(run)
    out = []
    for name, runs in by_case.items():
        case = Case(**runs[0]["case"])
        guess = result["figures"]["predicted"][name]
        first = [run["ranks"][0] for run in runs]

        def median(values: list[float]) -> float:
            return float(statistics.median(values))

        measured = median([growth(r) for r in first])
        overhead = cpu_process_overhead(case.devices if case.engine != "single" else 1)
        out.append(
            {
                "case": case,
                "runs": len(runs),
                "imported": median([r["imported"]["VmRSS"] * 1024 for r in first]),
                "imported_anon": median([r["imported"]["RssAnon"] * 1024 for r in first]),
                "group": median([(r["group"]["VmRSS"] - r["imported"]["VmRSS"]) * 1024 for r in first]),
                "growth": measured,
                "spread": max(growth(r) for r in first) - min(growth(r) for r in first),
                "largest_rank": median([max(growth(r) for r in run["ranks"]) for run in runs]),
                "tensors": guess["tensors"],
                "largest_unit": guess["largest_unit"],
                "param_bytes": guess["param_bytes"],
                "not_tensors": measured - guess["tensors"],
                "malloc_free": median([r.get("malloc", {}).get("free", 0) for r in first]),
                "overhead": overhead,
                "process": guess["tensors"] + overhead,
                "error": (guess["tensors"] + overhead - measured) / measured,
            }
        )
    return out


def fit(rows: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Least squares of ``not_tensors = a + b (processes - 1) + c largest_unit`` over the
    fitting models' FSDP rows: (a, b, c). The one-process rows are left out: their tensors are
    FSDP2's one-process simulation, which counts a gathered copy of each unit that the
    single-device Trainer does not make, so their part that is not tensors reads low."""
    points = [
        (1.0, float(r["case"].devices - 1), float(r["largest_unit"]), float(r["not_tensors"]))
        for r in rows
        if r["case"].model in FIT and r["case"].engine != "single"
    ]
    if len(points) < 3:
        return (float("nan"),) * 3  # type: ignore[return-value]
    # normal equations, 3 x 3, by Cramer's rule
    m = [[sum(p[i] * p[j] for p in points) for j in range(3)] for i in range(3)]
    v = [sum(p[i] * p[3] for p in points) for i in range(3)]

    def det(a: list[list[float]]) -> float:
        return (
            a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
        )

    d = det(m)
    if d == 0:
        return (float("nan"),) * 3  # type: ignore[return-value]
    solved = []
    for k in range(3):
        mk = [[v[i] if j == k else m[i][j] for j in range(3)] for i in range(3)]
        solved.append(det(mk) / d)
    return solved[0], solved[1], solved[2]


def render(result: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result."""
    from fullshard.planner import overhead

    rows = rows_of(result)

    def mib(n: float) -> str:
        return f"{n / MIB:.0f}"

    a, b, c = fit(rows)
    checks = [abs(r["error"]) for r in rows if r["case"].model not in FIT and r["case"].engine != "single"]
    first = table(
        [
            "case",
            "processes",
            "RSS after imports",
            "process group",
            "growth (rank 0)",
            "largest rank",
            "tensors (planner)",
            "not tensors",
            "glibc free at end",
            "largest unit",
        ],
        [
            [
                f"{r['case'].model} {r['case'].engine}",
                str(r["case"].devices),
                mib(r["imported"]),
                mib(r["group"]),
                mib(r["growth"]) + (f" ±{mib(r['spread'] / 2)}" if r["runs"] > 1 else ""),
                mib(r["largest_rank"]),
                mib(r["tensors"]),
                mib(r["not_tensors"]),
                mib(r["malloc_free"]),
                mib(r["largest_unit"]),
            ]
            for r in rows
        ],
    )
    second = table(
        [
            "case",
            "processes",
            "fitted on it",
            "tensors",
            "overhead (model)",
            "predicted process peak",
            "measured growth",
            "error",
        ],
        [
            [
                f"{r['case'].model} {r['case'].engine}",
                str(r["case"].devices),
                "yes" if r["case"].model in FIT else "no",
                mib(r["tensors"]),
                mib(r["overhead"]),
                mib(r["process"]),
                mib(r["growth"]),
                f"{r['error']:+.1%}",
            ]
            for r in rows
        ],
    )
    return "\n".join(
        [
            SECTION,
            "",
            wrap(
                "What each CPU process holds beyond the tensors the planner counts, under fullshard's "
                "Trainer (FULL_SHARD, every block a unit, gloo, 3 AdamW steps; one process: the "
                "single-device Trainer with the same allocator settings, its tensors predicted by FSDP2's "
                "one-process simulation, which counts a gathered copy of each unit that this Trainer does not "
                "make). MiB; each case run "
                f"{max(r['runs'] for r in rows)} times, rank 0's median (± half the spread of its runs)."
                " Growth: the process's peak RSS less its RSS before the Trainer was made (imports done, "
                "no tensor of the model yet); not tensors: growth less the planner's tensor peak."
            ),
            "",
            provenance(result, __file__, timed=False),
            "",
            first,
            "",
            wrap(
                f"Fitted on the FSDP runs of {', '.join(FIT)} (least squares): not tensors = {a / MIB:.1f} MiB "
                f"+ {b / MIB:.1f} MiB x (processes - 1) {'+' if c >= 0 else '-'} {abs(c):.3f} x largest unit. "
                "`fullshard.planner.overhead.cpu_process_overhead` holds the model: no term in the unit's "
                f"size, the constant the largest fitted run rounded up ({overhead.CPU_BASE / MIB:.0f} MiB), "
                f"{overhead.CPU_PER_PEER / 1024:.0f} KiB a process beyond the first "
                "([Note: memory that is not tensors]); with it:"
            ),
            "",
            second,
            "",
            wrap(
                f"Cases not fitted on (models of 100 MB and up, 2 and 4 processes): |error| "
                f"max {max(checks):.1%}, median {statistics.median(checks):.1%} over {len(checks)}."
                if checks
                else "No case outside the fitted ones was run."
            ),
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each case (default 2)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.worker:
        run_worker(Case(**json.loads(args.worker)), Path(args.out))
        return
    result = run_or_report(args, __file__, lambda: measure_all(args))
    section = render(result)
    print(section)
    if args.write_docs:
        write_section(section)


if __name__ == "__main__":
    main()

"""python benchmarks/gpu_check.py --out "$OUT" --write-docs

One prepared GPU check: fullshard's CUDA tests on one GPU, the seed guide's Transformer under fullshard and Lightning's FSDPStrategy by turns, a 1B Llama under FSDP2 eager and compiled, and saves, each part in a process of its own.

Run on the GPU machine from the repository root, as is: nothing is installed there (fullshard runs
from ``src/`` through ``PYTHONPATH``; Lightning, transformers and pytest are the machine's own).
It takes about 8 minutes on one H100 (the device gives 15 minutes a session, one call at most
10); ``--budget`` (default 540 s) bounds the whole run, each part has its own timeout within it,
and a part that fails or times out does not stop the others; the parts run in the order below,
the figures first, so a run cut short loses the CUDA tests.
It prints a table as the parts finish and writes ``gpu_check.json``, ``gpu_check.md`` and the
profiled steps (``profiles.json``) to ``--out`` (with ``--write-docs``, also the section "GPU" of
that machine's docs/benchmarks.md).
The GPU machine's tree does not come back: to put the figures into this checkout's docs, copy
its ``gpu_check.json`` into benchmarks/results/ under a name that says the device and date, and
render the section from it (the section names that file; tests/test_benchmark_claims.py checks
that it renders the section exactly)::

    cp path/to/gpu_check.json benchmarks/results/gpu_check-h100-2026-11-27.json
    python benchmarks/gpu_check.py --report benchmarks/results/gpu_check-h100-2026-11-27.json --write-docs

Tried on CPU first (a test runs this; one to four minutes on 2 cores, as busy as they are)::

    python benchmarks/gpu_check.py --accelerator cpu --tiny --out /tmp/gpu_check

The parts:

``transformer-paired`` (benchmarks/_gpu_speed.py, [Note: paired runs])
    The seed guide's script (its ``Transformer(vocab_size=33278, nlayers=32, nhid=4096,
    ninp=1024, nhead=64)``, 1.0B parameters; random tokens in place of WikiText2, batch 8 of 128
    tokens) with ``FSDPStrategy(auto_wrap_policy={TransformerEncoderLayer,
    TransformerDecoderLayer})`` and ``precision="bf16-mixed"`` on one device, under fullshard's
    names and under Lightning 2.6.6's, by turns: 3 rounds of a fullshard run, a Lightning run
    and one fullshard variant (Lightning's FSDP1 ``MixedPrecision``, float32 parameters under
    autocast only, ``on_nonfinite_loss=None``), each run a process of its own timing the median
    of 10 steps after 3 of warm-up; the median of the rounds' ratios fullshard/Lightning (tokens/s
    and ``torch.cuda.max_memory_allocated``), each variant against fullshard's runs, and the
    profile of one more step of the last round's two runs (top kernels, the reads that wait for
    the device, the GPU's idle time and its longest gaps with the host operations then running).
    On CPU Lightning runs its single-device strategy, since it refuses FSDP there;
    ``--lightning-python`` names the Python that has Lightning (default: this one on CUDA,
    /tmp/lvenv's on CPU). (The check of 2026-11-27 ran one unpaired run of each, as the parts
    ``transformer-fullshard`` and ``transformer-lightning``; ``--report`` still renders it.)
``llama-fsdp2``
    A Hugging Face ``LlamaForCausalLM`` of 1.1B parameters built with ``empty_init``, FSDP2,
    bf16-mixed, activation checkpointing on the decoder layers, 20 steps of 8 x 2048 tokens:
    tokens/s, model FLOPs utilisation against the card's bf16 peak, peak memory against the wrap
    plan's estimate (parameters, gradients and optimizer state: activations are not in it) and
    against the memory planner's prediction for the same configuration (``fullshard.plan``,
    activations included, planned on fake tensors before the run's numbers are read); and the
    memory that is not tensors against the planner's overhead model: the CUDA context, what
    lies outside the caching allocator at the end (NCCL's buffers, libraries' workspaces), the
    allocator's reserve (``max_memory_reserved - max_memory_allocated``), the process's peak
    against the planner's process peak (on CPU: the growth of the resident set).
``llama-compiled``
    The same Llama with ``Trainer(compile=True)``: each decoder layer (an FSDP2 unit, with its
    activation checkpointing) compiled in place; tokens/s and MFU against ``llama-fsdp2``'s, and
    the first step's time (compiling, mostly). On CPU with the ``aot_eager`` backend.
``save-peaks``
    The seed guide's model with 8 layers a stack under ``FSDPStrategy``: the peak GPU memory of
    3 training steps, then of a full save (gathered to host memory on rank 0 since issue 41:
    [Note: full saves gathered off the GPU] in fullshard/strategies/state_dict_options.py) and
    of a sharded save, each from a reset of the peak; the files' sizes and the saves' times.
``llama-save``
    The same model after two steps: how long training is blocked by a synchronous sharded save,
    and by an asynchronous one (``FSDP2Strategy(async_save=True)``: the call, plus the next
    ``optimizer.step()``'s wait for the copy to pinned host memory).
``cuda-tests``
    ``pytest tests/test_gpu.py -m gpu``: FSDP1 and FSDP2 on NCCL with one process, CPU offload,
    bf16-mixed and bf16-true, activation checkpointing, ``empty_init`` to CUDA, ``torch.compile``,
    full and sharded checkpoints resumed bitwise, async saves with pinned staging, 16-mixed's
    grad scaler. What needs two GPUs is skipped with that reason. (On CPU every test skips.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import REPO, heading_target, load_result, make_parser, parse_args, table, today, write_section
from _gpu_report import SPEED_LINES, compiled_lines, paired_lines, save_lines

SECTION = "## GPU"
LVENV_PYTHON = Path("/tmp/lvenv/bin/python")
TAIL_CHARS = 4000  # of each part's output, kept in the JSON


@dataclass
class Part:
    """One part of the check: a command run in a process of its own, with its own timeout."""

    name: str
    timeout_s: float
    worker: str | None = None  # a worker of _gpu_parts.py or _gpu_speed.py; None: the CUDA tests
    framework: str = "fullshard"
    result: dict[str, Any] = field(default_factory=dict)


PARTS = [  # the figures first: a run cut short by the device's time keeps them
    Part("transformer-paired", 300, "paired"),
    Part("llama-fsdp2", 120, "llama"),
    Part("llama-compiled", 150, "llama_compiled"),
    Part("save-peaks", 100, "save_peaks"),
    Part("llama-save", 150, "llama_save"),
    Part("cuda-tests", 200),
]


# ---------------------------------------------------------------------------------------------
# Running the parts.


def part_env(args: argparse.Namespace) -> dict[str, str]:
    """This environment with fullshard's ``src/`` first on ``PYTHONPATH`` (nothing installed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if args.accelerator == "cuda":
        # the tests' fork server execs `python -I` where it cannot fork a job, which ignores
        # PYTHONPATH (fullshard is not installed there): every process a real python instead
        env["FULLSHARD_TEST_FORKSERVER"] = "0"
    return env


def lightning_python(args: argparse.Namespace) -> str:
    if args.lightning_python:
        return str(args.lightning_python)
    if args.accelerator == "cpu" and LVENV_PYTHON.exists():
        return str(LVENV_PYTHON)
    return sys.executable


def command_of_part(part: Part, args: argparse.Namespace, work: Path, timeout: float) -> list[str]:
    if part.worker is None:
        command = [sys.executable, "-m", "pytest", "tests/test_gpu.py", "-m", "gpu", "-q", "-rA"]
        command += ["-p", "no:cacheprovider", f"--junitxml={work / 'junit.xml'}", "--timeout", "150"]
        return command + (["-n", str(args.test_workers)] if args.accelerator == "cuda" else [])
    python = lightning_python(args) if part.framework == "lightning" else sys.executable
    command = [python, str(Path(__file__).resolve()), "--worker", part.worker, "--framework", part.framework]
    command += ["--accelerator", args.accelerator, "--result", str(work / "result.json"), "--work", str(work)]
    command += ["--lightning-python", lightning_python(args), "--part-timeout", f"{timeout:.0f}"]
    return command + (["--tiny"] if args.tiny else [])


def missing_requirement(part: Part, args: argparse.Namespace) -> str | None:
    """Why ``part`` cannot run here (a package its Python lacks), or None."""
    needs = {"lightning": "lightning", "llama": "transformers", "llama_save": "transformers"}
    needs.update(llama_compiled="transformers", paired="lightning")
    module = needs.get(part.framework if part.framework == "lightning" else part.worker or "")
    if module is None:
        return None
    uses_lightning = part.framework == "lightning" or part.worker == "paired"
    python = lightning_python(args) if uses_lightning else sys.executable
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"{python} cannot import {module}"


def run_part(part: Part, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """Run ``part`` within its timeout and the run's ``deadline``; its result (never raises)."""
    timeout = min(part.timeout_s, deadline - time.monotonic())
    if timeout < 10:
        return {"status": "not run", "reason": f"the run's budget of {args.budget:.0f} s was spent"}
    missing = missing_requirement(part, args)
    if missing:
        return {"status": "skipped", "reason": missing}
    work = Path(tempfile.mkdtemp(prefix=f"{part.name}-", dir=args.work))
    command = command_of_part(part, args, work, timeout)
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=REPO, env=part_env(args), capture_output=True, text=True, timeout=timeout
        )
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output = _text(expired.stdout) + _text(expired.stderr)
        code = None
    result: dict[str, Any] = {"seconds": time.monotonic() - start, "command": " ".join(command)}
    result["output_tail"] = output[-TAIL_CHARS:]
    if part.worker is None:
        result.update(test_results(work / "junit.xml"))
        failed = result.get("failed", 0) + result.get("errors", 0)
        result["status"] = (
            "timed out" if code is None else ("failed" if code not in (0, 5) or failed else "ok")
        )
        return result
    if code is None:
        result["status"] = f"timed out after {timeout:.0f} s"
    elif code != 0:
        result["status"] = f"failed (exit {code})"
    else:
        result["status"] = "ok"
        result["figures"] = json.loads((work / "result.json").read_text())
    return result


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def test_results(junit: Path) -> dict[str, Any]:
    """Counts and each test's outcome (with the reason of a skip or failure) from pytest's XML."""
    if not junit.exists():
        return {"tests": []}
    tests = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[tag]
                reason = (node.get("message") or node.text or "")[:300]
        tests.append(
            {
                "id": f"{case.get('classname', '')}::{case.get('name', '')}",
                "outcome": outcome,
                "reason": reason,
            }
        )
    counts = {
        key: sum(t["outcome"] == key for t in tests) for key in ("passed", "failed", "errors", "skipped")
    }
    return {**counts, "tests": tests}


# ---------------------------------------------------------------------------------------------
# Reporting.


def figures_line(name: str, result: dict[str, Any]) -> str:
    """The short figures of one part, for the table printed as the run goes."""
    if "tests" in result and name == "cuda-tests":
        return ", ".join(f"{result.get(k, 0)} {k}" for k in ("passed", "failed", "errors", "skipped"))
    fig = result.get("figures")
    if not fig:
        return result.get("reason", "")
    if name in SPEED_LINES:
        return SPEED_LINES[name](fig)
    if name == "llama-save":
        return (
            f"sync save blocks {fig['sync_blocked_s']:.2f} s, async {fig['async_blocked_s']:.2f} s "
            f"({fig['blocked_ratio']:.3f}x), {fig['checkpoint_mb']:.0f} MB"
        )
    line = f"{fig['tokens_per_s']:,.0f} tokens/s, step {fig['step_s'] * 1e3:.1f} ms, peak {fig['peak_memory_mb']:,.0f} MB"
    if fig.get("mfu") is not None:
        line += f", MFU {fig['mfu']:.1%}"
    return line


def ratios(report: dict[str, Any]) -> dict[str, float] | None:
    """fullshard/Lightning on the seed guide's model: tokens/s and peak memory."""
    parts = report["parts"]
    paired = parts.get("transformer-paired", {}).get("figures") or {}
    if "tokens_per_s_ratio" in paired:  # the median of the rounds' ratios ([Note: paired runs])
        return {"tokens_per_s": paired["tokens_per_s_ratio"], "peak_memory": paired["peak_memory_ratio"]}
    ours = parts.get("transformer-fullshard", {}).get("figures")
    theirs = parts.get("transformer-lightning", {}).get("figures")
    if not ours or not theirs:
        return None
    return {
        "tokens_per_s": ours["tokens_per_s"] / theirs["tokens_per_s"],
        "peak_memory": ours["peak_memory_mb"] / theirs["peak_memory_mb"],
    }


def render(report: dict[str, Any]) -> str:
    """The section "GPU" of docs/benchmarks.md (also written as gpu_check.md)."""
    parts = report["parts"]
    lines = [
        SECTION,
        "",
        f"`{report['command']}` on {report['device']} ({report['date']}; torch {report['torch']}, "
        f"Python {report['python']}; {report['wall_s']:.0f} s in all). Each part ran in a process of "
        "its own; see the script's docstring for what each measures.",
        "",
        *(
            [
                f"Result file: `{report['result_file']}` (`python benchmarks/gpu_check.py --report "
                f"{report['result_file']} --write-docs` renders this section from it again).",
                "",
            ]
            if "result_file" in report
            else []
        ),
        table(
            ["part", "status", "seconds", "figures"],
            [
                [name, r["status"], f"{r['seconds']:.0f}" if "seconds" in r else "", figures_line(name, r)]
                for name, r in parts.items()
            ],
            align="llrl",
        ),
    ]
    rows = []
    for name in ("transformer-fullshard", "transformer-lightning"):
        fig = parts.get(name, {}).get("figures")
        if fig:
            rows.append(
                [
                    f"{fig['framework']} ({fig['strategy']})",
                    f"{fig['tokens_per_s']:,.0f}",
                    f"{fig['step_s'] * 1e3:.1f}",
                    f"{fig['peak_memory_mb']:,.0f}",
                    f"{fig['setup_s']:.1f}",
                ]
            )
    ratio = ratios(report)
    if rows:
        size = next(
            parts[n]["figures"]
            for n in ("transformer-fullshard", "transformer-lightning")
            if parts.get(n, {}).get("figures")
        )
        lines += [
            "",
            f"The seed guide's Transformer ({size['params'] / 1e9:.2f}B parameters, bf16-mixed, one device, "
            f"{size['tokens_per_step']:,} tokens a step; median of {size['timed_steps']} steps after warm-up):",
            "",
        ]
        lines.append(
            table(["Trainer", "tokens/s", "step (ms)", "peak memory (MB)", "to first step (s)"], rows)
        )
        if ratio:
            lines += [
                "",
                f"fullshard/Lightning: {ratio['tokens_per_s']:.3f}x the tokens/s, "
                f"{ratio['peak_memory']:.3f}x the peak memory.",
            ]
    lines += paired_lines(parts.get("transformer-paired", {}).get("figures"))
    fig = parts.get("llama-fsdp2", {}).get("figures")
    if fig:
        mfu = (
            f"{fig['mfu']:.1%} of a {fig['bf16_peak_tflops']:.0f} TFLOP/s bf16 peak"
            if fig.get("mfu")
            else "n/a"
        )
        lines += [
            "",
            f"Llama, {fig['params'] / 1e9:.2f}B parameters (FSDP2, bf16-mixed, activation checkpointing, "
            f"empty_init; {fig['size']['batch']} x {fig['size']['seq']} tokens a step): "
            f"{fig['tokens_per_s']:,.0f} tokens/s ({fig['step_s']:.3f} s a step), "
            f"{fig['model_tflops_per_s']:.0f} model TFLOP/s, MFU {mfu}; peak memory "
            f"{fig['peak_memory_mb']:,.0f} MB against the wrap plan's estimate of {fig.get('estimate_mb', 0):,.0f} MB "
            "(parameters, gradients and optimizer state: no activations)"
            + (
                f" and the memory planner's prediction of {fig['planner_peak_mb']:,.0f} MB, activations included "
                f"({(fig['planner_peak_mb'] - fig['peak_memory_mb']) / fig['peak_memory_mb']:+.1%}; "
                f"planned in {fig['planner_s']:.1f} s)."
                if fig.get("planner_peak_mb")
                else "."
            ),
        ]
        lines += non_tensor_lines(fig)
    fig = parts.get("llama-save", {}).get("figures")
    if fig:
        lines += [
            "",
            f"Its sharded checkpoint ({fig['checkpoint_mb']:,.0f} MB): a synchronous save blocks training "
            f"{fig['sync_blocked_s']:.2f} s, an asynchronous one {fig['async_blocked_s']:.2f} s "
            f"({fig['blocked_ratio']:.3f}x: {fig['async_in_call_s']:.2f} s in the call, "
            f"{fig['async_copy_wait_s']:.2f} s waited by the next step); its files were written "
            f"{fig['async_until_written_s']:.1f} s after the call.",
        ]
    eager = parts.get("llama-fsdp2", {}).get("figures")
    lines += compiled_lines(parts.get("llama-compiled", {}).get("figures"), eager)
    lines += save_lines(parts.get("save-peaks", {}).get("figures"))
    tests = parts.get("cuda-tests", {}).get("tests", [])
    if tests:
        lines += ["", "The CUDA tests:", ""]
        lines.append(
            table(
                ["test", "outcome"],
                [
                    [t["id"], t["outcome"] + (f": {t['reason']}" if t["reason"] else "")]
                    for t in sorted(tests, key=lambda t: t["id"])
                ],
                "ll",
            )
        )
    return "\n".join(lines) + "\n"


def non_tensor_lines(fig: dict[str, Any]) -> list[str]:
    """The Llama's memory that is not tensors, on CUDA, against the planner's overhead model
    (fullshard/planner/overhead.py, whose CUDA values wait for these figures)."""
    memory = fig.get("non_tensor", {})
    if "context_mb" not in memory or "planner_overhead_mb" not in fig:
        return []
    return [
        "",
        f"Its memory that is not tensors: the CUDA context {memory['context_mb']:,.0f} MB, outside the caching "
        f"allocator at the end {memory['outside_allocator_mb']:,.0f} MB (NCCL and libraries "
        f"{memory['nccl_and_libraries_mb']:,.0f} MB beyond the context), the allocator's reserve at its peak "
        f"{memory['allocator_reserve_mb']:,.0f} MB: {memory['non_tensor_mb']:,.0f} MB in all, against the "
        f"planner's {fig['planner_overhead_mb']:,.0f} MB; the process's peak {memory['process_peak_mb']:,.0f} MB "
        f"against the planner's {fig['planner_process_mb']:,.0f} MB "
        f"({(fig['planner_process_mb'] - memory['process_peak_mb']) / memory['process_peak_mb']:+.1%}).",
    ]


# ---------------------------------------------------------------------------------------------
# The command line.


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION), report=False)
    parser.add_argument("--out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--accelerator", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models (the CPU try-out)")
    parser.add_argument("--parts", nargs="+", choices=[p.name for p in PARTS], help="run only these parts")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run (default 540)")
    parser.add_argument("--lightning-python", type=Path, help="the Python that has Lightning 2.6.6")
    parser.add_argument("--test-workers", type=int, default=6, help="pytest-xdist workers for the CUDA tests")
    parser.add_argument("--work", type=Path, help="scratch folder for checkpoints (default: a temporary one)")
    parser.add_argument(
        "--report", type=Path, help="render a gpu_check.json written before instead of running"
    )
    # a worker's own options (the driver passes them)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--framework", default="fullshard", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="baseline", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--part-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    return parser


def device_name(args: argparse.Namespace) -> str:
    if args.accelerator == "cpu":
        return f"CPU ({os.cpu_count()} cores)"
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; print(f'{torch.cuda.get_device_name()} ({torch.cuda.device_count()} GPU)')",
        ],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() or f"no CUDA device ({probe.stderr.strip()[-200:]})"


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # only for the versions: the parts import it in their own processes

    started = time.monotonic()
    deadline = started + args.budget
    report: dict[str, Any] = {
        "command": args.command,
        "date": today(),
        "device": device_name(args),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "parts": {},
    }
    print(f"gpu_check on {report['device']}, torch {report['torch']}, budget {args.budget:.0f} s", flush=True)
    print("| part | status | seconds | figures |\n| --- | --- | ---: | --- |", flush=True)
    for part in PARTS:
        if args.parts and part.name not in args.parts:
            continue
        result = run_part(part, args, deadline)
        report["parts"][part.name] = result
        seconds = f"{result['seconds']:.0f}" if "seconds" in result else ""
        print(
            f"| {part.name} | {result['status']} | {seconds} | {figures_line(part.name, result)} |",
            flush=True,
        )
        if result["status"] != "ok" and result.get("output_tail"):
            print("  " + result["output_tail"][-1500:].replace("\n", "\n  "), flush=True)
        write_report(report, args.out, started)  # after each part: a run cut short keeps what it has
    return write_report(report, args.out, started)


def write_report(report: dict[str, Any], out: Path, started: float) -> dict[str, Any]:
    """Write ``gpu_check.json`` and ``gpu_check.md`` (and the profiled steps, ``profiles.json``)
    to ``out`` with the parts run so far."""
    report["wall_s"] = time.monotonic() - started
    report["ratios"] = ratios(report)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (out / "gpu_check.md").write_text(render(report))
    profiles = (report["parts"].get("transformer-paired", {}).get("figures") or {}).get("profiles")
    if profiles:  # also in gpu_check.json: here on their own, to read
        (out / "profiles.json").write_text(json.dumps(profiles, indent=1))
    return report


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    if args.worker:
        import _gpu_parts
        import _gpu_speed

        _gpu_parts.WORKERS.update(_gpu_speed.WORKERS)
        _gpu_parts.run(args)
        return
    if args.report:
        report = load_result(args.report)
    else:
        if args.out is None:
            raise SystemExit(
                "gpu_check: give --out DIR (where gpu_check.json and gpu_check.md go), or --report FILE"
            )
        args.out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gpu_check-", dir=args.work) as work:
            args.work = Path(work)
            report = run_all(args)
        print(f"wrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'}")
    if args.write_docs:
        write_section(render(report))
    elif args.report:
        print(render(report), end="")


if __name__ == "__main__":
    main()

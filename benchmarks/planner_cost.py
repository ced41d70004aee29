"""python benchmarks/planner_cost.py --write-docs

What planning costs: wall time, CPU time and peak memory of `fullshard plan` for Llama 2 7B and 70B, every candidate included.

Run it from the repository root, alone on the machine (it times). Each plan is the command a user
runs, ``fullshard plan benchmarks/_planner_models.py:llama_7b --devices D --nodes N
--device-memory 80GiB --precision bf16-mixed --device-type cuda``, as its own process; its
memory is the sum of the resident sets of that process and its workers (forked, one per core),
sampled every 50 ms with psutil, and the highest sum is reported (pages the workers share with
the parent copy-on-write are counted once per process: an upper bound). CPU time is the
process's and its children's user + system time. The table's "planned in" is the planner's own
timer (from the call to the result, imports and building the model excluded). The figures,
and the fit answers they come with, go between the ``fit answers`` markers of docs/fsdp/plan.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from typing import Any

from _common import (
    REPO,
    make_parser,
    markers,
    parse_args,
    provenance,
    run_or_report,
    table,
    worker_env,
    write_marked,
)

DOC = REPO / "docs" / "fsdp" / "plan.md"
PLANS = [("llama_7b", 8, 1), ("llama_7b", 8, 8), ("llama_70b", 8, 8)]


def run(factory: str, devices: int, nodes: int) -> dict[str, Any]:
    import psutil

    command = [
        sys.executable,
        "-m",
        "fullshard.cli",
        "plan",
        f"benchmarks/_planner_models.py:{factory}",
        "--devices",
        str(devices),
        "--nodes",
        str(nodes),
        "--device-memory",
        "80GiB",
        "--precision",
        "bf16-mixed",
        "--device-type",
        "cuda",
    ]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=worker_env(1), stdout=subprocess.PIPE, text=True)
    watched = psutil.Process(process.pid)
    peak = 0
    while process.poll() is None:
        try:
            tree = [watched, *watched.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - started
    out = process.stdout.read() if process.stdout else ""
    if process.returncode not in (0, 2):
        raise RuntimeError(f"{factory} on {devices}x{nodes} failed ({process.returncode}):\n{out[-2000:]}")
    usage = psutil.Process().cpu_times()
    planned = re.search(r"planned in ([0-9.]+) s", out)
    chosen = next((line for line in out.splitlines() if line.startswith("* ")), "x (nothing fits)")
    return {
        "wall": wall,
        "cpu": usage.children_user + usage.children_system,
        "rss": peak,
        "planned": float(planned.group(1)) if planned else float("nan"),
        "rows": sum(1 for line in out.splitlines() if line[:2] in ("* ", "x ", "  ") and "GiB" in line),
        "chosen": _label(chosen[2:]),
    }


def _label(row: str) -> str:
    """A table row's configuration and predicted peak: ``fsdp2 FULL_SHARD AC every layer, 21.11 GiB``."""
    found = re.match(r"\s*(.*?)\s+([0-9.]+ [KMGT]?i?B)\b", row)
    return f"{found.group(1)}, {found.group(2)}" if found else row.strip()


def build_parser() -> argparse.ArgumentParser:
    """The script's command line."""
    return make_parser(__file__, __doc__, write_docs="the planning-cost block of docs/fsdp/plan.md")


def measure() -> list[dict[str, Any]]:
    """``run``'s figures for each plan of ``PLANS``, CPU time per plan (not cumulative)."""
    measured, cpu_before = [], 0.0
    for factory, devices, nodes in PLANS:
        result = run(factory, devices, nodes)
        result["cpu"], cpu_before = result["cpu"] - cpu_before, result["cpu"]
        measured.append({"factory": factory, "devices": devices, "nodes": nodes, **result})
        print(measured[-1], flush=True)
    return measured


def render(result: dict[str, Any]) -> str:
    """The block of docs/fsdp/plan.md, from a result (``measure``'s figures, saved)."""
    rows = [
        [
            m["factory"].replace("llama_", "Llama 2 ").upper().replace("LLAMA", "Llama"),
            f"{m['devices'] * m['nodes']} ({m['nodes']} node{'s' if m['nodes'] > 1 else ''})",
            str(m["rows"]),
            f"{m['planned']:.1f}",
            f"{m['wall']:.1f}",
            f"{m['cpu']:.1f}",
            f"{m['rss'] / 2**20:.0f}",
            m["chosen"],
        ]
        for m in result["figures"]
    ]
    return "\n".join(
        [
            f"Measured {result['date']} with `{result['command']}` on {result['cores']} cores ({result['machine']}).",
            "",
            provenance(result, __file__),
            "",
            table(
                [
                    "model",
                    "processes",
                    "candidates",
                    "planned in s",
                    "wall s (with imports)",
                    "CPU s",
                    "peak RSS MiB (all processes)",
                    "chosen (predicted peak)",
                ],
                rows,
            ),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    body = render(run_or_report(args, __file__, measure))
    print(body)
    if args.write_docs:
        write_marked(body, DOC, *markers("planner_cost.py"))


if __name__ == "__main__":
    main()

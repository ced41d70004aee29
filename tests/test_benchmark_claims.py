"""Every figure the benchmarks put into the docs comes from a result file in benchmarks/results/.

For each section or block a script writes (docs/benchmarks.md, the tables of docs/fsdp/plan.md
and docs/compile.md): either the result file the section names exists and the script's
``render`` of it is exactly the text in the docs (a figure cannot drift from its result, nor be
edited by hand), or the section says at its top that its figures are not yet backed by a saved
result, with the command that reruns it. And every figure in the README's opening claims is
computed here from the result file it cites.

Nothing here runs a benchmark: the scripts are imported and render saved files."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"
README = REPO / "README.md"

# every script that writes into the docs, and the page it writes: a "## " section of
# docs/benchmarks.md (its SECTION) or the block between its markers on another page
WRITERS = {
    "overhead": "docs/benchmarks.md",
    "fsdp_step": "docs/benchmarks.md",
    "memory": "docs/benchmarks.md",
    "cpu_allocator": "docs/benchmarks.md",
    "fast_init": "docs/benchmarks.md",
    "process_overhead": "docs/benchmarks.md",
    "checkpoint": "docs/benchmarks.md",
    "stuck_ranks": "docs/benchmarks.md",
    "checkpoint_scale": "docs/benchmarks.md",
    "async_save": "docs/benchmarks.md",
    "parallel_2d": "docs/benchmarks.md",
    "clip_norm": "docs/benchmarks.md",
    "nonfinite_check": "docs/benchmarks.md",
    "gpu_check": "docs/benchmarks.md",
    "compile": "docs/compile.md",
    "planner": "docs/fsdp/plan.md",
    "planner_choice": "docs/fsdp/plan.md",
    "planner_cost": "docs/fsdp/plan.md",
}
# sections of docs/benchmarks.md written by hand from a script's output, and that command
BY_HAND = {
    "## FSDP start-up": "python benchmarks/overhead.py --steps 200 --repeats 3 --pairs 0 --only fullshard-fsdp loop-fsdp"
}
NOT_FIGURES = {"## How to run the benchmarks"}

MARK = re.compile(
    r"\*\*Figures not yet backed by a saved result\*\* \(measured (?P<date>[^()]*\d{4}-\d\d-\d\d[^()]*) "
    r"before results were saved; rerun: `(?P<command>python benchmarks/[^`]+)`\)\."
)
NAMED = re.compile(r"Result file: `(benchmarks/results/[^`]+\.json)`")


@pytest.fixture(scope="module")
def scripts() -> Iterator[tuple[ModuleType, dict[str, ModuleType]]]:
    """benchmarks/_common.py and every writing script, imported as they import each other."""
    environ, modules = dict(os.environ), set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        common = importlib.import_module("_common")
        yield common, {name: importlib.import_module(name) for name in WRITERS}
    for name in set(sys.modules) - modules:
        if (BENCHMARKS / f"{name}.py").exists():  # a script or helper imported from benchmarks/
            sys.modules.pop(name, None)
    os.environ.clear()
    os.environ.update(environ)  # stuck_ranks.py sets OMP_NUM_THREADS as it is imported


def written_text(common: ModuleType, name: str, module: ModuleType) -> str:
    """What ``name`` wrote into its page, as ``render`` returns it (without trailing blank lines)."""
    page = (REPO / WRITERS[name]).read_text()
    if WRITERS[name] == "docs/benchmarks.md":
        return common.section_of(page, module.SECTION, WRITERS[name]).rstrip("\n")
    start, end = common.markers(f"{name}.py")
    assert page.count(start) == 1 and page.count(end) == 1, f"{WRITERS[name]}: the markers of {name}.py"
    return page.split(start, 1)[1].split(end, 1)[0].strip("\n")


def first_lines(text: str) -> list[str]:
    """The section's first lines after its heading (or the block's first line): where the mark goes."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[1:2] if lines and lines[0].startswith("## ") else lines[:1]


@pytest.mark.parametrize("name", list(WRITERS))
def test_each_section_renders_from_its_result_file_or_says_it_cannot(
    name: str, scripts: tuple[ModuleType, dict[str, ModuleType]]
) -> None:
    common, modules = scripts
    module = modules[name]
    text = written_text(common, name, module)
    marked = [MARK.fullmatch(line) for line in first_lines(text)]
    if marked and marked[0]:
        # not backed yet: the mark names the script's own command, and no result file claims it
        assert marked[0]["command"] == common.command_of(module.__doc__), text[:300]
        assert not common.result_file(name).exists(), (
            f"{common.result_file(name)} exists but {WRITERS[name]} still carries the mark: render it "
            f"(python benchmarks/{name}.py --report {common.result_file(name).relative_to(REPO)} --write-docs)"
        )
        assert not NAMED.search(text)
        return
    assert "not yet backed" not in text, "the mark belongs at the top of the section, exactly as written"
    named = NAMED.findall(text)
    assert named, f"{name}'s part of {WRITERS[name]} names no result file and carries no mark"
    path = REPO / named[0]
    assert path.is_file(), f"{named[0]}, named in {WRITERS[name]}, is not in the repository"
    if name != "gpu_check":  # gpu_check's file is named for its machine and date
        assert path == common.result_file(name)
    result = common.load_result(path)
    assert module.render(result).strip("\n") == text, (
        f"{WRITERS[name]} differs from what {named[0]} renders: rerun "
        f"python benchmarks/{name}.py --report {named[0]} --write-docs"
    )
    if "command" in result and "commit" in result:  # the standard facts of a saved run
        assert result["command"].startswith(f"python benchmarks/{name}.py")
        for fact in ("date", "cores", "load_average_start", "torch", "commit", "arguments", "figures"):
            assert fact in result, fact


def test_every_section_of_benchmarks_md_is_a_scripts_or_marked(
    scripts: tuple[ModuleType, dict[str, ModuleType]],
) -> None:
    """A section written by hand from a script's output carries the mark with the command."""
    common, modules = scripts
    page = (REPO / "docs" / "benchmarks.md").read_text()
    headings = {line.rstrip() for line in page.splitlines() if line.startswith("## ")}
    by_script = {m.SECTION for n, m in modules.items() if WRITERS[n] == "docs/benchmarks.md"}
    assert headings - NOT_FIGURES - by_script == set(BY_HAND)
    for heading, command in BY_HAND.items():
        found = MARK.fullmatch(first_lines(common.section_of(page, heading))[0])
        assert found and found["command"] == command, heading


def test_a_changed_figure_is_caught(scripts: tuple[ModuleType, dict[str, ModuleType]]) -> None:
    """The comparison above sees a figure edited in the result (or, the same, in the docs)."""
    common, modules = scripts
    result = common.load_result(RESULTS / "stuck_ranks.json")
    before = modules["stuck_ranks"].render(result)
    result["figures"]["active_ns"] += 100
    assert modules["stuck_ranks"].render(result) != before


# ---------------------------------------------------------------------------------------------
# The README's opening claims.


def _gpu(result: dict[str, Any]) -> list[str]:
    llama = result["parts"]["llama-fsdp2"]["figures"]
    save = result["parts"]["llama-save"]["figures"]
    seed = result["parts"]["transformer-fullshard"]["figures"]
    return [
        f"{llama['params'] / 1e9:.2f}B-parameter Hugging Face Llama",
        f"seed guide's {seed['params'] / 1e9:.2f}B-parameter Transformer",
        f"{llama['tokens_per_s']:,.0f} tokens/s",
        f"{llama['mfu']:.1%} MFU",
        f"{save['checkpoint_mb']:,.0f} MB",
        f"{save['async_blocked_s']:.2f} s against {save['sync_blocked_s']:.2f} s",
        f"{result['ratios']['tokens_per_s']:.2f}x the tokens/s",
        f"{result['ratios']['peak_memory']:.2f}x the peak memory",
    ]


def _choice(result: dict[str, Any]) -> list[str]:
    cases = result["figures"]["results"]
    return [
        f"{sum(case['ok'] for case in cases)} of {len(cases)} measured cases",
        f"within {result['figures']['tolerance']:.0%}",
    ]


# the result files the README cites, and the claims each one backs, as the README words them
CITED: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "benchmarks/results/gpu_check-h100-2026-11-27.json": _gpu,
    "benchmarks/results/planner_choice.json": _choice,
}


def opening() -> str:
    """README.md up to "## Run the demo", without link targets and code spans."""
    text = README.read_text().split("## Run the demo", 1)[0]
    return re.sub(r"`[^`]*`|\]\([^)]*\)", "", text)


def test_the_readme_figures_come_from_the_result_files_it_cites(
    scripts: tuple[ModuleType, dict[str, ModuleType]],
) -> None:
    common, _ = scripts
    raw = README.read_text().split("## Run the demo", 1)[0]
    text = " ".join(opening().split())
    claims = []
    for path, claimed in CITED.items():
        assert path in raw, f"the README no longer cites {path}: drop it from CITED"
        for claim in claimed(common.load_result(REPO / path)):
            assert claim in text, f"README.md should say {claim!r}, from {path}"
            claims.append(claim)
    # every number in the opening is one of those claims' (a new figure needs a result behind it)
    figures = set(re.findall(r"(?<![\w.,])\d[\d,.]*\d(?!\d)|(?<![\w.,])\d(?![\d.,])", text))
    backed = {f for claim in claims for f in re.findall(r"\d[\d,.]*\d|\d", claim)}
    assert figures <= backed, f"figures in README.md with no cited result: {sorted(figures - backed)}"

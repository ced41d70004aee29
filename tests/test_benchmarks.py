"""benchmarks/: the shared helper (benchmarks/_common.py) and every script's command line.

Nothing here runs a benchmark: the helper's functions run on strings and temporary files, and
each script is imported (not run) to build its argument parser."""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
DOCS = REPO / "docs" / "benchmarks.md"
# every script, and whether --write-docs writes a section of docs/benchmarks.md ("compile":
# docs/compile.md)
SCRIPTS = {
    "overhead": "benchmarks",
    "fsdp_step": "benchmarks",
    "memory": "benchmarks",
    "cpu_allocator": "benchmarks",
    "fast_init": "benchmarks",
    "process_overhead": "benchmarks",
    "checkpoint": "benchmarks",
    "stuck_ranks": "benchmarks",
    "checkpoint_scale": "benchmarks",
    "async_save": "benchmarks",
    "parallel_2d": "benchmarks",
    "clip_norm": "benchmarks",
    "compile": "compile",
    "planner": "plan",
    "planner_choice": "plan",
    "planner_cost": "plan",
    "nonfinite_check": "benchmarks",
    "gpu_check": "benchmarks",
    "_lightning_overhead": None,
}
HELPERS = {
    "_common",
    "_gpu_parts",
    "_gpu_speed",
    "_gpu_report",
    "_planner_models",
    "_planner_families",
    "_planner_moe",
}  # modules the scripts import, not scripts


@pytest.fixture(scope="module")
def common() -> Iterator[ModuleType]:
    """benchmarks/_common.py, imported as the scripts import it (their folder on sys.path)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield importlib.import_module("_common")
    sys.modules.pop("_common", None)


@pytest.fixture(scope="module")
def scripts(common: ModuleType) -> Iterator[dict[str, ModuleType]]:
    """Every script, imported; sys.path, sys.modules and the environment as they were after."""
    environ, modules = dict(os.environ), set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield {name: importlib.import_module(name) for name in SCRIPTS}
    for name in set(SCRIPTS) - modules:
        sys.modules.pop(name, None)
    os.environ.clear()
    os.environ.update(environ)  # stuck_ranks.py sets OMP_NUM_THREADS as it is imported


PAGE = """# Benchmarks

Intro, kept.

## First

first body
```bash
## a comment in a code block, not a heading
```

### A subsection of First

more of First


## Second

second body
no blank line at the end"""


def test_replace_section_keeps_the_rest_byte_for_byte(common: ModuleType) -> None:
    new = "## First\n\nnew body\n\n### Its subsection\n\nnew\n"
    updated = common.replace_section(PAGE, new)
    before, after = PAGE.split("## First\n", 1)[0], PAGE[PAGE.index("## Second") :]
    assert updated == before + new + "\n" + after
    assert common.replace_section(updated, new) == updated  # a second run changes nothing
    assert common.section_of(updated, "## First") == new
    # the last section, to the end of the file
    assert (
        common.replace_section(PAGE, "## Second\n\nx") == PAGE[: PAGE.index("## Second")] + "## Second\n\nx\n"
    )


def test_the_docs_sections_read_back_unchanged(common: ModuleType) -> None:
    """Every section of docs/benchmarks.md written again as it stands gives the same bytes."""
    text = DOCS.read_bytes().decode("utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(headings) >= 8
    for heading in headings:
        assert common.replace_section(text, common.section_of(text, heading)) == text, heading


def test_a_missing_or_repeated_heading_is_an_error(common: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(
        common.SectionError, match=r"no line '## Third'.*## First, ## Second.*add that heading"
    ):
        common.replace_section(PAGE, "## Third\n\nbody\n")
    with pytest.raises(common.SectionError, match="2 lines '## Second'"):
        common.replace_section(PAGE + "\n## Second\n", "## Second\n")
    with pytest.raises(common.SectionError, match="'## ' heading line"):
        common.replace_section(PAGE, "First\n\nbody\n")
    # a heading in a code block is not one
    with pytest.raises(common.SectionError, match="no line '## a comment"):
        common.replace_section(PAGE, "## a comment in a code block, not a heading\n")
    page = tmp_path / "benchmarks.md"
    page.write_bytes(PAGE.encode())
    with pytest.raises(common.SectionError, match=f"{page}"):
        common.write_section("## Third\n\nbody\n", page)
    assert page.read_bytes() == PAGE.encode()  # nothing written


def test_write_section_keeps_notes_written_by_hand(
    common: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = f"{common.HAND_WRITTEN}\r\n\r\nWhat the figures say, by hand.\r\n\r\n"
    text = PAGE.replace("\n", "\r\n").replace("## Second", f"old figures\r\n\r\n{notes}## Second", 1)
    page = tmp_path / "benchmarks.md"
    page.write_bytes(text.encode())
    common.write_section("## First\n\nnew figures\n", page)
    assert "updated" in capsys.readouterr().out
    expected = text.split("## First", 1)[0] + "## First\n\nnew figures\n\n" + text[text.index(notes) :]
    assert page.read_bytes().decode() == expected  # the notes and the rest as they were, CRLF and all
    with pytest.raises(common.SectionError, match="only the docs"):
        common.replace_section(text, f"## First\n{common.HAND_WRITTEN}\n")


def test_replace_marked(common: ModuleType, tmp_path: Path) -> None:
    start, end = common.markers("x.py")
    text = f"head\n{start}\nold\n{end}\ntail\n"
    assert (
        common.replace_marked(text, start, end, "new\nlines") == f"head\n{start}\nnew\nlines\n{end}\ntail\n"
    )
    with pytest.raises(common.SectionError, match="0 times"):
        common.replace_marked(text.replace(end, ""), start, end, "new")
    with pytest.raises(common.SectionError, match="before"):
        common.replace_marked(f"{end}\n{start}\n", start, end, "new")
    compile_md = (REPO / "docs" / "compile.md").read_text()
    start, end = common.markers("compile.py")
    body = compile_md.split(start, 1)[1].split(end, 1)[0]
    assert common.replace_marked(compile_md, start, end, body) == compile_md
    page = tmp_path / "page.md"
    page.write_text(text)
    common.write_marked("written", page, *common.markers("x.py"))
    assert "written" in page.read_text()


def test_table(common: ModuleType) -> None:
    assert (
        common.table(["", "a", "b"], [["row", "1", ""]])
        == "| | a | b |\n| --- | ---: | ---: |\n| row | 1 | |"
    )
    assert common.table(["x", "y"], [], align="ll") == "| x | y |\n| --- | --- |"
    with pytest.raises(ValueError, match="2 columns, 3"):
        common.table(["x", "y"], [], align="lll")


def test_paired_timings(common: ModuleType) -> None:
    calls: list[str] = []
    pairs = common.abba(3, lambda: calls.append("a") or 2.0, lambda: calls.append("b") or 1.0)
    assert calls == ["a", "b", "b", "a", "a", "b"] and pairs == [(2.0, 1.0)] * 3
    assert list(common.rotations("xyz", 4)) == [list("xyz"), list("yzx"), list("zxy"), list("xyz")]
    assert common.ratio_summary([1.0, 1.2, 0.9], "pairs of 5-step segments") == (
        "1.000x (median of 3 pairs of 5-step segments; 0.900x to 1.200x)"
    )
    assert common.ratio_summary([]) == "not measured"


def test_worker_env(common: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("FULLSHARD_LAUNCHER_PID", "1")
    env = common.worker_env(threads=2, EXTRA="x")
    assert "LOCAL_RANK" not in env and "FULLSHARD_LAUNCHER_PID" not in env
    assert env["OMP_NUM_THREADS"] == "2" and env["EXTRA"] == "x" and env["PATH"] == os.environ["PATH"]


def test_every_script_is_listed() -> None:
    found = {p.stem for p in BENCHMARKS.glob("*.py")} - HELPERS
    assert found == set(SCRIPTS), "a new script: add it to SCRIPTS here and to docs/benchmarks.md"


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_script_command_line(
    name: str, scripts: dict[str, ModuleType], common: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docstring starts with the command, which the script's parser takes; --help works;
    --write-docs where the script has a section, and that section is in the docs."""
    module = scripts[name]
    command = common.command_of(module.__doc__)
    words = shlex.split(command)
    assert words[1] == f"benchmarks/{name}.py"
    parser = module.build_parser()
    args = parser.parse_args(words[2:])
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert ("--write-docs" in shown) == (SCRIPTS[name] is not None)
    assert getattr(args, "write_docs", False) == (SCRIPTS[name] is not None)
    if SCRIPTS[name] == "benchmarks":
        assert DOCS.read_text().splitlines().count(module.SECTION) == 1
    if not name.startswith("_"):
        assert shown.startswith(f"usage: python benchmarks/{name}.py")
        assert common.summary(module.__doc__) in " ".join(shown.split())


def test_the_docs_list_every_command(common: ModuleType, scripts: dict[str, ModuleType]) -> None:
    howto = common.section_of(DOCS.read_text(), "## How to run the benchmarks")
    for name, module in scripts.items():
        if not name.startswith("_"):
            assert f"`{common.command_of(module.__doc__)}`" in howto, name


def test_a_run_saves_its_result_and_report_renders_it_without_running(
    common: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = common.make_parser(
        "benchmarks/x.py", "python benchmarks/x.py --write-docs\n\nMeasures x.", write_docs="somewhere"
    )
    parser.add_argument("--n", type=int, default=3)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    args = common.parse_args(parser, ["--write-docs", "--n", "4"])
    result = common.run_or_report(args, "x.py", lambda: {"a": 1.5})
    saved = tmp_path / "x.json"
    assert saved.is_file() and result["figures"] == {"a": 1.5} and result["arguments"] == {"n": 4}
    assert result["command"] == "python benchmarks/x.py --write-docs --n 4"
    for fact in ("date", "cores", "load_average_start", "torch", "commit", "cpu"):
        assert fact in result
    again = common.parse_args(parser, ["--report", str(saved), "--write-docs"])
    assert common.run_or_report(again, "x.py", lambda: pytest.fail("--report runs nothing")) == result
    # without --write-docs a run saves nothing
    saved.unlink()
    common.run_or_report(common.parse_args(parser, []), "x.py", lambda: {"a": 2})
    assert not saved.exists()
    assert f"`{result['result_file']}`" in common.provenance(result, "x.py")

"""Every ```python block in the documentation (docs/ and the README) is a complete script; run each one.

(Fragments that are not meant to run on their own are fenced as ```py.) Every ``[Note: title]``
reference, in the code and the documentation, names a note that exists, in full."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import forkserver

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
FSDP_DOCS = DOCS / "fsdp"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in [DOCS.parent / "README.md", *sorted(DOCS.glob("**/*.md"))]:
        for i, code in enumerate(_BLOCK.findall(page.read_text())):
            found.append((f"{page.relative_to(DOCS.parent)}#{i}", code))
    return found


BLOCKS = _blocks()


def test_every_fsdp_page_has_a_tested_example() -> None:
    pages = {name.split("#")[0] for name, _ in BLOCKS}
    expected = {f"docs/fsdp/{p.name}" for p in FSDP_DOCS.glob("*.md")} - {"docs/fsdp/README.md"}
    assert expected <= pages


@pytest.mark.multiprocess
@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_doc_block_runs(tmp_path: Path, name: str, code: str) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = {
        k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "RANK")
    }
    result = subprocess.run(
        [forkserver.python(), str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"


# Note references and the notes they name: a note is a paragraph of a docstring or comment
# whose first line starts with its title in brackets (a heading), see [Note: atomic commit] in
# src/fullshard/checkpoint/io.py. The heading is alone on its line, or opens a comment block with
# the text going on after it; a reference is any other mention, possibly wrapped over lines.
_NOTE_SOURCES = [
    ROOT / "README.md",
    *(
        path
        for folder in ("src", "tests", "benchmarks", "examples", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".md")
        and "__pycache__" not in path.parts
        and path != Path(__file__)  # its patterns and messages are no references
    ),
]
_NOTE_HEADING = re.compile(r'^\s*(#\s*|[rR]?""")?\[Note: ([^\]\n]+)\](.*)$')
_NOTE_REFERENCE = re.compile(r"\[Note:\s+([^\]]+?)\]")
_WRAPPED = re.compile(r"\s*\n\s*(?:#\s*)?")  # a title wrapped onto a comment's next line


def _notes() -> tuple[set[str], list[tuple[str, str]]]:
    """The titles of the notes, and each reference as (title, "file:line")."""
    titles: set[str] = set()
    references: list[tuple[str, str]] = []
    for path in _NOTE_SOURCES:
        text = path.read_text()
        lines = text.splitlines()
        for i, line in enumerate(lines):
            heading = _NOTE_HEADING.match(line)
            if heading is None:
                continue
            opens_comment = (heading.group(1) or "").startswith("#") and (
                i == 0 or not lines[i - 1].lstrip().startswith("#")
            )
            if not heading.group(3).strip() or opens_comment:
                titles.add(heading.group(2))
        for ref in _NOTE_REFERENCE.finditer(text):
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, ref.start()) + 1}"
            references.append((_WRAPPED.sub(" ", ref.group(1)), where))
    return titles, references


def test_note_references_are_not_cut_short() -> None:
    _, references = _notes()
    cut = [f"{where}: [Note: {title}]" for title, where in references if title.endswith(("...", "\u2026"))]
    assert not cut, "note titles cut short with '...'; write each in full:\n" + "\n".join(cut)


def test_note_references_name_existing_notes() -> None:
    titles, references = _notes()
    assert len(titles) > 50  # the headings were found
    dangling = [f"{where}: [Note: {title}]" for title, where in references if title not in titles]
    assert not dangling, "references to notes that do not exist (a title changed?):\n" + "\n".join(dangling)

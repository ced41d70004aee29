"""Every ```python block in the documentation (docs/ and the README) is a complete script; run each one.

(Fragments that are not meant to run on their own are fenced as ```py.)"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import forkserver

DOCS = Path(__file__).parents[1] / "docs"
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

"""Every Python block in the FSDP documentation is a complete script; run each one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[1] / "docs" / "fsdp"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for i, code in enumerate(_BLOCK.findall(page.read_text())):
            found.append((f"{page.name}#{i}", code))
    return found


BLOCKS = _blocks()


def test_every_page_has_a_tested_example() -> None:
    pages = {name.split("#")[0] for name, _ in BLOCKS}
    expected = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages == expected


@pytest.mark.multiprocess
@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_doc_block_runs(tmp_path: Path, name: str, code: str) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = {
        k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "RANK")
    }
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"

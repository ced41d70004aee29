"""No function in src/fullshard longer than ~80 lines: functions that fit on a screen. A function's length runs from its ``def`` line to the last line of its body, its
docstring included; decorators do not count. There is no allow-list: split an offender by
concern (see Trainer.__init__, trainer/loop_settings.py, FitLoop.run_epoch)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "fullshard"
MAX_LINES = 80


def long_functions(root: Path, limit: int) -> list[str]:
    """``file:line name (N lines)`` for each function or method under ``root`` longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_over_80_lines() -> None:
    offenders = long_functions(SRC, MAX_LINES)
    assert not offenders, (
        f"functions longer than {MAX_LINES} lines (def to the end of the body); split them by concern:\n"
        + "\n".join(offenders)
    )


def test_the_scan_counts_from_def_to_the_end_of_the_body(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    (tmp_path / "a.py").write_text(
        f"@decorator\ndef fits():\n{body}\n\n\nclass C:\n    async def too_long(self):\n"
        '        """doc"""\n' + body.replace("    ", "        ") + "\n",
        encoding="utf-8",
    )
    # fits: the def and 79 lines (80; its decorator does not count); too_long: def, docstring, 79
    assert long_functions(tmp_path, MAX_LINES) == [f"{tmp_path.name}/a.py:85 too_long (81 lines)"]


def test_the_scan_reads_the_files_of_src() -> None:
    # with no limit every function shows up, so the scan does reach these files
    files = {line.split(":")[0] for line in long_functions(SRC, 0)}
    assert "fullshard/trainer/trainer.py" in files
    assert "fullshard/trainer/loops/fit_loop.py" in files

"""docs/design.md and src/fullshard/README.md name only files and packages that exist (issue 39).

Every ``.py`` file and every package (``name/``) the two documents mention, in prose, in
backticks or in their pictures, is looked up: a path that starts at the repository's top
(``src/``, ``docs/``, ``tests/``, ...) from there, any other path under ``src/fullshard``, and a
bare file name (``fit_loop.py``) anywhere under ``src/fullshard``. A renamed or deleted file
fails here until the documents follow. A file outside the repository (Lightning's, torch's) is
named in words, never as a path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fullshard"
DOCUMENTS = (ROOT / "docs" / "design.md", SRC / "README.md")

# the repository's own top-level folders: a path starting with one is read from the top
_TOP = ("src/", "docs/", "tests/", "benchmarks/", ".ci/")
# a file (``dir/name.py``, ``name.py``) or a package (``dir/``, ``dir/sub/``): lower-case words
# and slashes, not part of a longer word, a URL (``pytorch/pytorch#1``) or a relative link
_WORD = r"[a-z_][a-z0-9_]*"
_PATH = re.compile(
    rf"(?<![\w./<>-])((?:\.ci/|{_WORD}/)(?:{_WORD}/)*(?:{_WORD}\.(?:py|md))?|{_WORD}\.py)(?![\w/#-])"
)
# placeholders, not files: the directory a checkpoint is saved to, in the checkpoint's picture
_NOT_FILES = frozenset({"path/"})


def mentioned_paths(text: str) -> set[str]:
    """Every file and package path ``text`` mentions (see the module docstring)."""
    return {m.group(1) for m in _PATH.finditer(text)} - _NOT_FILES


def missing_paths(text: str, src: Path = SRC, root: Path = ROOT) -> list[str]:
    """The paths ``text`` mentions that do not exist (``src``: the package; ``root``: the repository)."""
    files = {p.name for p in src.rglob("*.py")}
    missing = []
    for path in sorted(mentioned_paths(text)):
        if path.startswith(_TOP):
            found = (root / path).exists()
        elif "/" in path:
            found = (src / path).exists()
        else:
            found = path in files
        if not found:
            missing.append(path)
    return missing


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_file_and_package_the_document_names_exists(document: Path) -> None:
    missing = missing_paths(document.read_text())
    assert not missing, (
        f"{document.relative_to(ROOT)} names {missing}, which the repository does not hold: write the "
        "path the file has now (under src/fullshard, or from the repository's top for docs/, tests/, ...)"
    )


def unnamed_modules(text: str, src: Path = SRC) -> list[str]:
    """The packages (at any depth) and the top-level modules of ``src`` that ``text`` does not name."""
    named = mentioned_paths(text)
    packages = [
        init.parent.relative_to(src).as_posix() + "/"
        for init in src.rglob("__init__.py")
        if init.parent != src
    ]
    modules = [path.name for path in src.glob("*.py") if path.name != "__init__.py"]
    return sorted(name for name in [*packages, *modules] if name not in named)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_document_names_every_package_and_top_level_module(document: Path) -> None:
    missing = unnamed_modules(document.read_text())
    assert not missing, (
        f"{document.relative_to(ROOT)} does not name {missing}: say where each sits and what it owns "
        "(docs/design.md: the Architecture picture; src/fullshard/README.md: the file map)"
    )


def test_the_design_names_every_module_of_the_checkpoint_package() -> None:
    named = mentioned_paths(DOCUMENTS[0].read_text())
    modules = [
        f"checkpoint/{path.name}" for path in (SRC / "checkpoint").glob("*.py") if path.name != "__init__.py"
    ]
    missing = sorted(module for module in modules if module not in named)
    assert not missing, f"docs/design.md's table of the checkpoint package lacks {missing}"


_LAYER_NAME = re.compile(r"[a-z_]+(?:/|\.py)")


def picture_layers(design: str) -> list[list[str]]:
    """The layers of the Architecture picture, top to bottom: each line that starts with module
    names (``cli/  demos/  serve/``, ``compile.py  policies.py``) gives one layer, its names without
    the ``/`` or ``.py``."""
    section = design[design.index("## Architecture") :]
    picture = section[section.index("```text") : section.index("```\n", section.index("```text") + 7)]
    layers = []
    for line in picture.splitlines()[1:]:
        names = []
        for token in line.split(" ") if line[:1].strip() else []:
            if not token:
                continue
            if not _LAYER_NAME.fullmatch(token):
                break
            names.append(token.removesuffix("/").removesuffix(".py"))
        if names:
            layers.append(names)
    return layers


def test_the_architecture_picture_is_pyproject_layers_contract() -> None:
    # the one layers contract's list (read as text: tomllib is Python 3.11's, the project supports 3.10)
    config = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r'type = "layers"\n(?:[^\n]*\n)*?layers = \[(.*?)\]', config, re.DOTALL)
    assert listed is not None, "pyproject.toml has no layers contract"
    layers = re.findall(r'"([^"]*)"', listed.group(1))
    expected = [[name.strip() for name in layer.split("|")] for layer in layers]
    drawn = picture_layers(DOCUMENTS[0].read_text())
    assert drawn == expected, (
        "docs/design.md's Architecture picture, one line per layer, differs from pyproject.toml's layers "
        f"contract: drawn {drawn}, contract {expected}"
    )


def test_a_missing_file_is_found(tmp_path: Path) -> None:
    src = tmp_path / "src" / "fullshard"
    (src / "checkpoint").mkdir(parents=True)
    (src / "checkpoint" / "engine.py").write_text("")
    (src / "trainer" / "loops").mkdir(parents=True)
    (src / "trainer" / "loops" / "fit_loop.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("")
    text = (
        "`checkpoint/engine.py` writes; `fit_loop.py` and trainer/loops/ run; see docs/design.md and\n"
        "src/fullshard/checkpoint/engine.py. Gone: `checkpoint/planted.py`, (strategies/fsdp3.py),\n"
        "`planted_name.py`, `tuner/`, src/fullshard/nowhere.py, docs/nowhere.md, in ```text\n"
        "cli/  serve/\n```; not paths: pytorch/pytorch#179291, https://x.org/a/b.py, ../../docs/design.md,\n"
        "data-<id>/, gloo / NCCL, and/or.\n"
    )
    assert missing_paths(text, src, tmp_path) == sorted(
        [
            "checkpoint/planted.py",
            "strategies/fsdp3.py",
            "planted_name.py",
            "tuner/",
            "src/fullshard/nowhere.py",
            "docs/nowhere.md",
            "cli/",
            "serve/",
        ]
    )

"""What the scripts in benchmarks/ share: their command line, their section of the docs, tables,
the description of the machine, worker processes and paired timings. Not a benchmark itself.

One way to write a benchmark (``benchmarks/NAME.py``):

- The module docstring starts with the exact command that produces the figures in the docs,
  ``python benchmarks/NAME.py ... --write-docs``, alone on the first line; then a blank line
  and a one-line summary (``--help`` shows it); then what is measured and how.
- ``parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))`` (or
  ``write_docs=None``, with the docstring saying where the figures go instead), then
  ``args = parse_args(parser, argv)``: ``args.command`` is the command as run, for the docs.
- The section is rendered as one string that starts with its heading line
  (``SECTION = "## Title"``) and written with ``write_section(section)``: the lines from that
  heading to the next ``#``/``##`` heading of docs/benchmarks.md are replaced, every other byte
  of the file stays. The heading must be in the file already (add it by hand, in its place,
  the first time). Notes on the figures written by hand go at the end of the section, after a
  line ``HAND_WRITTEN``: a rewrite keeps them (they may then speak of older figures: date
  them). A page where the figures sit between two marker comments instead (see
  docs/compile.md) takes ``write_marked``.
- Every figure in the docs comes from a result file: ``result = run_or_report(args, __file__,
  measure)`` runs ``measure()`` (JSON-able figures) or, with ``--report FILE`` (``make_parser``
  adds it with ``--write-docs``), loads a result saved before without running anything; with
  ``--write-docs`` a run saves ``benchmarks/results/<script>.json`` (the figures, the command
  line, the date, the machine: cores, load average at the start, torch version, git commit).
  The section is rendered by the script's ``render(result)`` from that result alone (never from
  ``today()``, the current arguments or versions: tests/test_benchmark_claims.py re-renders it
  from the saved file and compares with the docs), and names its file (``provenance(result)``).
  A section measured before results were saved carries ``unbacked_mark(date, command)`` at its
  top instead, until it is rerun.
- Workers run in ``subprocess.run(..., env=worker_env(), cwd=REPO)``; tables are built with
  ``table``; ``cores()``, ``cpu_model()``, ``today()`` and ``load_average()`` describe the run;
  ``abba`` and ``rotations`` order paired timings and ``ratio_summary`` reports them.

Only the standard library is imported here: overhead.py's workers measure their start-up from
before ``import torch``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DOCS = REPO / "docs" / "benchmarks.md"
RESULTS = HERE / "results"

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# The command line.


def command_of(doc: str | None) -> str:
    """The command a script's docstring starts with (its first line)."""
    first = (doc or "").lstrip("\n").split("\n", 1)[0].strip()
    if not first.startswith(("python benchmarks/", "benchmarks/.venv-lightning/bin/python benchmarks/")):
        raise ValueError(f"the docstring must start with the command that runs the script, not {first!r}")
    return first


def summary(doc: str | None) -> str:
    """The paragraph after the command: what the script measures, in a sentence or two (without
    the docstring's double backquotes)."""
    paragraphs = [p for p in (doc or "").strip().split("\n\n") if p.strip()]
    return " ".join(paragraphs[1].replace("``", "").split()) if len(paragraphs) > 1 else ""


def heading_target(heading: str, path: Path = DOCS) -> str:
    """Where ``--write-docs`` writes, for its help: the section ``heading`` of ``path``."""
    return f"the section '{heading}' of {_shown(path)}"


def make_parser(
    file: str, doc: str | None, *, write_docs: str | None, report: bool = True
) -> argparse.ArgumentParser:
    """The argument parser of ``benchmarks/<file>``: the usage line shows the command that runs it,
    the description is the docstring's summary. ``write_docs`` says what ``--write-docs``
    rewrites (see ``heading_target``); None for a script that has no section in the docs.
    ``report``: with ``--write-docs``, add ``--report RESULT`` too (see ``run_or_report``)."""
    parser = argparse.ArgumentParser(
        prog=f"python benchmarks/{Path(file).name}", description=summary(doc) or None
    )
    if write_docs is not None:
        parser.add_argument(
            "--write-docs",
            action="store_true",
            help=f"after the run, rewrite {write_docs} (other sections stay as they are), "
            f"and save the figures to {_shown(result_file(file))}",
        )
        if report:
            parser.add_argument(
                "--report",
                type=Path,
                metavar="RESULT",
                help="render a result file saved before (benchmarks/results/*.json) instead of running",
            )
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with ``command``: the command as run (for the docs)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command = " ".join([parser.prog, *(shlex.quote(a) for a in argv)])
    # now, before the benchmark's own work (the rest of the facts: when a result is saved)
    args.facts = {"command": args.command, "date": today(), "load_average_start": round(load_average(), 2)}
    return args


# ---------------------------------------------------------------------------------------------
# Result files: every figure a script writes into the docs, saved with how it was made.

UNBACKED = (
    "**Figures not yet backed by a saved result** (measured {date} before results were saved; "
    "rerun: `{command}`)."
)


def unbacked_mark(date: str, command: str) -> str:
    """The line at the top of a section (or marked block) whose figures were measured before
    scripts saved their results: it stays until the command is rerun and rewrites the section."""
    return UNBACKED.format(date=date, command=command)


def result_file(script: str) -> Path:
    """``benchmarks/results/<script>.json`` for ``script`` (a path or a name)."""
    return RESULTS / f"{Path(script).stem}.json"


def git_commit() -> str:
    """The checkout's commit, ``+changes`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def torch_version() -> str:
    """The installed torch's version, without importing it (overhead.py times its imports)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


def run_facts(args: argparse.Namespace) -> dict[str, Any]:
    """What a result file says of its run: the command, date and load average ``parse_args``
    took at the start, and the machine."""
    return {
        **args.facts,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "torch": torch_version(),
        "python": platform.python_version(),
        "commit": git_commit(),
    }


def _arguments(args: argparse.Namespace) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, value in vars(args).items():
        if key in ("command", "facts", "write_docs", "report"):
            continue
        kept[key] = str(value) if isinstance(value, Path) else value
    return json.loads(json.dumps(kept, default=str))


def save_result(
    args: argparse.Namespace, script: str, figures: Any, path: Path | None = None
) -> dict[str, Any]:
    """Write ``figures`` with the run's facts and arguments to ``path`` (default
    ``benchmarks/results/<script>.json``); return the result as ``load_result`` reads it."""
    path = path or result_file(script)
    result = {**run_facts(args), "arguments": _arguments(args), "figures": figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {_shown(path)}")
    return {**result, "result_file": _shown(path)}


def load_result(path: Path) -> dict[str, Any]:
    """A saved result, with ``result_file``: its path as the docs name it."""
    result: dict[str, Any] = json.loads(Path(path).read_text())
    result["result_file"] = _shown(Path(path))
    return result


def run_or_report(args: argparse.Namespace, script: str, measure: Callable[[], Any]) -> dict[str, Any]:
    """The result a script renders: with ``--report FILE`` the one saved there (nothing runs);
    otherwise ``measure()``'s figures, saved to ``benchmarks/results/<script>.json`` when
    ``--write-docs`` is given (a run without it leaves the saved result alone)."""
    if getattr(args, "report", None):
        return load_result(args.report)
    figures = measure()
    if getattr(args, "write_docs", False):
        return save_result(args, script, figures)
    return {
        **run_facts(args),
        "arguments": _arguments(args),
        "figures": figures,
        "result_file": "(not saved)",
    }


def provenance(result: dict[str, Any], script: str, timed: bool = True) -> str:
    """One paragraph naming the result file of ``script``'s section and how it was made;
    ``timed``: the run timed something (a loaded machine is then said to have been loaded)."""
    load = result["load_average_start"]
    cores_ = result["cores"]
    busy = (
        f"; the machine was shared with other work (load average {load:.2f} at the start on {cores_} cores):"
        " its times are slower and noisier than an idle machine's; ratios paired within the job are the"
        " figures to compare"
        if load >= 0.5 and timed
        else f", load average {load:.2f} at the start"
    )
    return wrap(
        f"Result file: `{result['result_file']}`, made by `{result['command']}` on {result['date']}"
        f" ({cores_} cores, {result['machine']}, {result['cpu']}; torch {result['torch']}; commit"
        f" {result['commit'][:12]}{'+changes' if result['commit'].endswith('+changes') else ''}){busy}."
        f" `python benchmarks/{Path(script).stem}.py --report {result['result_file']}"
        " --write-docs` renders this section from it again."
    )


# ---------------------------------------------------------------------------------------------
# The docs: a script's section of docs/benchmarks.md, or a marked block of another page.


HAND_WRITTEN = "<!-- written by hand: --write-docs keeps what follows, to the next section -->"


class SectionError(ValueError):
    """The docs do not have the place a benchmark writes to (exactly once)."""


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _heading_lines(lines: list[str]) -> Iterator[tuple[int, str]]:
    """``(index, line)`` of every line outside fenced code blocks."""
    fence = ""
    for index, line in enumerate(lines):
        stripped = line.lstrip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            if not fence:
                fence = marker
            elif marker == fence:
                fence = ""
            continue
        if not fence:
            yield index, line


def _locate(text: str, heading: str, name: str) -> tuple[list[str], int, int, int]:
    """(lines, start, kept, end): the section ``heading`` is ``lines[start:end]``, its
    hand-written notes ``lines[kept:end]`` (``kept == end``: none)."""
    lines = text.splitlines(keepends=True)
    visible = list(_heading_lines(lines))
    starts = [i for i, line in visible if line.rstrip() == heading]
    if len(starts) != 1:
        found = [line.rstrip() for _, line in visible if line.startswith("## ")]
        if not starts:
            raise SectionError(
                f"{name} has no line {heading!r} to replace (its sections: {', '.join(found) or 'none'}); "
                f"add that heading where the section belongs, then run again"
            )
        raise SectionError(f"{name} has {len(starts)} lines {heading!r}; keep one")
    start = starts[0]
    end = next((i for i, line in visible if i > start and line.startswith(("# ", "## "))), len(lines))
    kept = next((i for i, line in visible if start < i < end and line.strip() == HAND_WRITTEN), end)
    return lines, start, kept, end


def section_of(text: str, heading: str, name: str = "the docs") -> str:
    """The section ``heading`` of ``text`` as a script writes it: from the heading line to its
    hand-written notes or the next section, without the blank lines at its end."""
    lines, start, kept, _ = _locate(text, heading, name)
    return "".join(lines[start:kept]).rstrip("\n") + "\n"


def replace_section(text: str, section: str, name: str = "the docs") -> str:
    """``text`` with the section that starts with ``section``'s heading line replaced by ``section``.

    A section runs from its heading line (``## Title``) to the line before the next ``#`` or
    ``##`` heading outside code blocks, or to the end; ``###`` subsections belong to it. One
    blank line separates the new section from the next heading; every byte before the heading
    and from the next heading on stays. Where the old section has a line ``HAND_WRITTEN``, that
    line and what follows it in the section (notes on the figures, written by hand) stay too,
    after the new section. ``name`` names ``text`` in errors."""
    heading = section.split("\n", 1)[0].rstrip()
    if not heading.startswith("## "):
        raise SectionError(f"a section starts with its '## ' heading line, not {heading!r}")
    if HAND_WRITTEN in section:
        raise SectionError(f"the new section {heading!r} has the line {HAND_WRITTEN!r}; only the docs do")
    lines, start, kept, end = _locate(text, heading, name)
    new = section.rstrip("\n") + "\n"
    rest = "".join(lines[end:])
    if kept < end:  # the notes as they are, with the blank lines that end them
        return "".join(lines[:start]) + new + "\n" + "".join(lines[kept:])
    return "".join(lines[:start]) + new + ("\n" + rest if rest else "")


def replace_marked(text: str, start: str, end: str, body: str, name: str = "the docs") -> str:
    """``text`` with what lies between the ``start`` and ``end`` markers replaced by ``body``
    on lines of its own: ``start``, a line break, ``body`` without the line breaks it starts or
    ends with, a line break, ``end``."""
    for marker in (start, end):
        if text.count(marker) != 1:
            raise SectionError(
                f"{name} has the marker {marker!r} {text.count(marker)} times; it needs it once, "
                f"with {start!r} before {end!r}"
            )
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    if end in head:
        raise SectionError(f"{name} has {end!r} before {start!r}")
    body = body.strip("\n")
    return f"{head}{start}\n{body}\n{end}{tail}"


def write_section(section: str, path: Path = DOCS) -> None:
    """Replace ``section``'s own section of ``path`` (docs/benchmarks.md), read just before."""
    _write(path, replace_section(_read(path), section, _shown(path)))


def write_marked(body: str, path: Path, start: str, end: str) -> None:
    """Replace what lies between the markers ``start`` and ``end`` of ``path``."""
    _write(path, replace_marked(_read(path), start, end, body, _shown(path)))


def markers(script: str) -> tuple[str, str]:
    """The comments around a script's block on a page other than docs/benchmarks.md."""
    return f"<!-- benchmarks/{script}: start -->", f"<!-- benchmarks/{script}: end -->"


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # no newline translation: the rest stays byte for byte


def _write(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_bytes(text.encode("utf-8"))
    scratch.replace(path)  # whole or not at all
    print(f"updated {_shown(path)}")


# ---------------------------------------------------------------------------------------------
# Tables and the description of the run.


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str | None = None) -> str:
    """A markdown table; ``align`` has one letter a column, ``l`` or ``r`` (default: the first
    column left, the others right). An empty cell is written ``| |``."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"{len(header)} columns, {len(align)} alignments")

    def line(cells: Sequence[str]) -> str:
        return "|" + "".join(f" {cell} |" if cell else " |" for cell in cells)

    rule = line(["---:" if a == "r" else "---" for a in align])
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def wrap(text: str, bullet: bool = False) -> str:
    """``text`` as a markdown paragraph of lines of at most 100 characters; a list item when
    ``bullet``."""
    if bullet:
        return textwrap.fill(
            text, width=100, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False
        )
    return textwrap.fill(text, width=100, break_on_hyphens=False)


def today() -> str:
    return datetime.date.today().isoformat()


def cores() -> str:
    """``2 cores (x86_64)``."""
    return f"{os.cpu_count()} cores ({platform.machine()})"


def cpu_model() -> str:
    """The processor's name, from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> float:
    """The 1-minute load average: above the benchmark's own processes, other work competed."""
    return os.getloadavg()[0]


def rss_kib() -> int:
    """This process's resident set size now, in KiB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS missing from /proc/self/status (the benchmark needs Linux)")


def peak_rss_kib() -> int:
    """This process's peak resident set size so far, in KiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ---------------------------------------------------------------------------------------------
# Worker processes and paired timings.

JOB_VARIABLES = frozenset(
    {"LOCAL_RANK", "RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
)


def worker_env(threads: int = 1, **extra: str) -> dict[str, str]:
    """The environment of a worker command: this one without a job's variables (a worker must
    not think it is rank 1 of the job the benchmark was started from), ``threads`` intra-op
    threads a process (2 processes on 2 cores: 1 each), unbuffered output, and ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in JOB_VARIABLES and not k.startswith(("TORCHELASTIC_", "SLURM_", "FULLSHARD_"))
    }
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def rotations(items: Sequence[T], rounds: int) -> Iterator[list[T]]:
    """``items`` in a new order each round, rotated by one, so that each comes first as often
    as the others (a machine that drifts favours no one)."""
    for index in range(rounds):
        shift = index % len(items)
        yield [*items[shift:], *items[:shift]]


def abba(pairs: int, first: Callable[[], float], second: Callable[[], float]) -> list[tuple[float, float]]:
    """``pairs`` pairs of (``first()``, ``second()``), run by turns, ``first`` first in even
    pairs and ``second`` first in odd ones: neighbours see about the same load, so the ratio
    within a pair is less noisy than the ratio of separate runs."""
    results = []
    for index in range(pairs):
        if index % 2 == 0:
            a = first()
            b = second()
        else:
            b = second()
            a = first()
        results.append((a, b))
    return results


def ratio_summary(ratios: Sequence[float], what: str = "pairs", digits: int = 3) -> str:
    """``1.045x (median of 12 pairs; 0.835x to 1.136x)``; ``not measured`` without ratios."""
    if not ratios:
        return "not measured"
    median = statistics.median(ratios)
    return (
        f"{median:.{digits}f}x (median of {len(ratios)} {what}; "
        f"{min(ratios):.{digits}f}x to {max(ratios):.{digits}f}x)"
    )

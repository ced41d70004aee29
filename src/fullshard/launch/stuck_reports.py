"""What a stuck-rank report says: where a thread is, each rank's heartbeat, which ranks are
behind, and the texts a stuck rank and its peers write (see [Note: stuck ranks] in
:mod:`fullshard.launch.stuck_ranks`, which runs the watchdog that uses them)."""

from __future__ import annotations

import importlib.util
import json
import os
import sysconfig
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

STUCK_EXIT_CODE = 1
_STAGE_NAMES = {"train": "training", "validate": "validation", "test": "test", "predict": "prediction"}
_TORCH_SPEC = importlib.util.find_spec("torch")  # found, not imported: launch/ does not need torch
_TORCH_DIR = (
    Path(_TORCH_SPEC.origin).parent
    if _TORCH_SPEC is not None and _TORCH_SPEC.origin
    else Path("/nonexistent")
)
_FULLSHARD_DIR = Path(__file__).parent.parent
_STDLIB_DIRS = tuple(Path(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
_DEBUGGER_FILES = ("bdb.py", "pdb.py")


def _inside(filename: str, directory: Path) -> bool:
    return filename.startswith(str(directory) + os.sep)


def _in_stdlib(filename: str) -> bool:
    return "site-packages" not in filename and any(_inside(filename, d) for d in _STDLIB_DIRS)


def _short_path(filename: str) -> str:
    for directory in (_TORCH_DIR, _FULLSHARD_DIR):
        if _inside(filename, directory):
            return os.path.relpath(filename, directory.parent)
    return filename


def _describe_frame(frame: FrameType) -> str:
    return f"{frame.f_code.co_name} ({_short_path(frame.f_code.co_filename)}:{frame.f_lineno})"


def _frames(innermost: FrameType) -> list[FrameType]:
    """``innermost`` and its callers, innermost first."""
    frames: list[FrameType] = []
    frame: FrameType | None = innermost
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def locate(innermost: FrameType | None) -> tuple[str, bool]:
    """Where a thread is, in one line, and whether it is inside torch (waiting in a collective,
    most likely).

    The innermost frame is named first. When it is in torch or the standard library (a lock's
    ``wait``), its innermost caller outside both follows: the user's code, or fullshard's loop.
    Whether the thread is inside torch is decided by its innermost frame outside the standard
    library.
    """
    if innermost is None:
        return "nowhere in Python (no frame)", False
    frames = _frames(innermost)
    own = [f for f in frames if not _in_stdlib(f.f_code.co_filename)]
    in_torch = bool(own) and _inside(own[0].f_code.co_filename, _TORCH_DIR)
    where = _describe_frame(innermost)
    callers = [f for f in own if not _inside(f.f_code.co_filename, _TORCH_DIR)]
    if callers and callers[0] is not innermost:
        where += f", called from {_describe_frame(callers[0])}"
    return where, in_torch


def in_debugger(innermost: FrameType | None) -> bool:
    """Whether a thread is stopped in pdb or a debugpy/pydevd debugger."""
    if innermost is None:
        return False
    return any(
        os.path.basename(f.f_code.co_filename) in _DEBUGGER_FILES or "pydevd" in f.f_code.co_filename
        for f in _frames(innermost)
    )


def format_threads(
    frames: Mapping[int, FrameType], names: Mapping[int, str], main: int | None, skip: int | None
) -> str:
    """The stack of every thread in ``frames`` (the ``main`` one first, ``skip`` left out), most
    recent call last, as ``traceback`` prints them."""
    order = sorted(frames, key=lambda ident: (ident != main, names.get(ident, "")))
    blocks = []
    for ident in order:
        if ident == skip:
            continue
        label = "main thread, the one running the loop" if ident == main else "thread"
        stack = "".join(traceback.format_stack(frames[ident]))
        blocks.append(f"{label} {names.get(ident, '?')!r} (most recent call last):\n{stack}")
    return "".join(blocks)


# ---------------------------------------------------------------------------------------------
# Heartbeats and who is behind


@dataclass(frozen=True)
class Heartbeat:
    """What one rank publishes about itself."""

    rank: int
    pid: int
    host: str
    seq: int  # publications so far: a heartbeat whose seq does not move comes from a silent rank
    kicks: int  # batches begun in this process
    stage: str | None  # the stage of the last batch begun ('train', 'validate', ...), None before any
    batch: int  # its batch index
    idle: float  # seconds since that batch began, when published
    state: str  # 'running', 'paused' (checkpoint I/O), 'resting' (outside fit/validate/...), 'stuck' (reported, ending)
    where: str  # the main thread's innermost frame (see :func:`locate`)
    in_torch: bool  # that frame is inside torch: most likely waiting in a collective

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Heartbeat:
        return cls(**json.loads(text))

    def progress(self) -> str:
        """E.g. ``"training batch_idx=2, 3.1 s ago"``."""
        if self.stage is None:
            return "no batch begun yet"
        return (
            f"{_STAGE_NAMES.get(self.stage, self.stage)} batch_idx={self.batch} began {self.idle:.1f} s ago"
        )

    def describe(self) -> str:
        state = {
            "paused": ", reading or writing a checkpoint",
            "resting": ", outside fit/validate/test/predict",
            "stuck": ", reported itself stuck and is ending",
        }
        return (
            f"rank {self.rank} (pid {self.pid} on {self.host}): {self.progress()}{state.get(self.state, '')};"
            f" in {self.where}"
        )


@dataclass(frozen=True)
class Verdict:
    """Who is behind, from two reads of every rank's heartbeat."""

    behind: list[int]
    silent: list[int]  # ranks among ``behind`` whose heartbeat did not move (or never came)


def find_behind(
    own_rank: int, first: Mapping[int, Heartbeat | None], second: Mapping[int, Heartbeat | None]
) -> Verdict:
    """The ranks holding the job back; see [Note: stuck ranks]. ``first`` and ``second`` hold
    every rank's heartbeat (None where there is none), read ``2 * heartbeat`` apart."""
    silent = []
    for rank, beat in second.items():
        before = first.get(rank)
        if rank != own_rank and (beat is None or (before is not None and before.seq == beat.seq)):
            silent.append(rank)
    if silent:
        return Verdict(behind=sorted(silent), silent=sorted(silent))
    beats = {rank: beat for rank, beat in second.items() if beat is not None}
    if not beats:  # not even this rank's own: nothing to compare
        return Verdict(behind=[own_rank], silent=[])
    fewest = min(beat.kicks for beat in beats.values())
    behind = [rank for rank, beat in beats.items() if beat.kicks == fewest]
    outside_torch = [rank for rank in behind if not beats[rank].in_torch]
    return Verdict(behind=sorted(outside_torch or behind), silent=[])


def ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def reported_stuck(ranks: list[int]) -> str:
    return (
        f"{ranks_text(ranks)} reported "
        + ("itself" if len(ranks) == 1 else "themselves")
        + " stuck and ended"
    )


def seconds_text(value: float) -> str:
    return f"{value:g} s"


def stuck_report(own: Heartbeat, others: list[Heartbeat], timeout: float, stacks: str) -> str:
    """What a stuck rank writes before it ends."""
    lines = [
        f"fullshard: rank {own.rank} (pid {own.pid} on {own.host}) is stuck: its {own.progress()} and it"
        f" has made no progress since (stuck_rank_timeout={seconds_text(timeout)}). Where rank {own.rank} is:",
        stacks.rstrip("\n"),
    ]
    if others:
        lines.append("fullshard: the other ranks:")
        lines += [f"  {beat.describe()}" for beat in others]
    lines.append(
        f"fullshard: ending rank {own.rank} (exit code {STUCK_EXIT_CODE}) so that the job ends now instead of"
        " waiting in collectives until the process group's timeout. If this rank was busy on purpose (a long"
        " hook between two batches), raise stuck_rank_timeout, or pass stuck_rank_timeout=None to turn the"
        " check off (docs/launching.md, 'Stuck ranks')."
    )
    return "\n".join(lines) + "\n"


def waiting_report(
    own: Heartbeat, verdict: Verdict, beats: Mapping[int, Heartbeat | None], wait: float
) -> str:
    """What a rank that waits for a stuck peer writes (it ends itself once that peer ended, or
    ``wait`` seconds later)."""
    behind = verdict.behind
    lines = [
        f"fullshard: rank {own.rank} (pid {own.pid} on {own.host}) has made no progress: its {own.progress()},"
        f" and it is in {own.where}. It waits for {ranks_text(behind)}, which "
        + ("is" if len(behind) == 1 else "are")
        + " behind:"
    ]
    for rank in behind:
        beat = beats.get(rank)
        if rank in verdict.silent:
            last = f"; last heard: {beat.describe()}" if beat is not None else "; it never published one"
            lines.append(
                f"  rank {rank} has published no heartbeat for a while: its process is gone, stopped, or holds"
                f" the GIL in native code, so it cannot report where it is{last}"
            )
        elif beat is not None:
            lines.append(f"  {beat.describe()}")
    lines.append(
        f"fullshard: rank {own.rank} ends itself once {ranks_text(behind)} ended, or in {seconds_text(wait)} unless"
        " the job ends first (a stuck rank reports itself and ends, and the launcher then ends the others)."
    )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The watchdog

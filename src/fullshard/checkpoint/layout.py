"""Where a checkpoint's files live, how its completeness is recorded, and how it is checked.

A **full** checkpoint is one file written by ``torch.save`` (a zip archive whose entries carry
CRC-32 checksums computed while writing).

A **sharded** checkpoint is a directory::

    path/
      fullshard-checkpoint.json    the commit record, written last and atomically
      data-<id>/                   one save's files
        .metadata                  torch.distributed.checkpoint's index of the tensors
        __<rank>_<n>.distcp        tensor data written by each rank
        __<rank>.checksums.json    each rank's record: size and CRC-32 of its .distcp files
        meta.pt                    everything else (loops, schedulers, RNG states, ...)

[Note: directory commit]
A save writes a fresh ``data-<id>`` directory. Each rank fsyncs its tensor files and writes,
beside them, its rank record (their sizes and CRC-32s, fsynced); the ranks then agree that all
succeeded (one all-reduce of a flag: a fixed size per rank, whatever the number of files), and
rank 0 writes ``meta.pt``, fsyncs it, ``.metadata`` and the directory, and atomically replaces
the commit record, which names that directory, the number of rank records, and the size and
CRC-32 of the two files rank 0 wrote (``files``). Nothing in the commit grows with the number of
ranks but that one flag: no rank's checksums travel to rank 0. Until the rename the record still
names the previous save's directory, which was never touched: a save killed at any moment leaves
the previous checkpoint intact. Directories no record names are leftovers of interrupted saves;
the next save removes them.

Format 1 (fullshard before rank records, still read): the commit record's ``files`` lists every
file of the data directory with its size and CRC-32, gathered on rank 0 at the commit;
``rank_records`` is absent (read as 0). Format 2 is format 3 without the save identity below.

[Note: one save, one identity]
A save's identity is the name of its data directory (``data-<12 hex digits>``, random) and its
global step. Format 3 writes it into every file that describes the save: the commit record
(``data``, ``global_step``), each rank record (``save``, ``step``, under the record's own CRC-32),
DCP's ``.metadata`` (``storage_meta.save_id``) and ``meta.pt`` (``fullshard_save``); the tensor
files are bound to it through the CRC-32s of the rank record that lists them. A load compares
each with the commit record before it reads a tensor, so the files of two saves (a directory
half-synced from another run, a rank's shard and record copied from another checkpoint of the
same model) never load together, whatever their own checksums say.

[Note: checksums checked on load]
Every load checks CRC-32s before it changes anything (``verify=False`` turns it off):

- sharded: rank 0 checks the small files it parses itself (``.metadata``, ``meta.pt``), listed in
  the commit record, before reading them. Each rank then reads its share of the rank records
  (record ``i`` to rank ``i % world size``: at the world size that wrote them, its own, whose
  files it reads its shards from) and checks the files each lists: there, of the recorded size,
  and (verifying) of the recorded CRC-32; a rank record carries a CRC-32 of its own content.
  The ranks agree whether all is well (one all-reduce of a flag) and, only when not, exchange
  what they found, so every rank raises the same error naming the files. Format 1 records: the
  tensor files are split among the ranks by size (:func:`assign_shares`).
- full: the file is the ``torch.save`` zip archive, whose entries carry the CRC-32 that
  ``torch.save`` computed while writing (``torch.load`` never checks them). No sidecar file and
  no new entry: the file stays what plain ``torch.load`` and Lightning read, and files written
  before fullshard checked anything are verified too. Rank 0 checks the pickle entry before
  ``torch.load`` unpickles it and the tensor entries in a thread while ``torch.load`` reads
  them (:func:`archive_entries`, :func:`entry_problems`). Entries recorded with CRC-32 0 (torch's
  ``torch.utils.serialization.config.save.compute_crc32 = False``) and files that are no zip
  archive (torch's legacy format) carry nothing to check against and load unverified.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from fullshard.checkpoint.links import LINK_OUTSIDE, link_problem
from fullshard.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
)

RECORD_NAME = "fullshard-checkpoint.json"
DATA_PREFIX = "data-"
META_NAME = "meta.pt"
# 3: the save's identity in every record ([Note: one save, one identity]); 2: rank records beside the
# shards; 1: every file's checksum in the commit record
FORMAT_VERSION = 3
RANK_RECORD_SUFFIX = ".checksums.json"
# the files of a sharded checkpoint rank 0 parses itself, and so checksums before reading them
PARSED_BY_RANK0 = (".metadata", META_NAME)
Files = dict[str, dict[str, int]]  # file name -> {"size": bytes, "crc32": checksum}
CHUNK = 2**20
SHARD_FILE = re.compile(r"__(\d+)_\d+\.distcp")  # the tensor file a rank wrote (DCP's FileSystemWriter)


def crc32_of(path: Path) -> int:
    """CRC-32 of a file's bytes (about 3 GB/s with zlib)."""
    with open(path, "rb", buffering=0) as f:
        return crc32_of_range(f, bytearray(CHUNK), None)


def crc32_of_range(f: Any, buffer: bytearray, size: int | None) -> int:
    """CRC-32 of the next ``size`` bytes of the unbuffered file ``f`` (all the rest: None)."""
    # One reused buffer: a fresh bytes object per read is a fresh mapping, page-faulted in, under
    # FSDP's fixed mmap threshold (see [Note: CPU memory under FSDP]); that halved the speed.
    view = memoryview(buffer)
    crc = 0
    left = size
    while left is None or left > 0:
        n = f.readinto(view if left is None or left >= len(buffer) else view[:left])
        if not n:
            break
        crc = zlib.crc32(view[:n], crc)
        if left is not None:
            left -= n
    return crc


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class CommitRecord:
    """What a sharded checkpoint's ``fullshard-checkpoint.json`` holds (see [Note: directory commit]).

    ``files``: the size and CRC-32 of the files rank 0 wrote (format 1: of every file);
    ``rank_records``: how many rank records the data directory holds (format 1: 0, none).
    """

    data: str
    files: Files
    world_size: int
    strategy: str
    epoch: int
    global_step: int
    fullshard_version: str
    format_version: int = FORMAT_VERSION
    rank_records: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, int] | None:
        """The save's identity (its data directory's name and its step), which every file of a
        format 3 checkpoint carries ([Note: one save, one identity]); None for older formats."""
        return (self.data, self.global_step) if self.format_version >= 3 else None

    @property
    def save_id(self) -> str | None:
        """The save's id (its data directory's name) where the checkpoint's files carry it (format 3)."""
        return self.data if self.format_version >= 3 else None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True)

    @classmethod
    def read(cls, directory: Path) -> CommitRecord:
        """Parse the record of ``directory``, checking every field's type.

        Raises:
            CorruptCheckpointError: the record exists but is no JSON object, lacks a field, has a
                field of the wrong type, or names a file outside its data directory.
            CheckpointError: the record was written by a newer fullshard (a later format).
        """
        record = directory / RECORD_NAME
        problem = link_problem(directory, RECORD_NAME)
        if problem is not None:
            raise damaged_sharded(directory, [problem])
        try:
            raw = json.loads(record.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise _damaged_record(record, f"it is not valid JSON: {err}") from err
        problem = _record_problem(raw)
        if problem is not None:
            raise _damaged_record(record, problem)
        if raw["format_version"] > FORMAT_VERSION:
            raise CheckpointError(
                f"The commit record {str(record)!r} has format version {raw['format_version']}; this fullshard "
                f"reads format {FORMAT_VERSION} and older. Load the checkpoint with the fullshard version that "
                f"wrote it ({raw['fullshard_version']!r}) or a newer one."
            )
        known = {f.name for f in fields(cls)}
        parsed = cls(**{k: v for k, v in raw.items() if k in known})  # later fields of format 1: ignored
        problem = _count_problem(directory / parsed.data, parsed.rank_records)
        if problem is not None:
            raise _damaged_record(record, problem)
        return parsed


def _count_problem(data: Path, rank_records: int) -> str | None:
    """A record count the data directory cannot hold (each rank record is a file of it): checked
    before anything loops over the ranks, so that a forged count ends at once, not after 10**9
    reads."""
    if not rank_records:
        return None
    try:
        held = sum(1 for _ in os.scandir(data))
    except OSError:
        held = 0
    if rank_records > held:
        return (
            f"field 'rank_records' is {rank_records}, but its data directory {data.name} holds "
            f"{held} file(s), so it cannot hold that many rank records"
        )
    return None


# the commit record's fields, their JSON types, and how to say them
_RECORD_FIELDS: dict[str, tuple[type, str]] = {
    "data": (str, "a string"),
    "files": (dict, "an object"),
    "world_size": (int, "an integer"),
    "strategy": (str, "a string"),
    "epoch": (int, "an integer"),
    "global_step": (int, "an integer"),
    "fullshard_version": (str, "a string"),
    "format_version": (int, "an integer"),
}


def _plain_name(name: object) -> bool:
    """A file or directory name without a path in it (the record must not lead outside the checkpoint)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _record_problem(raw: object) -> str | None:
    """What is wrong with a parsed commit record, or None."""
    if not isinstance(raw, dict):
        return f"it holds a JSON {type(raw).__name__}, not an object"
    missing = [name for name in _RECORD_FIELDS if name not in raw]
    if missing:
        return f"it lacks the field(s) {', '.join(map(repr, missing))}"
    for name, (kind, said) in _RECORD_FIELDS.items():
        value = raw[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"field {name!r} is {json.dumps(value)[:40]}, not {said}"
    if not _plain_name(raw["data"]) or not raw["data"].startswith(DATA_PREFIX):
        return f"field 'data' is {raw['data']!r}, not the name of a {DATA_PREFIX}* directory"
    if raw["world_size"] < 1:
        return f"field 'world_size' is {raw['world_size']}, not a number of processes (1 or more)"
    if raw["format_version"] >= 2:
        count = raw.get("rank_records")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return f"field 'rank_records' is {json.dumps(count)[:40]}, not a number of ranks (1 or more)"
        if count != raw["world_size"]:
            return (
                f"field 'rank_records' is {count}, but the checkpoint was written by {raw['world_size']} "
                "process(es) (field 'world_size'), each of which writes one"
            )
    if "extra" in raw and not isinstance(raw["extra"], dict):
        return f"field 'extra' is {json.dumps(raw['extra'])[:40]}, not an object"
    problem = _files_problem(raw["files"])
    unlisted = [name for name in PARSED_BY_RANK0 if name not in raw["files"]]
    if problem is None and unlisted:
        problem = f"'files' does not list {' or '.join(unlisted)}, which every sharded save writes"
    return problem


def _files_problem(files: Mapping[str, Any]) -> str | None:
    """What is wrong with a ``files`` map (of a commit record or a rank record), or None."""
    for name, info in files.items():
        if not _plain_name(name):
            return f"'files' names {name!r}, which is not a file name"
        if (
            not isinstance(info, dict)
            or not all(
                isinstance(info.get(k), int) and not isinstance(info.get(k), bool) for k in ("size", "crc32")
            )
            or info["size"] < 0
        ):
            return f'\'files\' entry {name!r} is {json.dumps(info)[:60]}, not {{"size": bytes, "crc32": checksum}}'
    return None


def _damaged_record(record: Path, problem: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"The commit record {str(record)!r} is damaged: {problem}. Without it the checkpoint's files cannot be "
        "checked, so it cannot be trusted: resume from an earlier checkpoint."
    )


Format = Literal["full", "sharded"]


def detect_format(path: str | Path) -> Format:
    """``"full"`` for a checkpoint file, ``"sharded"`` for a committed checkpoint directory.

    Raises:
        CheckpointNotFoundError: nothing is at ``path``, or an empty / unrelated directory.
        IncompleteCheckpointError: a directory whose save was interrupted before its commit.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(
            f"No checkpoint at {str(path)!r}: the path does not exist. Check the path, or pass "
            "ckpt_path='last' to resume from the newest checkpoint ModelCheckpoint wrote."
        )
    if path.is_file():
        return "full"
    if not path.is_dir():
        raise CorruptCheckpointError(
            f"{str(path)!r} {file_kind(path)}: a checkpoint is a regular file or a directory. Pass the path of one."
        )
    if (path / RECORD_NAME).is_file():
        return "sharded"
    entries = [p.name for p in path.iterdir()]
    if any(name.startswith(DATA_PREFIX) for name in entries):
        raise IncompleteCheckpointError(
            f"The checkpoint directory {str(path)!r} was never completed: its save was interrupted before "
            "the commit record was written. Resume from an earlier checkpoint; the next save to this path "
            "cleans it up."
        )
    if ".metadata" in entries and META_NAME in entries:
        raise CheckpointError(
            f"{str(path)!r} looks like a sharded checkpoint written by Lightning's FSDPStrategy (a "
            f"torch.distributed.checkpoint directory with {META_NAME}, but no {RECORD_NAME}). Turn it into "
            "one file with Lightning's `python -m lightning.pytorch.utilities.consolidate_checkpoint "
            f"{path}` and pass that file: fullshard reads Lightning's single-file checkpoints."
        )
    if ".metadata" in entries:
        raise CheckpointError(
            f"{str(path)!r} is a torch.distributed.checkpoint directory, but not one fullshard wrote (it has no "
            f"{RECORD_NAME}). Load it with torch.distributed.checkpoint.load, or re-save it with fullshard."
        )
    raise CheckpointNotFoundError(
        f"{str(path)!r} is a directory that holds no checkpoint"
        + (" (it is empty)." if not entries else f" (found {', '.join(sorted(entries)[:5])}).")
        + " Pass a checkpoint file or a directory written by Trainer.save_checkpoint()."
    )


def file_problems(data: Path, files: Mapping[str, Mapping[str, int]], verify: bool) -> list[str]:
    """What is wrong with each of ``files`` (name -> recorded size and CRC-32) in the directory
    ``data``: missing, another size, or (``verify``) another CRC-32. Never raises: a file that
    cannot be read is a problem too."""
    problems = []
    buffer = bytearray(CHUNK) if verify else bytearray()
    for name, info in sorted(files.items()):
        file = data / name
        link = link_problem(data.parent, f"{data.name}/{name}")
        if link is not None:
            problems.append(link)
            continue
        try:
            found = file_kind(file)
            if found is not None:
                problems.append(f"{name} {found}")
                continue
            size = file.stat().st_size
            if size != info["size"]:
                problems.append(f"{name} has {size} bytes, {info['size']} were written")
            elif verify:
                with open(file, "rb", buffering=0) as f:
                    if crc32_of_range(f, buffer, None) != info["crc32"]:
                        problems.append(
                            f"{name} fails its CRC-32 check (its bytes changed after it was written)"
                        )
        except OSError as err:
            problems.append(f"{name} cannot be read ({type(err).__name__}: {err})")
    return problems


def file_kind(file: Path) -> str | None:
    """None for a regular file (a symbolic link to one included: whether a link may be followed is
    :func:`link_problem`'s to say); otherwise what it is, said as
    the end of a sentence. A checkpoint is read only from regular files: reading a FIFO blocks
    forever, a device never ends. Never raises."""
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        return "is missing"
    except OSError as err:
        return f"cannot be read ({type(err).__name__}: {err})"
    if stat.S_ISREG(mode):
        return None
    kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
    return f"is {kind}, not a regular file"


UNVERIFIED_HINT = (
    "To load it regardless, damaged bytes and all (to salvage what it holds), turn the check off: "
    "fit/validate/test/predict(..., ckpt_verify=False), or Strategy.load_checkpoint(..., verify=False)."
)


def damaged_sharded(directory: Path, problems: Sequence[str], hint: str = "") -> CorruptCheckpointError:
    """The error for a sharded checkpoint whose files have ``problems`` (each said once)."""
    problems = list(dict.fromkeys(problems))  # a data directory linked outside: once, not per file
    links = all(LINK_OUTSIDE in p for p in problems)  # no damage: a hint to read damaged bytes is no help
    hint, said = ("", "reads outside its directory") if links else (hint, "is damaged")
    return CorruptCheckpointError(
        f"The sharded checkpoint {str(directory)!r} {said}: {'; '.join(problems)}. Nothing was loaded. "
        "Resume from an earlier checkpoint." + (f" {hint}" if hint else "")
    )


def check_sharded_files(directory: Path, record: CommitRecord, verify: bool, hint: str = "") -> None:
    """Check every file of the checkpoint, in this process: each the record lists, and (format 2)
    each rank record and every file it lists: present, the recorded size, and (``verify``) CRC-32.

    Raises:
        CorruptCheckpointError: a file is missing, truncated or (``verify``) altered, or a rank
            record is missing or damaged; ``hint`` ends its message.
    """
    data = directory / record.data
    problems = file_problems(data, record.files, verify)
    problems += rank_records_problems(data, range(record.rank_records), verify, record.identity)
    if problems:
        raise damaged_sharded(directory, problems, hint if verify else "")


# ------------------------------------------------------------------------------ rank records
def rank_record_name(rank: int) -> str:
    """The file name of the record rank ``rank`` writes beside its tensor files."""
    return f"__{rank}{RANK_RECORD_SUFFIX}"


def _record_crc(content: Mapping[str, Any]) -> int:
    """The CRC-32 of a rank record's content: every field but ``crc32`` itself."""
    return zlib.crc32(json.dumps({k: v for k, v in content.items() if k != "crc32"}, sort_keys=True).encode())


def write_rank_record(data: Path, rank: int, files: Files, *, step: int) -> None:
    """Write and fsync the record of rank ``rank``: the size and CRC-32 of each of ``files`` (its
    tensor files in the data directory ``data``) and the save's identity (the directory's name
    and ``step``: [Note: one save, one identity]), with a CRC-32 of the record's own content.

    A fresh file in a data directory no commit record names yet: nothing to replace atomically.
    """
    content: dict[str, Any] = {"files": files, "rank": rank, "save": data.name, "step": step}
    text = json.dumps({**content, "crc32": _record_crc(content)}, sort_keys=True)
    with open(data / rank_record_name(rank), "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_rank_record(
    data: Path, rank: int, identity: tuple[str, int] | None = None
) -> tuple[Files, str | None]:
    """The files the record of rank ``rank`` lists, or what is wrong with it: damaged, or (given
    the save's ``identity``) of another save. Never raises."""
    name = rank_record_name(rank)
    link = link_problem(data.parent, f"{data.name}/{name}")
    if link is not None:
        return {}, link
    if file_kind(data / name) not in (None, "is missing"):
        return {}, f"{name} {file_kind(data / name)}"
    try:
        raw = json.loads((data / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, f"{name} is missing"
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}, f"{name} cannot be read ({type(err).__name__}: {err})"
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), dict) or raw.get("rank") != rank:
        return {}, f"{name} is not the record of rank {rank}"
    problem = _files_problem(raw["files"])
    if problem is None and raw.get("crc32") != _record_crc(raw):
        problem = "it fails its CRC-32 check (its bytes changed after it was written)"
    if problem is None and not all(_written_by(name, rank) for name in raw["files"]):
        problem = f"it lists files rank {rank} did not write"
    if problem is not None:
        return {}, f"{name} is damaged: {problem}"
    if identity is not None and (raw.get("save"), raw.get("step")) != identity:
        return {}, (
            f"{name} belongs to another save ({raw.get('save')!r} at step {raw.get('step')!r}; this checkpoint "
            f"is {identity[0]!r} at step {identity[1]}): the files of two saves are mixed"
        )
    return raw["files"], None


def _written_by(name: str, rank: int) -> bool:
    match = SHARD_FILE.fullmatch(name)
    return match is not None and int(match[1]) == rank


def rank_records_problems(
    data: Path, ranks: Iterable[int], verify: bool, identity: tuple[str, int] | None = None
) -> list[str]:
    """What is wrong with the records of ``ranks`` in the data directory ``data`` (of another save
    than ``identity``, given) and with the files they list (see :func:`file_problems`). Never raises."""
    problems: list[str] = []
    for rank in ranks:
        files, problem = read_rank_record(data, rank, identity)
        problems += [problem] if problem is not None else file_problems(data, files, verify)
    return problems


def share_problems(
    directory: Path, record: CommitRecord, rank: int, world_size: int, verify: bool
) -> list[str]:
    """What is wrong with the tensor files that rank ``rank`` of ``world_size`` checks on load (see
    [Note: checksums checked on load]): format 2, those of the rank records ``rank``,
    ``rank + world_size``, ...; format 1, its share by :func:`assign_shares`. Never raises."""
    data = directory / record.data
    if record.rank_records:
        return rank_records_problems(
            data, range(rank, record.rank_records, world_size), verify, record.identity
        )
    rest = {name: info for name, info in record.files.items() if name not in PARSED_BY_RANK0}
    shares = assign_shares({name: info["size"] for name, info in rest.items()}, world_size)
    return file_problems(data, {name: rest[name] for name in shares[rank]}, verify)


def recorded_files(directory: Path, record: CommitRecord) -> Files:
    """Every data file of the checkpoint with its recorded size and CRC-32: the commit record's
    and (format 2) those each rank record lists, read in this process.

    Raises:
        CorruptCheckpointError: a rank record is missing or damaged.
    """
    data = directory / record.data
    files = dict(record.files)
    for rank in range(record.rank_records):
        listed, problem = read_rank_record(data, rank, record.identity)
        if problem is not None:
            raise damaged_sharded(directory, [problem])
        files.update(listed)
    return files


def assign_shares(sizes: Mapping[str, int], world_size: int) -> list[list[str]]:
    """Split files (name -> bytes) among ``world_size`` ranks for checksumming.

    Each rank takes the tensor files its own rank number wrote (``__<rank>_<n>.distcp``): at the
    world size that wrote them, the files it reads its own shards from, likeliest in its page
    cache. The rest (written by ranks this job does not have) go out largest first, each to the
    rank with the fewest bytes so far (the lowest rank on a tie). Every rank computes the same
    split from the same record.
    """
    shares: list[list[str]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    rest = []
    for name in sorted(sizes):
        match = SHARD_FILE.fullmatch(name)
        if match is not None and int(match[1]) < world_size:
            shares[int(match[1])].append(name)
            loads[int(match[1])] += sizes[name]
        else:
            rest.append(name)
    for name in sorted(rest, key=lambda n: (-sizes[n], n)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(name)
        loads[rank] += sizes[name]
    return shares


SAVE_KEY = "fullshard_save"  # meta.pt's copy of the save's identity: {"id": data directory name, "step": int}


def check_meta_identity(meta: dict[str, Any], record: CommitRecord, directory: Path) -> None:
    """Check that ``meta`` (the parsed ``meta.pt``) is of the save the commit record names, and
    take the identity out of it (format 3; [Note: one save, one identity]).

    Raises:
        CorruptCheckpointError: ``meta.pt`` is another save's.
    """
    saved = meta.pop(SAVE_KEY, None)
    identity = record.identity
    if identity is not None and saved != {"id": identity[0], "step": identity[1]}:
        found = f"{saved.get('id')!r} at step {saved.get('step')!r}" if isinstance(saved, dict) else "none"
        raise damaged_sharded(
            directory,
            [
                f"{META_NAME} belongs to another save ({found}; this checkpoint is {identity[0]!r} at step {identity[1]})"
            ],
        )


def leftover_data_dirs(directory: Path, keep: str | None) -> list[Path]:
    """Data directories in ``directory`` that the commit record does not name."""
    if not directory.is_dir():
        return []
    return [
        p for p in directory.iterdir() if p.is_dir() and p.name.startswith(DATA_PREFIX) and p.name != keep
    ]

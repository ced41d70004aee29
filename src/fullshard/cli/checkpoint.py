"""The ``fullshard`` command line (``fullshard checkpoint ...``; :mod:`fullshard.cli` re-exports
:func:`main`, the console script).

fullshard checkpoint inspect PATH [--verify] [--all] [--trust]
fullshard checkpoint consolidate SHARDED_DIR OUT [--no-verify] [--trust]
fullshard checkpoint export PATH OUT[.safetensors] [--prefix model.] [--keep-tied] [--drop-other-keys] [--no-verify] [--trust]

Every command reads a checkpoint without running code from it; ``--trust`` unpickles it
unrestricted (see [Note: loading without running code] in checkpoint/trust.py).
"""

from __future__ import annotations

import argparse
import os
import sys

from fullshard.errors import CheckpointError, MisconfigurationError


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _inspect(args: argparse.Namespace) -> int:
    from fullshard.checkpoint.tools import inspect

    result = inspect(args.path, verify_checksums=args.verify, trust_checkpoint=args.trust)
    print(f"path:        {result.path}")
    print(f"format:      {result.format}")
    print(f"complete:    {'yes' if result.complete else 'no'}")
    if result.world_size is not None:
        print(
            f"written by:  {result.strategy} with {result.world_size} process(es), fullshard {result.fullshard_version}"
        )
        print(f"position:    epoch {result.epoch}, global step {result.global_step}")
        if result.save_id is not None:
            print(f"save id:     {result.save_id}")
        print(f"size:        {_size(result.total_bytes)} on disk, {len(result.tensors)} tensors")
    for alias, canonical in result.tied.items():
        print(f"tied:        {alias} -> {canonical} (stored once)")
    if result.verified is not None:
        # verify reads as a load does ([Note: verify checks what a load checks] in checkpoint/tools.py)
        print(
            f"checksums:   {'all match' if result.verified else 'FAILED: a load would refuse it (see problem)'}"
        )
    if result.problem:
        print(f"problem:     {result.problem}")
    shown = result.tensors if args.all else result.tensors[:40]
    if shown:
        width = max(len(t.name) for t in shown)
        print()
        for t in shown:
            print(f"  {t.name:<{width}}  {t.dtype:<9} {list(t.shape)}")
        if len(shown) < len(result.tensors):
            print(f"  ... {len(result.tensors) - len(shown)} more (--all lists every tensor)")
    return 0 if result.complete and result.problem is None else 1


def _consolidate(args: argparse.Namespace) -> int:
    from fullshard.checkpoint.tools import consolidate

    out = consolidate(args.sharded_dir, args.out, verify=args.verify, trust_checkpoint=args.trust)
    print(f"wrote {out} ({_size(out.stat().st_size)})")
    return 0


def _export(args: argparse.Namespace) -> int:
    from fullshard.checkpoint.tools import export_safetensors, exported_ties

    out = export_safetensors(
        args.path,
        args.out,
        prefix=args.prefix,
        keep_tied=args.keep_tied,
        drop_other_keys=args.drop_other_keys,
        verify=args.verify,
        trust_checkpoint=args.trust,
    )
    print(f"wrote {out} ({_size(out.stat().st_size)})")
    for alias, canonical in exported_ties(out).items():
        kept = (
            "a copy of its own"
            if args.keep_tied
            else "written once: from_pretrained re-ties it, load_exported() restores it"
        )
        print(f"tied: {alias} -> {canonical} ({kept})")
    return 0


def _no_verify(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="read the checkpoint without checking its CRC-32s first (to salvage a damaged one)",
    )


def _trust(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust",
        action="store_true",
        help="unpickle the checkpoint unrestricted, which runs any code it names: only for a checkpoint from "
        "someone you trust (without it, anything but plain data is refused)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fullshard`` command."""
    parser = argparse.ArgumentParser(prog="fullshard", description="fullshard command line tools.")
    groups = parser.add_subparsers(dest="group", required=True)
    checkpoint = groups.add_parser("checkpoint", help="inspect, consolidate and export checkpoints")
    commands = checkpoint.add_subparsers(dest="command", required=True)
    p = commands.add_parser("inspect", help="describe a checkpoint (format, completeness, position, tensors)")
    p.add_argument("path")
    p.add_argument(
        "--verify",
        action="store_true",
        help="read every byte as a load does: every checksum, every check a load makes without the model",
    )
    p.add_argument("--all", action="store_true", help="list every tensor, not the first 40")
    _trust(p)
    p.set_defaults(run=_inspect)
    p = commands.add_parser("consolidate", help="sharded checkpoint directory -> one full checkpoint file")
    p.add_argument("sharded_dir")
    p.add_argument("out")
    _no_verify(p)
    _trust(p)
    p.set_defaults(run=_consolidate)
    p = commands.add_parser("export", help="model weights -> .safetensors (needs: pip install safetensors)")
    p.add_argument("path")
    p.add_argument(
        "out", help="a .safetensors file, or a directory (gets model.safetensors, as Hugging Face)"
    )
    p.add_argument("--prefix", help="strip this module prefix from every key, e.g. 'model.' for self.model")
    p.add_argument("--keep-tied", action="store_true", help="write every name of a tied tensor, each a copy")
    p.add_argument("--drop-other-keys", action="store_true", help="leave out the keys without --prefix")
    _no_verify(p)
    _trust(p)
    p.set_defaults(run=_export)
    from fullshard.cli.plan import add_plan_parser

    add_plan_parser(groups)  # `fullshard plan SCRIPT:FACTORY ...` (fullshard.cli.plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (CheckpointError, MisconfigurationError, ModuleNotFoundError) as err:
        print(f"fullshard: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `fullshard checkpoint inspect X | head`: the reader left, as it may
        # point stdout at /dev/null so that the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command a closed pipe ended

"""Run generated scripts under one framework, in one process, and write what each observed.

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/differential/run.py --seeds 0-9 --out l.json
    TWIN_FRAMEWORK=fullshard python tests/differential/run.py --seeds 0-9 --out f.json

Each script (generate.py; under fullshard the ported text) runs in a fresh temporary directory
that is its working directory, with every warning recorded. Its observations: the recorders'
events (hooks, in order, with their arguments' gist and the Trainer's epoch/step at each), the
metrics after each stage, its own values (what each stage returned, counters, what its logger
received), the warnings (category and topic, see ``compare.py``), the exception that ended it
(type, and the stage it was raised in), the files it wrote, and each checkpoint's keys and counters.
Needs only the standard library, torch and the framework.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "porting")]

import generate  # noqa: E402
import recording  # noqa: E402

FRAMEWORK = os.environ.get("TWIN_FRAMEWORK", "fullshard")
SCRIPT_TIMEOUT = 60


class _Timeout(BaseException):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout(f"a script ran over {SCRIPT_TIMEOUT} s")


def parse_seeds(text: str) -> list[int]:
    """``"0-9,12"`` -> [0, ..., 9, 12]."""
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            seeds.extend(range(int(a), int(b) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def _files(root: Path) -> list[str]:
    names = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.name != "script.py":
            name = str(path.relative_to(root))
            names.append(re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents.*", name))
    # a run directory's event files are one name: how many writers TensorBoard opened is not an
    # observation (their scalars are, see _tensorboard)
    return sorted(set(names))


def _checkpoints(root: Path) -> dict[str, Any]:
    import torch

    found: dict[str, Any] = {}
    for path in sorted(root.rglob("*.ckpt")):
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:
            found[str(path.relative_to(root))] = f"<unreadable: {type(err).__name__}>"
            continue
        if not isinstance(ckpt, dict):
            found[str(path.relative_to(root))] = f"<{type(ckpt).__name__}>"
            continue
        callbacks = ckpt.get("callbacks") or {}
        found[str(path.relative_to(root))] = {
            "keys": sorted(k for k in ckpt if k not in ("pytorch-lightning_version", "fullshard_version")),
            "global_step": ckpt.get("global_step"),
            "epoch": ckpt.get("epoch"),
            "state_dict": sorted(ckpt.get("state_dict", {})),
            "callbacks": sorted(str(k).split("{")[0] for k in callbacks),
            "optimizer_states": len(ckpt.get("optimizer_states", [])),
            "lr_schedulers": len(ckpt.get("lr_schedulers", [])),
        }
    return found


def _csv(root: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(root)): p.read_text().splitlines() for p in sorted(root.rglob("metrics.csv"))}


def _tensorboard(root: Path) -> dict[str, list[list[Any]]]:
    """The scalars each TensorBoard run directory holds: [tag, step, value] in the order written."""
    found: dict[str, list[list[Any]]] = {}
    files = sorted(root.rglob("events.out.tfevents.*"))
    if not files:
        return found
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    for path in files:
        scalars = found.setdefault(str(path.parent.relative_to(root)), [])
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:
                if v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "scalars":
                    number = float(v.tensor.float_val[0] if v.tensor.float_val else v.tensor.double_val[0])
                    scalars.append([v.tag, int(event.step), round(number, 5)])
                elif v.HasField("simple_value"):
                    scalars.append([v.tag, int(event.step), round(float(v.simple_value), 5)])
    # sorted: a directory's event files are named by the second they were opened, so the order
    # of two files written within one second is not an observation
    return {name: sorted(scalars) for name, scalars in found.items()}


_ONCE_CACHES: list[set[Any]] = []
_SCRIPTS_RUN = [0]


def _forget_warnings_given() -> None:
    """Each script starts as in a fresh process: the warnings both frameworks give once per process
    (Lightning's module-level ``WarningCache`` sets, fullshard's ``rank_zero_warn_once``) are
    forgotten, so whether one is given does not depend on the scripts that ran before it. The
    caches are looked for again every 25 scripts (a module imported late brings its own)."""
    import gc

    if _SCRIPTS_RUN[0] % 25 == 0:
        _ONCE_CACHES[:] = [o for o in gc.get_objects() if type(o).__name__ == "WarningCache"]
        if FRAMEWORK == "fullshard":
            from fullshard import rank_zero

            _ONCE_CACHES.append(rank_zero._said_once)
    _SCRIPTS_RUN[0] += 1
    for cache in _ONCE_CACHES:
        cache.clear()


def run_one(seed: int, source: str, workdir: Path | None = None) -> dict[str, Any]:
    """Run one script's source in a fresh directory (``workdir``, or a temporary one); its
    observations."""
    _forget_warnings_given()
    recording.RECORD = recording._Record()
    recording._ACTIVE.clear()
    start = os.getcwd()
    error: dict[str, Any] | None = None
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) if workdir is None else workdir
        root.mkdir(parents=True, exist_ok=True)
        script = root / "script.py"
        script.write_text(source)
        os.chdir(root)
        namespace: dict[str, Any] = {"__name__": f"generated_{seed}", "__file__": str(script)}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            signal.alarm(SCRIPT_TIMEOUT)
            try:
                exec(compile(source, str(script), "exec"), namespace)
                namespace["main"]()
            except BaseException as err:  # an exception is an observation, as is its stage
                stages = [e for e in recording.RECORD.events if e.startswith("S ")]
                error = {"type": type(err).__name__, "stage": stages[-1][2:] if stages else "build"}
                error["message"] = str(err)[:300]
                error["traceback"] = traceback.format_exc()[-1500:]
                if isinstance(err, KeyboardInterrupt):
                    raise
            finally:
                signal.alarm(0)
                os.chdir(start)
        record = recording.RECORD
        return {
            "events": record.events,
            "states": record.states,
            "metrics": record.metrics,
            "values": record.values,
            "warnings": [[w.category.__name__, str(w.message)[:400]] for w in seen],
            "error": error,
            "files": _files(root),
            "checkpoints": _checkpoints(root),
            "csv": _csv(root),
            "tensorboard": _tensorboard(root),
            "seconds": round(time.perf_counter() - began, 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", help="e.g. 0-449 or 3,7,9")
    parser.add_argument("--out", required=True, type=Path, help="a file; with --one, a folder")
    parser.add_argument("--specs", type=Path, help="a JSON list of specs to run instead of seeds")
    parser.add_argument(
        "--one",
        help="run these seeds' scripts (e.g. 2,3,6) in turn, rendered with --strategy and --devices, in"
        " processes the framework launches (with this command line): each rank writes"
        " OUT/out.rank{RANK}.json ({seed: observations}); a script runs in OUT/work/SEED, which all ranks share",
    )
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    if (args.seeds is None) == (args.one is None):
        parser.error("give --seeds or --one")
    os.environ["PORT_FRAMEWORK"] = FRAMEWORK  # the recorders read it
    recording.FRAMEWORK = FRAMEWORK
    recording.FINGERPRINT = "sum"  # a batch told apart by all its samples
    signal.signal(signal.SIGALRM, _alarm)
    # the framework imported before the first script, so its once-per-process caches exist to be found
    importlib.import_module("lightning.pytorch" if FRAMEWORK == "lightning" else "fullshard")
    import logging

    logging.disable(logging.INFO)  # the frameworks' info lines are not observations here
    if args.one is not None:
        # rank 0 is the process started by hand (no LOCAL_RANK yet); the others get it from the
        # launcher, which starts them with this command line: every rank runs the same scripts, in
        # turn, the first one's Trainer launching the job and the others' running in it
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        results = {}
        for seed in parse_seeds(args.one):
            source = generate.render(generate.spec(seed), strategy=args.strategy, devices=args.devices)
            if FRAMEWORK == "fullshard":
                source = generate.port(source)
            observed = run_one(seed, source, workdir=args.out.resolve() / "work" / str(seed))
            if rank:  # the folder is rank 0's too, which may still be writing it: rank 0 reports its files
                observed.update(files=[], checkpoints={}, csv={}, tensorboard={})
            results[str(seed)] = observed
        (args.out / f"out.rank{rank}.json").write_text(json.dumps(results, sort_keys=True, default=repr))
        return
    specs = (
        json.loads(args.specs.read_text())
        if args.specs
        else [generate.spec(seed) for seed in parse_seeds(args.seeds)]
    )
    results: dict[str, Any] = {}
    for spec in specs:
        source = generate.render(spec)
        if FRAMEWORK == "fullshard":
            source = generate.port(source)
        results[str(spec.get("id", spec["seed"]))] = run_one(spec["seed"], source)
    args.out.write_text(json.dumps(results, indent=None, sort_keys=True, default=repr))


if __name__ == "__main__":
    main()

"""The fixed corpus and how to run scripts under either framework (used by record.py, fuzz.py and
tests/test_differential.py).

The corpus is the scripts of seeds ``0 .. CORPUS_SIZE - 1``. Lightning's observations of it are
recorded once into ``FIXTURE`` (with each script's spec, so a change of the generator is noticed
and the fixture re-recorded: ``python tests/differential/record.py``); the suite runs only
fullshard's side and compares.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "differential_lightning_2.6.6.json.gz"
CORPUS_SIZE = 450
DDP_FIXTURE = REPO / "tests" / "fixtures" / "differential_ddp_lightning_2.6.6.json.gz"
DDP_SUBSET_SIZE = 12
DDP_DEVICES = 2
_LAUNCH_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def run(
    framework: str,
    python: str,
    *,
    seeds: list[int] | None = None,
    specs: list[dict[str, Any]] | None = None,
    jobs: int = 1,
    timeout: float = 1800,
) -> dict[str, Any]:
    """Observations of the scripts of ``seeds`` (or of ``specs``) under ``framework``, run by
    ``python`` in ``jobs`` processes side by side."""
    items: list[Any] = list(specs) if specs is not None else list(seeds or [])
    chunks = [items[i::jobs] for i in range(jobs) if items[i::jobs]]
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV and not k.startswith("PL_")}
    env.update(TWIN_FRAMEWORK=framework, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = str(REPO / "src") if framework == "fullshard" else ""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i, chunk in enumerate(chunks):
            out = Path(tmp) / f"{i}.json"
            command = [python, str(HERE / "run.py"), "--out", str(out)]
            if specs is not None:
                (Path(tmp) / f"{i}.specs.json").write_text(json.dumps(chunk))
                command += ["--seeds", "", "--specs", str(Path(tmp) / f"{i}.specs.json")]
            else:
                command += ["--seeds", ",".join(map(str, chunk))]
            log = open(Path(tmp) / f"{i}.log", "w")  # noqa: SIM115 (closed below)
            procs.append(
                (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp), out, log)
            )
        for proc, out, log in procs:
            try:
                proc.wait(timeout=timeout)
            finally:
                if proc.poll() is None:
                    proc.kill()
                log.close()
            if proc.returncode != 0:
                tail = Path(log.name).read_text()[-4000:]
                raise RuntimeError(
                    f"{framework} run of generated scripts failed ({proc.returncode}):\n{tail}"
                )
            results.update(json.loads(out.read_text()))
    return results


def ddp_subset(recorded: dict[str, Any], size: int = DDP_SUBSET_SIZE) -> list[int]:
    """The seeds of the 2-process subset: the first ``size`` corpus seeds whose script finished
    without an exception under Lightning (``recorded``: the one-process fixture) and uses none of
    what a second process would make a different script: manual optimization, an iterable dataset
    (each rank would read all of it), a resumed second Trainer (its checkpoint path is per rank),
    an empty training set."""
    seeds = []
    for seed in range(CORPUS_SIZE):
        s = recorded["scripts"][str(seed)]
        spec = s["spec"]
        if s["observed"]["error"] or spec["manual"] or spec["resume"]:
            continue
        if spec["data"]["iterable"] or spec["data"]["empty_train"]:
            continue
        seeds.append(seed)
        if len(seeds) == size:
            break
    return seeds


def run_launched(
    framework: str,
    python: str,
    seeds: list[int],
    *,
    strategy: str,
    devices: int = DDP_DEVICES,
    timeout: float = 600,
) -> dict[str, dict[str, Any]]:
    """Observations of the scripts of ``seeds`` rendered with ``strategy`` on ``devices`` CPU
    processes, under ``framework``: ``{seed: {rank: ...}}``. One process is started
    (``run.py --one``), which runs the scripts in turn; the framework launches the other ranks
    with its command line when the first script's Trainer starts, and the later scripts run in
    that job (the launch is paid once)."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV and not k.startswith("PL_")}
    env.update(TWIN_FRAMEWORK=framework, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = str(REPO / "src") if framework == "fullshard" else ""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        command = [python, str(HERE / "run.py"), "--one", ",".join(map(str, seeds)), "--out", str(out)]
        command += ["--strategy", strategy, "--devices", str(devices)]
        done = subprocess.run(
            command, env=env, cwd=tmp, timeout=timeout, capture_output=True, text=True, check=False
        )
        ranks = {str(r): out / f"out.rank{r}.json" for r in range(devices)}
        if done.returncode != 0 or not all(p.exists() for p in ranks.values()):
            raise RuntimeError(
                f"{framework} run of scripts {seeds} with strategy={strategy!r}, devices={devices} failed"
                f" ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
            )
        per_rank = {r: json.loads(p.read_text()) for r, p in ranks.items()}
        return {str(s): {r: per_rank[r][str(s)] for r in per_rank} for s in seeds}


def load_fixture(path: Path = FIXTURE) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)  # type: ignore[no-any-return]


def write_fixture(data: dict[str, Any], path: Path = FIXTURE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


def trim(observed: dict[str, Any]) -> dict[str, Any]:
    """What is kept of an observation (the traceback and timing are not compared)."""
    out = {k: v for k, v in observed.items() if k != "seconds"}
    if out.get("error"):
        out["error"] = {k: v for k, v in out["error"].items() if k != "traceback"}
    return out


def lightning_python() -> str:
    sys.path.insert(0, str(REPO / "tests"))
    import lightning_env

    # with tensorboard: the corpus has TensorBoardLogger scripts (made on first use)
    return str(lightning_env.make_with_tensorboard())

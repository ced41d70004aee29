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
CORPUS_SIZE = 300
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


def load_fixture() -> dict[str, Any]:
    with gzip.open(FIXTURE, "rt") as f:
        return json.load(f)  # type: ignore[no-any-return]


def write_fixture(data: dict[str, Any]) -> None:
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(FIXTURE, "wb", mtime=0) as f:
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

    return str(lightning_env.PYTHON)

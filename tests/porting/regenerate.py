"""Record the porting scripts under Lightning and write tests/porting/expected/<script>.json.

The recorded behaviour (hook order, metrics, values, checks) is the documented Lightning order
that tests/test_porting.py holds fullshard to. Lightning is never a dependency of fullshard: run
this with a Python that has it, e.g. a throwaway virtual environment:

    python3 -m venv /tmp/lvenv && /tmp/lvenv/bin/pip install lightning==2.6.6 torch
    /tmp/lvenv/bin/pip install tensorboard wandb mlflow  # for logger_backends only
    python tests/porting/regenerate.py --python /tmp/lvenv/bin/python [script ...]

Lightning refuses FSDP on CPU, so the scripts are recorded with ``--strategy ddp``, except those
``runner.RECORDED_WITH`` names (``model_parallel_tp``: Lightning's ``ModelParallelStrategy``, which
runs on CPU with gloo). A script whose
own checks fail under Lightning is a bug in the script: nothing is written for it then.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from runner import EXPECTED, SCRIPTS, recorded_with, run_port


def _versions(python: str) -> dict[str, str]:
    code = "import json, lightning, torch; print(json.dumps({'lightning': lightning.__version__, 'torch': torch.__version__}))"
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default="/tmp/lvenv/bin/python", help="a Python with lightning installed")
    parser.add_argument("scripts", nargs="*", help=f"some of {', '.join(SCRIPTS)} (default: all)")
    args = parser.parse_args()
    unknown = sorted(set(args.scripts) - set(SCRIPTS))
    if unknown:
        parser.error(f"unknown scripts {unknown}; choose from {', '.join(SCRIPTS)}")
    versions = _versions(args.python)
    EXPECTED.mkdir(exist_ok=True)
    failed = []
    for script in args.scripts or SCRIPTS:
        with tempfile.TemporaryDirectory() as tmp:
            result, record = run_port(
                script, "lightning", recorded_with(script), Path(tmp), python=args.python
            )
        problems = [] if result.returncode == 0 else [f"exit {result.returncode}"]
        for rank, data in enumerate(record["ranks"]):
            if data is None:
                problems.append(f"rank {rank} wrote no record")
                continue
            problems += [
                f"rank {rank}: check failed: {name} ({detail})"
                for name, ok, detail in data["checks"]
                if not ok
            ]
            if data["error"]:
                problems.append(f"rank {rank}: {data['error']}")
        if problems:
            failed.append(script)
            print(
                f"{script}: NOT written\n  "
                + "\n  ".join(problems)
                + f"\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
            continue
        record.update(versions)
        (EXPECTED / f"{script}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"{script}: written ({sum(len(r['events']) for r in record['ranks'])} events)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

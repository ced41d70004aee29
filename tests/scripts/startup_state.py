"""Print, as JSON, what a process finds at start that python sets up from its command line and
environment; used by tests/test_forkserver.py to compare a forked job with a real ``python``.

python tests/scripts/startup_state.py MODULE...   (imports the modules first)
"""

from __future__ import annotations

import importlib
import io
import json
import os
import random
import sys
import warnings

for name in sys.argv[1:]:
    importlib.import_module(name)

import torch  # noqa: E402


def _stream(stream: io.TextIOWrapper) -> list[object]:
    return [type(stream.buffer).__name__, stream.buffer.raw.name if hasattr(stream.buffer, "raw") else stream.buffer.name,
            stream.encoding, stream.errors, stream.line_buffering, stream.write_through, stream.mode]  # fmt: skip


main = sys.modules["__main__"]
print(json.dumps({
    "argv": sys.argv,
    "path0": sys.path[0],
    "path": sys.path,
    "cwd": os.getcwd(),
    "ppid": os.getppid(),
    "umask": os.umask(0o22),
    "env": dict(os.environ),
    "warnoptions": sys.warnoptions,
    "filters": [repr(f) for f in warnings.filters],
    "stdio": [_stream(s) for s in (sys.stdin, sys.stdout, sys.stderr)],  # type: ignore[arg-type]
    "dunder_stdio": [s is d for s, d in ((sys.stdin, sys.__stdin__), (sys.stdout, sys.__stdout__), (sys.stderr, sys.__stderr__))],
    "dont_write_bytecode": sys.dont_write_bytecode,
    "threads": torch.get_num_threads(),
    "main": [main.__name__, main.__file__, type(main.__loader__).__name__, main.__spec__],
    "random": random.random(),
}, sort_keys=True))  # fmt: skip

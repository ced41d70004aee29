"""``import fullshard`` freezes torch's objects out of the garbage collector's full collections
([Note: torch's objects frozen at import] in fullshard/_startup.py)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, weakref
import torch
# Held, so that none is freed during the import: a frozen object that is freed leaves the frozen
# count (lightning_utilities' typing annotations evict old entries of typing's caches).
before = gc.get_objects()
import fullshard
assert gc.get_freeze_count() >= len(before), (gc.get_freeze_count(), len(before))  # torch's objects, frozen
assert not any(o is torch.nn.Linear for o in gc.get_objects())  # no longer walked by collections

class Cycle:
    pass

a, b = Cycle(), Cycle()
a.other, b.other = b, a  # garbage made after the import is still collected
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None
print("ok")
"""


def test_import_freezes_torchs_objects_and_later_garbage_is_collected() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr

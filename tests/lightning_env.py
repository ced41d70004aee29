"""Lightning 2.6.6 in a virtual environment of its own, for the tests that run the same code under
Lightning and compare (Lightning is never a dependency of fullshard).

``python tests/lightning_env.py`` makes the environment (once; a second call checks it and returns),
and the README's test command runs it before pytest. A comparison test calls :func:`require`:

- the environment is there: the test gets its interpreter;
- it is not: the test **fails**, naming the command that makes it. A comparison is skipped only
  when the person running the suite says so (``FULLSHARD_SKIP_LIGHTNING=1``), and never under
  CI (``CI`` set, as ``.ci/run`` does): a green CI run has run every comparison.

``FULLSHARD_LIGHTNING_VENV`` moves the environment (default ``/tmp/lvenv``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

VENV = Path(os.environ.get("FULLSHARD_LIGHTNING_VENV", "/tmp/lvenv"))
PYTHON = VENV / "bin" / "python"
VERSION = "2.6.6"
# torch first, from the pinned CPU build, so pip does not pull a CUDA build for Lightning's sake
PACKAGES = (("torch==2.13.0",), (f"lightning=={VERSION}", "jsonargparse[signatures]>=4.27.7"))
MAKE = "python tests/lightning_env.py"
SKIP_VARIABLE = "FULLSHARD_SKIP_LIGHTNING"


@functools.cache
def ready() -> bool:
    """Whether ``PYTHON`` imports Lightning at ``VERSION`` and jsonargparse (checked once a process)."""
    if not PYTHON.is_file():
        return False
    check = f"import jsonargparse, lightning; assert lightning.__version__ == {VERSION!r}"
    done = subprocess.run([str(PYTHON), "-c", check], capture_output=True, timeout=120)
    return done.returncode == 0


def require() -> Path:
    """The interpreter with Lightning, for a comparison test; fails the test (or skips it, when the
    person running the suite opted out outside CI) when the environment is missing."""
    if ready():
        return PYTHON
    import pytest

    missing = f"the comparison with Lightning {VERSION} needs its environment at {VENV}, which is missing"
    if os.environ.get(SKIP_VARIABLE) == "1" and not os.environ.get("CI"):
        pytest.skip(f"{missing} ({SKIP_VARIABLE}=1)")
    pytest.fail(
        f"{missing}: run `{MAKE}` (the README's test command does), or set {SKIP_VARIABLE}=1 to skip "
        "the comparisons knowingly (refused under CI)",
        pytrace=False,
    )


def make() -> None:
    """Make the environment unless it is ready; print where it is."""
    if ready():
        print(f"Lightning {VERSION} for the comparison tests: {PYTHON} (ready)")
        return
    print(f"Lightning {VERSION} for the comparison tests: making {VENV} (about a minute)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    for packages in PACKAGES:
        subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", *packages], check=True)
    ready.cache_clear()
    if not ready():
        raise SystemExit(f"{VENV} was made but does not import lightning=={VERSION} and jsonargparse")
    print(f"Lightning {VERSION} for the comparison tests: {PYTHON} (made)")


# Lightning with tensorboard installed, for recording the differential corpus (its TensorBoardLogger
# scripts): an environment of its own that sees VENV's packages through a .pth file, so VENV stays
# without tensorboard (where Lightning's default logger is a CSVLogger, as tests/twins compare)
TENSORBOARD_VENV = VENV.parent / f"{VENV.name}-tensorboard"


def make_with_tensorboard() -> Path:
    """The interpreter of ``TENSORBOARD_VENV``, made (once) over a ready ``VENV``."""
    python = TENSORBOARD_VENV / "bin" / "python"
    check = f"import lightning, tensorboard; assert lightning.__version__ == {VERSION!r}"
    if python.is_file() and subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0:
        return python
    make()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(TENSORBOARD_VENV)], check=True)
    site = subprocess.run(
        [str(PYTHON), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(own, "lightning_env.pth").write_text(site + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "tensorboard>=2.14"], check=True)
    subprocess.run([str(python), "-c", check], check=True)
    return python


if __name__ == "__main__":
    make()

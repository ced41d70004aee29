"""``rich`` is an optional extra of fullshard (``pip install 'fullshard[rich]'``): the callbacks
that draw with it check for it when they are made."""

from __future__ import annotations

import importlib.util

from lightning_utilities.core.imports import RequirementCache

RICH_AVAILABLE = RequirementCache("rich>=10.2.2")


def rich_available() -> bool:
    """Whether ``rich`` (>= 10.2.2) is installed and importable (not blocked with
    ``sys.modules["rich"] = None``). The Trainer's default bar and summary draw with it then."""
    if not RICH_AVAILABLE:
        return False
    try:
        return importlib.util.find_spec("rich") is not None
    except ValueError:  # in sys.modules as None: imports of it fail
        return False


def require_rich(what: str) -> None:
    """Raise ``ModuleNotFoundError`` naming the extra when ``rich`` is not installed."""
    if not rich_available():
        raise ModuleNotFoundError(
            f"{what} draws with the `rich` package, which is not installed. Install fullshard's rich extra: "
            "pip install 'fullshard[rich]' (or pip install rich)."
        )

"""``rich`` is an optional extra of fullshard (``pip install 'fullshard[rich]'``): the callbacks
that draw with it check for it when they are made."""

from __future__ import annotations

from lightning_utilities.core.imports import RequirementCache

RICH_AVAILABLE = RequirementCache("rich>=10.2.2")


def require_rich(what: str) -> None:
    """Raise ``ModuleNotFoundError`` naming the extra when ``rich`` is not installed."""
    if not RICH_AVAILABLE:
        raise ModuleNotFoundError(
            f"{what} draws with the `rich` package, which is not installed. Install fullshard's rich extra: "
            "pip install 'fullshard[rich]' (or pip install rich)."
        )

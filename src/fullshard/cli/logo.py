"""``cli_lightning_logo``: the banner Lightning's example scripts print at start (``from
lightning.pytorch import cli_lightning_logo``), here fullshard's name in the same colour."""

_LOGO = r"""
  __       _ _     _                   _
 / _|_   _| | |___| |__   __ _ _ __ __| |
| |_| | | | | / __| '_ \ / _` | '__/ _` |
|  _| |_| | | \__ \ | | | (_| | | | (_| |
|_|  \__,_|_|_|___/_| |_|\__,_|_|  \__,_|
"""


def cli_lightning_logo() -> None:
    """Print the banner (magenta on a terminal that shows ANSI colours)."""
    print()
    print("\033[0;35m" + _LOGO + "\033[0m")
    print()

"""``python -m fullshard.cli checkpoint ...``: the ``fullshard`` command."""

import sys

from fullshard.cli.checkpoint import main

sys.exit(main())

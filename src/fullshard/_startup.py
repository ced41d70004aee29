"""What ``import fullshard`` does first, before its own modules load.

[Note: torch's objects frozen at import]
torch's import leaves some 160,000 objects that the cyclic garbage collector tracks, nearly all
of which live as long as the process (modules, functions, operator registrations). Every full
collection walks them all: 0.1-0.15 s each on a 2-core machine, at whichever allocation happens
to trigger it. One fell inside ``import fullshard`` on rank 0 before the launch, where it delayed
the start of every other rank (docs/benchmarks.md, "FSDP start-up"), and later ones land on
training steps. ``gc.freeze()`` moves every object that exists at this point into the collector's
permanent generation, which no collection walks again; objects made later are collected as
before. A program that wants the old behaviour calls ``gc.unfreeze()`` after importing fullshard.
"""

import gc

import torch  # noqa: F401  # its objects are the ones to freeze

gc.freeze()

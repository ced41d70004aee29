"""fullshard's version, in a module of its own so that any layer may read it (a checkpoint
records it) without importing the package's top, which imports the Trainer."""

__version__ = "0.1.0"

"""The host: Trainer, loops, callbacks, loggers and the progress bar."""

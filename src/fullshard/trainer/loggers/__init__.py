"""Experiment loggers: where the Trainer sends logged metrics and hyperparameters.

One module per logger: the file-based ``CSVLogger`` and ``TensorBoardLogger`` (runs in
``save_dir/name/version_N``), and the trackers ``WandbLogger``, ``MLFlowLogger`` and
``CometLogger``, each needing its optional package (``pip install "fullshard[wandb]"``,
``[mlflow]``, ``[comet]``, ``[tensorboard]``), imported only when a logger is made. ``base``
holds the interface and the rank-zero rule ([Note: loggers on rank zero]); ``dispatch`` what the
Trainer calls. This package exports nothing itself: users import the loggers from
:mod:`fullshard.loggers` (their one public path), fullshard's own modules from the module that
defines each.
"""

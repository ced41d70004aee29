"""The tuner's callbacks: ``BatchSizeFinder`` (batch_size_finder.py) and ``LearningRateFinder``
(lr_finder.py) run the tuner's searches when ``fit`` starts. Users import them from
:mod:`fullshard.callbacks`, their one public path; they live here, above the Trainer, because
they drive the tuner (docs/design.md, "Principles")."""

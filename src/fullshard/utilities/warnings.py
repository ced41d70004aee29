"""Lightning's ``utilities.warnings`` path: the category of fullshard's warnings about settings
that may be meant (``from lightning.pytorch.utilities.warnings import PossibleUserWarning`` ports
as ``from fullshard.utilities.warnings import PossibleUserWarning``)."""

from fullshard.rank_zero import PossibleUserWarning

__all__ = ["PossibleUserWarning"]

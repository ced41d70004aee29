"""Whether optional packages are installed, under the names Lightning's examples import from
``lightning.pytorch.utilities.imports`` (``if _TORCHVISION_AVAILABLE: import torchvision``)."""

from importlib.util import find_spec

_TORCHVISION_AVAILABLE = find_spec("torchvision") is not None
_RICH_AVAILABLE = find_spec("rich") is not None
_OMEGACONF_AVAILABLE = find_spec("omegaconf") is not None

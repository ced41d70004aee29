"""Demo models and data: fullshard's own (``python -m fullshard.demos``: the
:class:`Transformer` on :class:`StdlibText`) and the ones Lightning's examples import from
``lightning.pytorch.demos`` (``WikiText2``, ``LightningTransformer``, ``BoringModel``, the LSTM,
``mnist_datamodule.MNISTDataModule``). No data is downloaded: a missing local copy is replaced
by synthetic data of the same layout, with a warning."""

from fullshard.demos.boring_classes import BoringDataModule, BoringModel, DemoModel
from fullshard.demos.data import StdlibText
from fullshard.demos.lightning_transformer import LightningTransformer
from fullshard.demos.lstm import LightningLSTM, SequenceSampler, SimpleLSTM
from fullshard.demos.transformer import Transformer
from fullshard.demos.wikitext import WikiText2

__all__ = [
    "BoringDataModule",
    "BoringModel",
    "DemoModel",
    "LightningLSTM",
    "LightningTransformer",
    "SequenceSampler",
    "SimpleLSTM",
    "StdlibText",
    "Transformer",
    "WikiText2",
]

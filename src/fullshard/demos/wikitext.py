"""``WikiText2``: Lightning's small word-level language-modelling dataset
(``lightning.pytorch.demos.WikiText2``), read from a local copy; fullshard downloads nothing.

Lightning keeps the text at ``data_dir / "wikitext-2.txt"`` (the training split of PyTorch's
word-language-model example). Where that file is missing, the dataset is built from synthetic
text instead (seeded, so every process and run gets the same), with one warning saying so: the
shapes, dtypes and item layout are Lightning's; the words are not English.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch
from torch.utils.data import Dataset

_SYNTHETIC_LINES = 36_718  # the lines of WikiText-2's training split
_SYNTHETIC_VOCABULARY = 20_000
_warned: set[Path] = set()


class Dictionary:
    """Words to ids in order of first appearance, and back."""

    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: list[str] = []

    def add_word(self, word: str) -> int:
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


def _tokenize_lines(lines: Iterable[str]) -> tuple[torch.Tensor, Dictionary]:
    dictionary = Dictionary()
    ids = [dictionary.add_word(word) for line in lines for word in [*line.split(), "<eos>"]]
    return torch.tensor(ids, dtype=torch.int64), dictionary


def tokenize(path: Path) -> tuple[torch.Tensor, Dictionary]:
    """The file's words (each line ended by ``<eos>``) as one ``int64`` tensor of ids, and the
    dictionary that numbers them."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"tokenize({str(path)!r}): no such file")
    with open(path, encoding="utf8") as f:
        return _tokenize_lines(f)


def synthetic_text(lines: int = _SYNTHETIC_LINES, seed: int = 0) -> tuple[torch.Tensor, Dictionary]:
    """Token ids of ``lines`` sentences of made-up words (5 to 34 words and ``<eos>`` each, with a
    Zipf-like word frequency as in real text), and their dictionary: about the size of
    WikiText-2's training split, so scripts that split it as Lightning's examples do still work."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "de", "po", "an", "el", "su", "ba"]
    words: set[str] = set()
    while len(words) < _SYNTHETIC_VOCABULARY:
        words.add("".join(rng.choices(syllables, k=rng.randint(1, 4))))
    dictionary = Dictionary()
    for word in ["<eos>", *sorted(words)]:
        dictionary.add_word(word)
    generator = torch.Generator().manual_seed(seed)
    frequency = 1.0 / torch.arange(1, _SYNTHETIC_VOCABULARY + 1, dtype=torch.float64)
    lengths = torch.randint(5, 35, (lines,), generator=generator)
    ids = torch.multinomial(frequency, int(lengths.sum()), replacement=True, generator=generator) + 1
    ends = torch.cumsum(lengths, 0) + torch.arange(lines)  # where each line's <eos> goes
    data = torch.zeros(int(lengths.sum()) + lines, dtype=torch.int64)  # 0 is <eos>
    is_word = torch.ones_like(data, dtype=torch.bool)
    is_word[ends] = False
    data[is_word] = ids
    return data, dictionary


class WikiText2(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Blocks of ``block_size`` token ids and the same block shifted by one token (the targets).

    ``download=True`` is accepted for Lightning's scripts but fetches nothing: the text is read
    from ``data_dir / "wikitext-2.txt"`` when it exists, else synthetic text is used (one
    warning per path)."""

    def __init__(self, data_dir: Path = Path("./data"), block_size: int = 35, download: bool = True) -> None:
        super().__init__()
        self.path = Path(data_dir) / "wikitext-2.txt"
        self.block_size = block_size
        if self.path.is_file():
            self.data, self.dictionary = tokenize(self.path)
            return
        if self.path not in _warned:
            _warned.add(self.path)
            warnings.warn(
                f"WikiText2: there is no {self.path} and fullshard downloads nothing; using synthetic "
                "text of the same layout. For the real text, put WikiText-2's train.txt (PyTorch's "
                f"word_language_model example data) at {self.path}.",
                UserWarning,
                stacklevel=2,
            )
        self.data, self.dictionary = synthetic_text()

    @property
    def vocab_size(self) -> int:
        return len(self.dictionary)

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        end = start + self.block_size
        return self.data[start:end], self.data[start + 1 : end + 1]

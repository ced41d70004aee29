"""A small encoder-decoder Transformer for next-token prediction, used by the demos and tests.

The model is assembled from ``torch.nn.TransformerEncoderLayer`` and
``torch.nn.TransformerDecoderLayer`` instances (not subclasses), so FSDP auto-wrap policies can
target exactly those classes.

How the two stacks share the work (language modelling, ``target[:, t]`` is the token after
``input[:, t]``):

* the encoder reads ``input`` under a causal mask;
* the decoder reads ``target`` shifted right by one, behind a start token (teacher forcing),
  also under a causal mask, and cross-attends to encoder positions ``<= t`` only.

Position ``t`` therefore sees ``input[:, :t+1]`` and ``target[:, :t]`` and never the token it
predicts, ``target[:, t]``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fullshard.lightning_aliases import lightning_names

__all__ = ["Transformer", "sinusoidal_positions"]


def sinusoidal_positions(
    seq_len: int, dim: int, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Fixed sine/cosine position codes, shape ``(seq_len, dim)``.

    Even feature ``2k`` of position ``p`` is ``sin(p / 10000**(2k/dim))`` and odd feature
    ``2k+1`` the matching cosine.
    """
    positions = torch.arange(seq_len, device=device, dtype=torch.float32).unsqueeze(1)
    exponents = torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim
    freqs = torch.exp(exponents * -math.log(10000.0))
    angles = positions * freqs  # (seq_len, ceil(dim / 2))
    codes = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)[:, :dim]
    return codes.to(dtype) if dtype is not None else codes


class PositionalEncoding(nn.Module):
    """Adds :func:`sinusoidal_positions` to a ``(batch, seq, dim)`` input, then applies dropout.

    The codes are computed in ``forward`` rather than kept in a buffer: the module holds no
    tensors, so it needs nothing special after construction on the meta device. The constructor
    is ``lightning.pytorch.demos.PositionalEncoding``'s (``dim`` and ``max_len`` are checked
    against the input).
    """

    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dim = dim
        self.max_len = max_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[2] != self.dim or x.shape[1] > self.max_len:
            raise ValueError(
                f"PositionalEncoding(dim={self.dim}, max_len={self.max_len}): got an input of shape "
                f"{tuple(x.shape)}; it takes (batch, seq <= max_len, dim)"
            )
        codes = sinusoidal_positions(x.shape[1], x.shape[2], device=x.device, dtype=x.dtype)
        out: torch.Tensor = self.dropout(x + codes)
        return out


def _init_attention(attention: nn.MultiheadAttention) -> None:
    """Initialise a ``MultiheadAttention`` the way its constructor does.

    ``MultiheadAttention`` has no public ``reset_parameters`` (only the private
    ``_reset_parameters``), so the same scheme is written out here with public ``nn.init`` calls.
    """
    if attention.in_proj_weight is not None:
        nn.init.xavier_uniform_(attention.in_proj_weight)
    else:
        for weight in (attention.q_proj_weight, attention.k_proj_weight, attention.v_proj_weight):
            nn.init.xavier_uniform_(weight)
    attention.out_proj.reset_parameters()
    if attention.in_proj_bias is not None:
        nn.init.zeros_(attention.in_proj_bias)
    if attention.out_proj.bias is not None:
        nn.init.zeros_(attention.out_proj.bias)
    for extra in (attention.bias_k, attention.bias_v):
        if extra is not None:
            nn.init.xavier_normal_(extra)


class Transformer(nn.Module):
    """Encoder-decoder Transformer over a token vocabulary (bytes by default).

    Args:
        vocab_size: Number of distinct tokens.
        ninp: Width of the embeddings and of every layer (``d_model``).
        nhead: Attention heads per layer; must divide ``ninp``.
        nhid: Hidden width of each layer's feed-forward block.
        nlayers: Number of encoder layers, and of decoder layers.
        dropout: Dropout probability used throughout.

    ``forward(input, target)`` takes two ``(batch, seq)`` ``int64`` tensors and returns
    log-probabilities of shape ``(batch * seq, vocab_size)`` in ``float32``, so
    ``F.nll_loss(output, target.view(-1))`` is the training loss.

    Initialisation: the constructor initialises every parameter. To build on the meta device
    and materialise later, call ``model.to_empty(device=...)`` and then
    :meth:`reset_parameters`, which re-initialises all parameters of the model.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        ninp: int = 200,
        nhead: int = 2,
        nhid: int = 200,
        nlayers: int = 2,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        sizes = {"vocab_size": vocab_size, "ninp": ninp, "nhead": nhead, "nlayers": nlayers}
        for arg, value in sizes.items():
            if value < 1:
                raise ValueError(f"`{arg}` must be a positive integer, got {value!r}.")
        if ninp % nhead != 0:
            raise ValueError(
                f"`ninp={ninp}` must be divisible by `nhead={nhead}` so every head gets the same width. "
                f"Pick `nhead` from the divisors of {ninp}."
            )
        self.vocab_size = vocab_size
        self.ninp = ninp
        # One extra row: the start token the decoder sees before the first target token.
        self.embedding = nn.Embedding(vocab_size + 1, ninp)
        self.positions = PositionalEncoding(ninp, dropout)
        self.encoder_layers = nn.ModuleList(
            nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout, batch_first=True) for _ in range(nlayers)
        )
        self.decoder_layers = nn.ModuleList(
            nn.TransformerDecoderLayer(ninp, nhead, nhid, dropout, batch_first=True) for _ in range(nlayers)
        )
        self.head = nn.Linear(ninp, vocab_size)

    @property
    def start_token(self) -> int:
        """Index of the start token that precedes the target sequence in the decoder."""
        return self.vocab_size

    def reset_parameters(self) -> None:
        """Re-initialise every parameter, e.g. after ``to_empty`` on a model built on the meta device."""
        for module in self.modules():
            if module is self or isinstance(module, nn.MultiheadAttention):
                continue
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
        # After the generic pass, which also reset each `out_proj` with a random bias.
        for module in self.modules():
            if isinstance(module, nn.MultiheadAttention):
                _init_attention(module)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if input.dim() != 2 or input.shape != target.shape:
            raise ValueError(
                "`input` and `target` must both be (batch, seq) token tensors of the same shape, got "
                f"{tuple(input.shape)} and {tuple(target.shape)}."
            )
        seq_len = input.shape[1]
        # True above the diagonal: position t may not look at positions after t.
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=input.device).triu(1)
        start = torch.full_like(target[:, :1], self.start_token)
        shifted_target = torch.cat((start, target[:, :-1]), dim=1)

        memory = self.positions(self.embedding(input))
        for encoder_layer in self.encoder_layers:
            memory = encoder_layer(memory, src_mask=causal, is_causal=True)
        hidden = self.positions(self.embedding(shifted_target))
        for decoder_layer in self.decoder_layers:
            hidden = decoder_layer(
                hidden, memory, tgt_mask=causal, memory_mask=causal, tgt_is_causal=True, memory_is_causal=True
            )
        logits = self.head(hidden).view(-1, self.vocab_size)
        # float32 softmax: under bf16/fp16 mixed precision a low-precision log-softmax loses accuracy.
        return F.log_softmax(logits.float(), dim=-1)


if not TYPE_CHECKING:  # Lightning's names of this path that live elsewhere: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)

"""Tests of the demo Transformer and the stdlib byte dataset."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from fullshard.demos import StdlibText, Transformer
from fullshard.demos.data import _stdlib_sources
from fullshard.demos.transformer import sinusoidal_positions

SMALL = {"ninp": 32, "nhead": 2, "nhid": 64, "nlayers": 1}


def _tokens(batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (batch, seq + 1), generator=generator)
    return data[:, :-1], data[:, 1:]


# ----- Transformer -----


def test_forward_returns_log_probabilities_of_the_documented_shape() -> None:
    torch.manual_seed(0)
    model = Transformer(**SMALL).eval()
    input, target = _tokens(batch=3, seq=7)
    output = model(input, target)
    assert output.shape == (3 * 7, 256)
    assert output.dtype == torch.float32
    torch.testing.assert_close(output.exp().sum(dim=-1), torch.ones(21))
    loss = F.nll_loss(output, target.reshape(-1))
    assert math.isfinite(loss.item())


def test_position_t_never_sees_the_token_it_predicts() -> None:
    torch.manual_seed(0)
    model = Transformer(**SMALL, dropout=0.0).eval()
    input, target = _tokens(batch=2, seq=10)
    base = model(input, target).view(2, 10, 256)
    k = 6
    changed_input, changed_target = input.clone(), target.clone()
    changed_input[:, k] = (changed_input[:, k] + 1) % 256
    changed_target[:, k] = (changed_target[:, k] + 1) % 256

    # input[:, k] may influence positions >= k only; target[:, k] positions > k only.
    out = model(changed_input, target).view(2, 10, 256)
    torch.testing.assert_close(out[:, :k], base[:, :k])
    assert not torch.allclose(out[:, k], base[:, k])
    out = model(input, changed_target).view(2, 10, 256)
    torch.testing.assert_close(out[:, : k + 1], base[:, : k + 1])
    assert not torch.allclose(out[:, k + 1], base[:, k + 1])


def test_loss_decreases_when_training_on_stdlib_text() -> None:
    torch.manual_seed(0)
    dataset = StdlibText(block_size=32, max_bytes=64 * 1024)
    input, target = next(iter(DataLoader(dataset, batch_size=16)))
    model = Transformer(**SMALL, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = F.nll_loss(model(input, target), target.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_construction_is_deterministic_given_the_seed() -> None:
    torch.manual_seed(3)
    first = Transformer(**SMALL).state_dict()
    torch.manual_seed(3)
    second = Transformer(**SMALL).state_dict()
    torch.manual_seed(4)
    other = Transformer(**SMALL).state_dict()
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=0, atol=0)
    assert not torch.equal(first["head.weight"], other["head.weight"])


def test_layers_are_instances_of_the_exact_torch_classes() -> None:
    model = Transformer(**{**SMALL, "nlayers": 3})
    encoders = [m for m in model.modules() if type(m) is nn.TransformerEncoderLayer]
    decoders = [m for m in model.modules() if type(m) is nn.TransformerDecoderLayer]
    assert len(encoders) == 3
    assert len(decoders) == 3


def test_reset_parameters_initialises_every_parameter() -> None:
    model = Transformer(**SMALL)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    model.reset_parameters()
    for name, parameter in model.named_parameters():
        assert torch.isfinite(parameter).all(), name
    attention = model.encoder_layers[0].self_attn
    assert torch.count_nonzero(attention.in_proj_bias) == 0
    assert torch.count_nonzero(attention.out_proj.bias) == 0
    assert attention.in_proj_weight.std() > 0


def test_meta_device_construction_can_be_materialised() -> None:
    with torch.device("meta"):
        model = Transformer(**SMALL)
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.reset_parameters()
    assert not any(p.is_meta for p in model.parameters())
    input, target = _tokens(batch=2, seq=8)
    loss = F.nll_loss(model(input, target), target.reshape(-1))
    assert math.isfinite(loss.item())
    # An untrained model is far from confident: loss within a few nats of uniform guessing.
    assert 0.5 * math.log(256) < loss.item() < 3 * math.log(256)


def test_invalid_configurations_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"`ninp=30` must be divisible by `nhead=4`"):
        Transformer(ninp=30, nhead=4)
    with pytest.raises(ValueError, match=r"`nlayers` must be a positive integer, got 0"):
        Transformer(nlayers=0)


def test_forward_rejects_mismatched_shapes() -> None:
    model = Transformer(**SMALL)
    with pytest.raises(ValueError, match=r"same shape, got \(2, 5\) and \(2, 4\)"):
        model(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))


def test_sinusoidal_positions_values() -> None:
    codes = sinusoidal_positions(4, 5)
    assert codes.shape == (4, 5)
    torch.testing.assert_close(codes[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0]))
    # Feature pair 0 has frequency 1: position p gives (sin p, cos p).
    torch.testing.assert_close(codes[:, 0], torch.arange(4.0).sin())
    torch.testing.assert_close(codes[:, 1], torch.arange(4.0).cos())


# ----- StdlibText -----


def test_items_are_blocks_with_target_shifted_by_one() -> None:
    dataset = StdlibText(block_size=16, max_bytes=10_000)
    assert dataset.vocab_size == 256
    assert dataset.num_bytes == 10_000
    assert len(dataset) == (10_000 - 1) // 16
    input, target = dataset[0]
    assert input.shape == target.shape == (16,)
    assert input.dtype == target.dtype == torch.int64
    torch.testing.assert_close(input[1:], target[:-1])
    # Blocks are consecutive and do not overlap.
    next_input, _ = dataset[1]
    assert next_input[0] == target[-1]
    assert int(input.min()) >= 0
    assert int(input.max()) < 256


def test_items_are_the_bytes_of_the_given_files(tmp_path: Path) -> None:
    first, second = tmp_path / "b.txt", tmp_path / "a.txt"
    first.write_bytes(b"hello ")
    second.write_bytes(b"world!")
    dataset = StdlibText(block_size=4, files=[first, second])
    assert len(dataset) == 2  # 12 bytes: 2 blocks of 4 with their targets, 3 bytes left over
    assert bytes(dataset[0][0].tolist()) == b"hell"
    assert bytes(dataset[0][1].tolist()) == b"ello"
    assert bytes(dataset[1][0].tolist()) == b"o wo"
    assert bytes(dataset[-1][1].tolist()) == b" wor"
    with pytest.raises(IndexError, match="index 2 is out of range for a dataset of 2 blocks"):
        dataset[2]


def test_construction_is_deterministic() -> None:
    first = StdlibText(block_size=8, max_bytes=50_000)
    second = StdlibText(block_size=8, max_bytes=50_000)
    assert len(first) == len(second)
    for index in (0, len(first) // 2, len(first) - 1):
        torch.testing.assert_close(first[index], second[index], rtol=0, atol=0)


def test_default_reads_a_capped_amount_and_batches_with_a_dataloader() -> None:
    dataset = StdlibText()
    assert dataset.num_bytes == 4 * 2**20
    input, target = next(iter(DataLoader(dataset, batch_size=5)))
    assert input.shape == target.shape == (5, 64)


def test_stdlib_sources_are_walked_sorted_and_skip_installed_packages(tmp_path: Path) -> None:
    for relative in (
        "b.py",
        "a.py",
        "notes.txt",
        "pkg/z.py",
        "pkg/sub/y.py",
        "site-packages/thirdparty.py",
        "__pycache__/a.py",
        "aaa/x.py",
    ):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("pass\n")
    found = [p.relative_to(tmp_path).as_posix() for p in _stdlib_sources(tmp_path)]
    assert found == ["a.py", "b.py", "aaa/x.py", "pkg/z.py", "pkg/sub/y.py"]


def test_dataset_errors_say_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"`block_size` must be a positive integer, got 0"):
        StdlibText(block_size=0)
    with pytest.raises(ValueError, match=r"`max_bytes=8` is too small .* Pass `max_bytes >= 9`"):
        StdlibText(block_size=8, max_bytes=8)
    with pytest.raises(ValueError, match=r"No text files found in `files=\[\]`. Pass `files=\[...\]`"):
        StdlibText(files=[])
    short = tmp_path / "short.txt"
    short.write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"Read only 3 bytes .* fewer than the 5 .* Lower `block_size`"):
        StdlibText(block_size=4, files=[short])

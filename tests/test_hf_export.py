"""Tied tensors in checkpoints and the Hugging Face-style export (``fullshard checkpoint export``).

The multi-process part runs this file as a script, once per strategy (2 CPU processes, gloo):

python tests/test_hf_export.py --job OUT --strategy fsdp

which trains the model below, saves a full and a sharded checkpoint, resumes from each in a
fresh module and writes ``reference.pt`` (the trained state) and ``result.json`` to OUT.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.checkpoint import load_exported
from fullshard.checkpoint.io import TIED_KEY
from fullshard.checkpoint.layout import CommitRecord
from fullshard.checkpoint.tools import EXPORT_TIED_KEY, export_safetensors, find_ties
from fullshard.cli import main as cli
from fullshard.errors import CheckpointError, CheckpointNotFoundError

VOCAB, DIM, SEQ, STEPS = 64, 16, 8, 3


# ------------------------------------------------------------------ a model written the HF way
class RMSNorm(nn.Module):
    """Llama's norm: its weight is set in ``__init__`` only (no ``reset_parameters``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(DIM)
        # rotary frequencies: a buffer computed in __init__, not in the state dict
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, DIM, 2) / DIM), persistent=False)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        freqs = torch.outer(torch.arange(x.size(1), dtype=torch.float32), self.inv_freq)
        cos, sin = freqs.cos()[None], freqs.sin()[None]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return x + self.proj(
            F.scaled_dot_product_attention(self.rotate(q), self.rotate(k), v, is_causal=True)
        )


class TinyCausalLM(nn.Module):
    """GPT-2 / Llama shaped: the output head is the input embedding (one ``nn.Parameter``)."""

    _tied_weights_keys = ["lm_head.weight"]  # as Hugging Face lists the alias it re-ties

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.norm = RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


class LM(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = TinyCausalLM()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def tokens(n: int = 32, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))


def logits_of(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(tokens(4, seed=1))


# ------------------------------------------------------------------------ the 2-process job
def _job(out: Path, strategy: str) -> None:
    from fullshard.strategies import DDPStrategy, FSDPStrategy

    def trainer(fmt: str) -> fullshard.Trainer:
        chosen = (
            FSDPStrategy(auto_wrap_policy={Block}, state_dict_type=fmt)
            if strategy == "fsdp"
            else DDPStrategy(state_dict_type=fmt)
        )
        return fullshard.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=chosen,
            max_steps=STEPS,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=out,
        )

    data = DataLoader(TensorDataset(tokens()), batch_size=4)
    fullshard.seed_everything(0)
    trained = trainer("full")
    trained.fit(LM(), data)
    reference = {k: v.detach().clone() for k, v in trained.strategy.get_state((), full=True)[0].items()}
    trained.save_checkpoint(out / "full.ckpt")
    trained.strategy.state_dict_type = "sharded"  # the same weights in the other format
    trained.save_checkpoint(out / "sharded")
    results = {}
    for fmt, path in (("full", out / "full.ckpt"), ("sharded", out / "sharded")):
        module = LM()  # fresh weights: the resume must bring the trained ones
        resumed = trainer(fmt)
        resumed.fit(module, data, ckpt_path=path)  # at max_steps already: loads, trains nothing
        state = resumed.strategy.get_state((), full=True)[0]
        results[fmt] = {
            "tied": resumed.strategy.all_gather_object(
                module.model.lm_head.weight is module.model.embed.weight
            ),
            "keys": sorted(state) == sorted(reference),
            "equal": all(torch.equal(state[k], v) for k, v in reference.items()),
            "step": resumed.global_step,
        }
    if trained.is_global_zero:
        torch.save(reference, out / "reference.pt")
        (out / "result.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-process job for both strategies, in turn in one launch (one start-up): ``<strategy>/``."""
    from conftest import check_ok, run_script

    out = tmp_path_factory.mktemp("hf")
    check_ok(run_script("../test_hf_export.py", "--job", str(out), "--strategy", "fsdp,ddp", timeout=240))
    return out


@pytest.fixture(scope="module", params=["fsdp", "ddp"])
def job(request: pytest.FixtureRequest, jobs: Path) -> Path:
    return jobs / request.param


def _reference_model(job: Path) -> TinyCausalLM:
    reference = torch.load(job / "reference.pt", weights_only=True)
    model = TinyCausalLM()
    model.load_state_dict({k.removeprefix("model."): v for k, v in reference.items()}, strict=True)
    return model


# ------------------------------------------------------------------------ checkpoints
@pytest.mark.multiprocess
def test_tied_tensor_is_stored_once_and_resumes_tied(job: Path) -> None:
    for fmt, result in json.loads((job / "result.json").read_text()).items():
        assert result == {"tied": [True, True], "keys": True, "equal": True, "step": STEPS}, fmt
    full = torch.load(job / "full.ckpt", weights_only=False)
    embed, head = full["state_dict"]["model.embed.weight"], full["state_dict"]["model.lm_head.weight"]
    assert embed.untyped_storage().data_ptr() == head.untyped_storage().data_ptr()  # one copy in the file
    assert full[TIED_KEY] == {"model.lm_head.weight": "model.embed.weight"}
    TinyCausalLM().load_state_dict(  # the full format still loads into the plain module, strictly
        {k.removeprefix("model."): v for k, v in full["state_dict"].items()}, strict=True
    )
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    data = job / "sharded" / CommitRecord.read(job / "sharded").data
    keys = set(FileSystemReader(str(data)).read_metadata().state_dict_metadata)
    assert "model.model.embed.weight" in keys and "model.model.lm_head.weight" not in keys
    restored = LM.load_from_checkpoint(job / "sharded")  # the offline reader puts the alias back
    assert torch.equal(logits_of(restored.model), logits_of(_reference_model(job)))


# ------------------------------------------------------------------------------- export
@pytest.mark.multiprocess
@pytest.mark.parametrize("fmt", ["full.ckpt", "sharded"])
def test_export_with_prefix_round_trips(job: Path, fmt: str, tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    assert cli(["checkpoint", "export", str(job / fmt), str(tmp_path / "hf"), "--prefix", "model."]) == 0
    file = tmp_path / "hf" / "model.safetensors"
    stored = safetensors.load_file(str(file))
    assert "embed.weight" in stored and "lm_head.weight" not in stored  # written once
    assert not any(k.startswith("model.") for k in stored)
    expected = logits_of(_reference_model(job))

    model = TinyCausalLM()  # (a) the plain module, strictly, through load_exported
    model.load_state_dict(load_exported(tmp_path / "hf"), strict=True)
    assert model.lm_head.weight is model.embed.weight
    assert torch.equal(logits_of(model), expected)

    model = TinyCausalLM()  # (b) what from_pretrained does: missing tied keys allowed, re-tie
    keys = model.load_state_dict(stored, strict=False)
    assert keys.missing_keys == model._tied_weights_keys and not keys.unexpected_keys
    model.tie_weights()
    assert torch.equal(logits_of(model), expected)


@pytest.mark.multiprocess
def test_export_without_prefix_and_keep_tied(job: Path, tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    out = export_safetensors(job / "sharded", tmp_path / "lm.safetensors")
    assert out == tmp_path / "lm.safetensors"
    module = LM()
    module.load_state_dict(load_exported(out), strict=True)  # keys keep the Module's "model."
    assert torch.equal(logits_of(module.model), logits_of(_reference_model(job)))

    kept = export_safetensors(
        job / "full.ckpt", tmp_path / "kept.safetensors", prefix="model", keep_tied=True
    )
    stored = safetensors.load_file(str(kept))
    assert torch.equal(stored["lm_head.weight"], stored["embed.weight"])  # two copies, no aliasing needed
    TinyCausalLM().load_state_dict(stored, strict=True)


def test_export_errors_state_the_fix(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    torch.save({"state_dict": {"model.w": torch.randn(2), "ema.w": torch.randn(2)}}, tmp_path / "c.ckpt")
    with pytest.raises(
        CheckpointError,
        match=r"No model key of .* starts with the prefix 'net\.'; the keys start with 'model\.' \(1 key\), 'ema\.' \(1 key\)",
    ):
        export_safetensors(tmp_path / "c.ckpt", tmp_path / "a.safetensors", prefix="net.")
    with pytest.raises(
        CheckpointError,
        match=r"1 of the 2 model keys .* do not start with the prefix 'model\.': ema\.w; .* --drop-other-keys",
    ):
        export_safetensors(tmp_path / "c.ckpt", tmp_path / "a.safetensors", prefix="model")
    assert (
        cli(["checkpoint", "export", str(tmp_path / "c.ckpt"), str(tmp_path / "o"), "--prefix", "model."])
        == 1
    )
    out = export_safetensors(
        tmp_path / "c.ckpt", tmp_path / "b.safetensors", prefix="model.", drop_other_keys=True
    )
    assert set(load_exported(out)) == {"w"}
    with pytest.raises(CheckpointError, match=r"a file without the \.safetensors suffix. Give a file path"):
        export_safetensors(tmp_path / "c.ckpt", tmp_path / "c.ckpt")
    with pytest.raises(CheckpointNotFoundError, match=r"No exported weights at .*model\.safetensors'"):
        load_exported(tmp_path)


def test_ties_are_found_without_a_record() -> None:
    """[Note: finding ties]: views of one storage, or equal non-constant tensors of old checkpoints."""
    embed = torch.randn(8, 4)
    weights = {
        "embed": embed,
        "norm_a": torch.ones(4),
        "norm_b": torch.ones(4),  # equal, but constant: a coincidence, not a tie
        "head": embed.clone(),
        "view": embed.view(8, 4),
        "other": torch.randn(8, 4),
    }
    assert find_ties(weights) == {"view": "embed", "head": "embed"}
    assert find_ties(weights, recorded={"head": "embed"}) == {"head": "embed", "view": "embed"}


def test_checkpoint_without_tie_record_still_loads_and_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharded checkpoint written before ties were recorded (both keys in DCP, no record)."""
    from conftest import quiet_trainer
    from fullshard.checkpoint import engine
    from fullshard.strategies import SingleDeviceStrategy

    pytest.importorskip("safetensors")
    monkeypatch.setattr(engine, "tied_parameters", lambda module, state: None)
    fullshard.seed_everything(0)
    trainer = quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type="sharded"), max_steps=2)
    trained = LM()
    trainer.fit(trained, DataLoader(TensorDataset(tokens()), batch_size=4))
    trainer.save_checkpoint(tmp_path / "old")
    monkeypatch.undo()
    assert TIED_KEY not in torch.load(
        tmp_path / "old" / CommitRecord.read(tmp_path / "old").data / "meta.pt", weights_only=False
    )
    resumed = LM()
    quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type="sharded"), max_steps=2).fit(
        resumed, DataLoader(TensorDataset(tokens()), batch_size=4), ckpt_path=tmp_path / "old"
    )
    assert resumed.model.lm_head.weight is resumed.model.embed.weight
    out = export_safetensors(tmp_path / "old", tmp_path / "hf", prefix="model.")
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # noqa: SIM118
        assert json.loads(f.metadata()[EXPORT_TIED_KEY]) == {"lm_head.weight": "embed.weight"}
    model = TinyCausalLM()
    model.load_state_dict(load_exported(out), strict=True)
    assert torch.equal(logits_of(model), logits_of(trained.model))


# -------------------------------------------------------------------- real transformers
def test_gpt2_from_pretrained_after_export(tmp_path: Path) -> None:
    """Optional: a real ``GPT2LMHeadModel`` trained in a Module, exported, and loaded back with
    ``from_pretrained`` (skipped unless ``transformers`` is installed: pip install -e '.[hf]')."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from conftest import quiet_trainer
    from fullshard.strategies import SingleDeviceStrategy

    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=DIM,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )

    class GPT2Module(LM):
        def __init__(self) -> None:
            fullshard.Module.__init__(self)
            self.model = transformers.GPT2LMHeadModel(config)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(ids).logits  # type: ignore[no-any-return]

    fullshard.seed_everything(0)
    module = GPT2Module()
    trainer = quiet_trainer(tmp_path, strategy=SingleDeviceStrategy(state_dict_type="sharded"), max_steps=2)
    trainer.fit(module, DataLoader(TensorDataset(tokens()), batch_size=4))
    trainer.save_checkpoint(tmp_path / "ckpt")
    assert (
        cli(["checkpoint", "export", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--prefix", "model."]) == 0
    )
    config.save_pretrained(tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    assert hf.lm_head.weight is hf.transformer.wte.weight
    ids = tokens(2, seed=1)
    with torch.no_grad():
        assert torch.allclose(hf.eval()(ids).logits, module.model.eval()(ids).logits)


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--strategy", required=True, help="fsdp, ddp, or both in turn: fsdp,ddp")
    args = parser.parse_args()
    strategies = args.strategy.split(",")
    for strategy in strategies:
        if strategy not in ("fsdp", "ddp"):
            parser.error(f"--strategy: {strategy!r} is not fsdp or ddp")
        _job(args.job / strategy if len(strategies) > 1 else args.job, strategy)


if __name__ == "__main__":
    sys.exit(_main())

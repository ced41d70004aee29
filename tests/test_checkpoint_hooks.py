"""The save hooks see the whole checkpoint, and what they remove is not saved: the fine-tuning
idiom of keeping only a LoRA-style adapter (``on_save_checkpoint`` deletes the base weights from
``checkpoint["state_dict"]``), loaded back into a whole model with ``strict_loading = False``,
as under Lightning. Each case: 2 CPU processes (tests/scripts/adapter_ckpt_job.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import check_ok, run_script

pytestmark = pytest.mark.multiprocess

ADAPTER = ["layer.lora_a.weight", "layer.lora_b.weight"]
EVERY_KEY = ["head.bias", "head.weight", "layer.base.bias", "layer.base.weight", *ADAPTER]


@pytest.mark.parametrize(
    ("strategy", "fmt"),
    [
        ("ddp", "full"),
        ("ddp", "sharded"),
        ("fsdp", "full"),
        ("fsdp", "sharded"),
        ("fsdp2", "full"),
        ("fsdp2", "sharded"),
    ],
)
def test_a_hook_keeps_only_the_adapter(tmp_path: Path, strategy: str, fmt: str) -> None:
    check_ok(
        run_script("adapter_ckpt_job.py", "--out", str(tmp_path), "--strategy", strategy, "--format", fmt)
    )
    result = json.loads((tmp_path / "result.json").read_text())
    seen = result["seen"]
    # the hook saw the model's whole state and the optimizer's, as Lightning gives them:
    # whole tensors for a full checkpoint, this rank's shards (DTensors under FSDP2) for a sharded one
    assert seen["state_dict_keys"] == EVERY_KEY
    assert seen["optimizer_states"] == 1 and seen["optimizer_state_keys"] == ["param_groups", "state"]
    if strategy == "fsdp2" and fmt == "sharded":
        assert seen["tensor_types"] == ["DTensor"]
    # what it removed was not written; the adapter loads into a whole model, the base stays its own
    assert result["saved_keys"] == ADAPTER
    assert result["global_step"] == 3
    assert result["adapter_loaded"] and result["base_kept"] and result["base_differs_from_saved"]
    # the optimizer state of the adapter resumed too (under fsdp a rank whose flat shard holds
    # none of the adapter has no optimizer state of its own: the save still holds all of it)
    assert result["optimizer_keys"] == ADAPTER and result["optimizer_loaded"]

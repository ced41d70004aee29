"""The state-dict options a full save asks torch for ([Note: full saves gathered off the GPU] in
fullshard/strategies/state_dict_options.py): a sharded model's full state gathered to rank 0's
host memory on CUDA; on the CPU and for every other use, the options of before."""

from __future__ import annotations

import itertools

import pytest
from torch.distributed.checkpoint.state_dict import StateDictOptions

from fullshard.strategies import (
    DDPStrategy,
    FSDP2Strategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)
from fullshard.strategies.state_dict_options import state_dict_options


def test_a_sharded_models_full_save_on_cuda_gathers_to_rank0_host_memory() -> None:
    options = state_dict_options(full=True, device_type="cuda", sharded=True, to_save=True)
    assert options == StateDictOptions(full_state_dict=True, cpu_offload=True)


@pytest.mark.parametrize(
    ("full", "device_type", "sharded", "to_save"),
    [
        combo
        for combo in itertools.product((True, False), ("cpu", "cuda"), (True, False), (True, False))
        if combo != (True, "cuda", True, True)
    ],
)
def test_every_other_state_keeps_the_options_of_before(
    full: bool, device_type: str, sharded: bool, to_save: bool
) -> None:
    """On the CPU (where a full save is byte for byte what it was), for a model whose parameters
    are not sharded (one device, DDP: nothing is gathered), for sharded states, and for full
    states wanted on every rank (load templates, module_state_dict): cpu_offload=False."""
    options = state_dict_options(full=full, device_type=device_type, sharded=sharded, to_save=to_save)
    assert options == StateDictOptions(full_state_dict=full, cpu_offload=False)


def test_the_strategies_that_gather_a_full_state_are_the_sharded_ones() -> None:
    """What each strategy passes as ``sharded``: FSDP1, FSDP2 and model parallelism gather."""
    assert FSDPStrategy.shards_parameters and FSDP2Strategy.shards_parameters
    assert ModelParallelStrategy.shards_parameters
    assert not DDPStrategy.shards_parameters and not SingleDeviceStrategy.shards_parameters

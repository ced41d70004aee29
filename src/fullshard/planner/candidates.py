"""Which configurations to weigh for a model, and how to simulate a deep one cheaply.

The blocks to wrap are the model's repeated layers: the classes with two or more instances that
hold parameters, keeping the outermost (a Transformer's block, not the ``Linear`` inside it).

[Note: simulating fewer layers]
A model of L identical blocks held in ``ModuleList``s uses, per category, memory that grows by
the same amount with each block (its shard, its gradient, its optimizer state, its saved
activations), while what does not repeat (embeddings, head, the gathered unit in flight) stays.
So a deep model is simulated twice, with its block lists cut to ``a`` and ``b`` blocks, and every
figure is extended along the line through the two: exact for a model of identical blocks when
``a``, ``b`` and L are multiples of the checkpointing period. A model whose lists differ in
length, or with fewer than :data:`MIN_BLOCKS_TO_SCALE` blocks, is simulated whole.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from torch import nn

from fullshard.planner.config import Candidate

MIN_BLOCKS_TO_SCALE = 12
SCALE_POINTS = (4, 8)  # multiples of every checkpointing period the planner tries (1 and 2)


def repeated_blocks(model: nn.Module) -> tuple[str, ...]:
    """Names of the outermost module classes that occur at least twice and hold parameters, of
    those whose instances hold at least a tenth of the largest one's parameters."""
    counts = Counter(
        type(m).__name__
        for m in model.modules()
        if m is not model
        and not isinstance(m, nn.ModuleList | nn.ModuleDict)  # containers without a forward
        and any(True for _ in m.parameters())
    )
    repeated = {name for name, count in counts.items() if count >= 2}
    looked_through: set[int] = set()  # instances that are no block: a lone head, the list's holder

    def visit(module: nn.Module, found: dict[str, list[nn.Module]]) -> dict[str, list[nn.Module]]:
        for child in module.children():  # instances outside any other repeated instance
            if type(child).__name__ in repeated and id(child) not in looked_through:
                found.setdefault(type(child).__name__, []).append(child)
            else:
                visit(child, found)
        return found

    # a class with one outer instance (a lone head Linear, the nn.Sequential holding the blocks) is
    # no block there: look inside that instance instead, until every outer class repeats
    while True:
        outer = visit(model, {})
        lone = [m for instances in outer.values() if len(instances) < 2 for m in instances]
        if not lone:
            break
        looked_through.update(id(m) for m in lone)
    # a norm beside the blocks repeats too (a final LayerNorm, as in every block): keep the classes
    # whose instances are of a size with the largest
    size = {name: max(_numel(m) for m in instances) for name, instances in outer.items()}
    largest = max(size.values(), default=0)
    return tuple(sorted(name for name in outer if size[name] * 10 >= largest))


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def block_lists(model: nn.Module, wrap: tuple[str, ...]) -> list[tuple[nn.Module, str, nn.ModuleList]]:
    """The ``ModuleList``s made only of ``wrap`` blocks, with their parent and attribute name."""
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if (
                isinstance(child, nn.ModuleList)
                and len(child)
                and all(type(m).__name__ in wrap for m in child)
            ):
                found.append((parent, name, child))
    return found


def scalable_depth(model: nn.Module, wrap: tuple[str, ...]) -> int | None:
    """The blocks per list when :func:`cut_blocks` may stand in for the whole model (see
    [Note: simulating fewer layers]); None where the model is simulated whole."""
    lists = block_lists(model, wrap)
    lengths = {len(blocks) for _, _, blocks in lists}
    in_lists = sum(len(blocks) for _, _, blocks in lists)
    in_model = sum(1 for m in model.modules() if type(m).__name__ in wrap)
    if len(lengths) != 1 or in_lists != in_model:
        return None
    depth = lengths.pop()
    return depth if depth >= MIN_BLOCKS_TO_SCALE else None


def cut_blocks(model: nn.Module, wrap: tuple[str, ...], depth: int) -> nn.Module:
    """A copy of ``model`` with each block list cut to its first ``depth`` blocks (``model`` is
    left as it is). Meant for a model on the meta device, where a copy allocates nothing."""
    memo: dict[int, Any] = {}
    for _, _, blocks in block_lists(model, wrap):  # copied first: the model's copy takes them from memo
        memo[id(blocks)] = nn.ModuleList([copy.deepcopy(block, memo) for block in list(blocks)[:depth]])
    return copy.deepcopy(model, memo)


def enumerate_candidates(
    wrap: tuple[str, ...],
    *,
    num_blocks: int,
    num_nodes: int,
    devices: int,
    device_type: str,
    engines: tuple[str, ...] = ("fsdp2", "fsdp"),
) -> list[Candidate]:
    """Every configuration to weigh for ``num_nodes`` nodes of ``devices`` processes: sharding x checkpointing (none, every block, every 2nd when
    there are 4 or more blocks) x CPU offload (CUDA only: on CPU the state is in host memory
    already) x engine."""
    shardings = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"]
    if num_nodes > 1 and devices > 1:  # something to shard within a node, and nodes to replicate over
        shardings.insert(2, "HYBRID_SHARD")
    checkpointing = [0, 1] + ([2] if num_blocks >= 4 else [])
    offloads = [False, True] if device_type == "cuda" else [False]
    return [
        Candidate(engine, sharding, wrap, every, offload)
        for engine in engines
        for sharding in shardings
        for every in checkpointing
        for offload in offloads
        if not (offload and sharding == "NO_SHARD")  # NO_SHARD has no sharded state to offload
    ]

"""Which configurations to weigh for a model, and how to simulate a deep one cheaply.

The blocks to wrap are the model's repeated layers: the classes with two or more instances that
hold parameters, keeping the outermost (a Transformer's block, not the ``Linear`` inside it),
then the finest stage of them ([Note: the finest repeated block]).

[Note: the finest repeated block]
A class whose every instance only holds finer blocks (no parameters of its own, each child with
parameters a composite module of a repeated class, two or more of one class: a ResNet's
``layer1``..``layer4``, ``nn.Sequential``s of ``BasicBlock``s) is no block to wrap by: one unit
would hold a whole stage (a ResNet-18's last holds 72% of the parameters), gathered at once. Its
blocks are wrapped instead, and so on down, while the number of units stays at most
:data:`MAX_UNITS`. The bound is what keeps the count sane: each unit costs two or three
collectives a step whatever its size (their latency, tens of microseconds on NCCL and over a
millisecond on gloo, is paid per unit) and bookkeeping per unit; past about a hundred units that
cost outgrows what smaller units save in memory. A Transformer's layer holds norms (leaf modules
with parameters) beside its attention and MLP, so it is never looked through: it stays the unit.

[Note: simulating fewer layers]
A model of L identical blocks held in ``ModuleList``s uses, per category, memory that grows by
the same amount with each block (its shard, its gradient, its optimizer state, its saved
activations), while what does not repeat (embeddings, head, the gathered unit in flight) stays.
So a deep model is simulated twice, with its block lists cut to ``a`` and ``b`` blocks, and every
figure is extended along the line through the two: exact for a model of identical blocks when
``a``, ``b`` and L are multiples of the checkpointing period. A model whose lists differ in
length, whose blocks are not identical ([Note: identical blocks]), or with fewer than
:data:`MIN_BLOCKS_TO_SCALE` blocks, is simulated whole; the plan's notes say which was done.

[Note: identical blocks]
Two blocks use memory alike when they are alike in everything a step reads: the class and path
of every module inside, each parameter's and buffer's shape, dtype and ``requires_grad`` (what
is sharded, gradients and optimizer state), and each module's plain attributes (numbers,
strings, flags: a width, a dropout rate, a sliding-window flag change the activations). An int
attribute that is the block's position plus a constant (``layer_idx``) is left out: it names the
block and changes no memory. Blocks that repeat with a period p (alternating local and global
attention) are extended too when p divides ``a``, ``b`` and L: each cut then holds whole periods,
and each period adds the same. Anything else (widths that change along the list) is simulated
whole: a line through two cuts would price the later blocks as the first ones.

[Note: a peak per phase]
The peak of a step is the highest of three phases' peaks: forward (with last step's gradients
alive), backward, and the optimizer step. Each phase's peak grows linearly with the blocks, but
at different rates: the optimizer step's with the state, backward's with the saved activations.
So the step's peak is the highest of three lines, and which one is highest can change with depth:
at 4 blocks the peak may be in backward and at 8 in the optimizer step, or in the same phase at
both cuts and another at 80 blocks. A line through the two overall peaks then mixes moments: it
said 717 GiB for Llama 2 70B on 8 processes without checkpointing, where all 80 layers simulated
give 745.63 GiB (as the phases' lines do, to the byte), and its split (activations at one moment,
gradients at another) can come out negative (issue 40 measured -90.8 GiB of activations).
The simulation therefore records each phase's peak and split (``torch_tools.end_phase``), each
phase is extended on its own line, and the highest extended phase is the step's. Offload rows
take the state out of each phase and keep the highest rest, as the moment of the peak moves when
the state leaves the device. A figure that still comes out negative means a peak moved within a
phase between the cuts; that probe is then simulated whole rather than extended, and the notes
say so.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, Any

from torch import nn

from fullshard.planner.config import Candidate
from fullshard.planner.torch_tools import Phase

if TYPE_CHECKING:
    from fullshard.planner.simulate import Simulated

MIN_BLOCKS_TO_SCALE = 12
#: the most units the planner wraps by finer blocks ([Note: the finest repeated block])
MAX_UNITS = 100
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
    while (finer := _blocks_inside(outer, repeated)) is not None and _units(finer) <= MAX_UNITS:
        outer = finer  # see [Note: the finest repeated block]
    # a norm beside the blocks repeats too (a final LayerNorm, as in every block): keep the classes
    # whose instances are of a size with the largest
    size = {name: max(_numel(m) for m in instances) for name, instances in outer.items()}
    largest = max(size.values(), default=0)
    return tuple(sorted(name for name in outer if size[name] * 10 >= largest))


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _units(found: dict[str, list[nn.Module]]) -> int:
    return sum(len(instances) for instances in found.values())


def _holds_only_blocks(module: nn.Module, repeated: set[str]) -> list[nn.Module] | None:
    """The blocks ``module`` is a stage of, or None: it has no parameters of its own, every child
    with parameters is a module with children of its own (not a ``Linear`` or a norm) whose class
    repeats in the model, and two or more of those children share a class."""
    if any(True for _ in module.parameters(recurse=False)):
        return None
    held = [child for child in module.children() if any(True for _ in child.parameters())]
    if not held or any(type(c).__name__ not in repeated or not any(True for _ in c.children()) for c in held):
        return None
    classes = Counter(type(child).__name__ for child in held)
    return held if max(classes.values()) >= 2 else None


def _blocks_inside(
    outer: dict[str, list[nn.Module]], repeated: set[str]
) -> dict[str, list[nn.Module]] | None:
    """``outer`` with each class whose every instance is a stage of finer blocks replaced by those
    blocks ([Note: the finest repeated block]); None where no class is."""
    finer: dict[str, list[nn.Module]] = {}
    changed = False
    for name, instances in outer.items():
        stages = [_holds_only_blocks(m, repeated) for m in instances]
        if all(blocks is not None for blocks in stages):
            changed = True
            for blocks in stages:
                for block in blocks or ():
                    finer.setdefault(type(block).__name__, []).append(block)
        else:
            finer.setdefault(name, []).extend(instances)
    return finer if changed else None


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
    return depth_and_reason(model, wrap)[0]


def depth_and_reason(model: nn.Module, wrap: tuple[str, ...]) -> tuple[int | None, str]:
    """:func:`scalable_depth`, and a line for the plan's notes saying why the model is extended
    or simulated whole (empty when it is small enough to simulate whole anyway)."""
    lists = block_lists(model, wrap)
    lengths = {len(blocks) for _, _, blocks in lists}
    in_lists = sum(len(blocks) for _, _, blocks in lists)
    in_model = sum(1 for m in model.modules() if type(m).__name__ in wrap)
    if not lists or in_lists != in_model:
        return None, ""
    depth = max(lengths)
    if depth < MIN_BLOCKS_TO_SCALE:
        return None, ""
    if len(lengths) != 1:
        return None, f"simulated whole: its block lists differ in length ({sorted(lengths)})"
    periods = [_period([block_signature(block) for block in blocks]) for _, _, blocks in lists]
    period = max(periods)
    if any(points % period for points in (*SCALE_POINTS, depth)):
        first = next(blocks for (_, _, blocks), p in zip(lists, periods, strict=True) if p == period)
        where = _first_difference(first)
        return None, (
            f"simulated whole: its {depth} blocks are not identical ({where}), nor do they repeat with a period "
            f"dividing {SCALE_POINTS[0]}, {SCALE_POINTS[1]} and {depth}"
        )
    kind = "identical" if period == 1 else f"identical every {period} (the pattern repeats)"
    return depth, (
        f"simulated with {SCALE_POINTS[0]} and {SCALE_POINTS[1]} blocks per list and extended to {depth} "
        f"(the model's blocks are {kind}: see [Note: simulating fewer layers])"
    )


Signature = tuple[tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...], tuple[tuple[Any, ...], ...]]


def block_signature(block: nn.Module) -> Signature:
    """What makes two blocks use memory alike (see [Note: identical blocks]): the path and class of
    every module inside with its plain attributes (numbers, strings, flags, None), and each
    parameter's and buffer's name, shape, dtype and ``requires_grad``."""
    modules = tuple(
        (
            path,
            type(module).__qualname__,
            tuple(
                (k, v)
                for k, v in sorted(vars(module).items())
                if not k.startswith("_") and isinstance(v, int | float | str | bool | None)
            ),
        )
        for path, module in block.named_modules()
    )
    tensors = tuple(
        (name, tuple(t.shape), t.dtype, t.requires_grad)
        for name, t in [*block.named_parameters(), *block.named_buffers()]
    )
    return modules, tensors


def _without_positions(signatures: list[Signature]) -> list[Signature]:
    """``signatures`` less the int attributes that are the block's position plus a constant
    (``layer_idx``, ``layer_number``): they differ from block to block but change no memory."""
    counted: set[tuple[str, str]] = set()
    for path, _, attributes in signatures[0][0] if len(signatures) > 1 else ():
        for key, first in attributes:
            if isinstance(first, bool) or not isinstance(first, int):
                continue
            values = [dict(a).get(key) for sig in signatures for p, _, a in sig[0] if p == path]
            if len(values) == len(signatures) and all(v == first + i for i, v in enumerate(values)):
                counted.add((path, key))
    return [
        (
            tuple((p, c, tuple((k, v) for k, v in a if (p, k) not in counted)) for p, c, a in modules),
            tensors,
        )
        for modules, tensors in signatures
    ]


def _period(signatures: list[Signature]) -> int:
    """The smallest ``p`` with block ``i`` like block ``i % p`` for every ``i``."""
    signatures = _without_positions(signatures)
    for period in range(1, len(signatures) + 1):
        if all(signatures[i] == signatures[i % period] for i in range(len(signatures))):
            return period
    return len(signatures)


def _first_difference(blocks: nn.ModuleList) -> str:
    """Where the first block unlike block 0 differs from it, in words."""
    signatures = _without_positions([block_signature(block) for block in blocks])
    first_modules, first_tensors = signatures[0]
    for i, (modules, tensors) in enumerate(signatures[1:], start=1):
        for mine, theirs, what in ((first_tensors, tensors, "tensor"), (first_modules, modules, "module")):
            if mine != theirs:
                at = next((a[0] for a, b in zip(mine, theirs, strict=False) if a != b), "its structure")
                return f"block {i}'s {what} {at or '(the block itself)'} is unlike block 0's"
    return "they differ"


def cut_blocks(model: nn.Module, wrap: tuple[str, ...], depth: int) -> nn.Module:
    """A copy of ``model`` with each block list cut to its first ``depth`` blocks (``model`` is
    left as it is). Meant for a model on the meta device, where a copy allocates nothing."""
    memo: dict[int, Any] = {}
    for _, _, blocks in block_lists(model, wrap):  # copied first: the model's copy takes them from memo
        memo[id(blocks)] = nn.ModuleList([copy.deepcopy(block, memo) for block in list(blocks)[:depth]])
    return copy.deepcopy(model, memo)


def extend_to_depth(low: Simulated, high: Simulated, cuts: tuple[int, int], depth: int) -> Simulated | None:
    """The simulation of ``depth`` blocks per list from those of ``cuts`` blocks (``low``,
    ``high``): each phase's peak, split and offloadable bytes along the line through the two, and
    the highest phase's as the step's ([Note: a peak per phase]). None where a figure would come
    out negative: that phase's peak is not linear in depth (it moved within the phase between the
    cuts), and the model is to be simulated whole."""
    a, b = cuts
    scale = (depth - a) / (b - a)

    def line(x: int, y: int) -> int:
        return round(x + (y - x) * scale)

    def of(phase: Phase, other: Phase) -> Phase:
        return Phase(
            line(phase.peak, other.peak),
            {k: line(v, other.split[k]) for k, v in phase.split.items()},
            {k: line(v, other.offloadable[k]) for k, v in phase.offloadable.items()},
            line(phase.resident, other.resident),
            {k: line(v, other.resident_split[k]) for k, v in phase.resident_split.items()},
        )

    if len(low.phases) != len(high.phases) or not low.phases:
        return None
    phases = tuple(of(x, y) for x, y in zip(low.phases, high.phases, strict=True))
    figures = [
        n
        for p in phases
        for n in (p.peak, *p.split.values(), *p.offloadable.values(), p.resident, *p.resident_split.values())
    ]
    if min(figures) < 0:
        return None
    top = max(phases, key=lambda phase: phase.peak)
    return dataclasses.replace(
        low,
        peak=top.peak,
        split=dict(top.split),
        offloadable=dict(top.offloadable),
        forward_flops=line(low.forward_flops, high.forward_flops),
        backward_flops=line(low.backward_flops, high.backward_flops),
        block_forward_flops=line(low.block_forward_flops, high.block_forward_flops),
        phases=phases,
        extended_from=cuts,
    )


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

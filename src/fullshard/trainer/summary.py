"""Text the Trainer prints for people: the model summary at fit start, the test results table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fullshard.strategies.parameter_sizes import ParameterSize, unsharded_parameter_sizes


def human_count(n: int) -> str:
    """A count as Lightning's summary shows it: groups of three digits become K, M, B, T, with one
    decimal below 100 of the unit (``"1.2 K"``, ``"123 K"``); below 1000 the number and two spaces
    (a blank unit, so the column lines up)."""
    digits = len(str(n)) if n > 0 else 1
    group = min((digits + 2) // 3, 5) - 1
    unit = (" ", "K", "M", "B", "T")[group]
    value = n / 10 ** (3 * group)
    if group == 0 or value >= 100:
        return f"{int(value):,d} {unit}"
    return f"{value:,.1f} {unit}"


@dataclass(frozen=True)
class SummaryData:
    """What the model summary shows: ``columns`` as Lightning's ``summary_data`` (a header and the
    column's values, one per layer), and the totals (``local_parameters``: this process's share
    of a sharded model)."""

    columns: list[tuple[str, list[str]]]
    total_parameters: int
    trainable_parameters: int
    local_parameters: int
    model_size: float  # MB
    total_training_modes: dict[str, int]
    total_flops: int = field(default=0)


def summary_data(
    model: nn.Module,
    sizes: Sequence[ParameterSize] | None = None,
    max_depth: int = 1,
    run_example: bool = True,
) -> SummaryData:
    """The model's layers (down to ``max_depth`` levels; -1: all) with their parameter counts,
    the FLOPs of one forward of ``model.example_input_array`` and each layer's input and output
    sizes in it (when the module has one and ``run_example``), and the totals.

    ``sizes`` (from :meth:`Strategy.parameter_sizes`) gives each parameter's full size, so that a
    sharded model is counted whole. Without ``sizes`` the parameters are counted as they are in
    ``model``. ``run_example=False`` (a sharded model, whose forward needs every process) leaves
    the FLOPs at 0 and the sizes out.
    """
    sizes = unsharded_parameter_sizes(model) if sizes is None else sizes
    layers = _layers(model, max_depth)
    counts = [sum(s.numel for s in sizes if s.name.startswith(name + ".")) for name, _ in layers]
    modes = ["train" if layer.training else "eval" for _, layer in layers]
    example = getattr(model, "example_input_array", None) if run_example else None
    shapes, flops, total_flops = _run_example(model, layers, example) if example is not None else ({}, {}, 0)
    columns = [
        (" ", [str(i) for i in range(len(layers))]),
        ("Name", [name for name, _ in layers]),
        ("Type", [type(layer).__name__ for _, layer in layers]),
        ("Params", [human_count(count) for count in counts]),
        ("Mode", modes),
        ("FLOPs", [human_count(flops.get(name, 0)) for name, _ in layers]),
    ]
    if example is not None:
        columns.append(("In sizes", [str(shapes.get(name, ("?", "?"))[0]) for name, _ in layers]))
        columns.append(("Out sizes", [str(shapes.get(name, ("?", "?"))[1]) for name, _ in layers]))
    total = sum(s.numel for s in sizes)
    leftover = total - sum(counts)
    if leftover > 0:  # parameters of no listed layer (the root's own), in a row of their own
        for header, values in columns:
            values.append(
                {" ": " ", "Name": "other params", "Params": human_count(leftover)}.get(header, "n/a")
            )
    all_modes = ["train" if m.training else "eval" for name, m in model.named_modules() if name]
    return SummaryData(
        columns=columns,
        total_parameters=total,
        trainable_parameters=sum(s.numel for s in sizes if s.requires_grad),
        local_parameters=sum(s.local_numel for s in sizes),
        model_size=sum(s.numel * s.element_size for s in sizes) / 1e6,
        total_training_modes={"train": all_modes.count("train"), "eval": all_modes.count("eval")},
        total_flops=total_flops,
    )


def _shape(value: Any) -> Any:
    """A tensor's shape as a list, nested in lists for a sequence of them; ``"?"`` otherwise."""
    if hasattr(value, "shape"):
        return list(value.shape)
    if isinstance(value, list | tuple):
        return [_shape(v) for v in value]
    return "?"


def _run_example(
    model: nn.Module, layers: list[tuple[str, nn.Module]], example: Any
) -> tuple[dict[str, tuple[Any, Any]], dict[str, int], int]:
    """Run ``example`` through ``model`` once (eval mode, no grad) and return each layer's input and
    output sizes (its first call), its FLOPs, and the total FLOPs. The modes are restored after."""
    shapes: dict[str, tuple[Any, Any]] = {}
    handles = []
    for name, layer in layers:

        def record(_: nn.Module, args: Any, kwargs: Any, out: Any, name: str = name) -> None:
            given = (*args, *kwargs.values())
            shapes.setdefault(name, (_shape(given[0] if len(given) == 1 else given), _shape(out)))

        handles.append(layer.register_forward_hook(record, with_kwargs=True))
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    example = apply_to_collection(example, torch.Tensor, lambda t: t.to(device))
    counter = FlopCounterMode(display=False)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad(), counter:
            if isinstance(example, list | tuple):
                model(*example)
            elif isinstance(example, dict):
                model(**example)
            else:
                model(example)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training
    by_module = counter.get_flop_counts()
    root = type(model).__name__
    flops = {name: int(sum(by_module.get(f"{root}.{name}", {}).values())) for name, _ in layers}
    return shapes, flops, int(counter.get_total_flops())


def format_summary(data: SummaryData) -> str:
    """:func:`summary_data` as a text table; the share this process holds is shown beside the
    total when it is smaller."""
    headers = ["" if h.strip() == "" else h for h, _ in data.columns]
    rows = [tuple(headers), *zip(*(values for _, values in data.columns), strict=True)]
    widths = [max(len(row[c]) for row in rows) for c in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    rule = "-" * max(len(line) for line in lines)
    total, trainable, local = data.total_parameters, data.trainable_parameters, data.local_parameters

    def count(n: int) -> str:
        return human_count(n).strip()

    share = f" (sharded: this process holds {count(local)})" if local < total else ""
    return "\n".join(
        [
            lines[0],
            rule,
            *lines[1:],
            rule,
            f"{count(trainable)}  Trainable params",
            f"{count(total - trainable)}  Non-trainable params",
            f"{count(total)}  Total params{share}",
            f"{data.model_size:.3f}  Total estimated model params size (MB)",
            f"{count(data.total_flops)}  Total Flops",
        ]
    )


def model_summary(model: nn.Module, sizes: Sequence[ParameterSize] | None = None, max_depth: int = 1) -> str:
    """The model summary as text (:func:`summary_data`, :func:`format_summary`)."""
    return format_summary(summary_data(model, sizes, max_depth))


def _layers(model: nn.Module, max_depth: int) -> list[tuple[str, nn.Module]]:
    """Named submodules of ``model`` at depth 1 to ``max_depth`` (-1: every depth), in order."""
    found = []
    for name, module in model.named_modules():
        depth = name.count(".") + 1
        if name and (max_depth == -1 or depth <= max_depth):
            found.append((name, module))
    return found


def format_results(stage: str, results: list[dict[str, float]]) -> str:
    """The metrics of a ``validate``/``test`` run as a table, a column per dataloader (the
    ``/dataloader_idx_<i>`` suffix left out of the names, as in Lightning)."""
    title = "Validate metric" if stage == "validate" else "Test metric"
    rows: dict[str, list[str]] = {}
    for column, metrics in enumerate(results):
        suffix = f"/dataloader_idx_{column}"
        for name, value in metrics.items():
            short = name[: -len(suffix)] if name.endswith(suffix) else name
            rows.setdefault(short, [""] * len(results))[column] = f"{value:.6g}"
    width = max(len(title), *(len(k) for k in rows))
    cell = 16
    rule = "─" * (width + 4 + (cell + 4) * len(results))
    header = "    ".join(f"DataLoader {i}".ljust(cell) for i in range(len(results)))
    lines = [rule, f"{title.ljust(width)}    {header}".rstrip(), rule]
    lines += [
        f"{name.ljust(width)}    {'    '.join(v.ljust(cell) for v in values)}".rstrip()
        for name, values in sorted(rows.items())
    ]
    lines.append(rule)
    return "\n".join(lines)

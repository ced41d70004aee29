"""Text the Trainer prints for people: the model summary at fit start, the test results table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from fullshard.strategies.parameter_sizes import ParameterSize, unsharded_parameter_sizes


def _human(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


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


def summary_data(
    model: nn.Module, sizes: Sequence[ParameterSize] | None = None, max_depth: int = 1
) -> SummaryData:
    """The model's layers (down to ``max_depth`` levels; -1: all) with their parameter counts,
    and the totals.

    ``sizes`` (from :meth:`Strategy.parameter_sizes`) gives each parameter's full size, so that a
    sharded model is counted whole. Without ``sizes`` the parameters are counted as they are in
    ``model``.
    """
    sizes = unsharded_parameter_sizes(model) if sizes is None else sizes
    layers = _layers(model, max_depth)
    counts = [sum(s.numel for s in sizes if s.name.startswith(name + ".")) for name, _ in layers]
    modes = ["train" if layer.training else "eval" for _, layer in layers]
    columns = [
        (" ", [str(i) for i in range(len(layers))]),
        ("Name", [name for name, _ in layers]),
        ("Type", [type(layer).__name__ for _, layer in layers]),
        ("Params", [_human(count) for count in counts]),
        ("Mode", modes),
    ]
    all_modes = ["train" if m.training else "eval" for name, m in model.named_modules() if name]
    return SummaryData(
        columns=columns,
        total_parameters=sum(s.numel for s in sizes),
        trainable_parameters=sum(s.numel for s in sizes if s.requires_grad),
        local_parameters=sum(s.local_numel for s in sizes),
        model_size=sum(s.numel * s.element_size for s in sizes) / 1e6,
        total_training_modes={"train": all_modes.count("train"), "eval": all_modes.count("eval")},
    )


def format_summary(data: SummaryData) -> str:
    """:func:`summary_data` as a text table; the share this process holds is shown beside the
    total when it is smaller."""
    headers = ["" if h.strip() == "" else h for h, _ in data.columns]
    rows = [tuple(headers), *zip(*(values for _, values in data.columns), strict=True)]
    widths = [max(len(row[c]) for row in rows) for c in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    rule = "-" * max(len(line) for line in lines)
    total, trainable, local = data.total_parameters, data.trainable_parameters, data.local_parameters
    share = f" (sharded: this process holds {_human(local)})" if local < total else ""
    return "\n".join(
        [
            lines[0],
            rule,
            *lines[1:],
            rule,
            f"{_human(trainable)}  Trainable params",
            f"{_human(total - trainable)}  Non-trainable params",
            f"{_human(total)}  Total params{share}",
            f"{data.model_size:.3f}  Total estimated model params size (MB)",
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

"""Text the Trainer prints for people: the model summary at fit start, the test results table."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fullshard.strategies.parameter_sizes import ParameterSize, unsharded_parameter_sizes


def _human(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def model_summary(model: nn.Module, sizes: Sequence[ParameterSize] | None = None, max_depth: int = 1) -> str:
    """A table of the model's layers (down to ``max_depth`` levels; -1: all) with their
    parameter counts, and the totals.

    ``sizes`` (from :meth:`Strategy.parameter_sizes`) gives each parameter's full size, so that a
    sharded model is counted whole; the share this process holds is shown beside the total when
    it is smaller. Without ``sizes`` the parameters are counted as they are in ``model``.
    """
    sizes = unsharded_parameter_sizes(model) if sizes is None else sizes
    rows = [("", "Name", "Type", "Params", "Mode")]
    for i, (name, child) in enumerate(_layers(model, max_depth)):
        mode = "train" if child.training else "eval"
        count = sum(s.numel for s in sizes if s.name.startswith(name + "."))
        rows.append((str(i), name, type(child).__name__, _human(count), mode))
    widths = [max(len(row[c]) for row in rows) for c in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    rule = "-" * max(len(line) for line in lines)
    total = sum(s.numel for s in sizes)
    trainable = sum(s.numel for s in sizes if s.requires_grad)
    local = sum(s.local_numel for s in sizes)
    share = f" (sharded: this process holds {_human(local)})" if local < total else ""
    size_mb = sum(s.numel * s.element_size for s in sizes) / 1e6
    return "\n".join(
        [
            lines[0],
            rule,
            *lines[1:],
            rule,
            f"{_human(trainable)}  Trainable params",
            f"{_human(total - trainable)}  Non-trainable params",
            f"{_human(total)}  Total params{share}",
            f"{size_mb:.3f}  Total estimated model params size (MB)",
        ]
    )


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

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


def model_summary(model: nn.Module, sizes: Sequence[ParameterSize] | None = None) -> str:
    """A table of the model's top-level layers with their parameter counts, and the totals.

    ``sizes`` (from :meth:`Strategy.parameter_sizes`) gives each parameter's full size, so that a
    sharded model is counted whole; the share this process holds is shown beside the total when
    it is smaller. Without ``sizes`` the parameters are counted as they are in ``model``.
    """
    sizes = unsharded_parameter_sizes(model) if sizes is None else sizes
    per_child: dict[str, int] = {}
    for size in sizes:
        top = size.name.split(".", 1)[0]
        per_child[top] = per_child.get(top, 0) + size.numel
    rows = [("", "Name", "Type", "Params", "Mode")]
    for i, (name, child) in enumerate(model.named_children()):
        mode = "train" if child.training else "eval"
        rows.append((str(i), name, type(child).__name__, _human(per_child.get(name, 0)), mode))
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

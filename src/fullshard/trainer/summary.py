"""Text the Trainer prints for people: the model summary at fit start, the test results table."""

from __future__ import annotations

from torch import nn


def _count(module: nn.Module) -> tuple[int, int]:
    params = list(module.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return total, trainable


def _human(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def model_summary(model: nn.Module) -> str:
    """A table of the model's top-level layers with their parameter counts, and the totals."""
    rows = [("", "Name", "Type", "Params", "Mode")]
    for i, (name, child) in enumerate(model.named_children()):
        rows.append((str(i), name, type(child).__name__, _human(_count(child)[0]), "train" if child.training else "eval"))
    widths = [max(len(row[c]) for row in rows) for c in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    rule = "-" * max(len(line) for line in lines)
    total, trainable = _count(model)
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    return "\n".join(
        [
            lines[0],
            rule,
            *lines[1:],
            rule,
            f"{_human(trainable)}  Trainable params",
            f"{_human(total - trainable)}  Non-trainable params",
            f"{_human(total)}  Total params",
            f"{size_mb:.3f}  Total estimated model params size (MB)",
        ]
    )


def format_results(stage: str, metrics: dict[str, float]) -> str:
    """The metrics of a ``validate``/``test`` run as a two-column table."""
    title = "Validate metric" if stage == "validate" else "Test metric"
    width = max(len(title), *(len(k) for k in metrics))
    rule = "─" * (width + 22)
    lines = [rule, f"{title.ljust(width)}    DataLoader 0", rule]
    lines += [f"{name.ljust(width)}    {value:.6g}" for name, value in sorted(metrics.items())]
    lines.append(rule)
    return "\n".join(lines)

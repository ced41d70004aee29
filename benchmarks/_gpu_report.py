"""The lines benchmarks/gpu_check.py's report gives the speed parts of benchmarks/_gpu_speed.py
(the paired Transformer, the compiled Llama, the saves' peaks). Kept apart from the parts
themselves so that the driver renders a report without importing torch."""

from __future__ import annotations

from typing import Any

from _common import table


def paired_lines(fig: dict[str, Any] | None) -> list[str]:
    """The paired runs of the seed guide's Transformer, the variants, the profiles."""
    if not fig or "tokens_per_s_ratio" not in fig:
        return []
    low, high = fig["tokens_per_s_ratio_range"]
    steps = "; ".join(
        f"{name}: {', '.join(f'{s * 1e3:.0f}' for s in fig[f'{name}_steps_s'])} ms"
        for name in ("fullshard", "lightning")
    )
    lines = [
        "",
        f"The seed guide's Transformer, paired ({len(fig['fullshard_steps_s'])} round(s) of one run each by turns, "
        f"each run a process of its own; median steps {steps}): fullshard/Lightning "
        f"{fig['tokens_per_s_ratio']:.3f}x the tokens/s (median of the rounds' ratios, {low:.3f}-{high:.3f}), "
        f"{fig['peak_memory_ratio']:.3f}x the peak memory.",
    ]
    if fig.get("variants"):
        rows = [
            [name, f"{v['step_s'] * 1e3:.1f}", f"{v['vs_baseline']:.3f}x", v["what"]]
            for name, v in fig["variants"].items()
        ]
        lines += [
            "",
            "fullshard with one thing changed (one run each, against the median of its baseline runs):",
            "",
        ]
        lines.append(table(["variant", "step (ms)", "vs. fullshard", "what changed"], rows, align="lrrl"))
    for framework, prof in (fig.get("profiles") or {}).items():
        idle = (
            f"; the GPU idle {prof['gpu_idle_ms']:.1f} of {prof['gpu_span_ms']:.1f} ms, longest gaps "
            + ", ".join(
                f"{g['ms']:.1f} ms ({' / '.join(g['host']) or 'no host op'})" for g in prof["gaps"][:3]
            )
            if prof.get("gaps") is not None and "gpu_span_ms" in prof
            else ""
        )
        top = ", ".join(f"{k['name'][:48]} {k['ms']:.1f} ms" for k in prof["top"][:5])
        syncs = ", ".join(f"{k} x{n}" for k, n in prof["syncs"].items()) or "none"
        lines += [
            "",
            f"One profiled step under {framework}: top {top}; host reads and synchronisations {syncs} (a read of a "
            f"CPU tensor, as Adam's step count, waits for nothing){idle}.",
        ]
    return lines


def compiled_lines(fig: dict[str, Any] | None, eager: dict[str, Any] | None) -> list[str]:
    """The Llama with torch.compile per block, against the eager part."""
    if not fig:
        return []
    mfu = f"MFU {fig['mfu']:.1%}" if fig.get("mfu") else "MFU n/a"
    against = f" (eager: {eager['tokens_per_s']:,.0f} tokens/s)" if eager else ""
    return [
        "",
        f"The same Llama with `Trainer(compile=True)` (each decoder layer compiled in place): "
        f"{fig['tokens_per_s']:,.0f} tokens/s{against}, {fig['model_tflops_per_s']:.0f} model TFLOP/s, {mfu}; "
        f"first step {fig['first_step_s']:.0f} s (compiling).",
    ]


def save_lines(fig: dict[str, Any] | None) -> list[str]:
    """The peak memory of a full and a sharded save against training's."""
    if not fig:
        return []
    return [
        "",
        f"Saving the seed guide's model ({fig['params'] / 1e9:.2f}B parameters, FSDP1): training peaked at "
        f"{fig['training_peak_mb']:,.0f} MB; a full save at {fig['full_save_peak_mb']:,.0f} MB "
        f"({fig['full_mb']:,.0f} MB written in {fig['full_save_s']:.1f} s), a sharded save at "
        f"{fig['sharded_save_peak_mb']:,.0f} MB ({fig['sharded_mb']:,.0f} MB in {fig['sharded_save_s']:.1f} s).",
    ]


SPEED_LINES = {
    "transformer-paired": lambda f: (
        f"fullshard/Lightning {f['tokens_per_s_ratio']:.3f}x tokens/s over {len(f['fullshard_steps_s'])} round(s)"
        if "tokens_per_s_ratio" in f
        else "no pair completed"
    ),
    "llama-compiled": lambda f: (
        f"{f['tokens_per_s']:,.0f} tokens/s, step {f['step_s'] * 1e3:.1f} ms"
        + (f", MFU {f['mfu']:.1%}" if f.get("mfu") else "")
    ),
    "save-peaks": lambda f: (
        f"training peak {f['training_peak_mb']:,.0f} MB, full save {f['full_save_peak_mb']:,.0f} MB, "
        f"sharded save {f['sharded_save_peak_mb']:,.0f} MB"
    ),
}

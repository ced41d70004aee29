"""Run fresh generated scripts under Lightning 2.6.6 and fullshard; report every difference that
docs/lightning.md does not accept, each minimized to the smallest script that still shows it.

    python tests/differential/fuzz.py --n 50 --seed 1000 --report fuzz-report.md [--jobs 2]

Seeds ``seed .. seed + n - 1`` (the suite's corpus is 0 .. 449: take seeds above it). For each
script with an unexplained difference, the report gives the differences and the minimized script
(by delta debugging over the features: as many dropped at once as keep the first difference), ready to run
under either framework (``--minimize K``: the first K, 3 by default; each takes a few minutes).
Needs Lightning's environment (``python tests/lightning_env.py``).
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import corpus
import differences
import generate

Spec = dict[str, Any]


def signature(line: str) -> str:
    """What identifies a difference while its script shrinks: its kind and its first words."""
    return re.sub(r"\d+(\.\d+)?", "N", line)[:70]


Edit = Callable[[Spec], None]


def edits(spec: Spec) -> list[Edit]:
    """The one-step simplifications of ``spec``, each an edit that composes with the others (an
    item to drop from a list is set to None; :func:`apply` removes them after all edits ran)."""
    out: list[Edit] = []
    for i in range(len(spec["callbacks"])):
        out.append(lambda s, i=i: s["callbacks"].__setitem__(i, None))
    for key in list(spec["trainer"]):
        if key not in ("max_epochs", "max_steps"):
            out.append(lambda s, key=key: s["trainer"].pop(key, None))
    if spec["loggers"]:
        out.append(lambda s: s.update(loggers=[]))
    for i in range(len(spec["hooks"])):
        out.append(lambda s, i=i: s["hooks"].__setitem__(i, None))
    for stage in ("test", "predict"):
        if spec[stage]["run"]:
            out.append(lambda s, stage=stage: s[stage].update(run=False))
    for flag in ("validate", "resume", "datamodule", "log_dict", "epoch_end_logging"):
        if spec[flag]:
            out.append(lambda s, flag=flag: s.update({flag: False}))
    if spec["validation"]["loaders"]:
        out.append(lambda s: s["validation"].update(loaders=0))
    if spec["validation"]["loaders"] == 2:
        out.append(lambda s: s["validation"].update(loaders=min(s["validation"]["loaders"], 1)))
    for stage, calls in spec["logging"].items():
        for i, call in enumerate(calls):
            out.append(lambda s, stage=stage, i=i: s["logging"][stage].__setitem__(i, None))
            for option in call:
                if option != "name":
                    out.append(
                        lambda s, stage=stage, i=i, option=option: (
                            s["logging"][stage][i] and s["logging"][stage][i].pop(option, None)
                        )
                    )
    if spec["training_step"]["returns"] != "loss":
        out.append(lambda s: s["training_step"].update(returns="loss"))
    if spec["optim"].get("scheduler"):
        out.append(lambda s: s["optim"].pop("scheduler", None))
    if spec["manual"]:
        out.append(lambda s: (s.update(manual=False), s["optim"].update(count=1)))
    for flag in ("iterable", "shuffle", "drop_last", "empty_train"):
        if spec["data"][flag]:
            out.append(lambda s, flag=flag: s["data"].update({flag: False}))
    more = spec.get("more", {})
    for i in range(len(more.get("callbacks", []))):
        out.append(lambda s, i=i: s["more"]["callbacks"].__setitem__(i, None))
    for key in ("early_stopping", "checkpoint"):
        for option in more.get(key, {}):
            out.append(lambda s, key=key, option=option: s["more"][key].pop(option, None))
    for key, empty in (
        ("metric", None),
        ("datamodule_hooks", []),
        ("tensorboard", False),
        ("lr_find", False),
        ("scale_batch_size", False),
    ):
        if more.get(key):
            out.append(lambda s, key=key, empty=empty: s["more"].update({key: empty}))
    return out


def apply(spec: Spec, chosen: list[Edit]) -> Spec:
    """``spec`` with the edits ``chosen`` made (items set to None dropped)."""
    out = copy.deepcopy(spec)
    for edit in chosen:
        edit(out)
    out["callbacks"] = [c for c in out["callbacks"] if c is not None]
    out["hooks"] = [h for h in out["hooks"] if h is not None]
    out["logging"] = {stage: [c for c in calls if c is not None] for stage, calls in out["logging"].items()}
    if "more" in out:
        out["more"]["callbacks"] = [c for c in out["more"]["callbacks"] if c is not None]
    return out


def _both(specs: list[Spec], lightning: str, jobs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    for i, spec in enumerate(specs):
        spec["id"] = i
    theirs = corpus.run("lightning", lightning, specs=specs, jobs=jobs)
    ours = corpus.run("fullshard", sys.executable, specs=specs, jobs=jobs)
    return theirs, ours


def minimize(spec: Spec, target: str, lightning: str, jobs: int, rounds: int = 8) -> Spec:
    """A simpler spec that still shows ``target``, by delta debugging over the edits of
    :func:`edits`: each round runs, in one batch, the spec with all edits made, with each half,
    quarter, ... of them, and with each single one, and keeps the candidate with the most edits
    made that still shows the difference; it stops when no edit can be made."""
    current = spec
    for _ in range(rounds):
        possible = edits(current)
        if not possible:
            break
        subsets: list[list[Edit]] = []
        size = len(possible)
        while size >= 1:
            subsets += [possible[i : i + size] for i in range(0, len(possible), size)]
            size //= 2
        candidates = [apply(current, chosen) for chosen in subsets]
        theirs, ours = _both(candidates, lightning, jobs)
        showing = [
            (len(chosen), i)
            for i, chosen in enumerate(subsets)
            if any(
                signature(line) == target for line in differences.differences(theirs[str(i)], ours[str(i)])
            )
        ]
        if not showing:
            break
        current = candidates[max(showing)[1]]
        if max(showing)[0] == len(possible):
            break  # every edit made at once: nothing is left to simplify
    current.pop("id", None)
    return current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--seed", type=int, default=corpus.CORPUS_SIZE)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--report", type=Path, default=Path("fuzz-report.md"))
    parser.add_argument(
        "--minimize",
        type=int,
        default=3,
        help="minimize the first K scripts that differ (0: none; minutes each)",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    lightning = corpus.lightning_python()
    seeds = list(range(args.seed, args.seed + args.n))
    theirs = corpus.run("lightning", lightning, seeds=seeds, jobs=args.jobs)
    ours = corpus.run("fullshard", sys.executable, seeds=seeds, jobs=args.jobs)
    rules = differences.accepted()
    kinds: Counter[str] = Counter()
    accepted_kinds: Counter[str] = Counter()
    sections = []
    for seed in seeds:
        found = differences.differences(theirs[str(seed)], ours[str(seed)])
        left = differences.unexplained(found, rules)
        for line in found:
            (kinds if line in left else accepted_kinds)[line.split(":")[0]] += 1
        if not left:
            continue
        spec, title = generate.spec(seed), "Script"
        if len(sections) < args.minimize:
            spec = minimize(spec, signature(left[0]), lightning, args.jobs)
            title = "Minimized (for the first difference)"
        sections.append(
            f"## seed {seed}\n\n"
            + "\n".join(f"- {line}" for line in left)
            + f"\n\n{title}:\n\n```python\n{generate.render(spec)}```\n"
        )
    summary = (
        f"# Differential run: seeds {seeds[0]}..{seeds[-1]}\n\n{len(seeds)} scripts, "
        f"{len(sections)} with unexplained differences, in {time.perf_counter() - began:.0f} s.\n"
        f"Unexplained by kind: {dict(kinds)}; accepted by kind: {dict(accepted_kinds)}.\n\n"
    )
    args.report.write_text(summary + "\n".join(sections))
    print(summary.strip())
    print(f"report: {args.report}")


if __name__ == "__main__":
    main()

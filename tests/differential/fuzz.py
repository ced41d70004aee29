"""Run fresh generated scripts under Lightning 2.6.6 and fullshard; report every difference that
docs/lightning.md does not accept, each minimized to the smallest script that still shows it.

    python tests/differential/fuzz.py --n 50 --seed 1000 --report fuzz-report.md [--jobs 2]

Seeds ``seed .. seed + n - 1`` (the suite's corpus is 0 .. 299: take seeds above it). For each
script with an unexplained difference, the report gives the differences and the minimized script
(features dropped one at a time, in rounds, as long as the first difference stays), ready to run
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import corpus
import differences
import generate

Spec = dict[str, Any]


def signature(line: str) -> str:
    """What identifies a difference while its script shrinks: its kind and its first words."""
    return re.sub(r"\d+(\.\d+)?", "N", line)[:70]


def simpler(spec: Spec) -> Iterator[Spec]:
    """Every spec one step simpler than ``spec``."""

    def changed(edit: Callable[[Spec], None]) -> Spec:
        out = copy.deepcopy(spec)
        edit(out)
        return out

    for i in range(len(spec["callbacks"])):
        yield changed(lambda s, i=i: s["callbacks"].pop(i))
    for key in list(spec["trainer"]):
        if key not in ("max_epochs", "max_steps"):
            yield changed(lambda s, key=key: s["trainer"].pop(key))
    if spec["loggers"]:
        yield changed(lambda s: s.update(loggers=[]))
    for i in range(len(spec["hooks"])):
        yield changed(lambda s, i=i: s["hooks"].pop(i))
    for stage in ("test", "predict"):
        if spec[stage]["run"]:
            yield changed(lambda s, stage=stage: s[stage].update(run=False))
    for flag in ("validate", "resume", "datamodule", "log_dict", "epoch_end_logging"):
        if spec[flag]:
            yield changed(lambda s, flag=flag: s.update({flag: False}))
    if spec["validation"]["loaders"]:
        yield changed(lambda s: s["validation"].update(loaders=0))
    if spec["validation"]["loaders"] == 2:
        yield changed(lambda s: s["validation"].update(loaders=1))
    for stage, calls in spec["logging"].items():
        for i, call in enumerate(calls):
            yield changed(lambda s, stage=stage, i=i: s["logging"][stage].pop(i))
            for option in call:
                if option != "name":
                    yield changed(
                        lambda s, stage=stage, i=i, option=option: s["logging"][stage][i].pop(option)
                    )
    if spec["training_step"]["returns"] != "loss":
        yield changed(lambda s: s["training_step"].update(returns="loss"))
    if spec["optim"].get("scheduler"):
        yield changed(lambda s: s["optim"].pop("scheduler"))
    if spec["manual"]:
        yield changed(lambda s: (s.update(manual=False), s["optim"].update(count=1)))
    for flag in ("iterable", "shuffle", "drop_last", "empty_train"):
        if spec["data"][flag]:
            yield changed(lambda s, flag=flag: s["data"].update({flag: False}))


def _both(specs: list[Spec], lightning: str, jobs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    for i, spec in enumerate(specs):
        spec["id"] = i
    theirs = corpus.run("lightning", lightning, specs=specs, jobs=jobs)
    ours = corpus.run("fullshard", sys.executable, specs=specs, jobs=jobs)
    return theirs, ours


def minimize(spec: Spec, target: str, lightning: str, jobs: int, rounds: int = 12) -> Spec:
    """The simplest spec found, by rounds of one-step simplifications, that still shows ``target``."""
    current = spec
    for _ in range(rounds):
        candidates = list(simpler(current))
        if not candidates:
            break
        theirs, ours = _both(candidates, lightning, jobs)
        for i, candidate in enumerate(candidates):
            found = differences.differences(theirs[str(i)], ours[str(i)])
            if any(signature(line) == target for line in found):
                current = candidate
                break
        else:
            break
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

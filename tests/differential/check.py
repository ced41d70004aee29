"""Run the corpus under fullshard and list what differs from the recorded Lightning observations,
grouped (what tests/test_differential.py checks, as one readable list while fixing).

    python tests/differential/check.py [--seeds 0-449] [--all] [--show SEED]

Each group: how many lines, the first seed showing it, the difference with numbers as N. Lines
that docs/lightning.md accepts are left out unless ``--all``. ``--show SEED`` prints that
script's source and its differences in full.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

import corpus
import differences
import generate
import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=f"0-{corpus.CORPUS_SIZE - 1}")
    parser.add_argument("--all", action="store_true", help="also the accepted differences")
    parser.add_argument("--show", type=int, help="print one script and its differences")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    recorded = corpus.load_fixture()["scripts"]
    seeds = [args.show] if args.show is not None else run.parse_seeds(args.seeds)
    ours = corpus.run("fullshard", sys.executable, seeds=seeds, jobs=args.jobs)
    rules = [] if args.all else differences.accepted()
    groups: Counter[str] = Counter()
    first: dict[str, int] = {}
    clean = 0
    for seed in seeds:
        found = differences.differences(recorded[str(seed)]["observed"], corpus.trim(ours[str(seed)]))
        left = differences.unexplained(found, rules)
        if args.show is not None:
            print(generate.render(generate.spec(seed)))
            print("\n".join(left) or "no difference")
            error = ours[str(seed)]["error"]
            if error:
                print(error["traceback"])
            return
        clean += not left
        for line in left:
            group = re.sub(r"\d+(\.\d+)?", "N", line)[:140]
            groups[group] += 1
            first.setdefault(group, seed)
    print(f"{clean} of {len(seeds)} scripts observe the same; {sum(groups.values())} differences left")
    for group, count in groups.most_common():
        print(f"{count:4d}  seed {first[group]:4d}  {group}")


if __name__ == "__main__":
    main()

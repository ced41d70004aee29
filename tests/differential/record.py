"""Record Lightning 2.6.6's observations of the corpus into the fixture the suite compares with.

    python tests/differential/record.py [--jobs 2]
    python tests/differential/record.py --ddp     # the 2-process subset, Lightning's "ddp"

Needs Lightning's environment (``python tests/lightning_env.py``). Rerun it after changing
generate.py or run.py: tests/test_differential.py refuses a fixture whose specs differ from what
the generator now draws.
"""

from __future__ import annotations

import argparse
import time

import corpus
import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--size", type=int, default=corpus.CORPUS_SIZE)
    parser.add_argument(
        "--ddp", action="store_true", help="record the 2-process subset (strategy='ddp') instead"
    )
    args = parser.parse_args()
    began = time.perf_counter()
    if args.ddp:
        seeds = corpus.ddp_subset(corpus.load_fixture())
        python = corpus.lightning_python()
        launched = corpus.run_launched("lightning", python, seeds, strategy="ddp")
        data = {
            "lightning": "2.6.6",
            "strategy": "ddp",
            "devices": corpus.DDP_DEVICES,
            "scripts": {
                str(s): {
                    "spec": generate.spec(s),
                    "observed": {rank: corpus.trim(o) for rank, o in launched[str(s)].items()},
                }
                for s in seeds
            },
        }
        corpus.write_fixture(data, corpus.DDP_FIXTURE)
        print(f"recorded {seeds} into {corpus.DDP_FIXTURE} in {time.perf_counter() - began:.0f} s")
        return
    seeds = list(range(args.size))
    observed = corpus.run("lightning", corpus.lightning_python(), seeds=seeds, jobs=args.jobs)
    data = {
        "lightning": "2.6.6",
        "scripts": {
            str(s): {"spec": generate.spec(s), "observed": corpus.trim(observed[str(s)])} for s in seeds
        },
    }
    corpus.write_fixture(data)
    print(f"recorded {len(seeds)} scripts into {corpus.FIXTURE} in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()

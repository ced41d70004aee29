"""python benchmarks/checkpoint_scale.py --repeats 2 --write-docs

How sharded checkpoints scale with the number of processes, at a fixed total state.

Run it from the repository root; without ``--write-docs`` it prints the section and leaves
docs/benchmarks.md ("Checkpoint scale") alone. By default it runs 2, 4, 8 and 16 processes
under fsdp and fsdp2, 3 repeats each (the figures in the docs: 2 repeats, as above); a smaller
run::

    python benchmarks/checkpoint_scale.py --processes 2 4 --strategies fsdp2 --repeats 2

Every job trains the same model (``--blocks`` blocks of ``Linear(--width, --width)``: by default
96 blocks of 640 x 640 without bias, 39.3M parameters in 96 tensors, 157 MB, plus AdamW's two
moments: 472 MB of state in 288 tensors) for one step in N CPU processes (gloo, one thread each) under
``FSDPStrategy`` or ``FSDP2Strategy(auto_wrap_policy={Block}, empty_init=True)``, then saves
and loads a sharded checkpoint ``--repeats`` times. On a 2-core machine N processes share two
cores, so the absolute times at 8 and 16 processes include waiting for a core; what the table is
for is how each phase grows, and which ones grow with the number of processes at all.

Phases of a save, timed on every rank from save-point hooks (rank 0's times and the slowest
rank's are shown):

state
    ``get_state``: the sharded state dicts (FSDP1 builds ShardedTensors through collectives;
    FSDP2 reads its DTensor shards).
plan
    DCP's planning: each rank's local plan, gathered on rank 0, the global plan scattered back
    (grows with ranks x tensors).
write
    this rank's ``.distcp`` file written (grows with the bytes per rank).
finish
    DCP's finish: the write results gathered, ``.metadata`` written by rank 0 (and, in plain DCP,
    the whole index broadcast back to every rank; fullshard sends an empty one: see [Note: DCP's
    finish returns the index to every rank] in fullshard/checkpoint/commit.py).
commit
    fullshard's commit: every rank fsyncs and checksums its files and writes its rank record
    beside them, the ranks agree with one all-reduce of a flag, rank 0 writes ``meta.pt`` and the
    commit record (no checksum travels between ranks).

A load is timed whole and in two parts: the checks (rank 0 reads the commit record and checks
files, sizes and shapes; every rank its share of the checksums, where loads verify) and DCP's
load into the state dicts plus ``set_state``. ``archive.verify`` (every byte of every file, in
one process) is timed once per job.

Then, in this process, what DCP's plan and finish steps move and compute at more ranks than the
machine can run (``index_costs``: 16 to 1,024 ranks x 300 tensors by default); ``--index-only``
prints just that, in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    heading_target,
    make_parser,
    parse_args,
    provenance,
    run_or_report,
    table,
    worker_env,
    write_section,
)

SECTION = "## Checkpoint scale"
SAVE_PHASES = ("state", "plan", "write", "finish", "commit")


# ---------------------------------------------------------------------------------------------
# The worker: every rank of one job.


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import fullshard
    from fullshard.checkpoint import commit, engine
    from fullshard.checkpoint.archive import verify
    from fullshard.checkpoint.events import set_event_hook
    from fullshard.strategies import FSDP2Strategy, FSDPStrategy

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(args.width, args.width, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    class Model(fullshard.Module):
        def configure_model(self) -> None:
            self.blocks = nn.Sequential(*(Block() for _ in range(args.blocks)))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.blocks(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    strategy_class = FSDP2Strategy if args.strategy == "fsdp2" else FSDPStrategy
    strategy = strategy_class(auto_wrap_policy={Block}, empty_init=True, state_dict_type="sharded")
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=args.processes, strategy=strategy, max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    data = TensorDataset(torch.randn(2 * args.processes, args.width))
    trainer.fit(Model(), DataLoader(data, batch_size=2))
    rank = trainer.global_rank

    marks: dict[str, float] = {}
    set_event_hook(lambda point: marks.__setitem__(point, time.perf_counter()))
    get_state, write_data, dcp_load = strategy.get_state, commit.ShardWriter.write_data, engine.dcp_load

    def timed_get_state(*a: Any, **k: Any) -> Any:
        result = get_state(*a, **k)
        marks["state_done"] = time.perf_counter()
        return result

    def timed_write_data(self: Any, *a: Any, **k: Any) -> Any:
        marks["write_start"] = time.perf_counter()
        return write_data(self, *a, **k)

    def timed_dcp_load(*a: Any, **k: Any) -> Any:
        marks["dcp_load_start"] = time.perf_counter()
        return dcp_load(*a, **k)

    strategy.get_state = timed_get_state  # type: ignore[method-assign]
    commit.ShardWriter.write_data = timed_write_data  # type: ignore[method-assign]
    engine.dcp_load = timed_dcp_load

    root = Path(args.dir)
    records: list[dict[str, float]] = []
    for repeat in range(args.repeats):
        path = root / f"ckpt-{repeat}"
        os.sync()
        dist.barrier()
        marks.clear()
        start = time.perf_counter()
        trainer.save_checkpoint(path)
        end = time.perf_counter()
        record = {
            "save": end - start,
            "state": marks["state_done"] - start,
            "plan": marks["write_start"] - marks["state_done"],
            "write": marks["sharded.data_written"] - marks["write_start"],
            "finish": marks["sharded.metadata_written"] - marks["sharded.data_written"],
            "commit": end - marks["sharded.metadata_written"],
        }
        dist.barrier()
        record["save_all"] = time.perf_counter() - start
        os.sync()
        dist.barrier()
        marks.clear()
        start = time.perf_counter()
        strategy.load_checkpoint(path, trainer.optimizers)
        end = time.perf_counter()
        record["load"] = end - start
        record["load_checks"] = marks["dcp_load_start"] - start
        record["load_dcp"] = end - marks["dcp_load_start"]
        dist.barrier()
        records.append(record)
        if rank == 0 and repeat + 1 < args.repeats:
            import shutil

            shutil.rmtree(path)
    gathered = [None] * trainer.world_size
    dist.all_gather_object(gathered, records)
    if rank == 0:
        last = root / f"ckpt-{args.repeats - 1}"
        start = time.perf_counter()
        verify(last)
        verify_s = time.perf_counter() - start
        files = sorted(p for p in last.rglob("*") if p.is_file())
        plan = strategy.wrap_plan
        assert plan is not None
        result = {
            "processes": args.processes,
            "strategy": args.strategy,
            "ranks": gathered,
            "verify": verify_s,
            "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "params": plan.total_numel,
            "tensors": 3 * sum(1 for _ in trainer.strategy.module.parameters()),  # type: ignore[union-attr]
        }
        Path(args.out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# The index: what DCP's plan and finish steps and fullshard's commit move, at any number of ranks,
# in this one process.


def index_costs(ranks: int, tensors: int, rows: int = 8, cols: int = 640) -> dict[str, float]:
    """What a sharded save of ``tensors`` tensors over ``ranks`` ranks moves and computes outside
    the tensor bytes, built as DCP builds it: each rank's local plan (one dim-0 shard of every
    tensor, ``rows`` x ``cols``), rank 0's global plan and index over all of them, each rank's
    write results, the ``.metadata`` file, and the load's overlap search on one rank.
    Sizes in bytes (pickled, as the gloo object collectives send them), times in seconds."""
    import pickle

    import torch
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.filesystem import (
        _StorageInfo,  # private: what its writer records per item
    )
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
    from torch.distributed.checkpoint.storage import WriteResult

    from fullshard.checkpoint.layout import CommitRecord
    from fullshard.seed import rng_states

    names = [f"model.blocks.{i}.linear.weight" for i in range(tensors)]
    mappings = {name: tuple(name.split(".", 1)) for name in names}  # DCP's flattening, per rank
    properties, size = TensorProperties(dtype=torch.float32), torch.Size([rows * ranks, cols])

    def local_plan(rank: int) -> SavePlan:
        chunk = ChunkStorageMetadata(offsets=torch.Size([rank * rows, 0]), sizes=torch.Size([rows, cols]))
        items = [
            WriteItem(
                index=MetadataIndex(name, chunk.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk=chunk, properties=properties, size=size),
            )
            for name in names
        ]
        return SavePlan(items, planner_data=mappings)

    start = time.perf_counter()
    plans = [local_plan(rank) for rank in range(ranks)]
    local_bytes = len(pickle.dumps(plans[-1]))
    built = time.perf_counter()
    global_plans, metadata = DefaultSavePlanner().create_global_plan(plans)
    planned = time.perf_counter()
    scatter_bytes = len(pickle.dumps(global_plans[-1]))
    results = [
        [
            WriteResult(
                index=item.index,
                size_in_bytes=rows * cols * 4,
                storage_data=_StorageInfo(f"__{rank}_0.distcp", i * rows * cols * 4, rows * cols * 4),
            )
            for i, item in enumerate(plan.items)
        ]
        for rank, plan in enumerate(global_plans)
    ]
    result_bytes = len(pickle.dumps(results[-1]))
    gathered = [pickle.dumps(plan) for plan in plans] + [pickle.dumps(r) for r in results]
    received = time.perf_counter()
    for message in gathered:  # what rank 0 unpickles of the plan and finish steps' gathers
        pickle.loads(message)
    del gathered
    merged = time.perf_counter()
    storage: dict[Any, Any] = {}
    for rank_results in results:  # FileSystemWriter.finish
        storage.update({result.index: result.storage_data for result in rank_results})
    metadata.storage_data = storage
    index = pickle.dumps(metadata)
    finished = time.perf_counter()
    pickle.loads(index)
    unpickled = time.perf_counter()
    mine = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([rows, cols]))]
    for name in names:  # the load's plan on one rank (same layout): every chunk of each of its tensors
        create_read_items_for_chunk_list(name, metadata.state_dict_metadata[name], mine)  # type: ignore[arg-type]
    searched = time.perf_counter()
    empty = Metadata(state_dict_metadata={}, storage_meta=metadata.storage_meta)
    rank_record = {
        "files": {"__0_0.distcp": {"size": 10**9, "crc32": 2**32 - 1}},
        "rank": ranks - 1,
        "crc32": 0,
    }
    record = CommitRecord(
        data="data-0123456789ab", files={n: {"size": 10**9, "crc32": 2**32 - 1} for n in (".metadata", "meta.pt")},
        world_size=ranks, strategy="FSDP2Strategy", epoch=0, global_step=10**6, fullshard_version="0.1.0",
        rank_records=ranks,
    )  # fmt: skip
    return {
        "ranks": ranks,
        "tensors": tensors,
        "local_plan_bytes": local_bytes,
        "build_s": built - start,
        "global_plan_s": planned - built,
        "scatter_bytes": scatter_bytes,
        "result_bytes": result_bytes,
        "finish_s": finished - merged,
        "gathered_unpickle_s": merged - received,
        "index_bytes": len(index),
        "unpickle_s": unpickled - finished,
        "load_search_s": searched - unpickled,
        "empty_index_bytes": len(pickle.dumps(empty)),
        "rank_record_bytes": len(json.dumps(rank_record, sort_keys=True)),
        "commit_record_bytes": len(record.to_json()),
        "rng_bytes": len(pickle.dumps(rng_states())),
    }


def render_index(rows: list[dict[str, float]]) -> str:
    header = [
        "ranks x tensors", "local plan / rank", "rank 0 gathers", "rank 0 unpickles them (s)", "global plan (s)",
        "write results / rank", ".metadata", "finish on rank 0 (s)", "index each rank unpickles (s)",
        "load search / rank (s)",
    ]  # fmt: skip
    cells = []
    for r in rows:
        cells.append([
            f"{r['ranks']} x {r['tensors']}", _size(r["local_plan_bytes"]),
            _size(r["ranks"] * (r["local_plan_bytes"] + r["result_bytes"])), f"{r['gathered_unpickle_s']:.2f}",
            f"{r['global_plan_s']:.2f}",
            _size(r["result_bytes"]), _size(r["index_bytes"]), f"{r['finish_s']:.2f}", f"{r['unpickle_s']:.2f}",
            f"{r['load_search_s']:.3f}",
        ])  # fmt: skip
    return table(header, cells, align="l" + "r" * (len(header) - 1))


def _size(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB" if n >= 1e3 else f"{n:.0f} B"


# ---------------------------------------------------------------------------------------------
# The driver.


def run_job(args: argparse.Namespace, processes: int, strategy: str, work: Path) -> dict[str, Any]:
    ckpts = work / f"{strategy}-{processes}"
    ckpts.mkdir(parents=True)
    out = work / f"{strategy}-{processes}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--out", str(out), "--dir", str(ckpts),
        "--processes", str(processes), "--strategies", strategy, "--blocks", str(args.blocks),
        "--width", str(args.width), "--repeats", str(args.repeats),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(
            f"{strategy} at {processes} processes failed:\n{done.stdout}\n{done.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - started
    return result


def phase(result: dict[str, Any], key: str, how: str = "rank0") -> float:
    """Median over the repeats of ``key`` on rank 0, or of the slowest rank (``how="max"``)."""
    ranks = result["ranks"]
    per_repeat = [
        (ranks[0][i][key] if how == "rank0" else max(r[i][key] for r in ranks)) for i in range(len(ranks[0]))
    ]
    return statistics.median(per_repeat)


def render_table(results: list[dict[str, Any]]) -> str:
    header = ["strategy", "processes", "save (s)", *SAVE_PHASES]
    header += ["load (s)", "load: checks", "load: DCP + set", "verify (s)", "files"]
    rows = []
    for r in results:
        cells = [f"{phase(r, 'save_all'):.2f}"]
        cells += [f"{phase(r, p):.2f} / {phase(r, p, 'max'):.2f}" for p in SAVE_PHASES]
        cells += [
            f"{phase(r, 'load', 'max'):.2f}",
            f"{phase(r, 'load_checks'):.2f}",
            f"{phase(r, 'load_dcp', 'max'):.2f}",
        ]
        cells += [f"{r['verify']:.2f}", str(r["files"])]
        rows.append([r["strategy"], str(r["processes"]), *cells])
    return table(header, rows, align="ll" + "r" * (len(header) - 2))


def growth(results: list[dict[str, Any]]) -> str:
    """Each phase's time at the most processes over its time at the fewest, per strategy, next to
    the ratio of process counts (linear growth would equal it)."""
    lines = []
    for strategy in dict.fromkeys(r["strategy"] for r in results):
        runs = sorted((r for r in results if r["strategy"] == strategy), key=lambda r: r["processes"])
        if len(runs) < 2:
            continue
        low, high = runs[0], runs[-1]
        factor = high["processes"] / low["processes"]
        parts = []
        for key in (*SAVE_PHASES, "load_checks", "load_dcp"):
            a, b = phase(low, key, "max"), phase(high, key, "max")
            parts.append(f"{key} {b / a:.1f}x" if a > 0 else f"{key} -")
        lines.append(
            f"- {strategy}, {low['processes']} -> {high['processes']} processes ({factor:.0f}x): "
            + ", ".join(parts)
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    p.add_argument(
        "--processes", type=int, nargs="+", default=[2, 4, 8, 16], help="process counts, one job each"
    )
    p.add_argument("--strategies", nargs="+", default=["fsdp", "fsdp2"], choices=["fsdp", "fsdp2"])
    p.add_argument("--blocks", type=int, default=96, help="number of blocks")
    p.add_argument("--width", type=int, default=640, help="features of each Linear")
    p.add_argument("--repeats", type=int, default=3, help="saves and loads per job")
    p.add_argument(
        "--index-ranks", type=int, nargs="+", default=[16, 64, 256, 1024], help="ranks of the index table"
    )
    p.add_argument("--index-tensors", type=int, default=300, help="tensors of the index table")
    p.add_argument(
        "--index-only", action="store_true", help="only the index table (one process, seconds); prints it"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    if args.worker:
        args.processes, args.strategy = args.processes[0], args.strategies[0]
        run_worker(args)
        return
    index = [index_costs(ranks, args.index_tensors) for ranks in args.index_ranks]
    if args.index_only:
        print(render_index(index))
        print(json.dumps(index, indent=1))
        return

    def measure() -> dict[str, Any]:
        results = []
        with tempfile.TemporaryDirectory(prefix="fullshard-scale-") as work:
            for strategy in args.strategies:
                for processes in args.processes:
                    result = run_job(args, processes, strategy, Path(work))
                    print(
                        f"{strategy} x{processes}: save {phase(result, 'save_all'):.2f} s, load "
                        f"{phase(result, 'load', 'max'):.2f} s ({result['wall_s']:.0f} s job)",
                        flush=True,
                    )
                    results.append(result)
        return {"jobs": results, "index": index}

    section = render(run_or_report(args, __file__, measure))
    print("\n" + section)
    if args.write_docs:
        write_section(section)


def render(saved: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (every job's figures and the index costs, saved)."""
    args = argparse.Namespace(**saved["arguments"])
    results, index = saved["figures"]["jobs"], saved["figures"]["index"]
    table, grown = render_table(results), growth(results)
    first = results[0]
    return f"""{SECTION}

Sharded save and load of one state ({first["params"] / 1e6:.1f}M parameters + AdamW: {first["tensors"]} tensors,
{first["bytes"] / 1e6:.0f} MB on disk) at several numbers of CPU processes on {saved["cores"]} cores, medians of
{args.repeats} repeats (`{saved["command"]}`; phases in its docstring).
Each phase shows rank 0 / the slowest rank, in seconds.

{provenance(saved, __file__)}

{table}

Growth from the fewest to the most processes (slowest rank):

{grown}

What DCP's plan and finish steps move and compute besides the tensor bytes, at {args.index_tensors} tensors
sharded over more ranks than this machine can run: built in one process as DCP builds it
(`index_costs` in the script; pickled sizes, as gloo's object collectives send them; times on one core).
A rank record is {index[0]["rank_record_bytes"]} bytes beside its shard, the commit record
{index[-1]["commit_record_bytes"]} bytes at {index[-1]["ranks"]} ranks, and the commit's agreement one all-reduce of a
flag; the index DCP sends back to every rank after its finish step is {index[0]["empty_index_bytes"]} bytes
(it was the whole `.metadata`). `meta.pt` holds every rank's RNG states, {index[0]["rng_bytes"]} bytes each.

{render_index(index)}
"""


if __name__ == "__main__":
    main()

"""What makes planning cheaper changes no figure of a plan: each way the planner shares or
reorders work (issue 40, item 6) against the plan made without it, row for row, every field."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from conftest import check_ok, run_script
from fullshard.planner import plan, torch_tools
from test_planner import Net, batch

#: a job of 2 nodes of 2 processes, one sharding: its three checkpointing periods, FSDP1 rows priced from them
CPU_JOB: dict[str, Any] = dict(
    devices=2, num_nodes=2, device_memory="64MiB", device_type="cpu", workers=1, shardings=("HYBRID_SHARD",)
)


def rows(result: Any) -> list[tuple[Any, ...]]:
    """Every field of every row, in the plan's order."""
    return [
        (
            r.candidate,
            r.peak,
            r.split,
            r.comm_bytes,
            r.host_bytes,
            r.flops,
            r.seconds,
            r.fits,
            r.modelled,
            r.host_peak,
        )
        for r in result.rows
    ]


def test_the_trackers_outputs_visited_without_a_mapped_copy_leave_every_row_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """[Note: the tracker's outputs, visited]: while a planner's tracker is entered, torch's tracker
    module visits outputs with fullshard's visitor (and gets its own function back after); the
    plan is the same to the byte as with pytree's ``tree_map_only``."""
    import torch.distributed._tools.fsdp2_mem_tracker as tracker_module

    original = tracker_module.tree_map_only
    visits: list[int] = []
    visit = torch_tools._for_each_tensor

    def counted(kind: type, fn: Any, tree: Any) -> None:
        visits.append(1)
        visit(kind, fn, tree)

    monkeypatch.setattr(torch_tools, "_for_each_tensor", counted)
    visited = plan(Net(depth=4), batch(), **CPU_JOB)
    assert len(visits) > 1000 and tracker_module.tree_map_only is original
    monkeypatch.setattr(torch_tools, "_visiting_outputs", contextlib.nullcontext)
    mapped = plan(Net(depth=4), batch(), **CPU_JOB)
    assert rows(visited) == rows(mapped)


def test_forked_workers_take_their_jobs_from_one_queue() -> None:
    """[Note: simulating on several cores]: a slow job does not hold back jobs dealt after it. In a
    fresh single-threaded process (this pytest worker runs other threads: the planner would not fork)."""
    result = run_script("planner_queue_job.py", fresh_python=True, timeout=240)
    check_ok(result)
    assert "queued jobs ok" in result.stdout

"""Two machines, simulated on this one: 2 "nodes" x 2 processes started (a) by two torchrun agents
on loopback and (b) by hand with the environment ``srun`` gives the tasks of a 2-node allocation.
Each trains with ``HYBRID_SHARD`` (replicate across the nodes, shard within each), saves a sharded
checkpoint, and a job of one node with 3 processes resumes from it with the same parameters, bit
for bit (DCP reshards 2 x 2 -> 3).

What cannot be simulated here: separate network interfaces and host names (every "node" is
127.0.0.1), and a shared file system seen from two machines.
"""

from __future__ import annotations

import json
import random
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import SCRIPTS
from fullshard.checkpoint.tools import consolidate
from proc_helpers import Processes, clean_env, free_port, torchrun

JOB = str(SCRIPTS / "multinode_job.py")
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
]  # multi-node jobs that restart: -m "not slow" skips them


def rank_records(out: Path, tag: str, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{tag}-rank{r}.json").read_text()) for r in range(world_size)]


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def assert_bitwise_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def check_hybrid_layout(records: list[dict[str, Any]], environment: str) -> None:
    """Ranks 0, 1 on node 0 and 2, 3 on node 1; each node holds the whole model in 2 shards, and
    the process with the same local rank on the other node holds the same shard (its replica)."""
    assert [(r["node_rank"], r["local_rank"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(r["world_size"], r["shard_size"], r["environment"], r["global_step"]) for r in records} == {
        (4, 2, environment, 3)
    }
    total = records[0]["local_numel"] + records[1]["local_numel"]
    assert total == records[2]["local_numel"] + records[3]["local_numel"] == 153  # the whole model per node
    for local in (0, 1):
        here, there = records[local], records[2 + local]
        assert (here["local_numel"], here["local_checksum"]) == (
            there["local_numel"],
            there["local_checksum"],
        )
    assert records[0]["local_checksum"] != records[1]["local_checksum"]


def check_resumed(out: Path, ckpt: Path, tmp_path: Path) -> None:
    """The 3-process job started from exactly what the 2 x 2 job saved, and trained one step on."""
    saved = load(out / "run-final.pt")
    assert_bitwise_equal(load(out / "at3-start.pt"), saved)
    assert_bitwise_equal(load(consolidate(ckpt, tmp_path / "consolidated.ckpt"))["state_dict"], saved)
    records = rank_records(out, "at3", 3)
    assert {(r["world_size"], r["node_rank"], r["shard_size"], r["global_step"]) for r in records} == {
        (3, 0, 3, 4)
    }


@pytest.mark.parametrize("fsdp2", [False, True], ids=["fsdp", "fsdp2"])
def test_two_torchrun_agents_hybrid_then_one_node_of_three(tmp_path: Path, fsdp2: bool) -> None:
    ckpt = tmp_path / "ckpt"
    flags = ["--fsdp2"] if fsdp2 else []
    job = [JOB, "--out", str(tmp_path), *flags]
    port = free_port()
    with Processes(tmp_path / "logs") as procs:
        for node in (0, 1):
            agent = ["--nnodes=2", f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}"]
            hybrid = ["--nodes", "2", "--devices", "2", "--sharding", "HYBRID_SHARD", "--save", str(ckpt)]
            procs.start(f"node{node}", torchrun(*agent, "--nproc-per-node=2", *job, *hybrid), clean_env())
        procs.check_ok(120)
        check_hybrid_layout(rank_records(tmp_path, "run", 4), "TorchElasticEnvironment")

        resume = ["--tag", "at3", "--resume", str(ckpt), "--max-steps", "4", "--sharding", "FULL_SHARD"]
        procs.start("one_node", torchrun("--standalone", "--nproc-per-node=3", *job, *resume), clean_env())
        procs.check_ok(120, "one_node")
    check_resumed(tmp_path, ckpt, tmp_path)


def slurm_job_id() -> int:
    """A job id whose derived port (10000 + id % 20000, as SLURMEnvironment computes it when
    MASTER_PORT is unset) is free on this machine now."""
    for _ in range(100):
        port = random.randint(10000, 29999)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 4_000_000 + port - 10000  # 4_000_000 is a multiple of 20000
    raise RuntimeError("found no free port in 10000..29999")


def start_slurm_tasks(procs: Processes, name: str, nodes: int, per_node: int, args: list[str]) -> None:
    """Start the tasks ``srun --nodes=N --ntasks-per-node=M`` would, with the variables it sets.
    The node list's first host is where rank 0 runs and the process group meets: ``localhost``
    (the other names are never resolved)."""
    nodelist = ",".join(["localhost", *(f"simnode{n}" for n in range(1, nodes))])
    common = {
        "SLURM_JOB_ID": str(slurm_job_id()),
        "SLURM_JOB_NAME": "train.sh",
        "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
    }
    for rank in range(nodes * per_node):
        env = clean_env(
            **common,
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank % per_node),
            SLURM_NODEID=str(rank // per_node),
        )
        procs.start(f"{name}-task{rank}", [sys.executable, *args], env)


def test_slurm_two_nodes_hybrid_then_one_node_of_three(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    job = [JOB, "--out", str(tmp_path)]
    with Processes(tmp_path / "logs") as procs:
        hybrid = ["--nodes", "2", "--devices", "2", "--sharding", "HYBRID_SHARD", "--save", str(ckpt)]
        start_slurm_tasks(procs, "two_nodes", 2, 2, [*job, *hybrid])
        procs.check_ok(120)
        check_hybrid_layout(rank_records(tmp_path, "run", 4), "SLURMEnvironment")

        # one node of 3: the node count comes from SLURM (num_nodes="auto"), and HYBRID_SHARD with a
        # (1, 3) mesh shards over the node's 3 processes
        resume = ["--nodes", "auto", "--sharding", "HYBRID_SHARD", "--mesh", "1,3"]
        resume += ["--tag", "at3", "--resume", str(ckpt), "--max-steps", "4"]
        start_slurm_tasks(procs, "one_node", 1, 3, [*job, *resume])
        procs.check_ok(120, *(f"one_node-task{r}" for r in range(3)))
    check_resumed(tmp_path, ckpt, tmp_path)

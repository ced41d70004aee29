"""Elastic restarts under torchrun: ``fit(ckpt_path="last")`` starts fresh on the first attempt and
resumes from the newest complete checkpoint after a crash (see [Note: ckpt_path="last" and elastic
restarts] in src/fullshard/checkpoint/manager.py).

The jobs run tests/scripts/elastic_job.py under ``python -m torch.distributed.run``: FSDP with
sharded checkpoints every 3 steps, 12 steps (8 an epoch at 2 processes, so step 6 is mid-epoch), a
shuffled loader and dropout, so that a resume is exact only when the model, optimizer, scheduler,
data position and RNG states all come back.

- a worker dies, in a step or in the middle of a checkpoint save, and torchrun restarts all
  (``--max-restarts=1``): the restart resumes from the newest complete checkpoint, and the final
  parameters equal those of the same job without a crash, bit for bit;
- ``--nnodes=1:2``: one of two nodes disappears, and the job goes on at 2 processes instead of 4
  from the newest checkpoint, resharded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import SCRIPTS
from fullshard.checkpoint.tools import consolidate
from fullshard.errors import MisconfigurationError
from fullshard.launch import LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment
from fullshard.trainer.devices import resolve_num_nodes
from proc_helpers import Processes, clean_env, descendants, torchrun

JOB = str(SCRIPTS / "elastic_job.py")
DIE_AT = 7  # a worker dies (or stalls) as step 7 begins; the newest checkpoint then is step 6's
RESTARTS_OK = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # [Note: torchrun restarts and the shared store]


def record(out: Path, run: str, attempt: int, rank: int) -> dict[str, Any]:
    return json.loads((out / f"{run}-attempt{attempt}-rank{rank}.json").read_text())  # type: ignore[no-any-return]


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def assert_bitwise_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def checkpoint_params(path: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The model parameters a sharded checkpoint holds, consolidated in this process."""
    full = consolidate(path, tmp_path / f"{path.name}.consolidated")
    state: dict[str, torch.Tensor] = load(full)["state_dict"]
    return state


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run: 2 processes, 12 steps."""
    out = tmp_path_factory.mktemp("reference")
    with Processes(out / "logs") as procs:
        procs.start(
            "torchrun", torchrun("--standalone", "--nproc-per-node=2", JOB, "--out", str(out)), clean_env()
        )
        procs.check_ok(timeout=180)  # a bound for a hang, generous for a loaded machine
    return out


@pytest.mark.multiprocess
@pytest.mark.slow  # torchrun jobs that restart: -m "not slow" skips them locally
@pytest.mark.timeout(600)  # the reference run and this one, each with a generous bound
@pytest.mark.parametrize(
    ("crash", "failure", "resumed_at"),
    [
        # rank 1 exits at step 7: step 6's checkpoint is the newest
        (["--die-at", str(DIE_AT)], "failed (exitcode: 1) local_rank: 1", 6),
        # rank 0 is killed before step 6's commit: that checkpoint is incomplete, step 3's is the newest
        (["--die-in-save", "6"], "failed (exitcode: -9) local_rank: 0", 3),
    ],
    ids=["dies-in-a-step", "dies-in-a-save"],
)
def test_restart_resumes_bitwise_from_newest_complete_checkpoint(
    reference: Path, tmp_path: Path, crash: list[str], failure: str, resumed_at: int
) -> None:
    with Processes(tmp_path / "logs") as procs:
        args = ["--standalone", "--nproc-per-node=2", "--max-restarts=1", JOB, "--out", str(tmp_path)]
        procs.start("torchrun", torchrun(*args, *crash), clean_env(**RESTARTS_OK))
        procs.check_ok(timeout=240)
        log = procs.output()
    assert "found no checkpoint in the ModelCheckpoint directories" in log  # attempt 0 starts fresh
    assert failure in log  # torchrun saw the crash, and restarted
    assert load(tmp_path / "run-start0.pt").keys() == load(tmp_path / "run-start1.pt").keys()

    last = tmp_path / "ckpts" / "last.ckpt"
    for rank in range(2):
        resumed, ref = record(tmp_path, "run", 1, rank), record(reference, "run", 0, rank)
        assert (resumed["ckpt_path"], resumed["start_step"], resumed["world_size"]) == (
            str(last),
            resumed_at,
            2,
        )
        assert (
            resumed["losses"] == ref["losses"][resumed_at:]
        )  # exact floats: the same steps on the same samples
    (saved,) = (tmp_path / "ckpts").glob(f"epoch=0-step={resumed_at}.ckpt")
    assert_bitwise_equal(load(tmp_path / "run-start1.pt"), checkpoint_params(saved, tmp_path))
    assert_bitwise_equal(load(tmp_path / "run-final.pt"), load(reference / "run-final.pt"))


@pytest.mark.multiprocess
@pytest.mark.slow  # torchrun jobs that restart: -m "not slow" skips them locally
@pytest.mark.timeout(600)  # its waits below are generous, for a loaded machine
def test_elastic_job_goes_on_with_the_node_that_is_left(tmp_path: Path) -> None:
    """``--nnodes=1:2``: two agents (2 processes each) train until the last rank stalls at step 7;
    its whole node is then killed, and the agent left restarts its workers as a 1-node job
    (``num_nodes="auto"``) that resumes from step 6's checkpoint at 2 processes instead of 4."""
    from torch.distributed import TCPStore

    # The rendezvous store lives in this process (is_host=false: no agent hosts it), so that
    # killing either node leaves it: an agent's store would die with its node, and which node
    # gets the last rank depends on the agents' pids (the rendezvous sorts nodes by pid).
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    agent = ["--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=1", "--rdzv-backend=c10d"]
    # rdzv-conf: a rendezvous that has its minimum waits last_call_timeout s for more nodes (30 by
    # default); a node that sent no heartbeat for keep_alive_interval x keep_alive_max_attempt s
    # (5 x 3 by default) is dropped. The killed node is only dropped, and the job left only goes
    # on, after that long: 2 x 10 s, ample for a live agent slowed by a loaded machine (1 x 2,
    # then 1 x 5, were not always)
    conf = "is_host=false,last_call_timeout=2,keep_alive_interval=2,keep_alive_max_attempt=10"
    agent += [f"--rdzv-endpoint=127.0.0.1:{store.port}", "--rdzv-id=elastic-test", f"--rdzv-conf={conf}"]
    job = [JOB, "--out", str(tmp_path), "--stall-at", str(DIE_AT)]
    try:
        with Processes(tmp_path / "logs") as procs:
            for node in ("node0", "node1"):
                procs.start(node, torchrun(*agent, *job), clean_env(**RESTARTS_OK))
            deadline = time.monotonic() + 300
            while not (tmp_path / "stalled").exists():  # written by the stalled rank (elastic_job.py)
                running = all(proc.poll() is None for proc in procs.procs.values())
                assert running and time.monotonic() < deadline, procs.output()
                time.sleep(0.2)
            # the node of the stalled rank is gone, its agent and its workers at once (which node
            # that is depends on the order of the agents' pids)
            stalled = int((tmp_path / "stalled").read_text())
            below = {name: [pid for pid, _ in descendants(proc.pid)] for name, proc in procs.procs.items()}
            (gone,) = [name for name in below if stalled in below[name]]
            (left,) = [name for name in below if name != gone]
            for pid in [procs.procs[gone].pid, *below[gone]]:
                os.kill(pid, signal.SIGKILL)
            procs.check_ok(240, left)
    finally:
        del store  # stops its server
    (step6,) = (tmp_path / "ckpts").glob("epoch=*-step=6.ckpt")  # 4 steps an epoch at 4 processes: epoch 1
    assert_bitwise_equal(load(tmp_path / "run-start1.pt"), checkpoint_params(step6, tmp_path))
    for rank in range(2):
        resumed = record(tmp_path, "run", 1, rank)
        assert (resumed["start_step"], resumed["world_size"]) == (6, 2)
        assert [s for s, _ in resumed["losses"]] == list(range(6, 12))


# ------------------------------------------------------------------------------- without processes
_TORCHRUN_ENV = {
    "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job",
}  # fmt: skip


def test_restarts_with_the_shared_store_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        **_TORCHRUN_ENV,
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(
        MisconfigurationError,
        match=r"torchrun was started with --max-restarts=3 and shares its TCPStore with the workers .*"
        r"Set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun and use the c10d rendezvous, e\.g\. "
        r"`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --max-restarts=3 \.\.\.`",
    ):
        TorchElasticEnvironment().validate_settings(num_devices=2, num_nodes=1)
    monkeypatch.setenv(
        "TORCHELASTIC_USE_AGENT_STORE", "False"
    )  # what TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives
    TorchElasticEnvironment().validate_settings(num_devices=2, num_nodes=1)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")  # nothing restarts: nothing to refuse
    TorchElasticEnvironment().validate_settings(num_devices=2, num_nodes=1)


def test_num_nodes_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_num_nodes("auto", LocalEnvironment()) == 1
    assert resolve_num_nodes(3, LocalEnvironment()) == 3
    for name, value in {**_TORCHRUN_ENV, "WORLD_SIZE": "6", "GROUP_WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(name, value)
    assert resolve_num_nodes("auto", TorchElasticEnvironment()) == 3
    monkeypatch.delenv("GROUP_WORLD_SIZE")
    assert resolve_num_nodes("auto", TorchElasticEnvironment()) == 3  # WORLD_SIZE / LOCAL_WORLD_SIZE
    monkeypatch.setenv("SLURM_NNODES", "4")
    assert resolve_num_nodes("auto", SLURMEnvironment()) == 4
    with pytest.raises(
        MisconfigurationError, match=r"num_nodes='two' is invalid: use an int >= 1, or 'auto'"
    ):
        resolve_num_nodes("two", LocalEnvironment())


def test_last_on_a_restart_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    import fullshard
    from conftest import quiet_trainer

    class Net(fullshard.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.layer(batch[0]).sum()
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    checkpoint = fullshard.ModelCheckpoint(dirpath=tmp_path / "ckpts")
    trainer = quiet_trainer(tmp_path, max_steps=1, callbacks=[checkpoint], enable_checkpointing=True)
    with pytest.warns(
        UserWarning,
        match=r"fit\(ckpt_path='last'\) found no checkpoint in the ModelCheckpoint directories \('.*ckpts'\); "
        r"training starts from scratch\. This is restart 1 of a torchrun job: .* pass ModelCheckpoint\(dirpath=\.\.\.\)",
    ):
        trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2), ckpt_path="last")

"""Tests of fullshard.launch: cluster environments (pure logic) and launchers (real processes).

Run: pytest tests/test_launch.py  (add -m "not multiprocess" for the fast unit tests only)
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo  # see the note above JOB_SCRIPT
import torch.distributed as dist

import fullshard
from fullshard.errors import MisconfigurationError, ProcessFailedError
from fullshard.launch import (
    LocalEnvironment,
    SLURMEnvironment,
    SpawnLauncher,
    SubprocessScriptLauncher,
    TorchElasticEnvironment,
    expand_slurm_hostlist,
    select_cluster_environment,
)
from fullshard.launch.launchers import RERUN_MAIN, _Child, _LocalJob, _rerun_command

# torch._dynamo is imported above, once and for all, because importing it sets
# TORCHINDUCTOR_CACHE_DIR (torch 2.13), and the first optimizer a process builds imports it:
# the Trainer tests below would otherwise trip no_environment_changes.
JOB_SCRIPT = Path(__file__).parent / "scripts" / "launch_job.py"
JOB_TIMEOUT_S = 60  # far above what any scenario needs; a hang fails the test instead of the run
PROMPT_S = 30  # the launcher's promise: a failure anywhere ends the job within this

_CLUSTER_VARIABLES = (
    "LOCAL_RANK",
    "NODE_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "FULLSHARD_LAUNCHER_PID",
)


@pytest.fixture(autouse=True)
def no_environment_changes() -> Iterator[None]:
    """Fail a test that changes any environment variable (conftest watches only the usual
    cluster ones; launchers also write FULLSHARD_LAUNCHER_PID and OMP_NUM_THREADS)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
    changed.discard("PYTEST_CURRENT_TEST")  # pytest's own
    assert not changed, f"the test changed environment variables {sorted(changed)}"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No cluster variables set; afterwards they are as before, even those the test wrote."""
    for name in [*_CLUSTER_VARIABLES, *(name for name in os.environ if name.startswith("SLURM_"))]:
        monkeypatch.setenv(name, "")  # so that monkeypatch records the name even when it was unset
        monkeypatch.delenv(name)
    return monkeypatch


# ---------------------------------------------------------------------------------------------
# LocalEnvironment


def test_local_environment_defaults(clean_env: pytest.MonkeyPatch) -> None:
    env = LocalEnvironment()
    assert LocalEnvironment.detect()
    assert not env.creates_processes_externally
    assert env.main_address == "127.0.0.1"
    assert (env.local_rank(), env.node_rank(), env.global_rank(), env.world_size()) == (0, 0, 0, 1)
    env.set_world_size(4)
    env.set_global_rank(3)
    assert (env.world_size(), env.global_rank()) == (4, 3)


def test_local_environment_reads_variables(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCAL_RANK", "1")
    clean_env.setenv("NODE_RANK", "2")
    clean_env.setenv("MASTER_ADDR", "10.0.0.7")
    clean_env.setenv("MASTER_PORT", "29512")
    env = LocalEnvironment()
    assert env.creates_processes_externally
    assert (env.local_rank(), env.node_rank()) == (1, 2)
    assert (env.main_address, env.main_port) == ("10.0.0.7", 29512)
    env.teardown()
    assert os.environ["MASTER_PORT"] == "29512"  # the user's port is not ours to remove


def test_local_environment_chooses_port_once_and_removes_it(clean_env: pytest.MonkeyPatch) -> None:
    env = LocalEnvironment()
    port = env.main_port
    assert 0 < port < 65536
    assert os.environ["MASTER_PORT"] == str(port)  # processes started now inherit it
    assert env.main_port == port
    env.teardown()
    assert "MASTER_PORT" not in os.environ
    assert env.main_port == port  # the same port again, written back
    env.teardown()


def test_local_environment_keeps_port_inside_a_launched_job(clean_env: pytest.MonkeyPatch) -> None:
    env = LocalEnvironment()
    port = env.main_port
    clean_env.setenv("LOCAL_RANK", "0")  # what the launcher sets in rank 0 after starting children
    env.teardown()
    assert os.environ["MASTER_PORT"] == str(port)


def test_local_environment_rejects_non_integer(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCAL_RANK", "one")
    with pytest.raises(MisconfigurationError, match=r"LOCAL_RANK='one' is not an integer"):
        LocalEnvironment().local_rank()


@pytest.mark.parametrize(
    ("variables", "devices", "nodes", "match"),
    [
        ({"MASTER_ADDR": "h"}, 2, 2, r"num_nodes=2.*MASTER_PORT, NODE_RANK is not set"),
        ({"NODE_RANK": "1"}, 2, 1, r"NODE_RANK=1 but Trainer\(num_nodes=1\) allows node ranks 0..0"),
        ({"LOCAL_RANK": "2"}, 2, 1, r"LOCAL_RANK=2 but Trainer\(devices=2\).*pass devices=3"),
        ({"LOCAL_RANK": "1", "WORLD_SIZE": "4"}, 2, 1, r"WORLD_SIZE=4 but Trainer\(devices=2, num_nodes=1\)"),
    ],
)
def test_local_environment_validate_settings_errors(
    clean_env: pytest.MonkeyPatch, variables: dict[str, str], devices: int, nodes: int, match: str
) -> None:
    for name, value in variables.items():
        clean_env.setenv(name, value)
    with pytest.raises(MisconfigurationError, match=match):
        LocalEnvironment().validate_settings(num_devices=devices, num_nodes=nodes)


def test_local_environment_validate_settings_accepts_consistent_values(clean_env: pytest.MonkeyPatch) -> None:
    LocalEnvironment().validate_settings(num_devices=4, num_nodes=1)
    for name, value in {"LOCAL_RANK": "1", "WORLD_SIZE": "4", "NODE_RANK": "1"}.items():
        clean_env.setenv(name, value)
    clean_env.setenv("MASTER_ADDR", "h")
    clean_env.setenv("MASTER_PORT", "1234")
    LocalEnvironment().validate_settings(num_devices=2, num_nodes=2)


# ---------------------------------------------------------------------------------------------
# TorchElasticEnvironment

_TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "abc",
    "MASTER_ADDR": "node7",
    "MASTER_PORT": "29400",
}


def _set_all(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_torchelastic_reads_ranks(clean_env: pytest.MonkeyPatch) -> None:
    _set_all(clean_env, _TORCHRUN)
    assert TorchElasticEnvironment.detect()
    env = TorchElasticEnvironment()
    assert env.creates_processes_externally
    assert (env.global_rank(), env.world_size(), env.local_rank(), env.node_rank()) == (3, 4, 1, 1)
    assert (env.main_address, env.main_port) == ("node7", 29400)
    env.validate_settings(num_devices=2, num_nodes=2)


@pytest.mark.parametrize("missing", [["RANK"], ["MASTER_PORT"], ["TORCHELASTIC_RUN_ID", "GROUP_RANK"]])
def test_torchelastic_not_detected_without(clean_env: pytest.MonkeyPatch, missing: list[str]) -> None:
    _set_all(clean_env, {name: value for name, value in _TORCHRUN.items() if name not in missing})
    assert not TorchElasticEnvironment.detect()


def test_torchelastic_detected_with_group_rank_only(clean_env: pytest.MonkeyPatch) -> None:
    _set_all(clean_env, {name: value for name, value in _TORCHRUN.items() if name != "TORCHELASTIC_RUN_ID"})
    assert TorchElasticEnvironment.detect()


def test_torchelastic_setters_warn_and_ignore(clean_env: pytest.MonkeyPatch, recwarn: Any) -> None:
    _set_all(clean_env, _TORCHRUN)
    env = TorchElasticEnvironment()
    env.set_world_size(4)
    env.set_global_rank(3)
    assert len(recwarn) == 0
    with pytest.warns(UserWarning, match=r"Ignoring world_size=8: torchrun \(WORLD_SIZE\) says 4"):
        env.set_world_size(8)
    with pytest.warns(UserWarning, match=r"Ignoring global_rank=0: torchrun \(RANK\) says 3"):
        env.set_global_rank(0)
    assert (env.world_size(), env.global_rank()) == (4, 3)


def test_torchelastic_validate_settings_error(clean_env: pytest.MonkeyPatch) -> None:
    _set_all(clean_env, _TORCHRUN)
    with pytest.raises(
        MisconfigurationError,
        match=r"torchrun started 2 processes per node and 4 in total.*devices=4, num_nodes=1\."
        r" Pass devices=2, num_nodes=2, or start torchrun with --nproc-per-node=4 --nnodes=1",
    ):
        TorchElasticEnvironment().validate_settings(num_devices=4, num_nodes=1)


# ---------------------------------------------------------------------------------------------
# SLURMEnvironment

_SLURM = {
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NAME": "train.sh",
    "SLURM_JOB_ID": "123456",
    "SLURM_NODELIST": "gpu[017-018]",
}


def test_slurm_reads_ranks_address_and_port(clean_env: pytest.MonkeyPatch) -> None:
    _set_all(clean_env, _SLURM)
    assert SLURMEnvironment.detect()
    env = SLURMEnvironment()
    assert env.creates_processes_externally
    assert (env.global_rank(), env.world_size(), env.local_rank(), env.node_rank()) == (2, 4, 0, 1)
    assert env.main_address == "gpu017"
    assert env.main_port == 10000 + 123456 % 20000 == 13456
    env.validate_settings(num_devices=2, num_nodes=2)


def test_slurm_master_variables_take_precedence(clean_env: pytest.MonkeyPatch) -> None:
    _set_all(clean_env, {**_SLURM, "MASTER_ADDR": "login1", "MASTER_PORT": "4242"})
    env = SLURMEnvironment()
    assert (env.main_address, env.main_port) == ("login1", 4242)


@pytest.mark.parametrize(
    ("variables", "detected"),
    [
        ({"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train"}, True),
        ({"SLURM_NTASKS": "2"}, True),
        ({"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "bash"}, False),
        ({"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "interactive"}, False),
        ({"SLURM_JOB_NAME": "train"}, False),
    ],
)
def test_slurm_detect(clean_env: pytest.MonkeyPatch, variables: dict[str, str], detected: bool) -> None:
    _set_all(clean_env, variables)
    assert SLURMEnvironment.detect() is detected


def test_slurm_validate_settings_error(clean_env: pytest.MonkeyPatch) -> None:
    _set_all(clean_env, _SLURM)
    with pytest.raises(
        MisconfigurationError,
        match=r"SLURM started 4 tasks on 2 nodes .*devices=4, num_nodes=1, which needs 4 tasks on 1 nodes\."
        r" Submit with `#SBATCH --nodes=1` and `#SBATCH --ntasks-per-node=4`",
    ):
        SLURMEnvironment().validate_settings(num_devices=4, num_nodes=1)


def test_slurm_without_nodelist_asks_for_master_addr(clean_env: pytest.MonkeyPatch) -> None:
    _set_all(clean_env, {name: value for name, value in _SLURM.items() if name != "SLURM_NODELIST"})
    with pytest.raises(MisconfigurationError, match=r"main address is unknown\. Set MASTER_ADDR"):
        _ = SLURMEnvironment().main_address


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[001-003,007],gpu2", ["node001", "node002", "node003", "node007", "gpu2"]),
        ("a[8-10]", ["a8", "a9", "a10"]),
        ("a[08-10]", ["a08", "a09", "a10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("x[3],y", ["x3", "y"]),
        (" a , b[1-2] ", ["a", "b1", "b2"]),
        ("[1-2]suffix", ["1suffix", "2suffix"]),
    ],
)
def test_expand_slurm_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_slurm_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "match"),
    [
        ("node[1-3", r"unclosed '\['"),
        ("node1-3]", r"unbalanced or nested brackets"),
        ("node[1-[2]]", r"unbalanced or nested brackets"),
        ("node[a-c]", r"has 'a-c' in brackets; expected a number or a range"),
        ("node[5-2]", r"descending range '5-2'"),
        (" , ", r"names no host"),
    ],
)
def test_expand_slurm_hostlist_errors(hostlist: str, match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        expand_slurm_hostlist(hostlist)


def test_select_cluster_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert type(select_cluster_environment()) is LocalEnvironment
    _set_all(clean_env, _SLURM)
    assert type(select_cluster_environment()) is SLURMEnvironment
    _set_all(clean_env, _TORCHRUN)  # torchrun inside a SLURM allocation: torchrun wins
    assert type(select_cluster_environment()) is TorchElasticEnvironment


# ---------------------------------------------------------------------------------------------
# Launchers: logic that needs no extra process


def _module(name: str, *, file: str | None, spec_name: str | None) -> types.ModuleType:
    module = types.ModuleType(name)
    if file is not None:
        module.__file__ = file
    module.__spec__ = None if spec_name is None else types.SimpleNamespace(name=spec_name)  # type: ignore[assignment]
    return module


def test_rerun_command_for_a_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    main = _module("__main__", file="train.py", spec_name=None)
    command = _rerun_command(main, ["train.py", "--lr", "0.1"], "/bin/python")
    assert command == ["/bin/python", RERUN_MAIN, str(tmp_path / "train.py"), "--lr", "0.1"]


@pytest.mark.parametrize(("spec_name", "module_arg"), [("pkg.train", "pkg.train"), ("pkg.__main__", "pkg")])
def test_rerun_command_for_a_module(spec_name: str, module_arg: str) -> None:
    main = _module("__main__", file="/x/pkg/train.py", spec_name=spec_name)
    command = _rerun_command(main, ["/x/pkg/train.py", "--fast"], "/bin/python")
    assert command == ["/bin/python", RERUN_MAIN, "-m", module_arg, "--fast"]


def test_rerun_command_refuses_interactive_sessions() -> None:
    main = _module("__main__", file=None, spec_name=None)
    with pytest.raises(MisconfigurationError, match=r"no script to start again.*strategy='ddp_notebook'"):
        _rerun_command(main, ["-c"], "/bin/python")


@pytest.mark.parametrize("launcher_class", [SubprocessScriptLauncher, SpawnLauncher])
def test_launchers_reject_bad_counts(clean_env: pytest.MonkeyPatch, launcher_class: Any) -> None:
    with pytest.raises(MisconfigurationError, match=r"got num_processes=0, num_nodes=1"):
        launcher_class(LocalEnvironment(), num_processes=0, num_nodes=1)


def test_spawn_launcher_rejects_unknown_start_method() -> None:
    with pytest.raises(MisconfigurationError, match=r"start_method='teleport' is not available.*'spawn'"):
        SpawnLauncher(LocalEnvironment(), num_processes=2, num_nodes=1, start_method="teleport")


def test_interactive_compatibility() -> None:
    env = LocalEnvironment()
    assert not SubprocessScriptLauncher(env, 2, 1).is_interactive_compatible
    assert not SpawnLauncher(env, 2, 1).is_interactive_compatible
    assert SpawnLauncher(env, 2, 1, start_method="fork").is_interactive_compatible


def _add(a: int, b: int, *, scale: int) -> int:
    return (a + b) * scale


def test_script_launcher_runs_directly_where_processes_exist(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCAL_RANK", "1")  # a copy started by the launcher (or by the user)
    launcher = SubprocessScriptLauncher(LocalEnvironment(), num_processes=2, num_nodes=1)
    assert launcher.launch(_add, 1, 2, scale=10, trainer=object()) == 30


def test_script_launcher_runs_directly_for_one_process(clean_env: pytest.MonkeyPatch) -> None:
    launcher = SubprocessScriptLauncher(LocalEnvironment(), num_processes=1, num_nodes=1)
    assert launcher.launch(_add, 1, 2, scale=2) == 6
    assert "LOCAL_RANK" not in os.environ


def _fail_with(message: str) -> None:
    raise ValueError(message)


def test_local_job_ends_children_when_rank_0_fails(capsys: pytest.CaptureFixture[str]) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    job = _LocalJob(0, [_Child(rank=1, process=sleeper)])
    atexit.unregister(job._at_exit)  # this test process must not wait for it at exit
    try:
        with pytest.raises(ValueError, match="rank 0 broke"):
            job.run(_fail_with, "rank 0 broke")
        assert sleeper.returncode == -signal.SIGTERM
        assert f"fullshard: rank 0 (pid {os.getpid()}) failed; stopping the other processes" in (
            capsys.readouterr().err
        )
        with pytest.raises(
            ProcessFailedError, match=r"stopped after an earlier failure.*start the script again"
        ):
            job.run(_add, 1, 2, scale=1)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


# ---------------------------------------------------------------------------------------------
# SubprocessScriptLauncher: real two-process jobs (tests/scripts/launch_job.py)


@dataclass(frozen=True)
class _JobRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def pid(self, rank: int) -> int:
        found = re.search(rf"launch-test rank={rank} pid=(\d+)", self.stdout)
        assert found, f"rank {rank} never started:\n{self}"
        return int(found.group(1))

    def __str__(self) -> str:
        return (
            f"returncode={self.returncode} after {self.seconds:.1f}s\n"
            f"--stdout--\n{self.stdout}\n--stderr--\n{self.stderr}"
        )


def _run_job(scenario: str, tmp_path: Path, *, interrupt_when_ready: bool = False) -> _JobRun:
    return _run_python(
        [str(JOB_SCRIPT), scenario, str(tmp_path)],
        tmp_path,
        ready_file=tmp_path / "rank0_waiting" if interrupt_when_ready else None,
    )


def _run_python(args: list[str], cwd: Path, *, ready_file: Path | None = None) -> _JobRun:
    """Run ``python *args`` in ``cwd``; with ``ready_file``, send it SIGINT once that file exists."""
    start = time.monotonic()
    # A session of its own, so that a hung job can be killed whole (its process group).
    process = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
        env={name: value for name, value in os.environ.items() if name not in _CLUSTER_VARIABLES},
    )
    try:
        if ready_file is not None:
            _wait_for(lambda: ready_file.exists() or process.poll() is not None, JOB_TIMEOUT_S)
            process.send_signal(signal.SIGINT)
        # communicate() returns once every process holding the pipes has ended: a leftover
        # child makes it time out.
        stdout, stderr = process.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"the job did not end within {JOB_TIMEOUT_S}s\n{stdout}\n{stderr}")
    return _JobRun(process.returncode, stdout, stderr, time.monotonic() - start)


def _wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # an orphan's zombie may wait for a reaper that never comes in a container
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def _assert_failed_promptly(run: _JobRun) -> None:
    assert run.returncode != 0, str(run)
    assert run.seconds < PROMPT_S, str(run)
    assert _wait_for(lambda: _process_gone(run.pid(1)), 5), f"rank 1 outlived the job\n{run}"


@pytest.mark.multiprocess
def test_job_succeeds_and_launches_twice(tmp_path: Path) -> None:
    # Like fit() then validate(): the second launch must reuse the processes of the first.
    run = _run_job("two_launches", tmp_path)
    assert run.returncode == 0, str(run)
    for rank in (0, 1):
        assert f"launch-test rank={rank} results=[6.0, 6.0]" in run.stdout, str(run)
        assert run.stdout.count(f"launch-test rank={rank} pid={run.pid(rank)}") == 2, str(run)
    assert "fullshard:" not in run.stderr, str(run)


@pytest.mark.multiprocess
def test_job_fails_when_rank_1_raises_in_a_collective(tmp_path: Path) -> None:
    run = _run_job("raise_rank1", tmp_path)
    _assert_failed_promptly(run)
    assert 'raise ValueError("boom on rank 1")' in run.stderr, str(run)
    assert "ValueError: boom on rank 1" in run.stderr, str(run)


@pytest.mark.multiprocess
def test_job_fails_when_rank_1_raises_while_rank_0_waits_for_it(tmp_path: Path) -> None:
    # Rank 0 waits in the rendezvous, where nothing fails on its own: only the monitor ends it.
    run = _run_job("raise_rank1_before_init", tmp_path)
    _assert_failed_promptly(run)
    assert "ValueError: boom on rank 1" in run.stderr, str(run)
    pid = run.pid(1)
    assert f"fullshard: rank 1 (pid {pid}) exited with code 1; stopping the other processes" in run.stderr
    assert run.returncode == 1


@pytest.mark.multiprocess
def test_job_fails_when_rank_0_raises_in_a_collective(tmp_path: Path) -> None:
    run = _run_job("raise_rank0", tmp_path)
    _assert_failed_promptly(run)
    assert "ValueError: boom on rank 0" in run.stderr, str(run)
    assert f"fullshard: rank 0 (pid {run.pid(0)}) failed; stopping the other processes" in run.stderr


@pytest.mark.multiprocess
def test_job_fails_when_rank_1_is_killed(tmp_path: Path) -> None:
    run = _run_job("kill_rank1", tmp_path)
    _assert_failed_promptly(run)
    assert re.search(rf"rank 1 \(pid {run.pid(1)}\) was killed by SIGKILL", run.stderr), str(run)


@pytest.mark.multiprocess
def test_children_end_when_rank_0_is_killed(tmp_path: Path) -> None:
    run = _run_job("kill_rank0", tmp_path)
    assert run.returncode == -signal.SIGKILL, str(run)
    _assert_failed_promptly(run)
    assert f"the launching process (pid {run.pid(0)}) is gone" in run.stderr, str(run)


@pytest.mark.multiprocess
def test_ctrl_c_in_rank_0_ends_the_children(tmp_path: Path) -> None:
    run = _run_job("sigint_rank0", tmp_path, interrupt_when_ready=True)
    _assert_failed_promptly(run)
    assert "KeyboardInterrupt" in run.stderr, str(run)
    assert "fullshard: rank 0" in run.stderr and "failed; stopping the other processes" in run.stderr


# ---------------------------------------------------------------------------------------------
# SpawnLauncher: in this process (functions at module level so that spawned processes import them)


def _init_gloo() -> int:
    rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=60),
    )
    return rank


_BIG = 1_000_000  # elements: 4 MB, far more than a pipe holds, and enough for multi-threaded ops


def _spawned_sum(scale: float, weights: torch.Tensor) -> tuple[float, torch.Tensor, bool]:
    rank = _init_gloo()
    total = torch.tensor([scale * (rank + 1)])
    dist.all_reduce(total)
    dist.barrier()
    dist.destroy_process_group()
    # Each process must own its copy of what it was given: ranks that shared the parent's
    # parameter memory would all step the same parameters.
    return total.item(), torch.ones(_BIG) * (rank + 1), weights.is_shared()


def _spawned_failure() -> None:
    rank = _init_gloo()
    total = torch.ones(1)
    dist.all_reduce(total)
    if rank == 1:
        raise ValueError("boom in spawned rank 1")
    dist.all_reduce(total)  # rank 0 waits here for rank 1, which never comes


def _spawned_sum_and_state(
    scale: float, weights: torch.Tensor
) -> tuple[tuple[float, torch.Tensor, bool], dict[str, Any]]:
    """What the Trainer's function returns under spawn: its value, and the state rank 0 sends back."""
    value = _spawned_sum(scale, weights)
    return value, {
        "pid": os.getpid(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "weights": torch.arange(3.0),
    }


@pytest.mark.multiprocess
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_spawn_launcher_returns_rank_0_result(clean_env: pytest.MonkeyPatch, start_method: str) -> None:
    # This process runs a multi-threaded op first: forked children must still not hang in theirs.
    assert torch.ones(_BIG).sum().item() == _BIG
    launcher = SpawnLauncher(LocalEnvironment(), num_processes=2, num_nodes=1, start_method=start_method)
    weights = torch.arange(4.0)
    (total, big, shared), applied = launcher.launch(_spawned_sum_and_state, 2.0, weights=weights)
    assert total == 6.0
    assert not shared and not weights.is_shared()
    assert big.shape == (_BIG,) and big.sum().item() == _BIG  # rank 0's tensor, readable after it exited
    assert applied["local_rank"] == 0
    assert applied["pid"] != os.getpid()
    assert torch.equal(applied["weights"], torch.arange(3.0))
    assert "MASTER_PORT" not in os.environ  # chosen for the job, then removed again


@pytest.mark.multiprocess
def test_spawn_launcher_reports_the_first_failure(
    clean_env: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # fork: the failure path is the same for every start method, and fork starts in a blink.
    launcher = SpawnLauncher(LocalEnvironment(), num_processes=2, num_nodes=1, start_method="fork")
    start = time.monotonic()
    with pytest.raises(ProcessFailedError, match=r"(?s)local rank 1 failed first.*boom in spawned rank 1"):
        launcher.launch(_spawned_failure)
    assert time.monotonic() - start < PROMPT_S
    assert "fullshard: spawned local rank 1 failed" in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------
# Notebook paths: fork, and spawn's checks (every path ends, with one clear error)


def test_fork_names_are_registered() -> None:
    from fullshard.strategies import STRATEGY_REGISTRY, DDPStrategy

    for name in ("ddp_notebook", "ddp_fork"):
        strategy = STRATEGY_REGISTRY.get(name)
        assert type(strategy) is DDPStrategy and strategy.start_method == "fork"
        assert "notebooks" in STRATEGY_REGISTRY.describe()[name]
    assert DDPStrategy(start_method="fork").start_method == "fork"


def test_notebook_strategy_gets_a_fork_launcher(clean_env: pytest.MonkeyPatch) -> None:
    trainer = fullshard.Trainer(accelerator="cpu", devices=2, strategy="ddp_notebook", logger=False)
    launcher = trainer.strategy.launcher
    assert isinstance(launcher, SpawnLauncher) and launcher.start_method == "fork"
    assert launcher.is_interactive_compatible


def test_fork_is_refused_once_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = SpawnLauncher(LocalEnvironment(), num_processes=2, num_nodes=1, start_method="fork")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    match = r"start_method='fork'.*cannot start processes after CUDA was initialised.*strategy='ddp_spawn'"
    with pytest.raises(MisconfigurationError, match=match):
        launcher.launch(_add, 1, 2, scale=1)  # CUDA initialised after the launcher was made
    with pytest.raises(MisconfigurationError, match=match):
        SpawnLauncher(LocalEnvironment(), num_processes=2, num_nodes=1, start_method="fork")


def test_fork_is_refused_where_the_platform_has_none(
    clean_env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    with pytest.raises(MisconfigurationError, match=r"start_method='fork'.*is not available.*has no fork"):
        fullshard.Trainer(accelerator="cpu", devices=2, strategy="ddp_notebook", logger=False)


class _TinyModule(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _collate_first(batch: list[Any]) -> Any:
    return torch.utils.data.default_collate(batch)


@pytest.mark.parametrize(
    ("unpicklable", "match"),
    [
        (
            "lambda_collate_fn",
            r"does not pickle \(found at args\[2\] \(\w+\) \.loaders\.train \(DataLoader\) \.collate_fn"
            r" \(function\)\): \w+: Can't pickle .*<lambda>",
        ),
        ("generator", r"does not pickle \(found at args\[1\] \(_TinyModule\) \.stream \(generator\)\)"),
    ],
)
def test_spawn_refuses_what_does_not_pickle_before_starting(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, unpicklable: str, match: str
) -> None:
    import multiprocessing

    model = _TinyModule()
    data = torch.utils.data.TensorDataset(torch.randn(16, 4))
    collate = (lambda batch: _collate_first(batch)) if unpicklable == "lambda_collate_fn" else _collate_first
    if unpicklable == "generator":
        model.stream = (step for step in range(3))
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=collate)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=1,
        logger=False,
        default_root_dir=tmp_path,
    )
    start = time.monotonic()
    with pytest.raises(
        MisconfigurationError, match=rf"(?s)^start_method='spawn' .*{match}.*No process was started"
    ):
        trainer.fit(model, loader)
    assert time.monotonic() - start < 5
    assert multiprocessing.active_children() == []


_INTERACTIVE_FIT = """
import torch, fullshard
from torch.utils.data import DataLoader, TensorDataset

class Net(fullshard.Module):  # defined in __main__ of `python -c`: no other process can import it
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.notes = list(range(300_000))  # pickles to far more than a pipe holds

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

model = Net()
before = model.layer.weight.detach().clone()
trainer = fullshard.Trainer(accelerator="cpu", devices=2, strategy=STRATEGY, max_steps=3, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4))
changed = not torch.equal(before, model.layer.weight)
print(f"interactive-fit global_step={trainer.global_step} weights_changed={changed}")
"""


@pytest.mark.multiprocess
def test_spawn_from_python_c_refuses_a_main_class_before_starting(tmp_path: Path) -> None:
    run = _run_python(["-c", _INTERACTIVE_FIT.replace("STRATEGY", "'ddp_spawn'")], tmp_path)
    assert run.returncode != 0, str(run)
    assert run.seconds < PROMPT_S, str(run)
    assert (
        "MisconfigurationError: start_method='spawn' starts fresh Python processes, which must import every"
        " class and function the model, the data and the Trainer use; Net (class) is defined in the __main__"
        " module of this session" in run.stderr
    ), str(run)
    assert "No process was started" in run.stderr and "use strategy='ddp_notebook'" in run.stderr, str(run)
    assert "spawned local rank" not in run.stderr, str(run)


@pytest.mark.multiprocess
def test_spawn_ends_when_the_processes_cannot_rebuild_the_module(tmp_path: Path) -> None:
    # The launching process cannot tell (its script's __main__ is re-created in the new processes),
    # and the payload is larger than a pipe holds: the parent must not block writing it.
    run = _run_python([str(Path(__file__).parent / "scripts" / "launch_spawn_guard.py")], tmp_path)
    assert run.returncode != 0, str(run)
    assert run.seconds < PROMPT_S, str(run)
    assert re.search(
        r"ProcessFailedError: Spawned local rank \d failed first.*\n"
        r"MisconfigurationError: Spawned local rank \d could not rebuild what the launching process sent it"
        r" \(AttributeError: Can't get attribute 'Hidden' on <module '__mp_main__'",
        run.stderr,
    ), str(run)
    assert "not under `if __name__ == '__main__':`" in run.stderr, str(run)


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp_notebook", "ddp_fork"])
def test_fork_trains_a_class_defined_in_python_c(tmp_path: Path, strategy: str) -> None:
    run = _run_python(["-c", _INTERACTIVE_FIT.replace("STRATEGY", repr(strategy))], tmp_path)
    assert run.returncode == 0, str(run)
    assert "interactive-fit global_step=3 weights_changed=True" in run.stdout, str(run)


@pytest.mark.multiprocess
def test_start_up_warnings_print_once_and_rank_warnings_still_show() -> None:
    from conftest import check_ok, run_script

    result = run_script("launch_warnings.py", fresh_python=True)
    check_ok(result)
    assert result.stderr.count("UserWarning: warned while the script starts") == 1, result.stderr
    assert "rank 0 warns in training_step" in result.stderr
    assert "rank 1 warns in training_step" in result.stderr

"""Read back what a logger sent to a tracking backend, through that backend's own package: the
records of an offline W&B run (its protobuf messages), the messages of an offline Comet
experiment (its archive, unpacked by comet_ml), and an MLflow run (MlflowClient). Used by
tests/test_logger_backends.py and by the porting script tests/porting/logger_backends.py, under
fullshard and Lightning alike, so it imports neither.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

_WANDB_HEADER = 7  # ":W&B", a 2-byte magic number and a version byte
_WANDB_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: W&B writes them in LevelDB's log format (32 KiB blocks of
    chunks, each a 7-byte header of checksum, length and type), which its package has no Python
    reader for since the writer moved into its Go core."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    records, partial, pos = [], b"", _WANDB_HEADER
    while pos + 7 <= len(data):
        left = _WANDB_BLOCK - pos % _WANDB_BLOCK
        if left < 7:  # the end of a block too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            partial = chunk
        elif kind == _MIDDLE:
            partial += chunk
        elif kind == _LAST:
            records.append(partial + chunk)
    return records


def read_wandb_offline(save_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The offline run under ``save_dir/wandb``: its id, project and name, its config, and each
    ``run.log`` as a dict (W&B's own ``_step``, ``_runtime`` and ``_timestamp`` left out)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = Path(save_dir, "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 20
    while True:  # W&B's core process may still be writing the run's last records
        records = [wandb_internal_pb2.Record.FromString(raw) for raw in _wandb_records(path)]
        kinds = {record.WhichOneof("record_type") for record in records}
        if {"run", "exit"} <= kinds or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    run: dict[str, Any] = {"config": {}, "history": []}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(id=record.run.run_id, project=record.run.project, name=record.run.display_name)
        elif kind == "config":
            for item in record.config.update:
                run["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            run["history"].append({k: v for k, v in row.items() if not k.startswith("_")})
    return run


def read_comet_offline(offline_directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The offline experiment archived in ``offline_directory``: its project, parameters (as
    logged, not Comet's own) and metrics as ``(name, value, step, epoch)``."""
    from comet_ml.offline import unzip_offline_archive

    (archive,) = Path(offline_directory).glob("*.zip")
    folder = Path(unzip_offline_archive(str(archive)))
    meta = json.loads((folder / "experiment.json").read_text())
    params: dict[str, Any] = {}
    metrics: list[tuple[str, float, int | None, Any]] = []
    others: dict[str, Any] = {}
    for line in (folder / "messages.json").read_text().splitlines():
        message = json.loads(line)
        payload = message["payload"]
        if message["type"] == "parameter_msg" and payload["param"]["source"] == "manual":
            params[payload["param"]["paramName"]] = payload["param"]["paramValue"]
        elif message["type"] == "metric_msg":
            m = payload["metric"]
            metrics.append((m["metricName"], m["metricValue"], m["step"], m.get("epoch")))
        elif message["type"] == "log_other":
            others[payload["key"]] = payload["value"]
    return {"project": meta["project_name"], "params": params, "metrics": metrics, "others": others}


def read_mlflow_run(tracking_uri: str, run_id: str) -> dict[str, Any]:
    """The run's status, parameters, tags and each metric's history as ``(step, value)`` pairs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    history = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }
    return {
        "status": run.info.status,
        "experiment": client.get_experiment(run.info.experiment_id).name,
        "params": dict(run.data.params),
        "tags": dict(run.data.tags),
        "metrics": history,
    }


class MLflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite backend under ``root``, in a session of its
    own so that :meth:`stop` ends it with the workers it starts."""

    def __init__(self, root: Path, timeout: float = 90) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.uri = f"http://127.0.0.1:{port}"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job workers: only tracking
        self._log = (root / "mlflow-server.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--default-artifact-root", str(root / "artifacts"), "--workers", "1"],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"mlflow server did not start; see {root / 'mlflow-server.log'}"
                    ) from None
                time.sleep(0.3)

    def stop(self) -> None:
        """End the server and its workers (its whole session), waiting for them."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # workers still there after the main process left
        self._log.close()

"""`placement_trial`: a numpy trial that records where it ran and who ran beside it."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.utils import write_atomic

from ._trials import numpy_trial

__all__ = ["most_at_once", "placement_trial", "read_placements"]

#: The environment variables a placement record keeps.
ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "PIPEKIT_SWEEP_DEVICE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "OMP_NUM_THREADS",
)
_OWN = {"record_dir": None, "peers": 1, "wait_s": 30.0, "hold_s": 0.2}


def _ray_context() -> tuple[str | None, list[Any] | None]:
    """This Ray worker's node id and GPU ids, or `(None, None)` outside Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None, None
    return ray.get_runtime_context().get_node_id(), [str(i) for i in ray.get_gpu_ids()]


def placement_trial(params: dict[str, Any], *, trial_dir: Path | None = None) -> TrainingLoop:
    """A `numpy_trial` that first records where it runs and how many trials run beside it.

    Before building its loop the trial puts a marker file (with its pid) into
    `<record_dir>/running/<group>/`, where the group is its Ray node (or host) and its
    `CUDA_VISIBLE_DEVICES`, i.e. the device it was given. It then waits until `peers`
    trials of its group run at once (itself included) or `wait_s` seconds pass, keeps
    running `hold_s` seconds more, counting its group's markers all along, removes its
    marker and writes `<record_dir>/<uuid>.json`: `pid`, `host`, `node_id` and `gpu_ids`
    (Ray workers: `ray.get_runtime_context().get_node_id()`, `ray.get_gpu_ids()`; else
    None), `env` (the variables in `ENV_VARS`, None when unset), `group`, `start` and
    `end` (wall-clock times around the marker's life) and `max_running` (the most
    markers of its group it saw at once).

    Params: `record_dir` (required), `peers` (1), `wait_s` (30.0), `hold_s` (0.2), plus
    every `numpy_trial` param.
    """
    opts = {**_OWN, **{k: v for k, v in params.items() if k in _OWN}}
    rest = {k: v for k, v in params.items() if k not in _OWN}
    if not isinstance(opts["record_dir"], str) or not opts["record_dir"]:
        raise ConfigError(
            f"`record_dir` must be a directory path. Received: record_dir={opts['record_dir']!r}."
        )
    record_dir = Path(opts["record_dir"])
    node_id, gpu_ids = _ray_context()
    env = {name: os.environ.get(name) for name in ENV_VARS}
    host = socket.gethostname()
    group = f"{node_id or host}|{env['CUDA_VISIBLE_DEVICES']}"
    running = record_dir / "running" / hashlib.sha256(group.encode()).hexdigest()[:16]
    running.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    marker = running / name
    start = time.time()
    pending = record_dir / f".{name}.marker"  # whole before it appears: readers poll it
    pending.write_text(json.dumps({"pid": os.getpid()}))
    os.replace(pending, marker)
    max_running = 0
    met_at = None
    try:
        while True:
            now = time.time()
            count = sum(1 for _ in running.iterdir())
            max_running = max(max_running, count)
            if met_at is None and (count >= int(opts["peers"]) or now - start > opts["wait_s"]):
                met_at = now
            if met_at is not None and now - met_at >= opts["hold_s"]:
                break
            time.sleep(0.02)
        end = time.time()
    finally:
        marker.unlink(missing_ok=True)
    record = {
        "pid": os.getpid(),
        "host": host,
        "node_id": node_id,
        "gpu_ids": gpu_ids,
        "env": env,
        "group": group,
        "start": start,
        "end": end,
        "max_running": max_running,
        "params": rest,
    }
    write_atomic(record_dir / f"{name}.json", json.dumps(record).encode())
    return numpy_trial(rest, trial_dir=trial_dir)


def read_placements(record_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records `placement_trial` wrote into `record_dir`, by start time."""
    records = [json.loads(p.read_text()) for p in Path(record_dir).glob("*.json")]
    return sorted(records, key=lambda r: r["start"])


def most_at_once(records: list[dict[str, Any]]) -> int:
    """The most records whose `[start, end]` intervals overlap at one moment."""
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best

"""`WandbWriter` in W&B's offline mode: no account, no network; the run files are read back."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task

wandb = pytest.importorskip("wandb")

_BLOCK = 32 * 1024  # the transaction log's block size (LevelDB log framing)
_HEADER = 7  # crc32 (4), length (2), type (1)


def _records(path: Path) -> list[Any]:
    """Every `Record` protobuf of an offline run's `run-<id>.wandb` transaction log.

    W&B ships no Python reader for the file in this version (its service, written in Go,
    reads it for `wandb sync`), so this parses the framing: a `:W&B` header, then 32 KiB
    blocks of chunks (`FULL`, or `FIRST`/`MIDDLE`/`LAST` pieces) holding W&B's own
    `wandb_internal_pb2.Record` messages.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    out, pos, pieces = [], 7, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        if pos + _HEADER + length > len(data):
            break  # the service is still writing this chunk
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces + chunk)
            out.append(record)
            pieces = b""
        else:  # FIRST, MIDDLE
            pieces += chunk
    return out


def _finished_log(run_dir: Path, timeout: float = 60.0) -> list[Any]:
    """The records of the run in `run_dir`, once W&B's service has written its `exit` record.

    `Run.finish()` returns when the service has the run's data; the service (a separate
    process) writes the file's buffered tail just after, or at the latest when the
    Python process exits.
    """
    (log,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        records = _records(log)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{log} has no exit record after {timeout} s"
        time.sleep(0.05)


def _history(run_dir: Path) -> dict[int, dict[str, Any]]:
    """`{step: {metric: value}}` logged to the offline run in `run_dir` (W&B's `_` keys dropped)."""
    rows: dict[int, dict[str, Any]] = {}
    for record in _finished_log(run_dir):
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.setdefault(int(items.pop("_step")), {}).update(
                {k: v for k, v in items.items() if not k.startswith("_")}
            )
    return rows


def _run_config(run_dir: Path) -> dict[str, Any]:
    for record in _finished_log(run_dir):
        if record.WhichOneof("record_type") == "run":
            return {
                item.key: json.loads(item.value_json)
                for item in record.run.config.update
                if not item.key.startswith("_")
            }
    raise AssertionError("no run record")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, with its settings, cache and artifacts under `tmp_path`."""
    for var, sub in (
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
    ):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


@pytest.mark.slow
def test_training_loop_logs_to_an_offline_run_and_resumes_it(offline):
    from pipekit_train.core.writers import WandbWriter

    train, val = regression_task(n_train=64, n_val=16, in_size=2)
    writer = WandbWriter(
        project="pipekit-test", name="linear", config={"lr": 0.1, "layers": [2, 1]}, dir=offline
    )
    artifact = TrainingLoop(
        NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=1),
        train,
        val,
        optimizer_config={"name": "sgd", "lr": 0.1},
        batch_size=16,
        max_steps=12,
        validate_every_n_steps=6,
        log_every_n_steps=4,
        writers=[writer],
        adapter=NumpyAdapter(),
    ).run()
    saved = json.loads(json.dumps(writer.state_dict()))
    assert saved == {"run_id": writer.run_id} and writer.run_id

    (run_dir,) = (offline / "wandb").glob(f"offline-run-*-{writer.run_id}")
    rows = _history(run_dir)
    assert sorted(rows) == list(range(1, 13))
    steps, losses = artifact.history.series("loss")
    assert steps == list(range(1, 13))
    np.testing.assert_allclose([rows[s]["loss"] for s in steps], losses, rtol=1e-6)
    assert rows[6]["val_loss"] == pytest.approx(artifact.history["val_loss"][0])
    assert rows[12]["val_loss"] == pytest.approx(artifact.final_metrics["val_loss"])
    assert _run_config(run_dir) == {"lr": 0.1, "layers": [2, 1]}

    # a resumed training logs into the same run id (offline, W&B writes one folder per
    # process; `wandb sync` appends them)
    resumed = WandbWriter(project="pipekit-test", dir=offline / "resumed")
    resumed.load_state_dict(saved)
    resumed.write(13, {"loss": 0.125})
    resumed.close()
    assert resumed.run_id == writer.run_id
    (resumed_dir,) = (offline / "resumed" / "wandb").glob(f"offline-run-*-{writer.run_id}")
    assert _history(resumed_dir) == {13: {"loss": 0.125}}


def test_wandb_writer_bad_arguments(offline):
    from pipekit_train.core.writers import WandbWriter

    with pytest.raises(ConfigError, match=r"`mode` must be one of .*Received: mode='ofline'"):
        WandbWriter(mode="ofline")
    with pytest.raises(ConfigError, match="`tags` must be a list of strings"):
        WandbWriter(tags="baseline")
    with pytest.raises(ConfigError, match="`project` must be a non-empty string"):
        WandbWriter(project="")
    assert not (offline / "wandb").exists()  # nothing started

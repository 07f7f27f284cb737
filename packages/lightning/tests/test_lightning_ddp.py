"""Two CPU processes with Lightning's own DDP (`strategy="ddp"`), in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipekit_train.core.adapter import step_dirs

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.slow
def test_ddp_two_processes_train_checkpoint_and_resume_exactly(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path), "ddp"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    first, resumed, reference, epoch, skipped = rank0
    assert epoch["steps"] == 8  # one epoch of a 128-sample shard in batches of 16
    assert [r["world"] for r in rank0[:3]] == [2, 2, 2]
    assert (
        first["steps"] == 6
        and first["history_steps"] == list(range(1, 7))
        and first["val_steps"] == [3, 6]
    )
    assert resumed["resumed_from_step"] == 6 and resumed["history_steps"] == list(range(1, 11))
    # exact resume: per-process RNG (dropout) and data shards restored
    assert resumed["sha"] == reference["sha"]
    # DDP keeps the replicas identical
    assert [r["sha"] for r in rank1[:3]] == [r["sha"] for r in rank0[:3]]
    assert step_dirs(tmp_path / "ckpt") == [3, 6, 9, 10]
    rng = json.loads((tmp_path / "ckpt" / "9" / "rng.json").read_text())
    assert len(rng) == 2 and rng[0] != rng[1]
    # only global rank 0 writes metrics
    rows = [
        json.loads(line)
        for line in (tmp_path / "metrics-reference-10.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 11))
    # on_nonfinite="skip", the NaN in one process's shard: both dropped the same update,
    # counted it, and postponed the same checkpoint (no process waits in a lone save)
    other = rank1[4]
    assert skipped["steps"] == other["steps"] == 8
    assert len(skipped["skipped"]) == 1 and other["skipped"] == skipped["skipped"]
    assert skipped["sha"] == other["sha"] and skipped["finite"]
    ckpts = step_dirs(tmp_path / "skip")
    assert skipped["skipped"][0] not in ckpts and len(ckpts) == 7

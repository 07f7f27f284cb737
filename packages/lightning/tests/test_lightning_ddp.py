"""Two CPU processes with Lightning's own DDP (`strategy="ddp"`), in one subprocess launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipekit_train.core.checkpoint import step_dirs

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's output directory after one launch (DDP runs and elastic resumes)."""
    out = tmp_path_factory.mktemp("ddp")
    # another run (this test process) holds `held`: the job must be refused on every rank
    from pipekit_train.core.testing import plant_lease

    plant_lease(out / "held", os.getpid())
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(out), "ddp", "elastic"],
        cwd=out,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # both ranks in one group: a hang kills them all
    )
    try:
        _, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"The DDP worker did not finish in 900 s. Its stderr:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    return out


@pytest.mark.slow
def test_ddp_two_processes_train_checkpoint_and_resume_exactly(ddp_run: Path) -> None:
    rank0 = json.loads((ddp_run / "rank0.json").read_text())
    rank1 = json.loads((ddp_run / "rank1.json").read_text())
    first, resumed, reference, epoch, skipped, _held = rank0
    assert epoch["steps"] == 16  # one epoch: 256 samples in global batches of 16
    assert [r["world"] for r in rank0[:3]] == [2, 2, 2]
    assert (
        first["steps"] == 6
        and first["history_steps"] == list(range(1, 7))
        and first["val_steps"] == [3, 6]
    )
    assert resumed["resumed_from_step"] == 6 and resumed["history_steps"] == list(range(1, 11))
    # exact resume: per-process RNG (dropout) and the data position restored
    assert resumed["sha"] == reference["sha"]
    # DDP keeps the replicas identical
    assert [r["sha"] for r in rank1[:3]] == [r["sha"] for r in rank0[:3]]
    assert step_dirs(ddp_run / "ckpt") == [3, 6, 9, 10]
    rng = json.loads((ddp_run / "ckpt" / "9" / "rng.json").read_text())
    assert len(rng) == 2 and rng[0] != rng[1]
    # only global rank 0 writes metrics
    rows = [
        json.loads(line)
        for line in (ddp_run / "metrics-reference-10.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 11))
    # on_nonfinite="skip", the NaN in one process's shard: both dropped the same update,
    # counted it, and postponed the same checkpoint (no process waits in a lone save)
    other = rank1[4]
    assert skipped["steps"] == other["steps"] == epoch["steps"]
    assert len(skipped["skipped"]) == 1 and other["skipped"] == skipped["skipped"]
    assert skipped["sha"] == other["sha"] and skipped["finite"]
    ckpts = step_dirs(ddp_run / "skip")
    assert skipped["skipped"][0] not in ckpts and len(ckpts) == epoch["steps"] - 1
    # one lease per job: a location another run holds refuses the job on every rank
    refused = [rank0[-1]["refused"], rank1[-1]["refused"]]
    assert all(r and f"pid {os.getpid()}" in r and "another run holds it" in r for r in refused)
    assert sorted(p.name for p in (ddp_run / "held").iterdir()) == [".pipekit-lease"]


def _global(*ranks: list[list[int]]) -> list[list[int]]:
    """The global batches of a run: each rank's part of every step, in rank order."""
    return [sum(parts, []) for parts in zip(*ranks, strict=True)]


def _max_diff(a: dict, b: dict) -> float:
    return max(
        max(abs(x - y) for x, y in zip(u, v, strict=True))
        for u, v in zip(a["weights"], b["weights"], strict=True)
    )


@pytest.mark.slow
def test_ddp_elastic_resume_continues_the_global_sample_sequence(ddp_run: Path) -> None:
    """1 -> 2 and 2 -> 1 processes: the same samples per step as an uninterrupted run."""
    one = json.loads((ddp_run / "elastic-rank0.json").read_text())
    other = json.loads((ddp_run / "elastic-rank1.json").read_text())
    ref1 = one["reference_1"]
    assert ref1["world"] == 1 and one["reference_2"]["world"] == 2
    whole = ref1["seen"]
    assert len(whole) == 10 and all(len(batch) == 16 for batch in whole)
    # the global order does not depend on the number of processes
    assert _global(one["reference_2"]["seen"], other["reference_2"]["seen"]) == whole
    assert all(len(part) == 8 for part in other["reference_2"]["seen"])
    # 1 -> 2: six steps on one process, then four on two
    r12 = one["resume_1_to_2"]
    assert r12["resumed_from_step"] == 6 and r12["steps"] == 10 and r12["world"] == 2
    seq12 = one["first_1"]["seen"] + _global(r12["seen"], other["resume_1_to_2"]["seen"])
    assert seq12 == whole
    # 2 -> 1: six steps on two processes, then four on one
    r21 = one["resume_2_to_1"]
    assert r21["resumed_from_step"] == 6 and r21["steps"] == 10 and r21["world"] == 1
    seq21 = _global(one["first_2"]["seen"], other["first_2"]["seen"]) + r21["seen"]
    assert seq21 == whole
    # the restored state is bit-exact on the other process count
    assert one["restored_2_on_1"]["sha"] == one["first_2"]["sha"] == other["first_2"]["sha"]
    # what is not bit-exact: DDP's gradient all-reduce rounds differently from one
    # process's mean; the differences stay at float32 rounding level
    diffs = [
        _max_diff(r12, ref1),
        _max_diff(r12, one["reference_2"]),
        _max_diff(r21, ref1),
        _max_diff(r21, one["reference_2"]),
        _max_diff(one["reference_2"], ref1),
    ]
    print("max |weight difference| (1->2 vs ref1, vs ref2, 2->1 vs ref1, vs ref2, ref2 vs ref1):")
    print(" ".join(f"{d:.3g}" for d in diffs))
    assert max(diffs) < 1e-5, diffs


@pytest.mark.slow
def test_torch_adapter_trains_data_parallel_on_the_process_group(ddp_run: Path) -> None:
    """`Torch()` in the same two processes, after Lightning's DDP set up the group."""
    runs = [json.loads((ddp_run / f"torch-rank{r}.json").read_text()) for r in (0, 1)]
    lightning = json.loads((ddp_run / "elastic-rank0.json").read_text())["reference_2"]
    one, other = runs
    # each process reads its half of every global batch, as under Lightning's DDP
    assert one["plain"]["seen"] == lightning["seen"]
    assert all(len(part) == 8 for part in other["plain"]["seen"])
    # the replicas stay bit-identical, and the run is Lightning's DDP run to rounding
    for name in ("plain", "first", "resumed", "reference", "skip"):
        assert one[name]["sha"] == other[name]["sha"], name
    assert one["plain"]["loss"] == other["plain"]["loss"]  # the losses are averaged too
    assert _max_diff(one["plain"], lightning) == 0.0  # the same bytes as DDP
    # dropout: every update draws anew (the shared private state advances), and the
    # run resumes exactly from the chief's checkpoint, on both processes
    rng = [(ddp_run / "t-ckpt" / str(s) / "torch_rng.safetensors").read_bytes() for s in (3, 6)]
    assert rng[0] != rng[1]
    assert one["resumed"]["resumed_from_step"] == 6
    assert one["resumed"]["sha"] == one["reference"]["sha"] != one["plain"]["sha"]
    # a NaN in one process's shard: both drop the same update
    assert len(one["skip"]["skipped"]) == 1 and one["skip"]["skipped"] == other["skip"]["skipped"]
    assert one["skip"]["steps"] == 16
    # a torch DataLoader is refused on every process, before any work
    for r in runs:
        assert "Received: data=DataLoader, processes=2" in r["refused_loader"]
        assert not r["loader_dir"]
    # dropout streams differ per process; the shared private state does not
    assert one["draw"] != other["draw"] and one["shared_rng"] == other["shared_rng"]

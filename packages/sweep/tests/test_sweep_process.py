"""The process executor: trials in `spawn`ed worker processes, journal written by the parent."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import ConfigError
from pipekit_train.sweep import HyperSweep, ParameterGrid, ProcessExecutor, SweepResult
from pipekit_train.sweep.testing import (
    most_at_once,
    numpy_trial,
    placement_trial,
    read_placements,
)

GRID = ParameterGrid({"lr": [0.003, 0.03, 0.3], "seed": [0, 1]})


def _outcomes(result: SweepResult) -> list[tuple[Any, ...]]:
    return [(t.index, t.params, t.status, t.value, t.weights_sha256) for t in result]


@pytest.mark.slow
def test_process_sweep_matches_serial_and_records_failures(tmp_path: Path) -> None:
    space = [*GRID, {"fail": True}]
    sweep = HyperSweep(
        "pipekit_train.sweep.testing:numpy_trial",
        space,
        "val_loss",
        executor="process",
        max_concurrent=2,
        directory=tmp_path / "process",
        sweep_id="proc",
    )
    result = sweep.run()
    serial = HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path / "serial").run()
    assert _outcomes(result) == _outcomes(serial)
    assert [t.status for t in result] == ["ok"] * 6 + ["failed"]
    assert result[6].error == "RuntimeError: this trial fails on purpose (params fail=True)"
    assert all(t.artifact is None and t.summary.get("sweep_id", "proc") == "proc" for t in result)
    assert {t.sweep_id for t in result} == {"proc"}
    pids = {rec["pid"] for rec in _journal(tmp_path / "process")}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # workers are reused
    # a re-run finds everything in the journal and starts no worker
    again = HyperSweep(
        numpy_trial, space, "val_loss", executor="process", directory=tmp_path / "process"
    ).run()
    assert all(t.from_journal for t in again) and _outcomes(again) == _outcomes(result)


def test_a_dying_worker_fails_its_trial_and_the_pool_restarts(tmp_path: Path) -> None:
    space = [{"lr": 0.1, "crash": True}, {"lr": 0.1}, {"lr": 0.01}]
    result = HyperSweep(
        numpy_trial, space, "val_loss", executor="process", max_concurrent=1, directory=tmp_path
    ).run()
    assert [t.status for t in result] == ["failed", "ok", "ok"]
    assert "worker process running this trial died unexpectedly" in result[0].error


@pytest.mark.slow
def test_devices_pin_each_worker_and_run_at_most_n_trials_per_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fake device names on a CPU machine: what each trial saw, and how many ran at once."""
    for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)
    records = tmp_path / "placements"
    # 8 trials on 4 slots: the last four wait for free slots. The first four (two per
    # device) wait until two trials run on their device, so two at once can be seen; the
    # last four have no partner to wait for and run straight through.
    space = [
        {"record_dir": str(records), "peers": 2 if i < 4 else 1, "wait_s": 60.0, "seed": i}
        for i in range(8)
    ]
    executor = ProcessExecutor(devices=["cuda:0", "cuda:3"], trials_per_device=2)
    result = HyperSweep(
        placement_trial, space, "val_loss", executor=executor, directory=tmp_path / "sweep"
    ).run()
    assert [t.status for t in result] == ["ok"] * 8
    placements = read_placements(records)
    assert len(placements) == 8
    by_device: dict[str, list[dict[str, Any]]] = {}
    for rec in placements:
        by_device.setdefault(rec["env"]["CUDA_VISIBLE_DEVICES"], []).append(rec)
        assert rec["pid"] != os.getpid()
    assert sorted(by_device) == ["0", "3"]
    for visible, recs in by_device.items():
        assert {r["env"]["PIPEKIT_SWEEP_DEVICE"] for r in recs} == {f"cuda:{visible}"}
        assert {r["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] for r in recs} == {"0.375"}
        assert len({r["pid"] for r in recs}) <= 2  # the device's two workers, reused
        assert max(r["max_running"] for r in recs) == 2  # two at once were seen ...
        assert most_at_once(recs) == 2  # ... and never more, by the recorded times
    pids = [{r["pid"] for r in recs} for recs in by_device.values()]
    assert not pids[0] & pids[1]  # a worker serves one device only
    assert most_at_once(placements) <= 4


def test_main_module_trials_are_refused_for_ray_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    main = types.ModuleType("__main__")

    def trial(params: dict[str, Any]) -> Any:
        return numpy_trial(params)

    trial.__module__, trial.__qualname__ = "__main__", "trial"
    main.trial = trial  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", main)  # an interactive session: no __file__
    with pytest.raises(
        ConfigError,
        match=r"defined in `__main__`, which worker processes \(this __main__ has no file\)",
    ):
        HyperSweep(trial, [{}], "val_loss", executor="process")
    main.__file__ = "/some/script.py"  # type: ignore[attr-defined]
    HyperSweep(trial, [{}], "val_loss", executor="process")  # spawn re-imports a script's main
    pytest.importorskip("ray")
    with pytest.raises(ConfigError, match="Ray workers cannot import"):
        HyperSweep(trial, [{}], "val_loss", executor="ray")


def _journal(directory: Path) -> list[dict[str, Any]]:
    from pipekit_train.sweep._journal import Journal

    return Journal(directory / "journal.jsonl").read()

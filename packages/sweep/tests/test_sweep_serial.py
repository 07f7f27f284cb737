"""`HyperSweep` with the serial executor on the numpy reference backend."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.sweep import (
    HyperSweep,
    ParameterGrid,
    SweepResult,
    TrialFailedError,
    load_result,
)
from pipekit_train.sweep.testing import numpy_trial

GRID = ParameterGrid({"lr": [1e-3, 1e-2, 1e-1], "batch_size": [16, 32]})


def _outcomes(result: SweepResult) -> list[tuple[Any, ...]]:
    return [
        (t.index, t.params, t.status, t.value, t.weights_sha256, t.summary.get("steps"))
        for t in result
    ]


def test_grid_sweep_ranks_and_stamps_sweep_id(tmp_path: Path) -> None:
    sweep = HyperSweep(numpy_trial, GRID, "val_loss", directory=tmp_path, sweep_id="sw-1")
    result = sweep.run()
    assert sweep.result is result and sweep.sweep_id == "sw-1"
    assert [t.params for t in result] == list(GRID) and [t.index for t in result] == list(range(6))
    assert all(t.status == "ok" and t.sweep_id == "sw-1" for t in result)
    for t in result:
        assert t.artifact is not None and t.artifact.sweep_id == "sw-1"
        assert t.artifact.plan["sweep_id"] == "sw-1"
        assert t.summary["sweep_id"] == "sw-1" and t.summary["backend"] == "numpy"
        assert t.value == t.artifact.final_metrics["val_loss"] == t.final_metrics["val_loss"]
        assert t.weights_sha256 == t.artifact.weights_sha256
        assert t.trial_dir == str(tmp_path / "trials" / t.key)
    values = [t.value for t in result.ranked()]
    assert values == sorted(values)
    assert result.best.params == {"lr": 0.1, "batch_size": 16}
    assert result.best is result.ranked()[0]
    # the same sweep ranked by max picks the worst trial
    worst = HyperSweep(numpy_trial, GRID, "val_loss", "max").run()
    assert worst.best.params == {"lr": 1e-3, "batch_size": 16}
    # journal: one line per trial, keyed by the params hash
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == [t.key for t in result]
    meta = json.loads((tmp_path / "sweep.json").read_text())
    assert (
        meta["sweep_id"] == "sw-1"
        and meta["trial"] == "pipekit_train.sweep.testing._trials:numpy_trial"
    )
    loaded = load_result(tmp_path)
    assert _outcomes(loaded) == _outcomes(result)


def test_rerun_skips_finished_trials_and_keeps_the_sweep_id(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def trial(params: dict[str, Any]) -> TrainingLoop:
        calls.append(params)
        return numpy_trial(params)

    first = HyperSweep(trial, list(GRID)[:4], "val_loss", directory=tmp_path).run()
    assert len(calls) == 4
    again = HyperSweep(trial, GRID, "val_loss", directory=tmp_path).run()
    assert calls[4:] == list(GRID)[4:]  # only the two new parameter sets ran
    assert again.sweep_id == first.sweep_id
    assert [t.from_journal for t in again] == [True] * 4 + [False] * 2
    assert _outcomes(again)[:4] == _outcomes(first)
    assert again[0].artifact is None and again[5].artifact is not None


def test_failed_trial_is_recorded_and_the_sweep_goes_on(tmp_path: Path) -> None:
    space = [{"lr": 0.01}, {"lr": 0.01, "fail": True}, {"lr": 0.1}]
    result = HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path).run()
    assert [t.status for t in result] == ["ok", "failed", "ok"]
    failed = result.by_status("failed")[0]
    assert failed.error == "RuntimeError: this trial fails on purpose (params fail=True)"
    assert "Traceback" in failed.traceback and failed.value is None and failed.summary == {}
    assert result.best.params == {"lr": 0.1}
    table = result.to_table()
    assert "RuntimeError: this trial fails on purpose" in table and "| failed |" in table
    # failed trials are finished: a re-run does not retry them unless asked to
    rerun = HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path).run()
    assert all(t.from_journal for t in rerun)
    retried = HyperSweep(
        numpy_trial, space, "val_loss", directory=tmp_path, retry_failed=True
    ).run()
    assert [t.from_journal for t in retried] == [True, False, True]
    assert retried[1].status == "failed"


def test_fail_fast_raises_after_recording_the_failure(tmp_path: Path) -> None:
    space = [{"lr": 0.01, "fail": True}, {"lr": 0.1}]
    with pytest.raises(TrialFailedError, match=r"Trial 0 failed and fail_fast=True") as info:
        HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path, fail_fast=True).run()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.trial.status == "failed"
    assert len((tmp_path / "journal.jsonl").read_text().splitlines()) == 1  # trial 1 never ran


def test_missing_metric_names_the_available_ones(tmp_path: Path) -> None:
    sweep = HyperSweep(numpy_trial, [{"lr": 0.01}], "val_accuracy", directory=tmp_path)
    with pytest.raises(
        ConfigError, match=r"metric='val_accuracy'; available: \['loss', 'val_loss', 'val_mae'\]"
    ):
        sweep.run()
    # nothing was journaled, so the fixed sweep can reuse the directory
    assert (
        HyperSweep(numpy_trial, [{"lr": 0.01}], "val_mae", directory=tmp_path).run()[0].status
        == "ok"
    )


def test_metric_falls_back_to_best_metric_when_monitored() -> None:
    from pipekit_train.sweep._result import metric_value

    summary = {"final_metrics": {"loss": 1.0}, "best_metric": 0.25, "monitor": "val_loss"}
    assert metric_value(summary, "val_loss") == 0.25
    assert metric_value(summary, "loss") == 1.0
    assert metric_value(summary, "val_mae") is None


def test_trial_dir_keyword_gets_a_per_trial_folder_for_checkpoints(tmp_path: Path) -> None:
    space = [{"lr": 0.01, "checkpoint_every": 20}, {"lr": 0.1, "checkpoint_every": 20}]
    result = HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path).run()
    for t in result:
        assert t.summary["checkpoint_dir"] == str(tmp_path / "trials" / t.key / "checkpoints")
        assert any((tmp_path / "trials" / t.key / "checkpoints").iterdir())


def test_pruning_like_stop_and_callbacks_survive_the_stamp(tmp_path: Path) -> None:
    seen: list[int] = []

    class Recorder:
        def on_validation_end(self, state: Any) -> None:
            seen.append(state.step)

    def trial(params: dict[str, Any]) -> TrainingLoop:
        loop = numpy_trial(params)
        loop.plan = dataclasses.replace(loop.plan, callbacks=(Recorder(),))
        return loop

    HyperSweep(trial, [{"max_steps": 20}], "val_loss", directory=tmp_path).run()
    assert seen == [10, 20]


def test_table_and_plot(tmp_path: Path) -> None:
    space = [*GRID, {"lr": 0.01, "fail": True}]
    result = HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path / "sweep").run()
    table = result.to_table()
    lines = table.splitlines()
    assert lines[0].startswith("| rank | trial | lr") and "val_loss" in lines[0]
    assert lines[2].startswith("| 1 ") and "best" in lines[2]
    assert lines[-1].split("|")[1].strip() == "-" and "failed" in lines[-1]
    assert len({len(line) for line in lines}) == 1  # aligned
    unsorted = result.to_table(sort=False).splitlines()
    assert [row.split("|")[2].strip() for row in unsorted[2:]] == [str(i) for i in range(7)]
    pytest.importorskip("matplotlib")
    png = result.plot(tmp_path / "sweep.png")
    data = Path(png).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(ConfigError, match="must name sweep parameters"):
        result.plot(tmp_path / "x.png", params=["nope"])


def test_best_raises_when_nothing_succeeded(tmp_path: Path) -> None:
    result = HyperSweep(numpy_trial, [{"fail": True}], "val_loss", directory=tmp_path).run()
    with pytest.raises(
        ValueError, match=r"No trial finished with a finite `val_loss` \(ok=0, failed=1"
    ):
        _ = result.best
    assert "failed=1" in repr(result)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverging_trial_fails_naming_the_step_and_is_not_ranked(tmp_path: Path) -> None:
    """The loop's default `on_nonfinite="stop"` ends a diverging trial early."""
    result = HyperSweep(
        numpy_trial, [{"lr": 1e6, "optimizer": "sgd"}, {"lr": 0.1}], "val_loss"
    ).run()
    diverged = result[0]
    assert diverged.status == "failed" and "NonFiniteLossError" in (diverged.error or "")
    assert "Non-finite `loss` at step" in (diverged.error or "")
    assert result.best.index == 1 and [t.index for t in result.ranked()] == [1]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_metric_is_not_ranked(tmp_path: Path) -> None:
    result = HyperSweep(
        numpy_trial,
        [{"lr": 1e6, "optimizer": "sgd", "on_nonfinite": "ignore"}, {"lr": 0.1}],
        "val_loss",
    ).run()
    diverged = result[0]
    assert diverged.status == "ok" and (diverged.value is None or not math.isfinite(diverged.value))
    assert result.best.index == 1 and [t.index for t in result.ranked()] == [1]


def test_a_directory_holding_another_sweep_is_refused(tmp_path: Path) -> None:
    HyperSweep(numpy_trial, [{"lr": 0.1}], "val_loss", directory=tmp_path).run()
    with pytest.raises(
        ConfigError, match=r"different sweep \(metric='val_loss' there, 'val_mae' now\)"
    ):
        HyperSweep(numpy_trial, [{"lr": 0.1}], "val_mae", directory=tmp_path).run()
    with pytest.raises(ConfigError, match="sweep_id="):
        HyperSweep(
            numpy_trial, [{"lr": 0.1}], "val_loss", directory=tmp_path, sweep_id="other"
        ).run()


def test_a_directory_in_use_is_refused(tmp_path: Path) -> None:
    from pipekit_train.sweep._lock import sweep_dir_lock

    with sweep_dir_lock(tmp_path):
        with pytest.raises(
            ConfigError, match=rf"Another sweep is running in this directory \(pid={os.getpid()}"
        ):
            HyperSweep(numpy_trial, [{"lr": 0.1}], "val_loss", directory=tmp_path).run()
    assert len(HyperSweep(numpy_trial, [{"lr": 0.1}], "val_loss", directory=tmp_path).run()) == 1


NO_FCNTL = """
import sys, time
sys.modules["fcntl"] = None  # a platform without fcntl (and not Windows)
from pathlib import Path
from pipekit_train.core import ConfigError
from pipekit_train.core.utils import ExclusiveLock
from pipekit_train.sweep import HyperSweep
from pipekit_train.sweep._lock import sweep_dir_lock
from pipekit_train.sweep.testing import numpy_trial

directory, role = Path(sys.argv[1]), sys.argv[2]
assert ExclusiveLock(directory / "probe.lock").soft
if role == "hold":
    with sweep_dir_lock(directory):
        print("held", flush=True)
        sys.stdin.readline()
else:
    try:
        HyperSweep(numpy_trial, [{"lr": 0.1}], "val_loss", directory=directory).run()
    except ConfigError as err:
        print("refused:", err, flush=True)
"""


def test_without_fcntl_a_second_sweep_is_still_refused(tmp_path: Path) -> None:
    """Where `fcntl` cannot be imported (and it is not Windows) the directory lock falls
    back to a lock file created exclusively: a second sweep is refused, and told which
    file to remove after a crash (the old lock did nothing there)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = [sys.executable, "-W", "ignore", "-c", NO_FCNTL, str(tmp_path)]
    holder = subprocess.Popen(
        [*run, "hold"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        second = subprocess.run([*run, "run"], env=env, capture_output=True, text=True, timeout=120)
        assert "refused: Another sweep is running in this directory" in second.stdout, second.stderr
        assert f"pid={holder.pid}" in second.stdout
        assert f"remove {str(tmp_path / '.lock')!r}" in second.stdout
        assert not (tmp_path / "journal.jsonl").exists()  # refused before any trial
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    after = subprocess.run([*run, "run"], env=env, capture_output=True, text=True, timeout=120)
    assert after.returncode == 0 and "refused" not in after.stdout, after.stderr
    assert (tmp_path / "journal.jsonl").exists()


def test_duplicate_parameter_sets_run_once() -> None:
    with pytest.warns(UserWarning, match="repeats 1 parameter set"):
        sweep = HyperSweep(numpy_trial, [{"lr": 0.1}, {"lr": 0.1}, {"lr": 0.01}], "val_loss")
    assert len(sweep.run()) == 2


def test_generators_are_materialised_once() -> None:
    sweep = HyperSweep(numpy_trial, ({"lr": lr} for lr in (0.1, 0.01)), "val_loss")
    assert len(sweep.run()) == 2
    assert sweep.get_config()["search_space"] == {"type": "list", "size": 2}


def _not_a_loop(params: dict[str, Any]) -> Any:
    return {"not": "a loop"}


def test_trial_returning_something_else_fails_clearly() -> None:
    result = HyperSweep(_not_a_loop, [{}], "val_loss").run()
    assert result[0].status == "failed"
    assert result[0].error.startswith(
        "ConfigError: `trial(params)` must return a TrainingLoop. Received: dict"
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"search_space": {"lr": [0.1]}}, r"Wrap a grid in ParameterGrid"),
        ({"search_space": []}, "is empty"),
        ({"search_space": [{"lr": object()}]}, "must be JSON data"),
        ({"search_space": [0.1]}, "must be a dict of name -> value"),
        ({"mode": "minimize"}, "`mode` must be 'min' or 'max'"),
        ({"metric": ""}, "`metric` must be a metric name"),
        ({"executor": "threads"}, r"`executor` must be one of \['serial', 'process', 'ray'\]"),
        ({"max_concurrent": 2}, "serial executor runs one trial at a time"),
        ({"max_concurrent": 0, "executor": "process"}, "positive int"),
        ({"ray_address": "ray://x:10001"}, "Pass executor='ray'"),
        ({"fail_fast": "yes"}, "`fail_fast` must be True or False"),
        (
            {"trial": lambda p: None, "executor": "process"},
            r"must be importable by name for executor='process'",
        ),
        ({"trial": "pipekit_train.sweep.testing:nope"}, "names an attribute that does not exist"),
        ({"trial": "no_such_module_xyz:trial"}, "names a module that cannot be imported"),
        ({"trial": 3}, "must be a function"),
    ],
)
def test_bad_arguments_raise_before_any_work(
    kwargs: dict[str, Any], match: str, tmp_path: Path
) -> None:
    args: dict[str, Any] = {
        "trial": numpy_trial,
        "search_space": [{"lr": 0.1}],
        "metric": "val_loss",
        "directory": tmp_path,
    }
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        HyperSweep(**args)
    assert not any(tmp_path.iterdir())


def test_closures_are_fine_for_serial_but_named_in_the_process_error() -> None:
    def local_trial(params: dict[str, Any]) -> TrainingLoop:
        return numpy_trial(params)

    assert HyperSweep(local_trial, [{"lr": 0.1}], "val_loss").run()[0].status == "ok"
    with pytest.raises(ConfigError, match="local_trial"):
        HyperSweep(local_trial, [{"lr": 0.1}], "val_loss", executor="process")

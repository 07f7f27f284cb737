"""`SweepResult.figure` / `plot`: axes that follow the search space (log, categorical)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.sweep import HyperSweep, ParameterGrid, SweepResult, TrialResult, load_result
from pipekit_train.sweep.testing import numpy_trial

pytest.importorskip("matplotlib")


def _result(
    params: list[dict[str, Any]],
    values: list[float | None],
    axes: dict[str, Any] | None = None,
    statuses: list[str] | None = None,
) -> SweepResult:
    statuses = statuses or ["ok" if v is not None else "failed" for v in values]
    trials = [
        TrialResult(i, f"k{i}", p, s, v, None, {}, 0.0, "sw")
        for i, (p, v, s) in enumerate(zip(params, values, statuses, strict=True))
    ]
    return SweepResult("sw", "val_loss", "min", trials, axes=axes or {})


def _panels(result: SweepResult, params: list[str] | None = None) -> dict[str, Any]:
    return {ax.get_xlabel().split(" (")[0]: ax for ax in result.figure(params).axes}


def _best_per_value_lines(ax: Any) -> list[Any]:
    return [line for line in ax.get_lines() if line.get_label() == "best per value"]


def _continuous_sweep() -> SweepResult:
    rng = np.random.default_rng(0)
    lrs = 10 ** rng.uniform(-5, -1, size=16)
    params = [
        {"lr": float(lr), "act": ["relu", "tanh", "gelu"][i % 3], "width": [16, 32, 64][i % 3]}
        for i, lr in enumerate(lrs)
    ]
    values = [float(abs(np.log10(lr) + 2.5) + 0.1) for lr in lrs]
    axes = {
        "lr": {"scale": "log", "discrete": False},
        "act": {"scale": "categorical", "discrete": True, "choices": ["relu", "tanh", "gelu"]},
        "width": {"scale": "categorical", "discrete": True, "choices": [16, 32, 64]},
    }
    return _result(params, values, axes)


def test_log_scaled_continuous_parameter_is_a_scatter_on_a_log_axis() -> None:
    panels = _panels(_continuous_sweep())
    lr = panels["lr"]
    assert lr.get_xscale() == "log" and lr.get_xlabel() == "lr (log scale)"
    # every trial has its own value: no "best per value" line through the trials
    assert _best_per_value_lines(lr) == []
    # ... and the figure shows the metric in trial order with the best so far
    history = panels["trial number"]
    best_so_far = [line for line in history.get_lines() if line.get_label() == "best so far"]
    assert len(best_so_far) == 1
    ys = list(best_so_far[0].get_ydata())
    assert ys == sorted(ys, reverse=True) and ys[-1] == pytest.approx(0.1, abs=0.5)


def test_categorical_parameters_get_a_tick_per_choice_in_space_order() -> None:
    panels = _panels(_continuous_sweep())
    act, width = panels["act"], panels["width"]
    assert [t.get_text() for t in act.get_xticklabels()] == ["relu", "tanh", "gelu"]
    # numeric choices stay categorical: evenly spaced ticks, not a numeric axis
    assert [t.get_text() for t in width.get_xticklabels()] == ["16", "32", "64"]
    assert list(width.get_xticks()) == [0, 1, 2] and width.get_xscale() == "linear"
    # best per choice is drawn as one short bar per choice, not a line across choices
    assert _best_per_value_lines(width) == []
    (bars,) = [c for c in width.collections if c.get_label() == "best per choice"]
    segments = bars.get_segments()
    assert [tuple(seg[:, 0]) for seg in segments] == [(-0.3, 0.3), (0.7, 1.3), (1.7, 2.3)]
    trials = _continuous_sweep().trials
    for i, w in enumerate((16, 32, 64)):
        best = min(t.value for t in trials if t.params["width"] == w)
        assert segments[i][0, 1] == pytest.approx(best)


def test_grid_spanning_decades_uses_a_log_axis_with_a_tick_per_value(tmp_path: Path) -> None:
    grid = ParameterGrid({"lr": [1e-3, 1e-2, 1e-1], "optimizer": ["adam", "sgd"]})
    result = HyperSweep(numpy_trial, grid, "val_loss", directory=tmp_path, sweep_id="g").run()
    assert result.axes["lr"] == {"scale": "log", "discrete": True}
    assert result.axes["optimizer"]["choices"] == ["adam", "sgd"]
    panels = _panels(result)
    assert panels["lr"].get_xscale() == "log"
    assert [t.get_text() for t in panels["lr"].get_xticklabels()] == ["0.001", "0.01", "0.1"]
    # grid values repeat: best per value is one line over the three learning rates
    (line,) = _best_per_value_lines(panels["lr"])
    assert list(line.get_xdata()) == [1e-3, 1e-2, 1e-1]
    best_by_lr = {
        lr: min(t.value for t in result if t.params["lr"] == lr) for lr in (1e-3, 1e-2, 1e-1)
    }
    assert list(line.get_ydata()) == [best_by_lr[lr] for lr in (1e-3, 1e-2, 1e-1)]
    assert "trial number" not in panels  # nothing continuous: no history panel
    # the axes travel in sweep.json: a reloaded result plots the same way
    assert json.loads((tmp_path / "sweep.json").read_text())["axes"] == result.axes
    reloaded = _panels(load_result(tmp_path))
    assert reloaded["lr"].get_xscale() == "log"
    assert [t.get_text() for t in reloaded["optimizer"].get_xticklabels()] == ["adam", "sgd"]


def test_plain_lists_are_inferred_from_the_values() -> None:
    params = [{"lr": lr, "bs": bs} for lr in (1e-4, 1e-3, 1e-2) for bs in (16, 32, 64, 128)]
    result = _result(params, [1.0 + i for i in range(len(params))])
    panels = _panels(result)
    # decades, and a ratio-spaced batch size: both log; both repeat, so both discrete
    assert panels["lr"].get_xscale() == "log" and panels["bs"].get_xscale() == "log"
    assert len(_best_per_value_lines(panels["bs"])) == 1
    # evenly spaced values stay linear; strings and mixed values are categorical
    linear = _result([{"dropout": d} for d in (0.1, 0.2, 0.3, 0.4)], [1.0, 2.0, 3.0, 4.0])
    assert _panels(linear)["dropout"].get_xscale() == "linear"
    mixed = _result([{"act": a} for a in ("relu", None, True)], [1.0, 2.0, 3.0])
    assert [t.get_text() for t in _panels(mixed)["act"].get_xticklabels()] == [
        "relu",
        "null",
        "true",
    ]


def test_failed_and_pruned_trials_are_marked() -> None:
    params = [{"lr": 10.0**-k} for k in range(1, 6)]
    result = _result(
        params, [0.5, 0.2, None, 0.3, 0.4], statuses=["ok", "ok", "failed", "pruned", "ok"]
    )
    ax = result.figure().axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "pruned (last report)" in legend and "failed (1)" in legend and "best" in legend
    assert "1 failed" in result.figure()._suptitle.get_text()


def test_optuna_space_axes() -> None:
    pytest.importorskip("optuna")
    from pipekit_train.sweep import OptunaSearch
    from pipekit_train.sweep._axes import describe_axes

    search = OptunaSearch(
        {
            "lr": ("float", 1e-4, 1e-1, {"log": True}),
            "optimizer": ("categorical", ["adam", "sgd"]),
            "max_steps": ("int", 10, 30, {"step": 10}),
            "layers": ("int", 1, 1000),
        },
        n_trials=4,
    )
    axes = describe_axes(search)
    assert axes == {
        "lr": {"scale": "log", "discrete": False},
        "optimizer": {"scale": "categorical", "discrete": True, "choices": ["adam", "sgd"]},
        "max_steps": {"scale": "linear", "discrete": True},
        "layers": {"scale": "linear", "discrete": False},
    }
    # a log axis even when the sampled values happen to span less than a decade
    params = [
        {"lr": lr, "optimizer": o, "max_steps": m, "layers": n}
        for lr, o, m, n in [(2e-3, "sgd", 10, 3), (3e-3, "adam", 20, 700), (5e-3, "sgd", 30, 40)]
    ]
    panels = _panels(_result(params, [0.3, 0.2, 0.1], axes))
    assert panels["lr"].get_xscale() == "log"
    assert [t.get_text() for t in panels["optimizer"].get_xticklabels()] == ["adam", "sgd"]
    assert [t.get_text() for t in panels["max_steps"].get_xticklabels()] == ["10", "20", "30"]
    assert "trial number" in panels

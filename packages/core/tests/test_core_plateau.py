"""`ReduceLROnPlateau` and core's learning-rate scale (the numpy reference backend)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, NotSupportedError, TrainingLoop
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.adapter import (
    Capabilities,
    StepAdapter,
    adjusts_learning_rate,
    learning_rate_at,
)
from pipekit_train.core.callbacks import LambdaCallback, LearningRateLogger, ReduceLROnPlateau
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp
from pipekit_train.core.testing._tasks import regression_task


class ScaleState:
    """What the callback reads and does: metrics, the rate, the scale."""

    def __init__(self, lr: float | None = 0.1) -> None:
        self.step = 0
        self.metrics: dict[str, float] = {}
        self.base = lr
        self.lr_scale = 1.0
        self.scales: list[tuple[int, float]] = []

    @property
    def learning_rate(self) -> float | None:
        return None if self.base is None else self.base * self.lr_scale

    def set_lr_scale(self, scale: float) -> None:
        self.lr_scale = scale
        self.scales.append((self.step, scale))


def feed(cb: ReduceLROnPlateau, values: list[float], state: ScaleState | None = None) -> ScaleState:
    state = state or ScaleState()
    for value in values:
        state.step += 10
        state.metrics = {"val_loss": value}
        cb.on_validation_end(state)
    return state


def test_keras_rules_patience_factor_and_cooldown() -> None:
    cb = ReduceLROnPlateau(factor=0.5, patience=2, cooldown=2, min_delta=0.0)
    # best 1.0; stalls at 20, 30 → reduce at 30 (cooldown 2); 40 spends one cooldown
    # validation; at 50 the counter reaches 0 and, as in Keras, that validation counts
    # again: stalls at 50, 60 → reduce at 60; 0.5 at 70 improves
    state = feed(cb, [1.0, 1.0, 1.2, 1.1, 1.0, 1.3, 0.5])
    assert state.scales == [(30, 0.5), (60, 0.25)]
    assert cb.reduced_at == [30, 60] and cb.num_reductions == 2
    assert cb.best == 0.5 and cb.wait == 0
    assert state.learning_rate == pytest.approx(0.025)


def test_min_delta_and_max_mode() -> None:
    cb = ReduceLROnPlateau(factor=0.1, patience=1, min_delta=0.05)
    state = feed(cb, [1.0, 0.96, 0.9])  # 0.96 is not better by more than 0.05
    assert state.scales == [(20, pytest.approx(0.1))]
    assert ReduceLROnPlateau(monitor="val_r2").mode == "max"
    assert ReduceLROnPlateau(monitor="val_mae").mode == "min"
    cb = ReduceLROnPlateau(monitor="val_accuracy", factor=0.5, patience=1)
    assert cb.mode == "max"  # "auto" → max for an accuracy
    state = ScaleState()
    for step, acc in ((10, 0.5), (20, 0.6), (30, 0.55)):
        state.step, state.metrics = step, {"val_accuracy": acc}
        cb.on_validation_end(state)
    assert state.scales == [(30, 0.5)]


def test_min_lr_bounds_the_effective_rate() -> None:
    cb = ReduceLROnPlateau(factor=0.1, patience=1, min_lr=0.004, min_delta=0.0)
    state = feed(cb, [1.0, 2.0, 2.0, 2.0])
    # 0.1 → 0.01 → max(0.001, 0.004) = 0.004 → already at min_lr: unchanged
    assert [s for _, s in state.scales] == [pytest.approx(0.1), pytest.approx(0.04)]
    assert state.learning_rate == pytest.approx(0.004)
    assert cb.num_reductions == 2


def test_the_state_round_trips_as_json_and_checks_its_settings() -> None:
    cb = ReduceLROnPlateau(factor=0.5, patience=3, cooldown=2)
    feed(cb, [1.0, 1.1, 1.2, 1.3, 1.4])
    saved = json.loads(json.dumps(cb.state_dict()))
    again = ReduceLROnPlateau(factor=0.5, patience=3, cooldown=2)
    again.load_state_dict(saved)
    assert again.state_dict() == cb.state_dict()
    assert (again.wait, again.cooldown_counter, again.best) == (cb.wait, cb.cooldown_counter, 1.0)
    with pytest.raises(ConfigError, match="factor"):
        ReduceLROnPlateau(factor=0.1).load_state_dict(saved)
    with pytest.raises(ConfigError, match="lacks key"):
        again.load_state_dict({"best": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"factor": 1.0}, "factor"),
        ({"factor": 0.0}, "factor"),
        ({"factor": float("nan")}, "factor"),
        ({"patience": -1}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"cooldown": -2}, "cooldown"),
        ({"min_lr": -1.0}, "min_lr"),
        ({"min_delta": -0.1}, "min_delta"),
        ({"mode": "lowest"}, "mode"),
        ({"monitor": ""}, "monitor"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=f"`{field}`.*Received: {field}="):
        ReduceLROnPlateau(**kwargs)


def test_unknown_monitor_and_min_lr_without_a_rate() -> None:
    cb = ReduceLROnPlateau(monitor="val_mae")
    state = ScaleState()
    state.metrics = {"val_loss": 1.0}
    with pytest.raises(ConfigError, match=r"Available keys: \['val_loss'\]"):
        cb.on_validation_end(state)
    with pytest.raises(ConfigError, match="min_lr"):
        ReduceLROnPlateau(min_lr=1e-3).on_train_start(ScaleState(lr=None))
    # without min_lr a rate the backend does not report is still scaled
    state = feed(ReduceLROnPlateau(factor=0.5, patience=1), [1.0, 2.0], ScaleState(lr=None))
    assert state.scales == [(20, 0.5)]


# -- through a run ---------------------------------------------------------------------


SCHEDULE = {"schedule": "cosine", "init_value": 0.05, "decay_steps": 30}


def _loop(*, callbacks: list[Any], adapter: Any = None, **kwargs: Any) -> TrainingLoop:
    train, val = regression_task()
    options: dict[str, Any] = {
        "model": NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
        "data": train,
        "validation": val,
        "optimizer_config": {"name": "sgd", "lr": SCHEDULE},
        "batch_size": 16,
        "max_steps": 24,
        "validate_every_n_steps": 6,
        "callbacks": callbacks,
        "adapter": adapter or NumpyAdapter(),
        "progress": False,
    }
    options.update(kwargs)
    return TrainingLoop(**options)


def test_a_scheduled_rate_is_scaled_and_logged() -> None:
    plateau = ReduceLROnPlateau(factor=0.5, patience=1, min_delta=100.0)
    art = _loop(callbacks=[plateau, LearningRateLogger()]).run()
    assert plateau.reduced_at == [12, 18, 24]
    steps, lrs = art.history.series("lr")
    # step s logs the rate of update s (0-based), before that step's validation
    expected = [
        learning_rate_at(SCHEDULE, s) * 0.5 ** sum(s > r for r in plateau.reduced_at) for s in steps
    ]
    np.testing.assert_allclose(lrs, expected, rtol=1e-12)


def test_the_scale_is_in_the_checkpoint_only_with_such_a_callback(tmp_path: Any) -> None:
    from pipekit_train.core.checkpoint._engine import step_dirs

    plain = Checkpoint(tmp_path / "plain", every_n_steps=12)
    _loop(callbacks=[], checkpoint=plain).run()
    scaled = Checkpoint(tmp_path / "scaled", every_n_steps=12)
    _loop(
        callbacks=[ReduceLROnPlateau(factor=0.5, patience=1, min_delta=100.0)], checkpoint=scaled
    ).run()

    def run_state(policy: Checkpoint) -> dict[str, Any]:
        step = step_dirs(policy)[-1]
        meta = next(
            (tmp_path / policy.location.rstrip("/").split("/")[-1] / str(step)).rglob("meta*.json")
        )
        return json.loads(meta.read_text())["run"]

    assert "lr_scale" not in run_state(plain)
    assert run_state(scaled)["lr_scale"] == 0.125


def test_setting_the_scale_needs_a_declaring_callback() -> None:
    poke = LambdaCallback(on_validation_end=lambda state: state.set_lr_scale(0.5))
    assert not adjusts_learning_rate([poke])
    with pytest.raises(ConfigError, match="adjusts_learning_rate"):
        _loop(callbacks=[poke]).run()


class _NoScale(NumpyAdapter):
    name = "noscale"
    capabilities = Capabilities(online=True)


def test_a_backend_without_the_scale_refuses_before_any_work(tmp_path: Any) -> None:
    with pytest.raises(NotSupportedError, match=r"ReduceLROnPlateau.*lr_scale=True"):
        _loop(
            callbacks=[ReduceLROnPlateau()],
            adapter=_NoScale(),
            checkpoint=Checkpoint(tmp_path / "ck"),
        )
    assert not (tmp_path / "ck").exists()
    assert isinstance(_NoScale(), StepAdapter)


def test_online_training_refuses_the_callback() -> None:
    from pipekit_train.core import OnlineTrainer

    with pytest.raises(ConfigError, match="OnlineTrainer runs no validation"):
        OnlineTrainer(
            NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
            optimizer_config={"name": "sgd", "lr": 0.1},
            callbacks=[ReduceLROnPlateau()],
            adapter=NumpyAdapter(),
        )

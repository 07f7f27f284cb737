"""Built-in callbacks against a small fake run state."""

from __future__ import annotations

import io
import json
import math
import pickle

import pytest

from pipekit_train.core._errors import ConfigError, PipekitError
from pipekit_train.core.callbacks import (
    EarlyStopping,
    LambdaCallback,
    LearningRateLogger,
    NaNGuard,
    NonFiniteLossError,
    ProgressBar,
)


class FakeState:
    """The subset of `RunState` callbacks use; counts reads of `metrics`."""

    def __init__(self, *, max_steps=None, is_tty=False, learning_rate=None):
        self.step = 0
        self.epoch = 0
        self.max_steps = max_steps
        self.is_tty = is_tty
        self._metrics: dict[str, float] = {}
        self.metric_reads = 0
        self._lr = learning_rate
        self.lr_reads = 0
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.stop_reason: str | None = None

    @property
    def metrics(self) -> dict[str, float]:
        self.metric_reads += 1
        return dict(self._metrics)

    @property
    def learning_rate(self):
        self.lr_reads += 1
        return self._lr(self.step) if callable(self._lr) else self._lr

    @property
    def stop_requested(self) -> bool:
        return self.stop_reason is not None

    def log(self, metrics):
        self.logged.append((self.step, dict(metrics)))

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason


def _validate(cb, state, step, **metrics):
    state.step = step
    state._metrics = metrics
    cb.on_validation_end(state)


# --------------------------------------------------------------------------- EarlyStopping


def test_early_stopping_min_mode_patience():
    cb = EarlyStopping(patience=2)
    state = FakeState()
    for step, value in [(10, 1.0), (20, 0.5), (30, 0.6), (40, 0.55)]:
        _validate(cb, state, step, val_loss=value, loss=0.1)
        if step < 40:
            assert not state.stop_requested
    assert state.stop_requested
    assert "val_loss" in state.stop_reason and "patience=2" in state.stop_reason
    assert "best 0.5 at step 20" in state.stop_reason
    assert cb.best == 0.5 and cb.best_step == 20 and cb.wait == 2 and cb.stopped_step == 40


def test_early_stopping_max_mode_and_min_delta():
    cb = EarlyStopping(monitor="val_acc", patience=1, mode="max", min_delta=0.05)
    state = FakeState()
    _validate(cb, state, 1, val_acc=0.50)
    _validate(cb, state, 2, val_acc=0.60)  # +0.10 improves
    assert cb.best == 0.60 and cb.wait == 0
    _validate(cb, state, 3, val_acc=0.62)  # +0.02 < min_delta: no improvement
    assert cb.best == 0.60 and state.stop_requested


def test_early_stopping_patience_zero_and_nan():
    cb = EarlyStopping(patience=0)
    state = FakeState()
    _validate(cb, state, 1, val_loss=float("nan"))  # non-finite never improves
    assert cb.best is None and state.stop_requested


def test_early_stopping_state_dict_round_trip_resumes_exactly():
    values = [1.0, 0.8, 0.9, 0.85, 0.7, 0.75, 0.8, 0.9, 0.6]
    uninterrupted = EarlyStopping(patience=3)
    ref_state = FakeState()
    stop_at = None
    for i, v in enumerate(values):
        _validate(uninterrupted, ref_state, i, val_loss=v)
        if ref_state.stop_requested and stop_at is None:
            stop_at = i

    first = EarlyStopping(patience=3)
    state = FakeState()
    for i, v in enumerate(values[:6]):  # saved mid-wait
        _validate(first, state, i, val_loss=v)
    saved = json.loads(json.dumps(first.state_dict()))  # must be JSON
    resumed = EarlyStopping(patience=3)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == first.state_dict()
    state2 = FakeState()
    resumed_stop = None
    for i, v in enumerate(values[6:], start=6):
        _validate(resumed, state2, i, val_loss=v)
        if state2.stop_requested and resumed_stop is None:
            resumed_stop = i
    assert resumed_stop == stop_at == 7
    assert resumed.state_dict() == uninterrupted.state_dict()


def test_early_stopping_errors():
    cb = EarlyStopping(monitor="val_los")
    state = FakeState()
    with pytest.raises(ConfigError) as info:
        _validate(cb, state, 1, val_loss=1.0, loss=2.0)
    msg = str(info.value)
    assert "Received: monitor='val_los'" in msg and "['loss', 'val_loss']" in msg
    for kwargs, field in [
        ({"patience": -1}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"mode": "minimum"}, "mode"),
        ({"min_delta": -0.1}, "min_delta"),
        ({"monitor": ""}, "monitor"),
    ]:
        with pytest.raises(ConfigError, match=f"`{field}`.*Received: {field}="):
            EarlyStopping(**kwargs)
    with pytest.raises(ConfigError, match="`mode` of the saved EarlyStopping state"):
        EarlyStopping(mode="max").load_state_dict(EarlyStopping().state_dict())
    with pytest.raises(ConfigError, match="lacks key"):
        EarlyStopping().load_state_dict({"best": 1.0})


# --------------------------------------------------------------------------- NaNGuard


def test_nan_guard_raises_with_step_metric_value():
    cb = NaNGuard()
    state = FakeState()
    state.step, state._metrics = 1, {"loss": 0.3}
    cb.on_step_end(state)
    state.step, state._metrics = 2, {"loss": float("nan")}
    with pytest.raises(NonFiniteLossError) as info:
        cb.on_step_end(state)
    err = info.value
    assert isinstance(err, FloatingPointError) and isinstance(err, PipekitError)
    assert err.step == 2 and err.metric == "loss" and math.isnan(err.value)
    msg = str(err)
    assert "step 2" in msg and "`loss`" in msg and "nan" in msg and "last good checkpoint" in msg
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == msg and again.step == 2
    state._metrics = {"loss": float("-inf")}
    with pytest.raises(NonFiniteLossError, match="-inf"):
        cb.on_step_end(state)


def test_nan_guard_checks_only_every_n_steps():
    cb = NaNGuard(monitor="total", check_every_n_steps=5)
    state = FakeState()
    state._metrics = {"total": float("inf")}
    for step in range(1, 5):
        state.step = step
        cb.on_step_end(state)  # not checked: no host fetch either
    assert state.metric_reads == 0
    state.step = 5
    with pytest.raises(NonFiniteLossError, match="step 5"):
        cb.on_step_end(state)
    assert state.metric_reads == 1


def test_nan_guard_errors():
    state = FakeState()
    state.step, state._metrics = 1, {"loss": 1.0}
    with pytest.raises(ConfigError, match=r"Received: monitor='los'. Available keys: \['loss'\]"):
        NaNGuard(monitor="los").on_step_end(state)
    with pytest.raises(ConfigError, match="`check_every_n_steps`"):
        NaNGuard(check_every_n_steps=0)


# --------------------------------------------------------------------------- ProgressBar


def _run_bar(bar, state, steps, loss=0.5):
    bar.on_train_start(state)
    for step in range(state.step + 1, steps + 1):
        state.step = step
        state._metrics = {"loss": loss}
        bar.on_step_end(state)
    bar.on_train_end(state, None)


@pytest.mark.parametrize("backend", ["tqdm", "rich"])
def test_progress_bar_draws_steps_loss_rate(backend):
    out = io.StringIO()
    bar = ProgressBar(backend=backend, refresh_seconds=0, enabled=True, file=out)
    state = FakeState(max_steps=20)
    bar.on_train_start(state)
    for step in range(1, 11):
        state.step, state._metrics = step, {"loss": 0.125}
        bar.on_step_end(state)
    state._metrics = {"val_loss": 0.25}
    bar.on_validation_end(state)
    state._metrics = {"loss": 0.125}
    bar.on_train_end(state, None)
    text = out.getvalue()
    assert "loss=0.125" in text and "val_loss=0.25" in text
    assert "10/20" in text
    assert "step" in text and "/s" in text


def test_progress_bar_reads_metrics_only_at_refresh():
    out = io.StringIO()
    bar = ProgressBar(backend="tqdm", refresh_seconds=3600, enabled=True, file=out)
    state = FakeState(max_steps=1000)
    _run_bar(bar, state, 1000)
    assert state.metric_reads == 1  # the final redraw only
    assert "1000/1000" in out.getvalue()


def test_progress_bar_auto_enable_follows_tty():
    out = io.StringIO()
    bar = ProgressBar(file=out)
    state = FakeState(max_steps=10, is_tty=False)
    _run_bar(bar, state, 10)
    assert out.getvalue() == "" and state.metric_reads == 0
    tty_state = FakeState(max_steps=10, is_tty=True)
    _run_bar(ProgressBar(backend="tqdm", file=out), tty_state, 10)
    assert "10/10" in out.getvalue()


def test_progress_bar_resume_starts_at_current_step():
    out = io.StringIO()
    state = FakeState(max_steps=10)
    state.step = 6
    _run_bar(ProgressBar(backend="tqdm", enabled=True, refresh_seconds=0, file=out), state, 10)
    assert "10/10" in out.getvalue()


def test_progress_bar_errors():
    with pytest.raises(ConfigError, match="`backend` must be one of"):
        ProgressBar(backend="curses")
    with pytest.raises(ConfigError, match="`refresh_seconds`"):
        ProgressBar(refresh_seconds=-1)
    with pytest.raises(ConfigError, match="`enabled`"):
        ProgressBar(enabled="yes")


# --------------------------------------------------------------------------- LR logger, Lambda


def test_learning_rate_logger():
    cb = LearningRateLogger(every_n_steps=2)
    state = FakeState(learning_rate=lambda step: 0.1 / step)
    for step in range(1, 7):
        state.step = step
        cb.on_step_end(state)
    assert state.logged == [(2, {"lr": 0.05}), (4, {"lr": 0.025}), (6, {"lr": 0.1 / 6})]
    assert state.lr_reads == 3 and state.metric_reads == 0
    none_state = FakeState(learning_rate=None)
    none_state.step = 2
    cb.on_step_end(none_state)
    assert none_state.logged == []
    with pytest.raises(ConfigError, match="`every_n_steps`"):
        LearningRateLogger(every_n_steps=0)


def test_lambda_callback_sets_only_given_hooks():
    seen = []
    cb = LambdaCallback(
        on_step_end=lambda s: seen.append(("step", s.step)),
        on_checkpoint=lambda s, path: seen.append(("ckpt", path)),
    )
    assert getattr(cb, "on_train_start", None) is None
    assert getattr(cb, "on_train_end", None) is None
    assert cb.hooks == ("on_step_end", "on_checkpoint")
    state = FakeState()
    state.step = 3
    for hook, args in [("on_step_end", (state,)), ("on_checkpoint", (state, "/tmp/3"))]:
        fn = getattr(cb, hook, None)
        if fn is not None:
            fn(*args)
    assert seen == [("step", 3), ("ckpt", "/tmp/3")]
    with pytest.raises(ConfigError, match="`on_step_end` must be a callable"):
        LambdaCallback(on_step_end=3)
    with pytest.raises(TypeError):
        LambdaCallback(on_epoch_end=print)

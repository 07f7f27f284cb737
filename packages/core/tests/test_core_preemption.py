"""Preemption signals, time budgets and the time-based checkpoint cadence (numpy backend).

Real signals are sent to this process (`os.kill(os.getpid(), ...)`) from a callback; the
conformance suite sends them to real child processes of every backend.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import (
    Checkpoint,
    ConfigError,
    LambdaCallback,
    OnlineTrainer,
    Preempted,
    TrainingLoop,
)
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.testing import NumpyLinearOp, regression_task


def _model() -> NumpyLinearOp:
    return NumpyLinearOp("pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1)


def _loop(**kw: Any) -> TrainingLoop:
    train, val = regression_task()
    base: dict[str, Any] = dict(
        model=_model(),
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=30,
        validate_every_n_steps=8,
        progress=False,
    )
    base.update(kw)
    return TrainingLoop(**base)


def _signal_at(step: int, signum: int = signal.SIGTERM) -> LambdaCallback:
    def on_step_end(state: Any) -> None:
        if state.step == step:
            os.kill(os.getpid(), signum)

    return LambdaCallback(on_step_end=on_step_end)


class _Previous:
    """A handler installed before the run: it must be back afterwards, untouched."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, signum: int, frame: Any) -> None:
        self.calls.append(signum)


@pytest.fixture
def previous() -> Any:
    handler = _Previous()
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield handler
    for s, h in old.items():
        signal.signal(s, h)


def test_sigterm_checkpoints_the_step_restores_handlers_and_raises(tmp_path, previous) -> None:
    policy = Checkpoint(tmp_path / "ckpt", every_n_steps=1000, max_to_keep=None)
    with pytest.raises(Preempted) as info:
        _loop(checkpoint=policy, callbacks=[_signal_at(11)]).run()
    exc = info.value
    assert (exc.step, exc.signal) == (11, "SIGTERM")
    assert exc.checkpoint == policy.step_location(11)
    assert "step 11" in str(exc) and policy.step_location(11) in str(exc)
    assert step_dirs(policy) == [11]
    assert signal.getsignal(signal.SIGTERM) is previous
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert previous.calls == []  # the run's handler took the signal, not this one
    resumed = _loop(checkpoint=policy).run()
    reference = _loop().run()
    assert resumed.resumed_from_step == 11
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()


def test_without_checkpoint_the_error_says_nothing_was_saved(previous) -> None:
    with pytest.raises(Preempted, match="no Checkpoint is configured") as info:
        _loop(callbacks=[_signal_at(3, signal.SIGUSR1)]).run()
    assert info.value.checkpoint is None and info.value.signal == "SIGUSR1"


def test_signals_not_listed_reach_the_previous_handler(tmp_path, previous) -> None:
    art = _loop(preemption_signals=["TERM"], callbacks=[_signal_at(5, signal.SIGUSR1)]).run()
    assert art.steps == 30 and previous.calls == [signal.SIGUSR1]
    art = _loop(preemption_signals=[], callbacks=[_signal_at(5)]).run()
    assert art.steps == 30 and previous.calls == [signal.SIGUSR1, signal.SIGTERM]


def test_off_the_main_thread_no_handler_is_installed(previous) -> None:
    out: dict[str, Any] = {}

    def target() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["art"] = _loop(max_steps=5).run()
        out["warned"] = [str(w.message) for w in caught]

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    assert out["art"].steps == 5
    assert any("not on the main thread" in m for m in out["warned"])
    assert signal.getsignal(signal.SIGTERM) is previous


def test_handlers_are_restored_after_a_failure(previous) -> None:
    def boom(state: Any) -> None:
        if state.step == 4:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _loop(callbacks=[LambdaCallback(on_step_end=boom)]).run()
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(4, 4.0), (2.5, 2.5), (datetime.timedelta(minutes=2), 120.0), ("01:02:03:04", 93784.0)],
)
def test_max_time_forms(value: Any, seconds: float) -> None:
    assert _loop(max_time=value).plan.max_time == seconds


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_time": 0}, "max_time=0"),
        ({"max_time": "12:00"}, "max_time='12:00'"),
        ({"max_time": True}, "max_time=True"),
        ({"preemption_signals": ["SIGINT"]}, "SIGINT"),
        ({"preemption_signals": ["SIGNOPE"]}, "SIGNOPE"),
        ({"preemption_signals": [9.5]}, "9.5"),
        ({"checkpoint": "EVERY"}, "every_n_minutes=0"),
    ],
)
def test_bad_budget_and_signals_are_refused_up_front(tmp_path, kwargs, field) -> None:
    if kwargs.get("checkpoint") == "EVERY":
        with pytest.raises(ConfigError, match="every_n_minutes") as info:
            Checkpoint(tmp_path / "c", every_n_minutes=0)
    else:
        with pytest.raises(ConfigError) as info:
            _loop(**kwargs)
    assert "Received:" in str(info.value) and field in str(info.value)
    assert not (tmp_path / "c").exists()


def test_plan_records_budget_and_signals_outside_the_resume_key() -> None:
    plan = _loop(max_time="00:00:01:00", preemption_signals=[signal.SIGUSR1]).plan
    data = plan.to_json()
    assert data["max_time"] == 60.0 and data["preemption_signals"] == ["SIGUSR1"]
    json.dumps(data)
    assert "max_time" not in plan.resume_key()
    assert "preemption_signals" not in plan.resume_key()


def test_max_time_stops_with_a_checkpoint_and_the_rerun_continues(tmp_path) -> None:
    policy = Checkpoint(tmp_path / "ckpt", every_n_steps=10**6, max_to_keep=None)
    slow = LambdaCallback(on_step_end=lambda state: time.sleep(0.01))
    first = _loop(max_steps=10**7, max_time=0.5, checkpoint=policy, callbacks=[slow]).run()
    assert first.stop_reason == "max_time" and 0.5 <= first.wall_time_s < 3
    assert step_dirs(policy) == [first.steps]
    second = _loop(max_steps=first.steps + 5, max_time=30, checkpoint=policy).run()
    assert second.resumed_from_step == first.steps and second.stop_reason == "max_steps"
    reference = _loop(max_steps=first.steps + 5).run()
    assert second.model.serialize_weights() == reference.model.serialize_weights()


def test_every_n_minutes_saves_on_the_clock_beside_the_step_cadence(tmp_path) -> None:
    policy = Checkpoint(
        tmp_path / "ckpt", every_n_steps=10, every_n_minutes=0.1 / 60, max_to_keep=None
    )
    slow = LambdaCallback(on_step_end=lambda state: time.sleep(0.03))
    art = _loop(max_steps=24, checkpoint=policy, callbacks=[slow]).run()
    saved = step_dirs(tmp_path / "ckpt")
    assert saved[-1] == 24 and 10 in saved and 20 in saved
    assert any(s % 10 for s in saved[:-1])  # clock saves between the step ones
    assert art.plan["checkpoint"]["every_n_minutes"] == pytest.approx(0.1 / 60)


def test_online_trainer_shares_the_cadence_and_preempts(tmp_path, previous) -> None:
    train, _ = regression_task()
    batches = [train.get_batch(np.arange(i * 8, i * 8 + 8)) for i in range(10)]
    policy = Checkpoint(tmp_path / "ckpt", every_n_steps=3, max_to_keep=None)
    seen: list[str] = []
    trainer = OnlineTrainer(
        _model(),
        optimizer_config={"name": "sgd", "lr": 0.1},
        checkpoint=policy,
        callbacks=[LambdaCallback(on_checkpoint=lambda s, p: seen.append(p))],
    )
    trainer.run(batches[:7])
    assert step_dirs(policy) == [3, 6] and seen == [
        policy.step_location(3),
        policy.step_location(6),
    ]
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Preempted) as info:
        trainer(batches[7])
    assert info.value.step == 8 and step_dirs(policy) == [3, 6, 8]
    assert signal.getsignal(signal.SIGTERM) is previous
    again = OnlineTrainer(_model(), optimizer_config={"name": "sgd", "lr": 0.1}, checkpoint=policy)
    assert again.step == 8
    again.run(batches[8:])
    again.close()
    assert signal.getsignal(signal.SIGTERM) is previous

"""Learning-rate schedules: validation and values (checked against closed forms)."""

from __future__ import annotations

import math

import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.adapter import learning_rate_at
from pipekit_train.core.spec._optimizer import resolve_optimizer_config
from pipekit_train.core.spec._schedules import peak_learning_rate


def test_cosine() -> None:
    spec = {"schedule": "cosine", "init_value": 1.0, "decay_steps": 10, "alpha": 0.1}
    assert learning_rate_at(spec, 0) == pytest.approx(1.0)
    assert learning_rate_at(spec, 5) == pytest.approx(0.9 * 0.5 + 0.1)
    assert learning_rate_at(spec, 10) == pytest.approx(0.1)
    assert learning_rate_at(spec, 50) == pytest.approx(0.1)


def test_warmup_cosine() -> None:
    spec = {"schedule": "warmup_cosine", "peak_value": 2.0, "warmup_steps": 4, "decay_steps": 14}
    assert [learning_rate_at(spec, t) for t in range(5)] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert learning_rate_at(spec, 9) == pytest.approx(1.0)
    assert learning_rate_at(spec, 14) == pytest.approx(0.0)
    assert peak_learning_rate(spec) == 2.0


def test_exponential_and_linear() -> None:
    exp = {"schedule": "exponential", "init_value": 1.0, "transition_steps": 10, "decay_rate": 0.5}
    assert learning_rate_at(exp, 10) == pytest.approx(0.5)
    assert learning_rate_at({**exp, "staircase": True}, 15) == pytest.approx(0.5)
    assert learning_rate_at({**exp, "end_value": 0.3}, 100) == pytest.approx(0.3)
    lin = {"schedule": "linear", "init_value": 1.0, "end_value": 0.0, "transition_steps": 4}
    assert [learning_rate_at(lin, t) for t in (0, 2, 4, 8)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert math.isclose(learning_rate_at(0.01, 3), 0.01)


@pytest.mark.parametrize(
    "lr, fragment",
    [
        ({"schedule": "cosinus", "init_value": 1.0, "decay_steps": 3}, "cosinus"),
        ({"schedule": "cosine", "init_value": 1.0}, "missing"),
        ({"schedule": "cosine", "init_value": 1.0, "decay_steps": 3, "gamma": 2}, "gamma"),
        ({"schedule": "cosine", "init_value": 1.0, "decay_steps": 0}, "decay_steps"),
        (
            {"schedule": "warmup_cosine", "peak_value": 1.0, "warmup_steps": 5, "decay_steps": 5},
            "warmup_steps",
        ),
    ],
)
def test_bad_schedules(lr: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        resolve_optimizer_config({"name": "adam", "learning_rate": lr})


def test_resolve_optimizer_config() -> None:
    adam = {"b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    clips = {"clip_norm": None, "clip_value": None}
    assert resolve_optimizer_config({"name": "Adam", "lr": 0.1}) == {
        "name": "adam",
        "learning_rate": 0.1,
        **adam,
        **clips,
    }
    assert resolve_optimizer_config(None) == {
        "name": "adam",
        "learning_rate": 1e-3,
        **adam,
        **clips,
    }
    sentinel = object()
    assert resolve_optimizer_config(sentinel) is sentinel
    with pytest.raises(ConfigError, match="clip_norm"):
        resolve_optimizer_config({"name": "adam", "lr": 0.1, "clip_norm": -1})

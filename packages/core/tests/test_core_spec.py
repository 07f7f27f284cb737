"""The canonical training spec: one table of optimizers, names and defaults for every backend."""

from __future__ import annotations

import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.adapter import optimizer_spec, resolve_precision
from pipekit_train.core.spec import OPTIMIZERS, PRECISIONS
from pipekit_train.core.spec._optimizer import resolve_optimizer_config


def test_every_default_is_filled_in_so_backend_defaults_never_apply() -> None:
    for name, defaults in OPTIMIZERS.items():
        config = resolve_optimizer_config({"name": name})
        for key, value in defaults.items():
            assert config[key] == value, (name, key)
        assert set(config) >= {"learning_rate", "weight_decay", "clip_norm", "clip_value"}


def test_adamw_decays_by_default_and_adam_does_not() -> None:
    assert optimizer_spec({"name": "adamw"}).weight_decay == 0.01
    assert optimizer_spec({"name": "adam"}).weight_decay == 0.0
    assert optimizer_spec({"name": "adam", "weight_decay": 0.1}).weight_decay == 0.1


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"lr": 0.1}, {"learning_rate": 0.1}),
        ({"betas": [0.8, 0.95]}, {"b1": 0.8, "b2": 0.95}),
        ({"beta_1": 0.8, "epsilon": 1e-6}, {"b1": 0.8, "eps": 1e-6}),
        ({"name": "rmsprop", "rho": 0.95}, {"decay": 0.95}),
        ({"gradient_clip_norm": 2.0}, {"clip_norm": 2.0}),
    ],
)
def test_familiar_spellings_are_renamed(given: dict, expected: dict) -> None:
    config = resolve_optimizer_config(given)
    for key, value in expected.items():
        assert config[key] == value
    assert not set(given) - {"name"} & set(config) - set(expected)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"name": "lion"}, r"must be one of \['adagrad', 'adam', 'adamw', 'rmsprop', 'sgd'\]"),
        ({"name": "sgd", "b1": 0.9}, r"keys the 'sgd' optimizer does not take: \['b1'\]"),
        ({"name": "adam", "momentum": 0.9}, "does not take"),
        ({"gradient_accumulation_steps": 2}, r"TrainingLoop\(accumulate_grad_batches=k\)"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"b1": 1.0}, r"in \[0, 1\)"),
        ({"name": "sgd", "nesterov": True}, "nesterov needs a momentum|needs a momentum"),
        ({"name": "sgd", "nesterov": "yes", "momentum": 0.9}, "True or False"),
        ({"clip_norm": 1.0, "clip_value": 0.5}, "both `clip_norm` and `clip_value`"),
        ({"eps": 0}, "eps"),
        ({"lr": 0.1, "learning_rate": 0.2}, "lr=0.1, learning_rate=0.2"),
        ({"betas": 0.9}, "pair"),
    ],
)
def test_bad_configs_name_the_field_and_the_fix(config: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        optimizer_spec(config)


def test_precision_has_one_vocabulary_and_accepts_native_names() -> None:
    assert PRECISIONS == ("float32", "bfloat16-mixed", "float16-mixed")
    assert resolve_precision(None) == "float32"
    assert resolve_precision("bf16-mixed") == "bfloat16-mixed"
    assert resolve_precision("mixed_float16") == "float16-mixed"
    assert resolve_precision("p=f32,c=bf16", native={"p=f32,c=bf16": "bfloat16-mixed"}) == (
        "bfloat16-mixed"
    )
    with pytest.raises(ConfigError, match=r"Received: precision='int8'"):
        resolve_precision("int8")

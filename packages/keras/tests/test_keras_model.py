"""`KerasModelOp`, the `Keras` adapter's options and the optimizer builder."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from pipekit_train.core import ConfigError, TrainingLoop, model_op_from_config
from pipekit_train.core.testing import regression_task
from pipekit_train.keras import Keras, KerasModelOp
from pipekit_train.keras._optim import build_optimizer

LINEAR = "pipekit_train.keras.testing:linear"
MLP = "pipekit_train.keras.testing:mlp"


def unbuilt(in_size: int, out_size: int) -> keras.Model:
    """A model without `keras.Input` (built by the operator from `in_size`)."""
    return keras.Sequential([keras.layers.Dense(out_size)])


def unbuilt_no_in_size(out_size: int, size: int) -> keras.Model:
    return keras.Sequential([keras.layers.Dense(out_size)])


def not_a_model(in_size: int) -> object:
    return object()


# -- the model operator ------------------------------------------------------------------


def test_same_seed_same_bytes_across_instances() -> None:
    a = KerasModelOp(MLP, in_size=3, out_size=2, width=8, seed=1)
    b = KerasModelOp(MLP, in_size=3, out_size=2, width=8, seed=1)
    # the second instance gets other auto-generated layer names; the bytes must not care
    assert [v.path for v in a.model.weights] != [v.path for v in b.model.weights]
    assert a.serialize_weights() == b.serialize_weights()
    assert (
        KerasModelOp(MLP, in_size=3, out_size=2, width=8, seed=2).serialize_weights()
        != a.serialize_weights()
    )


def test_call_and_weights_round_trip() -> None:
    op = KerasModelOp(LINEAR, in_size=4, out_size=2, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    out = op(x)
    assert isinstance(out, np.ndarray) and out.shape == (5, 2)
    other = KerasModelOp(LINEAR, in_size=4, out_size=2, seed=7).with_weights(op.serialize_weights())
    assert other.seed == 7
    np.testing.assert_array_equal(other(x), out)
    assert other.serialize_weights() == op.serialize_weights()
    big = np.zeros((5000, 4), np.float32)
    assert op(big).shape == (5000, 2)


def test_config_is_json_and_rebuilds() -> None:
    op = KerasModelOp(MLP, in_size=2, out_size=1, width=4, seed=3)
    config = json.loads(json.dumps(op.get_config()))
    assert config["backend"] == "keras" and config["type"].endswith(":KerasModelOp")
    again = model_op_from_config(config)
    assert isinstance(again, KerasModelOp)
    assert again.serialize_weights() == op.serialize_weights()
    assert isinstance(op.default_adapter(), Keras)


def test_unbuilt_model_is_built_from_in_size() -> None:
    op = KerasModelOp(unbuilt, in_size=3, out_size=2)
    assert op(np.zeros((1, 3), np.float32)).shape == (1, 2)


def test_factory_errors() -> None:
    with pytest.raises(ConfigError, match="keras.Model"):
        KerasModelOp(not_a_model, in_size=3)
    with pytest.raises(ConfigError, match="keras.Input"):
        KerasModelOp(unbuilt_no_in_size, out_size=2, size=3)


def test_bad_weights_blob() -> None:
    op = KerasModelOp(LINEAR, in_size=4, out_size=2)
    other = KerasModelOp(LINEAR, in_size=3, out_size=2)
    with pytest.raises(ValueError, match="shape"):
        op.with_weights(other.serialize_weights())
    with pytest.raises(ValueError, match="safetensors"):
        op.with_weights(b"not a weights file")


# -- adapter options ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"steps_per_execution": 0}, "steps_per_execution"),
        ({"steps_per_execution": 2.0}, "steps_per_execution"),
        ({"jit_compile": "yes"}, "jit_compile"),
        ({"jit_compile": 1}, "jit_compile"),
        ({"precision": "mixed_bf16"}, "precision"),
    ],
)
def test_adapter_option_errors(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        Keras(**kwargs)
    assert "Received" in str(info.value)


def test_adapter_config_round_trip() -> None:
    adapter = Keras(jit_compile=True, steps_per_execution=4, precision="mixed_bfloat16")
    config = json.loads(json.dumps(adapter.get_config()))
    assert config["type"] == "pipekit_train.keras:Keras"
    again = Keras(**config["kwargs"])
    assert again.get_config() == adapter.get_config()
    assert "steps_per_execution=4" in repr(again)


def _loop(**overrides):
    train, val = regression_task()
    kwargs = dict(
        model=KerasModelOp(LINEAR, in_size=4, out_size=1),
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=4,
        progress=False,
    )
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"optimizer_config": {"name": "adamw_typo"}}, "adamw_typo"),
        ({"optimizer_config": {"name": "adam", "betta_1": 0.9}}, "betta_1"),
        ({"optimizer_config": {"name": "adam", "b1": 0.8, "beta_1": 0.9}}, "beta_1"),
        (
            {"optimizer_config": {"name": "sgd", "gradient_accumulation_steps": 2}},
            r"TrainingLoop\(accumulate_grad_batches=k\)",
        ),
        ({"optimizer_config": "adam"}, "optimizer_config"),
        ({"sharding": "model_parallel"}, "sharding"),
        ({"sharding": 3}, "sharding"),
    ],
)
def test_plan_errors(overrides: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        _loop(**overrides)
    assert "Received" in str(info.value)


def test_adapter_refuses_other_model_operators() -> None:
    from pipekit_train.core.testing import NumpyLinearOp

    with pytest.raises(ConfigError, match="KerasModelOp"):
        _loop(
            model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
            adapter=Keras(),
        )


# -- optimizers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "cls", "attrs"),
    [
        ({"name": "adam"}, "Adam", {"epsilon": 1e-8, "weight_decay": None}),
        ({"name": "adamw"}, "AdamW", {"weight_decay": 0.01}),
        ({"name": "adam", "weight_decay": 0.1}, "AdamW", {"weight_decay": 0.1}),
        ({"name": "sgd", "weight_decay": 0.1}, "SGD", {"weight_decay": 0.1, "momentum": 0.0}),
        ({"name": "rmsprop"}, "RMSprop", {"rho": 0.9, "epsilon": 1e-8}),
        ({"name": "adagrad"}, "Adagrad", {"initial_accumulator_value": 0.1}),
    ],
)
def test_every_core_optimizer_translates(config: dict, cls: str, attrs: dict) -> None:
    """Core's defaults apply, not Keras's (epsilon=1e-7, AdamW weight_decay=0.004)."""
    opt = build_optimizer({**config, "learning_rate": 0.01})
    assert type(opt).__name__ == cls
    for key, value in attrs.items():
        assert getattr(opt, key) == value, key


def test_optimizer_aliases_and_schedules() -> None:
    opt = build_optimizer(
        {
            "name": "adamw",
            "learning_rate": 0.01,
            "b1": 0.8,
            "b2": 0.95,
            "eps": 1e-6,
            "clip_norm": 1.0,
            "weight_decay": 0.1,
        }
    )
    assert (opt.beta_1, opt.beta_2, opt.epsilon, opt.weight_decay) == (0.8, 0.95, 1e-6, 0.1)
    assert (
        opt.global_clipnorm == 1.0 and opt.clipnorm is None
    )  # clip_norm is global, as on every backend
    opt = build_optimizer({"name": "sgd", "learning_rate": 0.1, "clip_value": 0.5})
    assert opt.clipvalue == 0.5 and opt.global_clipnorm is None
    with pytest.raises(ConfigError, match="accumulate_grad_batches"):
        build_optimizer({"name": "sgd", "gradient_accumulation_steps": 4})


@pytest.mark.parametrize(
    "spec",
    [
        {"schedule": "constant", "value": 0.1},
        {"schedule": "cosine", "init_value": 0.1, "decay_steps": 20, "alpha": 0.1},
        {
            "schedule": "warmup_cosine",
            "peak_value": 0.2,
            "warmup_steps": 5,
            "decay_steps": 20,
            "init_value": 0.01,
            "end_value": 0.001,
        },
        {"schedule": "warmup_cosine", "peak_value": 0.2, "warmup_steps": 0, "decay_steps": 20},
        {
            "schedule": "exponential",
            "init_value": 0.1,
            "transition_steps": 3,
            "decay_rate": 0.5,
            "staircase": True,
            "end_value": 0.01,
        },
        {"schedule": "exponential", "init_value": 0.1, "transition_steps": 3, "decay_rate": 0.5},
        {"schedule": "linear", "init_value": 0.1, "end_value": 0.0, "transition_steps": 10},
    ],
    ids=lambda spec: spec["schedule"],
)
def test_core_schedules_follow_core_curve(spec: dict) -> None:
    from pipekit_train.core.adapter import check_schedule, learning_rate_at

    spec = check_schedule(spec)
    opt = build_optimizer({"name": "sgd", "learning_rate": spec})
    schedule = opt._learning_rate
    for step in (0, 1, 2, 4, 5, 6, 10, 19, 20, 30):
        got = float(keras.ops.convert_to_numpy(schedule(step)))
        assert got == pytest.approx(learning_rate_at(spec, step), rel=1e-5, abs=1e-8), step


def test_native_optimizer_is_cloned() -> None:
    native = keras.optimizers.SGD(0.05, momentum=0.5)
    clone = build_optimizer(native)
    assert clone is not native and isinstance(clone, keras.optimizers.SGD)
    assert float(clone.learning_rate) == pytest.approx(0.05) and clone.momentum == 0.5

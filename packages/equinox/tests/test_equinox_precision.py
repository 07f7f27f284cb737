"""Mixed precision: policy parsing, a bfloat16 run, float16 dynamic loss scaling."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.equinox import Equinox
from pipekit_train.equinox._mixed_precision import DynamicLossScale, Policy, parse_policy


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "params=float32,compute=bfloat16,output=float32",
            (jnp.float32, jnp.bfloat16, jnp.float32),
        ),
        ("p=f32,c=f16,o=f32", (jnp.float32, jnp.float16, jnp.float32)),
        ("compute=bf16", (jnp.float32, jnp.bfloat16, jnp.float32)),
        (" Params=float32, Compute=half ", (jnp.float32, jnp.float16, jnp.float32)),
        ("bfloat16", (jnp.float32, jnp.bfloat16, jnp.float32)),
        ("float32", (jnp.float32, jnp.float32, jnp.float32)),
    ],
)
def test_parse_policy(spec: str, expected: tuple) -> None:
    policy = parse_policy(spec)
    assert (policy.params, policy.compute, policy.output) == expected
    assert parse_policy(str(policy)) == policy


@pytest.mark.parametrize(
    "spec", ["params=float32,compute=int8", "weights=float32", "compute", "fp8", "", 3]
)
def test_bad_policies(spec: object) -> None:
    with pytest.raises(ConfigError, match="Received: precision="):
        parse_policy(spec)


def test_jmp_policy_is_accepted() -> None:
    jmp = pytest.importorskip("jmp")
    policy = parse_policy(jmp.get_policy("params=float32,compute=bfloat16,output=float32"))
    assert policy == Policy(jnp.float32, jnp.bfloat16, jnp.float32)


def test_adapter_config_is_json() -> None:
    adapter = Equinox(precision="p=f32,c=bf16,o=f32")
    assert (
        adapter.get_config()["kwargs"]["precision"]
        == "params=float32,compute=bfloat16,output=float32"
    )
    with pytest.raises(ConfigError, match="loss_scale"):
        Equinox(loss_scale="static")
    with pytest.raises(ConfigError, match="steps_per_execution"):
        Equinox(steps_per_execution=0)


def test_bfloat16_run(make_loop) -> None:
    art = make_loop(
        adapter=Equinox(precision="params=float32,compute=bfloat16,output=float32"), max_steps=60
    ).run()
    losses = art.history["loss"]
    assert np.mean(losses[-5:]) < 0.25 * np.mean(losses[:5])
    assert art.model.model.weight.dtype == jnp.float32  # parameters stay float32
    assert "loss_scale" not in art.final_metrics  # bfloat16 needs no loss scaling


def test_float16_loss_scaling_skips_non_finite_steps(make_loop) -> None:
    loop = make_loop("mlp", model_kwargs={"width": 8}, adapter=Equinox(precision="compute=float16"))
    backend = loop.plan.adapter.step_backend(loop.plan)
    state = backend.init_state()
    first = backend.train_state(state)
    w0 = np.array(first.model.layers[0].weight, copy=True)
    assert float(first.loss_scale.scale) == 2.0**15
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    # targets so large that the scaled float16 gradients overflow
    state, metrics = backend.train_step(
        state, backend.put({"x": x, "y": np.full((16, 1), 1e4, np.float32)})
    )
    after = backend.train_state(state)
    np.testing.assert_array_equal(np.asarray(after.model.layers[0].weight), w0)  # step skipped
    assert int(after.step) == 1
    assert float(metrics["loss_scale"]) == 2.0**14  # and the scale halved
    state, metrics = backend.train_step(
        state, backend.put({"x": x, "y": np.zeros((16, 1), np.float32)})
    )
    after = backend.train_state(state)
    assert not np.array_equal(np.asarray(after.model.layers[0].weight), w0)  # a finite step applies
    assert float(metrics["loss_scale"]) == 2.0**14
    assert np.isfinite(float(metrics["loss"]))


def test_float16_run_trains(make_loop) -> None:
    art = make_loop(
        "mlp",
        model_kwargs={"width": 16},
        adapter=Equinox(precision="compute=float16"),
        max_steps=60,
    ).run()
    losses = art.history["loss"]
    assert np.mean(losses[-5:]) < 0.25 * np.mean(losses[:5])
    assert art.final_metrics["loss_scale"] > 0


def test_loss_scale_grows_after_a_period() -> None:
    scale = DynamicLossScale.create(4.0, period=2)
    scale = scale.adjust(jnp.asarray(True))
    assert float(scale.scale) == 4.0 and int(scale.counter) == 1
    scale = scale.adjust(jnp.asarray(True))
    assert float(scale.scale) == 8.0 and int(scale.counter) == 0
    scale = scale.adjust(jnp.asarray(False))
    assert float(scale.scale) == 4.0
    floor = DynamicLossScale.create(1.0).adjust(jnp.asarray(False))
    assert float(floor.scale) == 1.0

"""Building optax optimizers from `optimizer_config`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.callbacks import LambdaCallback
from pipekit_train.core.spec import OPTIMIZERS
from pipekit_train.core.spec._optimizer import resolve_optimizer_config
from pipekit_train.equinox._optim import build_optimizer, build_schedule

PARAMS = {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))}
GRADS = {"w": jnp.full((3, 2), 0.5), "b": jnp.full((2,), -0.5)}


def _one_update(config: object) -> dict[str, jax.Array]:
    opt = build_optimizer(resolve_optimizer_config(config)).transform
    updates, _ = opt.update(GRADS, opt.init(PARAMS), PARAMS)
    return optax.apply_updates(PARAMS, updates)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_core_optimizer_steps(name: str) -> None:
    new = _one_update({"name": name, "lr": 0.1})
    assert not np.allclose(new["w"], PARAMS["w"])


@pytest.mark.parametrize(
    ("config", "reference"),
    [
        ({"name": "adam", "b1": 0.5, "eps": 1e-6}, optax.adam(0.1, b1=0.5, eps=1e-6)),
        ({"name": "adamw"}, optax.adamw(0.1, weight_decay=0.01)),
        ({"name": "adam", "weight_decay": 0.2}, optax.adamw(0.1, weight_decay=0.2)),
        ({"name": "sgd", "momentum": 0.9, "nesterov": True}, optax.sgd(0.1, 0.9, nesterov=True)),
        ({"name": "rmsprop", "decay": 0.8}, optax.rmsprop(0.1, decay=0.8, eps_in_sqrt=False)),
        ({"name": "adagrad"}, optax.adagrad(0.1, eps=1e-8)),
    ],
)
def test_translation_matches_optax(config: dict, reference: optax.GradientTransformation) -> None:
    new = _one_update({**config, "lr": 0.1})
    ref = optax.apply_updates(PARAMS, reference.update(GRADS, reference.init(PARAMS), PARAMS)[0])
    np.testing.assert_allclose(new["w"], ref["w"], rtol=1e-6)


def test_unknown_optimizer_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="adamw_typo") as info:
        build_optimizer({"name": "adamw_typo", "learning_rate": 0.1})
    assert "Received" in str(info.value) and "'adamw'" in str(info.value)


def test_unknown_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"Received: nu=") as info:
        build_optimizer({"name": "adam", "learning_rate": 0.1, "nu": 0.99})
    assert "b1" in str(info.value)


def test_not_an_optimizer() -> None:
    with pytest.raises(ConfigError, match="GradientTransformation"):
        build_optimizer(3.0)


@pytest.mark.parametrize(
    ("config", "reference"),
    [
        (
            {"schedule": "cosine", "init_value": 0.1, "decay_steps": 100},
            optax.cosine_decay_schedule(0.1, 100),
        ),
        (
            {
                "schedule": "warmup_cosine",
                "init_value": 0.0,
                "peak_value": 0.1,
                "warmup_steps": 10,
                "decay_steps": 100,
            },
            optax.warmup_cosine_decay_schedule(0.0, 0.1, 10, 100),
        ),
        (
            {
                "schedule": "exponential",
                "init_value": 0.1,
                "transition_steps": 10,
                "decay_rate": 0.5,
            },
            optax.exponential_decay(0.1, 10, 0.5),
        ),
        ({"schedule": "constant", "value": 0.3}, optax.constant_schedule(0.3)),
        (
            {"schedule": "linear", "init_value": 0.1, "end_value": 0.01, "transition_steps": 20},
            optax.linear_schedule(0.1, 0.01, 20),
        ),
    ],
)
def test_schedules_match_optax(config: dict, reference: optax.Schedule) -> None:
    schedule = build_schedule(config)
    for step in (0, 5, 10, 15, 50, 99):
        assert float(schedule(step)) == pytest.approx(float(reference(step)))


def test_bad_schedules() -> None:
    # only core's schedules: the same five on every backend
    with pytest.raises(ConfigError, match="piecewise_constant"):
        build_schedule({"schedule": "piecewise_constant", "init_value": 1.0})
    with pytest.raises(ConfigError, match="cosinus"):
        build_schedule({"schedule": "cosinus", "init_value": 0.1, "decay_steps": 10})
    with pytest.raises(ConfigError, match="decay_steps"):
        build_schedule({"schedule": "cosine", "init_value": 0.1})


def test_clip_norm_bounds_the_update() -> None:
    opt = build_optimizer({"name": "sgd", "learning_rate": 1.0, "clip_norm": 0.1}).transform
    huge = jax.tree.map(lambda g: 1e6 * g, GRADS)
    updates, _ = opt.update(huge, opt.init(PARAMS), PARAMS)
    assert float(optax.tree.norm(updates)) == pytest.approx(0.1, rel=1e-5)


def test_weight_decay_native_and_decoupled() -> None:
    zero = jax.tree.map(jnp.zeros_like, GRADS)
    # adamw has it natively; sgd gets decoupled decay: -lr * wd * p
    for name in ("adamw", "sgd"):
        opt = build_optimizer({"name": name, "learning_rate": 0.1, "weight_decay": 0.5}).transform
        updates, _ = opt.update(zero, opt.init(PARAMS), PARAMS)
        np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * PARAMS["w"], rtol=1e-6)
    with pytest.raises(ConfigError, match="weight_decay"):
        build_optimizer({"name": "sgd", "learning_rate": 0.1, "weight_decay": -1})


def test_gradient_transformation_passes_through() -> None:
    opt = optax.chain(optax.clip(1.0), optax.sgd(0.1))
    built = build_optimizer(opt)
    assert built.transform is opt and built.schedule is None


def test_multisteps_accumulates_in_a_loop(make_loop) -> None:
    """`optax.MultiSteps(opt, 4)`: no update before the 4th step, then one."""
    initial = make_loop().plan.model.serialize_weights()

    def acc(n):
        return make_loop(
            optimizer_config=optax.MultiSteps(optax.sgd(0.1), 4), max_steps=n, validation=None
        ).run()

    assert acc(3).model.serialize_weights() == initial
    assert acc(4).model.serialize_weights() != initial


def test_learning_rate_reported_from_the_schedule(make_loop) -> None:
    seen: list[tuple[int, float]] = []
    schedule = {"schedule": "cosine", "init_value": 0.1, "decay_steps": 10}
    make_loop(
        optimizer_config={"name": "sgd", "learning_rate": schedule},
        max_steps=6,
        validation=None,
        callbacks=[LambdaCallback(on_step_end=lambda s: seen.append((s.step, s.learning_rate)))],
    ).run()
    reference = optax.cosine_decay_schedule(0.1, 10)
    assert [step for step, _ in seen] == list(range(1, 7))
    for step, lr in seen:
        assert lr == pytest.approx(float(reference(step)))


def test_learning_rate_sweep_shares_one_compiled_step(make_loop, monkeypatch) -> None:
    """Runs that differ only in a constant lr reuse the compiled step, with their own lr."""
    from pipekit_train.equinox import _compiled

    built: list[object] = []
    original = _compiled.StepFunctions.__init__

    def counting_init(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    def weights(lr: float) -> bytes:
        config = {"name": "adam", "lr": lr, "b1": 0.8}
        return (
            make_loop(optimizer_config=config, max_steps=5, validation=None)
            .run()
            .model.serialize_weights()
        )

    monkeypatch.setattr(_compiled.StepFunctions, "__init__", counting_init)
    monkeypatch.setattr(_compiled, "_CACHE", type(_compiled._CACHE)())
    first = weights(0.013)
    second = weights(0.031)
    assert len(built) == 1  # the second run compiled nothing new
    assert first != second
    monkeypatch.setattr(_compiled, "_CACHE", type(_compiled._CACHE)())
    assert weights(0.031) == second  # a fresh compilation gives the same weights
    assert len(built) == 2
    # any other optimizer argument still changes the compiled step
    make_loop(
        optimizer_config={"name": "adam", "lr": 0.02, "b1": 0.7}, max_steps=2, validation=None
    ).run()
    assert len(built) == 3

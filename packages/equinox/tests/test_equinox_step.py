"""The compiled step: donation, fused steps, metrics on the device, the state."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.equinox import Equinox, EquinoxModelOp, TrainState

X = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
BATCH = {"x": X, "y": X.sum(axis=1, keepdims=True)}


def test_state_is_a_train_state(make_loop) -> None:
    loop = make_loop("batchnorm_mlp")
    backend = loop.plan.adapter.step_backend(loop.plan)
    ts = backend.train_state(backend.init_state())
    assert isinstance(ts, TrainState)
    assert (
        int(ts.step) == 0
        and ts.key.shape == (2,)
        and ts.model_state is not None
        and ts.loss_scale is None
    )


def test_donation_keeps_batches_and_the_operator_alive(make_loop) -> None:
    loop = make_loop()
    op = loop.plan.model
    before = op(X)
    backend = loop.plan.adapter.step_backend(loop.plan)
    state = backend.init_state()
    device_batch = jax.device_put(BATCH)
    for batch in (backend.put(BATCH), device_batch, device_batch):  # the same batch twice
        old = state
        state, metrics = backend.train_step(state, batch)
        assert all(x.is_deleted() for x in old.leaves)  # the state was donated ...
    assert not any(v.is_deleted() for v in device_batch.values())  # ... the batch was not
    np.testing.assert_array_equal(op(X), before)  # the operator's own arrays are untouched
    trained = backend.model_op(state)
    pred = trained(X)
    state, _ = backend.train_step(state, device_batch)  # donating the state again ...
    np.testing.assert_array_equal(trained(X), pred)  # ... does not touch the handed-out operator
    assert np.isfinite(backend.fetch([metrics["loss"]])[0])


def test_metrics_stay_on_the_device(make_loop) -> None:
    loop = make_loop()
    backend = loop.plan.adapter.step_backend(loop.plan)
    _, metrics = backend.train_step(backend.init_state(), backend.put(BATCH))
    assert isinstance(metrics["loss"], jax.Array)
    (value,) = backend.fetch([metrics["loss"]])
    assert np.asarray(value).shape == ()


def test_fused_steps_stack_metrics(make_loop) -> None:
    loop = make_loop(adapter=Equinox(steps_per_execution=3))
    backend = loop.plan.adapter.step_backend(loop.plan)
    stacked = {k: np.stack([v] * 3) for k, v in BATCH.items()}
    state, metrics = backend.train_steps(backend.init_state(), backend.put(stacked))
    assert metrics["loss"].shape == (3,)
    assert int(backend.train_state(state).step) == 3


@pytest.mark.parametrize("factory", ["linear", "dropout_mlp", "batchnorm_mlp"])
def test_fused_runs_match_single_steps(make_loop, factory: str) -> None:
    """K=4 with events every 6 steps (groups 4, 2, 4, 2, ...) equals K=1 bit for bit."""
    kw = {"max_steps": 18, "validate_every_n_steps": 6}
    one = make_loop(factory, **kw).run()
    four = make_loop(factory, adapter=Equinox(steps_per_execution=4), **kw).run()
    assert four.model.serialize_weights() == one.model.serialize_weights()
    np.testing.assert_array_equal(four.history["loss"], one.history["loss"])
    np.testing.assert_array_equal(four.history["val_loss"], one.history["val_loss"])


def test_sharding_must_be_a_spec(make_loop) -> None:
    with pytest.raises(ConfigError, match="Received: sharding="):
        make_loop(sharding={"data": 2})


def test_only_equinox_models(make_loop) -> None:
    from pipekit_train.core.testing import NumpyLinearOp

    with pytest.raises(ConfigError, match="EquinoxModelOp"):
        make_loop(
            model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
            adapter=Equinox(),
        )
    assert isinstance(make_loop().plan.model, EquinoxModelOp)

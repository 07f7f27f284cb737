"""`EquinoxModelOp`: building, inference, weights, stateful and stochastic layers."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest

from pipekit_train.core import ConfigError, model_factory, model_op_from_config
from pipekit_train.equinox import Equinox, EquinoxModelOp
from pipekit_train.equinox.testing import linear, mlp

X = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)


def test_string_and_callable_factories_agree() -> None:
    a = EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=2, seed=3)
    b = EquinoxModelOp(linear, in_size=4, out_size=2, seed=3)
    assert a.serialize_weights() == b.serialize_weights()
    assert a.get_config() == b.get_config()
    assert a.get_config()["backend"] == "equinox"
    out = a(X)
    assert isinstance(out, np.ndarray) and out.shape == (8, 2) and out.dtype == np.float32
    np.testing.assert_allclose(
        out, X @ np.asarray(a.model.weight).T + np.asarray(a.model.bias), rtol=1e-5
    )


def _same_arrays(a: object, b: object) -> None:
    leaves_a = jax.tree_util.tree_leaves(eqx.filter(a, eqx.is_array))
    leaves_b = jax.tree_util.tree_leaves(eqx.filter(b, eqx.is_array))
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_factories_hold_equinox_initial_values() -> None:
    """The testing factories draw each array at a power-of-two length and cut it (one
    compiled draw per length, not per shape): the values are those Equinox draws itself,
    and with jax's older, non-partitionable threefry they draw at the shape instead."""
    from pipekit_train.equinox.testing import BatchNormMLP, DropoutMLP

    key = jax.random.PRNGKey(11)
    with jax.threefry_partitionable(False):
        _same_arrays(linear(5, 3, key=key), eqx.nn.Linear(5, 3, key=key))
    with jax.threefry_partitionable(True):
        _same_arrays(linear(5, 3, key=key), eqx.nn.Linear(5, 3, key=key))
        for depth in (0, 2):
            ours = mlp(5, 3, width=40, depth=depth, key=key)
            ref = eqx.nn.MLP(5, 3, 40, depth, activation=jax.nn.tanh, key=key)
            _same_arrays(ours, ref)
        built_in_jit = eqx.filter_jit(lambda k: mlp(5, 3, width=40, depth=2, key=k))(key)
        _same_arrays(built_in_jit, ref)  # the cut happens inside the traced program
        k1, k2 = jax.random.split(key)
        drop = DropoutMLP(5, 3, 40, 0.1, key=key)
        _same_arrays(drop.hidden, eqx.nn.Linear(5, 40, key=k1))
        _same_arrays(drop.out, eqx.nn.Linear(40, 3, key=k2))
        norm = BatchNormMLP(5, 3, 40, key=key)
        _same_arrays((norm.hidden, norm.out), (drop.hidden, drop.out))


def test_float64_inputs_are_accepted() -> None:
    op = EquinoxModelOp(mlp, in_size=4, out_size=1)
    np.testing.assert_allclose(op(X.astype(np.float64)), op(X), rtol=1e-6)


def test_weights_round_trip_and_determinism() -> None:
    a = EquinoxModelOp(mlp, in_size=4, out_size=1, width=8, seed=0)
    b = EquinoxModelOp(mlp, in_size=4, out_size=1, width=8, seed=1)
    assert (
        a.serialize_weights()
        == EquinoxModelOp(mlp, in_size=4, out_size=1, width=8, seed=0).serialize_weights()
    )
    assert a.serialize_weights() != b.serialize_weights()
    c = b.with_weights(a.serialize_weights())
    assert c.serialize_weights() == a.serialize_weights()
    np.testing.assert_array_equal(c(X), a(X))
    rebuilt = model_op_from_config(a.get_config()).with_weights(a.serialize_weights())
    np.testing.assert_array_equal(rebuilt(X), a(X))


def test_bad_weights_are_refused() -> None:
    a = EquinoxModelOp(mlp, in_size=4, out_size=1, width=8)
    other = EquinoxModelOp(mlp, in_size=4, out_size=1, width=16)
    with pytest.raises(ConfigError, match="Received"):
        a.with_weights(other.serialize_weights())
    with pytest.raises(ConfigError, match="Received"):
        a.with_weights(a.serialize_weights() + b"extra")
    with pytest.raises(ConfigError, match="Received"):
        a.with_weights(a.serialize_weights()[:100])


def keyless(size: int) -> eqx.nn.Linear:
    return eqx.nn.Linear(size, 1, key=jax.random.PRNGKey(0))


def not_a_module(size: int, *, key: jax.Array) -> np.ndarray:
    return np.zeros(size)


def test_factory_must_return_a_module() -> None:
    with pytest.raises(ConfigError, match="eqx.Module"):
        EquinoxModelOp(not_a_module, size=3)
    with pytest.raises(ConfigError, match="`key`"):
        EquinoxModelOp(keyless, size=3)
    with pytest.raises(ConfigError, match="factory"):
        EquinoxModelOp("pipekit_train.equinox.testing:nope")


@pytest.mark.parametrize("seed", [-1, 2.0, True])
def test_bad_seeds_are_refused(seed: object) -> None:
    with pytest.raises(ConfigError, match=r"`seed` must be a non-negative int\. Received: seed="):
        EquinoxModelOp(linear, in_size=2, out_size=1, seed=seed)


def test_default_adapter() -> None:
    assert isinstance(EquinoxModelOp(linear, in_size=2, out_size=1).default_adapter(), Equinox)


class BatchedLinear(eqx.Module):
    """A module that takes the whole batch."""

    inner: eqx.nn.Linear

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.inner.weight.T + self.inner.bias


@model_factory
def batched_linear(in_size: int, out_size: int, *, key: jax.Array) -> BatchedLinear:
    return BatchedLinear(eqx.nn.Linear(in_size, out_size, key=key))


def test_batched_models(make_loop) -> None:
    op = EquinoxModelOp(batched_linear, in_size=4, out_size=1, batched=True)
    assert op.get_config()["batched"] is True
    assert model_op_from_config(op.get_config()).batched
    art = make_loop(model=op, max_steps=40).run()
    losses = art.history["loss"]
    assert np.mean(losses[-5:]) < 0.25 * np.mean(losses[:5])
    assert art.model(X).shape == (8, 1)


def test_batchnorm_trains_and_infers_in_inference_mode(make_loop) -> None:
    op = EquinoxModelOp(
        "pipekit_train.equinox.testing:batchnorm_mlp", in_size=4, out_size=1, width=16
    )
    assert isinstance(op.model_state, eqx.nn.State)
    art = make_loop(model=op, max_steps=60, validate_every_n_steps=30).run()
    losses = art.history["loss"]
    assert np.mean(losses[-5:]) < 0.25 * np.mean(losses[:5])
    trained = art.model
    # the running statistics were trained (the state changed) ...
    assert trained.serialize_weights() != op.serialize_weights()
    # ... and inference uses them: a sample's prediction does not depend on its batch
    np.testing.assert_allclose(trained(X[:1]), trained(X)[:1], rtol=1e-5, atol=1e-6)
    # the state survives the registry-style round trip
    again = model_op_from_config(trained.get_config()).with_weights(trained.serialize_weights())
    np.testing.assert_array_equal(again(X), trained(X))


def test_dropout_uses_the_run_key_and_inference_is_deterministic(make_loop) -> None:
    kw = {"model_kwargs": {"p": 0.5, "width": 16}, "max_steps": 10, "validation": None}
    a = make_loop("dropout_mlp", seed=0, **kw).run()
    b = make_loop("dropout_mlp", seed=0, **kw).run()
    c = make_loop("dropout_mlp", seed=0, shuffle=False, **kw).run()
    assert a.model.serialize_weights() == b.model.serialize_weights()
    assert a.model.serialize_weights() != c.model.serialize_weights()
    np.testing.assert_array_equal(a.model(X), a.model(X))

"""Losses and their composition, checked against hand-computed numpy references."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipekit_train.core import losses
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.losses import Loss, PerKeyLoss, WeightedLoss

RNG = np.random.default_rng(0)
P = RNG.normal(size=(8, 3)).astype(np.float32)
T = RNG.normal(size=(8, 3)).astype(np.float32)


def module_level_loss(pred, target):
    return np.mean((pred - target) ** 4)


# --------------------------------------------------------------------------- values


def test_mse_mae_values_and_dtype():
    d = P.astype(np.float64) - T
    assert float(losses.mse(P, T)) == pytest.approx(np.mean(d**2), rel=1e-6)
    assert float(losses.mae(P, T)) == pytest.approx(np.mean(np.abs(d)), rel=1e-6)
    assert losses.mse(P, T).dtype == np.float32
    assert losses.mse(P.astype(np.float64), T).dtype == np.float64
    # float64 target, float32 prediction: result follows the prediction
    assert losses.mse(P, T.astype(np.float64)).dtype == np.float32


def test_huber_default_and_configured():
    d = P.astype(np.float64) - T
    for delta in (1.0, 0.3):
        a = np.abs(d)
        ref = np.mean(np.where(a <= delta, 0.5 * d**2, delta * (a - 0.5 * delta)))
        loss = losses.huber if delta == 1.0 else losses.huber(delta=delta)
        assert float(loss(P, T)) == pytest.approx(ref, rel=1e-6)
    assert losses.huber(delta=0.3).describe() == {"name": "huber", "params": {"delta": 0.3}}
    assert losses.huber.describe() == {"name": "huber", "params": {"delta": 1.0}}
    assert losses.huber.params == {"delta": 1.0}  # the default is untouched


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1", True])
def test_huber_bad_delta(bad):
    with pytest.raises(ConfigError, match="`delta`.*Received: delta="):
        losses.huber(delta=bad)


def test_unknown_param():
    with pytest.raises(ConfigError, match=r"`huber` does not take.*\['beta'\].*Accepted.*delta"):
        losses.huber(beta=1.0)
    with pytest.raises(ConfigError, match="`mse` does not take"):
        losses.mse(delta=1.0)


def test_call_arity():
    with pytest.raises(TypeError):
        losses.mse(P)
    with pytest.raises(TypeError):
        losses.mse()


def test_gaussian_nll_split_and_dict():
    mean, log_var = P[:, :1], P[:, 1:2]
    pred = np.concatenate([mean, log_var], axis=-1)
    target = T[:, :1]
    ref = np.mean(0.5 * (log_var + (target - mean) ** 2 * np.exp(-log_var)))
    assert float(losses.gaussian_nll(pred, target)) == pytest.approx(ref, rel=1e-5)
    as_dict = {"mean": mean, "log_var": log_var}
    assert float(losses.gaussian_nll(as_dict, target)) == pytest.approx(ref, rel=1e-5)
    full = losses.gaussian_nll(full=True)
    assert float(full(pred, target)) == pytest.approx(ref + 0.5 * math.log(2 * math.pi), rel=1e-5)
    assert losses.gaussian_nll(pred, target).dtype == np.float32


def test_gaussian_nll_shape_errors():
    with pytest.raises(ConfigError, match="even-sized last axis"):
        losses.gaussian_nll(P, T)
    with pytest.raises(ConfigError, match="same shape"):
        losses.gaussian_nll(P[:, :2], T[:, 0])  # (8, 1) mean against (8,) target
    with pytest.raises(ConfigError, match="'mean' and 'log_var'"):
        losses.gaussian_nll({"mu": P}, T)
    with pytest.raises(ConfigError, match="`full`"):
        losses.gaussian_nll(full=1)


def _ref_log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_cross_entropy_integer_and_one_hot():
    labels = np.array([0, 2, 1, 1, 0, 2, 2, 1])
    ref = -np.mean(_ref_log_softmax(P)[np.arange(8), labels])
    assert float(losses.cross_entropy(P, labels)) == pytest.approx(ref, rel=1e-6)
    assert float(losses.cross_entropy(P, labels.astype(np.int32))) == pytest.approx(ref, rel=1e-6)
    one_hot = np.eye(3, dtype=np.float32)[labels]
    assert float(losses.cross_entropy(P, one_hot)) == pytest.approx(ref, rel=1e-6)
    assert losses.cross_entropy(P, labels).dtype == np.float32


def test_cross_entropy_is_stable_for_large_logits():
    logits = np.array([[1000.0, 0.0], [0.0, -1000.0]], dtype=np.float32)
    value = float(losses.cross_entropy(logits, np.array([1, 0])))
    assert value == pytest.approx(500.0)


def test_cross_entropy_errors():
    with pytest.raises(ConfigError, match="integer class indices"):
        losses.cross_entropy(P, np.zeros(8, dtype=np.float32))
    with pytest.raises(ConfigError, match="target.shape=\\(8, 2\\)"):
        losses.cross_entropy(P, np.zeros((8, 2)))


def test_binary_cross_entropy_stable():
    z = (T > 0).astype(np.float32)
    x = P.astype(np.float64) * 3
    ref = np.mean(-(z * np.log(1 / (1 + np.exp(-x))) + (1 - z) * np.log(1 - 1 / (1 + np.exp(-x)))))
    assert float(losses.binary_cross_entropy(P * 3, z)) == pytest.approx(ref, rel=1e-5)
    huge = np.array([1e4, -1e4], dtype=np.float32)
    out = losses.binary_cross_entropy(huge, np.array([0.0, 1.0], dtype=np.float32))
    assert np.isfinite(out) and float(out) == pytest.approx(1e4)


def test_shape_mismatch_is_refused():
    with pytest.raises(ConfigError, match=r"Received: pred.shape=\(8, 1\), target.shape=\(8,\)"):
        losses.mse(P[:, :1], T[:, 0])


def test_non_array_pred():
    with pytest.raises(ConfigError, match="`pred` must be an array"):
        losses.mse([1.0, 2.0], T)


# --------------------------------------------------------------------------- registry


def test_registry_names_get_and_unknown():
    assert losses.names() == [
        "binary_cross_entropy",
        "cross_entropy",
        "crps",
        "energy_score",
        "flow_nll",
        "gaussian_crps",
        "gaussian_nll",
        "huber",
        "mae",
        "mixture_crps",
        "mixture_nll",
        "mse",
    ]
    assert losses.get("mse") is losses.mse
    assert losses.get(losses.mae) is losses.mae
    with pytest.raises(ConfigError) as info:
        losses.get("mse_loss")
    msg = str(info.value)
    assert "Received: loss='mse_loss'" in msg and "'cross_entropy'" in msg and "Did you mean" in msg
    with pytest.raises(ConfigError, match="Received: loss=3"):
        losses.get(3)


def test_register_and_describe_user_losses():
    name = "test_core_losses_quartic"
    registered = losses.register(name, module_level_loss)
    try:
        assert losses.get(name) is registered
        assert registered.describe() == {"name": name}
        assert float(registered(P, T)) == pytest.approx(module_level_loss(P, T))
        with pytest.raises(ConfigError, match="already registered"):
            losses.register(name, module_level_loss)
        losses.register(name, module_level_loss, overwrite=True)
    finally:
        losses._compose._REGISTRY._items.pop(name, None)

    wrapped = losses.get(module_level_loss)
    assert isinstance(wrapped, Loss)
    assert wrapped.describe() == {"import_path": f"{__name__}:module_level_loss"}
    rebuilt = losses.get(wrapped.describe())
    assert float(rebuilt(P, T)) == pytest.approx(module_level_loss(P, T))

    lam = losses.get(lambda p, t: np.mean(p - t))
    desc = lam.describe()
    assert set(desc) == {"callable"} and "lambda" in desc["callable"]
    with pytest.raises(ConfigError, match="cannot be imported"):
        losses.from_description(desc)


def test_register_decorator():
    name = "test_core_losses_deco"
    try:

        @losses.register(name)
        def my_loss(pred, target):
            return np.mean(np.abs(pred - target)) * 2

        assert callable(my_loss) and not isinstance(my_loss, Loss)
        assert float(losses.get(name)(P, T)) == pytest.approx(2 * float(losses.mae(P, T)), rel=1e-6)
    finally:
        losses._compose._REGISTRY._items.pop(name, None)


def test_describe_is_json_and_round_trips():
    for loss in [losses.get(n) for n in losses.names()]:
        desc = loss.describe()
        assert json.loads(json.dumps(desc)) == desc
        assert losses.from_description(desc).describe() == desc


def test_bad_descriptions():
    with pytest.raises(ConfigError, match="not a loss description"):
        losses.from_description({"what": 1})
    with pytest.raises(ConfigError, match="unknown loss"):
        losses.get({"name": "nope"})


# --------------------------------------------------------------------------- composition


def test_weighted_and_arithmetic_agree():
    ref = float(losses.mse(P, T)) + 0.1 * float(losses.mae(P, T))
    a = Loss.weighted({"mse": 1.0, "mae": 0.1})
    b = losses.mse + 0.1 * losses.mae
    c = Loss.weighted([(losses.mse, 1.0), ("mae", 0.1)])
    for loss in (a, b, c):
        assert isinstance(loss, WeightedLoss)
        assert float(loss(P, T)) == pytest.approx(ref, rel=1e-6)
    assert (
        a.describe()
        == b.describe()
        == c.describe()
        == {
            "weighted": [
                {"weight": 1.0, "loss": {"name": "mse"}},
                {"weight": 0.1, "loss": {"name": "mae"}},
            ]
        }
    )
    assert losses.from_description(a.describe()).describe() == a.describe()


def test_arithmetic_flattens_scales_and_sums():
    loss = 2 * (losses.mse + losses.mae / 4) + losses.huber(delta=0.5)
    assert [w for w, _ in loss.terms] == [2.0, 0.5, 1.0]
    assert [t.name for _, t in loss.terms] == ["mse", "mae", "huber"]
    ref = (
        2 * float(losses.mse(P, T))
        + 0.5 * float(losses.mae(P, T))
        + float(losses.huber(delta=0.5)(P, T))
    )
    assert float(loss(P, T)) == pytest.approx(ref, rel=1e-6)
    assert sum([losses.mse, losses.mae]).describe() == (losses.mse + losses.mae).describe()
    mixed = losses.mse + module_level_loss
    assert mixed.describe()["weighted"][1]["loss"] == {
        "import_path": f"{__name__}:module_level_loss"
    }
    assert losses.mse(P, T).dtype == (0.5 * losses.mse)(P, T).dtype == np.float32


def test_weighted_errors():
    with pytest.raises(ConfigError, match="at least one loss"):
        Loss.weighted({})
    with pytest.raises(ConfigError, match="`weight` must be a finite"):
        Loss.weighted({"mse": float("inf")})
    with pytest.raises(ConfigError, match="unknown loss"):
        Loss.weighted({"msee": 1.0})
    with pytest.raises(ConfigError, match="`weight`"):
        losses.mse * float("nan")
    with pytest.raises(TypeError):
        losses.mse * "x"
    with pytest.raises(ConfigError, match="takes no parameters"):
        (losses.mse + losses.mae)(delta=1.0)


def test_per_key():
    pred = {"a": P, "b": P[:, :1], "aux": P}
    target = {"a": T, "b": T[:, :1]}
    loss = Loss.per_key({"a": "mse", "b": losses.mae}, weights={"b": 0.5})
    assert isinstance(loss, PerKeyLoss)
    ref = float(losses.mse(P, T)) + 0.5 * float(losses.mae(P[:, :1], T[:, :1]))
    assert float(loss(pred, target)) == pytest.approx(ref, rel=1e-6)
    desc = loss.describe()
    assert desc == {
        "per_key": {
            "a": {"weight": 1.0, "loss": {"name": "mse"}},
            "b": {"weight": 0.5, "loss": {"name": "mae"}},
        }
    }
    assert losses.from_description(desc).describe() == desc
    # composes with arithmetic too
    assert float((0.5 * loss)(pred, target)) == pytest.approx(0.5 * ref, rel=1e-6)


def test_per_key_errors():
    with pytest.raises(ConfigError, match="weights` has keys without a loss"):
        Loss.per_key({"a": "mse"}, weights={"c": 1.0})
    with pytest.raises(ConfigError, match="non-empty mapping"):
        Loss.per_key({})
    loss = Loss.per_key({"a": "mse", "b": "mae"})
    with pytest.raises(ConfigError, match=r"`pred` lacks key\(s\) \['b'\]"):
        loss({"a": P}, {"a": T, "b": T})
    with pytest.raises(ConfigError, match="`target` must be a dict"):
        loss({"a": P, "b": P}, T)


def test_losses_pickle_and_deepcopy():
    import copy
    import pickle

    for loss in [
        losses.mse,
        losses.huber(delta=0.5),
        losses.mse + 0.1 * losses.mae,
        Loss.per_key({"a": "mse"}, weights={"a": 2.0}),
    ]:
        for clone in (pickle.loads(pickle.dumps(loss)), copy.deepcopy(loss)):
            assert clone.describe() == loss.describe()
    assert float(pickle.loads(pickle.dumps(losses.huber))(P, T)) == float(losses.huber(P, T))


# --------------------------------------------------------------------------- mixture


def _mixture_reference(pred, target, k, covariance):
    """The mixture NLL by the textbook formula: build each covariance, invert it."""
    pred, target = np.asarray(pred, np.float64), np.asarray(target, np.float64)
    d = target.shape[-1]
    total = []
    for p, y in zip(pred, target, strict=True):
        logits, rest = p[:k], p[k:]
        weights = np.exp(logits) / np.exp(logits).sum()
        means = rest[: k * d].reshape(k, d)
        log_scales = rest[k * d : 2 * k * d].reshape(k, d)
        lower = rest[2 * k * d :].reshape(k, -1)
        density = 0.0
        for c in range(k):
            chol = np.diag(np.exp(log_scales[c]))
            if covariance == "full":
                chol[np.tril_indices(d, -1)] = lower[c]
            cov = chol @ chol.T
            r = y - means[c]
            quad = r @ np.linalg.solve(cov, r)
            norm = np.sqrt((2 * np.pi) ** d * np.linalg.det(cov))
            density += weights[c] * np.exp(-0.5 * quad) / norm
        total.append(-np.log(density))
    return float(np.mean(total))


@pytest.mark.parametrize("covariance", ["diag", "full"])
@pytest.mark.parametrize("k,d", [(1, 1), (3, 2), (4, 3)])
def test_mixture_nll_matches_the_textbook_density(k, d, covariance):
    width = losses.mixture_width(k, d, covariance)
    assert width == k * (1 + 2 * d + (d * (d - 1) // 2 if covariance == "full" else 0))
    rng = np.random.default_rng(k * 10 + d)
    pred = (0.5 * rng.normal(size=(16, width))).astype(np.float32)
    target = rng.normal(size=(16, d)).astype(np.float32)
    loss = losses.mixture_nll(n_components=k, covariance=covariance)
    value = loss(pred, target)
    assert value.dtype == np.float32 and value.shape == ()
    assert float(value) == pytest.approx(_mixture_reference(pred, target, k, covariance), rel=1e-5)
    # float64 in, float64 out, and the same value to float64 precision
    value64 = loss(pred.astype(np.float64), target)
    assert value64.dtype == np.float64
    assert float(value64) == pytest.approx(
        _mixture_reference(pred, target, k, covariance), rel=1e-10
    )


def test_mixture_nll_one_component_is_the_exact_gaussian_nll():
    pred = np.stack([np.zeros(8), P[:, 0], 0.3 * P[:, 1]], axis=1)  # d=1: [logit, mean, log-scale]
    target = T[:, :1].astype(np.float64)
    as_gaussian = np.stack([pred[:, 1], 2 * pred[:, 2]], axis=1)  # log-var = 2 log-scale
    expected = float(losses.gaussian_nll(full=True)(as_gaussian, target))
    assert float(losses.mixture_nll(pred, target)) == pytest.approx(expected, rel=1e-12)


def test_mixture_nll_is_stable_far_from_every_component():
    # Components 1e3 standard deviations away and logits of 1e4: finite, and the exact value.
    k, d = 2, 2
    pred = np.zeros((1, losses.mixture_width(k, d)))
    pred[0, :2] = [1e4, -1e4]
    target = np.full((1, d), 1e3)
    value = float(losses.mixture_nll(n_components=k)(pred, target))
    # the first component dominates: 0.5*|y|^2 + d/2 log(2 pi) (its weight is 1 - 0)
    assert value == pytest.approx(0.5 * 2 * 1e6 + np.log(2 * np.pi), rel=1e-12)
    assert np.isfinite(value)


def test_mixture_nll_bimodal_beats_unimodal_on_bimodal_data():
    # The loss prefers the right answer: two modes at ±2 fit a ±2 sample better than one.
    target = np.array([[-2.0], [2.0]] * 8)
    two = np.tile([0.0, 0.0, -2.0, 2.0, np.log(0.3), np.log(0.3)], (16, 1))
    one = np.tile([0.0, 0.0, 0.0, 0.0, np.log(2.0), np.log(2.0)], (16, 1))
    loss = losses.mixture_nll(n_components=2)
    assert float(loss(two, target)) < float(loss(one, target)) - 0.5


def test_mixture_nll_params_and_shape_errors():
    with pytest.raises(ConfigError, match=r"Received: n_components=0\..*n_components=5"):
        losses.mixture_nll(n_components=0)
    with pytest.raises(ConfigError, match="Received: n_components=True"):
        losses.mixture_nll(n_components=True)
    with pytest.raises(ConfigError, match=r"Received: covariance='tied'.*'diag'"):
        losses.mixture_nll(covariance="tied")
    loss = losses.mixture_nll(n_components=3)
    with pytest.raises(
        ConfigError, match=r"\(15,\).*Received: pred.shape=\(8, 14\).*mixture_width"
    ):
        loss(np.zeros((8, 14)), np.zeros((8, 2)))
    with pytest.raises(ConfigError, match=r"Received: pred.shape=\(8, 15\), target.shape=\(7, 2\)"):
        loss(np.zeros((8, 15)), np.zeros((7, 2)))
    with pytest.raises(ConfigError, match="trailing axis"):
        loss(np.zeros((8, 15)), np.zeros(8))
    with pytest.raises(ConfigError, match="must be an array"):
        loss([[0.0] * 15], np.zeros((1, 2)))
    described = loss.describe()
    assert described == {"name": "mixture_nll", "params": {"n_components": 3, "covariance": "diag"}}
    assert losses.from_description(json.loads(json.dumps(described))).params == loss.params

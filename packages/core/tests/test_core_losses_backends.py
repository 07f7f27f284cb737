"""The same array-API losses and metrics on jax (jit, grad) and torch (autograd) arrays.

Core never imports a backend; only these tests do, inside the test functions.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import losses, metrics
from pipekit_train.core.losses import Loss

RNG = np.random.default_rng(3)
P = RNG.normal(size=(8, 4)).astype(np.float32)
T = RNG.normal(size=(8, 4)).astype(np.float32)
LABELS = RNG.integers(0, 4, size=8)
ONE_HOT = np.eye(4, dtype=np.float32)[LABELS]
BINARY = (RNG.random(size=(8, 4)) > 0.5).astype(np.float32)
GAUSS_T = T[:, :2]
MIX_T = T[:, :2]  # 3 components over 2 values: widths 15 (diagonal) and 18 (full)
MIX_DIAG = (0.5 * RNG.normal(size=(8, 15))).astype(np.float32)
MIX_FULL = (0.5 * RNG.normal(size=(8, 18))).astype(np.float32)
ENS = RNG.normal(size=(8, 4, 3)).astype(np.float32)  # 4 members per sample
ENS_T = RNG.normal(size=(8, 3)).astype(np.float32)
FLOW_OPTS = {"flow_layers": 2, "flow_bins": 4, "flow_bound": 2.0}
FLOW_T = (1.5 * T[:, :2]).astype(np.float32)  # some values beyond the splines' bound
FLOW = (0.5 * RNG.normal(size=(8, losses.flow_width(2, 2, 4)))).astype(np.float32)
COUPLED_OPTS = {**FLOW_OPTS, "flow_hidden": 3}  # coupled layers over 3 values
COUPLED_T = (1.5 * T[:, :3]).astype(np.float32)
COUPLED = (0.5 * RNG.normal(size=(8, losses.flow_width(3, 2, 4, 3)))).astype(np.float32)


def _torch_gaussian(full):
    def ref(p, t):
        import torch.nn.functional as F  # noqa: TID251 (tests may use torch)

        return F.gaussian_nll_loss(p[:, :2], t, p[:, 2:].exp(), full=full)

    return ref


def _torch_mixture(k, full):
    """torch.distributions' own mixture: MixtureSameFamily of MultivariateNormal(scale_tril)."""

    def ref(p, t):
        import torch  # noqa: TID251 (tests may use torch)
        from torch import distributions as D  # noqa: TID251

        n, d = t.shape
        means = p[:, k : k + k * d].reshape(n, k, d)
        tril = torch.diag_embed(p[:, k + k * d : k + 2 * k * d].reshape(n, k, d).exp())
        if full:
            rows, cols = torch.tril_indices(d, d, -1)
            off = torch.zeros(n, k, d, d)
            off[:, :, rows, cols] = p[:, k + 2 * k * d :].reshape(n, k, -1)
            tril = tril + off
        mix = D.MixtureSameFamily(
            D.Categorical(logits=p[:, :k]), D.MultivariateNormal(means, scale_tril=tril)
        )
        return -mix.log_prob(t).mean()

    return ref


def _fn(name, **kw):
    def ref(p, t):
        import torch.nn.functional as F  # noqa: TID251 (tests may use torch)

        if name == "cross_entropy" and not t.is_floating_point():
            t = t.long()
        return getattr(F, name)(p, t, **kw)

    return ref


# (id, loss, pred, target, torch-native reference or None)
CASES = [
    ("mse", losses.mse, P, T, _fn("mse_loss")),
    ("mae", losses.mae, P, T, _fn("l1_loss")),
    ("huber", losses.huber, P * 2, T, _fn("huber_loss", delta=1.0)),
    ("huber_0.3", losses.huber(delta=0.3), P, T, _fn("huber_loss", delta=0.3)),
    ("gaussian_nll", losses.gaussian_nll, P, GAUSS_T, _torch_gaussian(False)),
    ("gaussian_nll_full", losses.gaussian_nll(full=True), P, GAUSS_T, _torch_gaussian(True)),
    ("mixture_nll", losses.mixture_nll(n_components=3), MIX_DIAG, MIX_T, _torch_mixture(3, False)),
    (
        "mixture_nll_full",
        losses.mixture_nll(n_components=3, covariance="full"),
        MIX_FULL,
        MIX_T,
        _torch_mixture(3, True),
    ),
    ("flow_nll", losses.flow_nll(**FLOW_OPTS), FLOW, FLOW_T, None),
    ("crps", losses.crps(members=4, noise_dim=1), ENS, ENS_T, None),
    ("energy_score", losses.energy_score(members=4, noise_dim=1), ENS, ENS_T, None),
    ("gaussian_crps", losses.gaussian_crps, P, GAUSS_T, None),
    (
        "mixture_crps_full",
        losses.mixture_crps(n_components=3, covariance="full"),
        MIX_FULL,
        MIX_T,
        None,
    ),
    # the flow's other layouts trace and compile for seconds each: the full run has them
    # (the coupled flow's own value check, `test_coupled_flow_same_on_numpy_jax_and_torch`,
    # stays in the fast tier)
    pytest.param(
        ("flow_nll_1d", losses.flow_nll(**FLOW_OPTS), FLOW[:, :26], FLOW_T[:, :1], None),
        marks=pytest.mark.slow,
        id="flow_nll_1d",
    ),
    pytest.param(
        ("flow_nll_coupled", losses.flow_nll(**COUPLED_OPTS), COUPLED, COUPLED_T, None),
        marks=pytest.mark.slow,
        id="flow_nll_coupled",
    ),
    ("cross_entropy_int", losses.cross_entropy, P, LABELS, _fn("cross_entropy")),
    ("cross_entropy_onehot", losses.cross_entropy, P, ONE_HOT, _fn("cross_entropy")),
    ("bce", losses.binary_cross_entropy, P * 3, BINARY, _fn("binary_cross_entropy_with_logits")),
    ("weighted", losses.mse + 0.25 * losses.huber(delta=0.5), P, T, None),
    (
        "per_key",
        Loss.per_key({"a": "mse", "b": "gaussian_nll"}, weights={"b": 0.5}),
        {"a": P, "b": P},
        {"a": T, "b": GAUSS_T},
        None,
    ),
]


# float32 gradients through the flow's chain of splines and mixing maps differ between jax
# and torch by float rounding (measured up to 2.6e-6 absolute, on gradients up to 0.3)
GRAD_ATOL = {"flow_nll": 1e-5, "flow_nll_1d": 1e-5, "flow_nll_coupled": 1e-5}


def _case_id(case):
    return case.id if hasattr(case, "marks") else case[0]


def _map(fn, x):
    return {k: fn(v) for k, v in x.items()} if isinstance(x, dict) else fn(x)


def _leaves(x):
    return [x[k] for k in sorted(x)] if isinstance(x, dict) else [x]


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_loss_same_on_numpy_jax_and_torch(case):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    torch = pytest.importorskip("torch")
    name, loss, pred, target, native = case
    ref = float(loss(pred, target))

    # jax: eager, and under jit with its gradient (one program: a flow's takes seconds)
    jp, jt = _map(jnp.asarray, pred), _map(jnp.asarray, target)
    value = loss(jp, jt)
    assert isinstance(value, jax.Array) and value.shape == () and value.dtype == jnp.float32
    assert float(value) == pytest.approx(ref, rel=1e-5, abs=1e-6)
    jit_value, jit_grads = jax.jit(jax.value_and_grad(loss))(jp, jt)
    assert float(jit_value) == pytest.approx(ref, rel=1e-5, abs=1e-6)
    jax_grads = _leaves(jit_grads)

    # torch: autograd through the same function
    tp = _map(lambda a: torch.tensor(a, requires_grad=True), pred)
    tt = _map(torch.as_tensor, target)
    tvalue = loss(tp, tt)
    assert isinstance(tvalue, torch.Tensor) and tvalue.shape == () and tvalue.dtype == torch.float32
    assert float(tvalue.detach()) == pytest.approx(ref, rel=1e-5, abs=1e-6)
    tvalue.backward()
    torch_grads = [leaf.grad.numpy() for leaf in _leaves(tp)]
    for gj, gt in zip(jax_grads, torch_grads, strict=True):
        np.testing.assert_allclose(np.asarray(gj), gt, rtol=1e-5, atol=GRAD_ATOL.get(name, 1e-7))

    # torch's own implementation agrees on value and gradient
    if native is not None:
        tp2 = torch.tensor(pred, requires_grad=True)
        expected = native(tp2, torch.as_tensor(target))
        assert float(expected.detach()) == pytest.approx(ref, rel=1e-5, abs=1e-6)
        expected.backward()
        np.testing.assert_allclose(tp2.grad.numpy(), torch_grads[0], rtol=1e-5, atol=1e-7)


def test_numpy_target_with_backend_prediction():
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    ref = float(losses.mse(P, T))
    assert float(jax.jit(lambda p: losses.mse(p, T))(jax.numpy.asarray(P))) == pytest.approx(ref)
    assert float(losses.mse(torch.as_tensor(P), T)) == pytest.approx(ref)


METRIC_CASES = [
    ("mae", P, T),
    ("rmse", P, T),
    ("r2", P, T),
    ("accuracy", P, LABELS),
    ("binary_accuracy", P, BINARY),
]


@pytest.mark.parametrize("name,pred,target", METRIC_CASES, ids=[c[0] for c in METRIC_CASES])
def test_metric_same_on_numpy_jax_and_torch(name, pred, target):
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    fn = metrics.get(name)
    ref = float(fn(pred, target))
    jp, jt = jax.numpy.asarray(pred), jax.numpy.asarray(target)
    assert float(fn(jp, jt)) == pytest.approx(ref, rel=1e-5)
    assert float(jax.jit(fn)(jp, jt)) == pytest.approx(ref, rel=1e-5)
    assert float(fn(torch.as_tensor(pred), torch.as_tensor(target))) == pytest.approx(ref, rel=1e-5)


def test_flow_transform_and_inverse_same_on_numpy_jax_and_torch():
    """The flow's two directions (what `log_prob` and `sample` run) give the same values
    on every array library, under `jax.jit` too."""
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    z_ref, ld_ref = losses.flow_transform(FLOW, FLOW_T, **FLOW_OPTS)
    inv_ref = losses.flow_inverse(FLOW, FLOW_T, **FLOW_OPTS)
    assert z_ref.dtype == np.float32 and ld_ref.shape == (8,)

    def both(p, t):
        z, ld = losses.flow_transform(p, t, **FLOW_OPTS)
        return z, ld, losses.flow_inverse(p, t, **FLOW_OPTS)

    jnp = jax.numpy
    for z, ld, inv in (
        jax.jit(both)(jnp.asarray(FLOW), jnp.asarray(FLOW_T)),
        both(torch.as_tensor(FLOW), torch.as_tensor(FLOW_T)),
    ):
        np.testing.assert_allclose(np.asarray(z), z_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(ld), ld_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(inv), inv_ref, rtol=1e-5, atol=1e-5)


def test_coupled_flow_same_on_numpy_jax_and_torch():
    """The coupled flow (`flow_hidden`): `log_prob` and the inverse on jax (under jit) and
    torch agree with numpy's float64 for the same parameters."""
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    pred, target = COUPLED.astype(np.float64), COUPLED_T.astype(np.float64)
    lp_ref = losses.flow_log_prob(pred, target, **COUPLED_OPTS)
    inv_ref = losses.flow_inverse(pred, target, **COUPLED_OPTS)

    def both(p, t):
        return (
            losses.flow_log_prob(p, t, **COUPLED_OPTS),
            losses.flow_inverse(p, t, **COUPLED_OPTS),
        )

    jnp = jax.numpy
    for lp, inv in (
        jax.jit(both)(jnp.asarray(COUPLED), jnp.asarray(COUPLED_T)),
        both(torch.as_tensor(COUPLED), torch.as_tensor(COUPLED_T)),
        both(torch.as_tensor(pred), torch.as_tensor(target)),  # float64 on torch
    ):
        np.testing.assert_allclose(np.asarray(lp), lp_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(inv), inv_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # the numpy path is `Flow`'s (test_core_flow.py); this is the promise
def test_broadcast_flow_same_on_numpy_jax_and_torch():
    """`broadcast=True` (one flow's parameters `(n, 1, w)` against `(n, k, d)` values) on
    jax under jit, with its gradient, and torch: numpy's float64 numbers."""
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    pred = COUPLED[:4, None].astype(np.float64)  # (4, 1, w)
    values = np.random.default_rng(7).normal(size=(4, 5, 3))
    opts = {**COUPLED_OPTS, "broadcast": True}
    lp_ref = losses.flow_log_prob(pred, values, **opts)
    inv_ref = losses.flow_inverse(pred, values, **opts)
    assert lp_ref.shape == (4, 5) and inv_ref.shape == (4, 5, 3)

    def both(p, t):
        return losses.flow_log_prob(p, t, **opts), losses.flow_inverse(p, t, **opts)

    jnp = jax.numpy
    for lp, inv in (
        jax.jit(both)(jnp.asarray(pred, jnp.float32), jnp.asarray(values, jnp.float32)),
        both(torch.as_tensor(pred), torch.as_tensor(values)),
    ):
        np.testing.assert_allclose(np.asarray(lp), lp_ref, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(np.asarray(inv), inv_ref, rtol=1e-5, atol=1e-4)
    # under jit: eager jax compiles each of the flow's many small operations on first use
    grad = jax.jit(jax.grad(lambda p, t: jnp.sum(losses.flow_log_prob(p, t, **opts))))(
        jnp.asarray(pred, jnp.float32), jnp.asarray(values, jnp.float32)
    )
    assert grad.shape == pred.shape and bool(jnp.all(jnp.isfinite(grad)))


def test_flow_nll_and_its_gradient_stay_finite_for_extreme_outputs():
    """Outputs of +-30 (saturated softmaxes and softplus) and targets far beyond the
    splines' bound: the loss and its gradients are finite on jax and torch."""
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    pred = (30.0 * np.random.default_rng(5).normal(size=FLOW.shape)).astype(np.float32)
    target = np.concatenate([FLOW_T[:4] * 10, FLOW_T[4:] * 0.01]).astype(np.float32)
    loss = losses.flow_nll(**FLOW_OPTS)
    # under jit: eager jax compiles each of the flow's many small operations on first use
    value, grad = jax.jit(jax.value_and_grad(loss))(
        jax.numpy.asarray(pred), jax.numpy.asarray(target)
    )
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
    tp = torch.tensor(pred, requires_grad=True)
    tvalue = loss(tp, torch.as_tensor(target))
    tvalue.backward()
    assert np.isfinite(float(tvalue.detach())) and torch.isfinite(tp.grad).all()

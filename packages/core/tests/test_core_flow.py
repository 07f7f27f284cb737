"""The flow head: `flow_nll`'s mathematics (a normalised density, exact inverse, exact
log-determinant), `Flow` (sample, log_prob, mean, a prior box), `NeuralForward(head="flow")`
in original units, and the head with its options through the registry."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import Flow, LocalModelRegistry, NeuralForward, RejectionError, losses
from pipekit_train.core._errors import ConfigError, IntegrityError
from pipekit_train.core.data import Normalizer
from pipekit_train.core.distributions._flow_math import flow_layer_width
from pipekit_train.core.testing._numpy_model import NumpyLinearOp

FACTORY = "pipekit_train.core.testing._numpy_model:linear"
OPTS = {"flow_layers": 3, "flow_bins": 5, "flow_bound": 2.0}


def params(d: int, scale: float = 0.4, seed: int = 0, batch: tuple[int, ...] = ()) -> np.ndarray:
    """Random flow parameters (a curved, skewed density for scale ~0.4)."""
    width = losses.flow_width(d, OPTS["flow_layers"], OPTS["flow_bins"])
    return scale * np.random.default_rng(seed).normal(size=(*batch, width))


def flow_op(d: int = 2, seed: int = 0) -> NumpyLinearOp:
    """A linear model from 2 inputs to `flow_width(d, 3, 5)` outputs."""
    width = losses.flow_width(d, OPTS["flow_layers"], OPTS["flow_bins"])
    rng = np.random.default_rng(seed)
    op = NumpyLinearOp(FACTORY, seed=0, in_size=2, out_size=width)
    op.model = op.model.replace(
        W=(0.2 * rng.normal(size=(2, width))).astype(np.float32),
        b=(0.3 * rng.normal(size=width)).astype(np.float32),
    )
    return op


def normalizer() -> Normalizer:
    return Normalizer({"x": [1.0, -2.0], "y": [100.0, -0.5]}, {"x": [2.0, 0.5], "y": [10.0, 0.01]})


def grid_over(draws: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    lo = np.quantile(draws, 1e-4, axis=0) - 1.5
    hi = np.quantile(draws, 1 - 1e-4, axis=0) + 1.5
    return tuple(np.linspace(a, b, n) for a, b in zip(lo, hi, strict=True))


# --------------------------------------------------------------------------- the mathematics


@pytest.mark.parametrize("d", [1, 2])
def test_log_prob_is_a_normalised_density(d: int) -> None:
    flow = Flow(params(d, seed=d), **OPTS)
    draws = flow.sample(np.random.default_rng(0), n=20_000)
    axes = grid_over(draws, 40_001 if d == 1 else 601)
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    cell = math.prod(float(a[1] - a[0]) for a in axes)
    total = np.exp(flow.log_prob(mesh)).sum() * cell
    assert total == pytest.approx(1.0, abs=2e-3)
    # and it is not a Gaussian: the mean of the draws is not the mode
    assert not np.allclose(draws.mean(0), mesh.reshape(-1, d)[np.argmax(flow.log_prob(mesh))])


def test_all_zero_parameters_are_the_standard_normal() -> None:
    """Zero raw values: identity splines and identity mixing maps."""
    width = losses.flow_width(3, 2, 4)
    theta = np.random.default_rng(0).normal(size=(5, 3)) * 3  # inside and outside the bound
    lp = losses.flow_log_prob(np.zeros((5, width)), theta, flow_layers=2, flow_bins=4)
    expected = -0.5 * (theta**2).sum(-1) - 1.5 * math.log(2 * math.pi)
    np.testing.assert_allclose(lp, expected, rtol=1e-12)


@pytest.mark.parametrize("d", [1, 3])
def test_inverse_and_forward_are_each_others_identity(d: int) -> None:
    rng = np.random.default_rng(1)
    pred = params(d, scale=0.8, batch=(500,))
    z = rng.normal(size=(500, d)) * 2.0  # some beyond the bound: the identity tails
    theta = losses.flow_inverse(pred, z, **OPTS)
    back, _ = losses.flow_transform(pred, theta, **OPTS)
    np.testing.assert_allclose(back, z, atol=1e-9)
    theta2 = rng.normal(size=(500, d)) * 3.0
    z2, _ = losses.flow_transform(pred, theta2, **OPTS)
    np.testing.assert_allclose(losses.flow_inverse(pred, z2, **OPTS), theta2, atol=1e-9)


def _assert_log_det_is_the_jacobians(
    pred: np.ndarray, theta: np.ndarray, log_det: np.ndarray, opts: dict
) -> None:
    """Each sample's log-determinant equals log|det| of a central-difference Jacobian of
    `flow_transform` (float64)."""
    eps, d = 1e-6, theta.shape[-1]
    for i in range(len(theta)):
        cols = []
        for j in range(d):
            step = np.zeros(d)
            step[j] = eps
            up, _ = losses.flow_transform(pred[i], theta[i] + step, **opts)
            down, _ = losses.flow_transform(pred[i], theta[i] - step, **opts)
            cols.append((up - down) / (2 * eps))
        jac = np.stack(cols, axis=-1)
        assert log_det[i] == pytest.approx(np.log(abs(np.linalg.det(jac))), abs=1e-5)


def test_log_determinant_is_the_jacobians() -> None:
    """The change-of-variables term equals log|det| of a finite-difference Jacobian."""
    pred = params(3, scale=0.8, batch=(6,))
    theta = np.random.default_rng(2).normal(size=(6, 3)) * 1.5
    _, log_det = losses.flow_transform(pred, theta, **OPTS)
    _assert_log_det_is_the_jacobians(pred[:6], theta[:6], log_det[:6], OPTS)


def test_samples_follow_the_density() -> None:
    """Kolmogorov–Smirnov on a 1-D flow (the CDF integrated from `log_prob`), and a
    2-D histogram against the density integrated over its cells."""
    flow = Flow(params(1, seed=3), **OPTS)
    draws = np.sort(flow.sample(np.random.default_rng(4), n=20_000)[:, 0])
    (axis,) = grid_over(draws[:, None], 40_001)
    density = np.exp(flow.log_prob(axis[:, None]))
    cdf = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(axis))])
    ecdf = np.arange(1, len(draws) + 1) / len(draws)
    ks = np.max(np.abs(np.interp(draws, axis, cdf) - ecdf))
    assert ks < 1.63 / math.sqrt(len(draws))  # the 1% critical value

    flow2 = Flow(params(2, seed=5), **OPTS)
    draws2 = flow2.sample(np.random.default_rng(6), n=200_000)
    edges = [np.quantile(draws2[:, i], np.linspace(0.02, 0.98, 9)) for i in range(2)]
    counts, _, _ = np.histogram2d(draws2[:, 0], draws2[:, 1], bins=edges)
    centres = [np.linspace(e[:-1], e[1:], 41, axis=-1) for e in edges]  # 40 sub-cells per cell
    expected = np.zeros_like(counts)
    for a in range(8):
        for b in range(8):
            mesh = np.stack(np.meshgrid(centres[0][a], centres[1][b], indexing="ij"), axis=-1)
            dens = np.exp(flow2.log_prob(mesh))
            expected[a, b] = np.trapezoid(np.trapezoid(dens, centres[1][b]), centres[0][a])
    expected *= len(draws2)
    assert np.max(np.abs(counts - expected) / np.sqrt(expected)) < 4.5


def test_flow_nll_is_minus_the_mean_log_prob() -> None:
    pred = params(2, batch=(16,), seed=7)
    theta = np.random.default_rng(8).normal(size=(16, 2))
    loss = losses.flow_nll(**OPTS)
    expected = -np.mean(Flow.from_output(pred, **OPTS).log_prob(theta))
    assert float(loss(pred, theta)) == pytest.approx(expected, rel=1e-12)
    assert losses.get("flow_nll").params == {
        "flow_layers": 4,
        "flow_bins": 8,
        "flow_bound": 3.0,
        "flow_hidden": 0,
    }
    assert loss.describe() == {"name": "flow_nll", "params": {**OPTS, "flow_hidden": 0}}


def test_flow_nll_refuses_bad_options_and_widths() -> None:
    with pytest.raises(ConfigError, match=r"Received: flow_layers=0"):
        losses.flow_nll(flow_layers=0)
    with pytest.raises(ConfigError, match=r"Received: flow_bins=1"):
        losses.flow_nll(flow_bins=1)
    with pytest.raises(ConfigError, match=r"Received: flow_bound=-1"):
        losses.flow_nll(flow_bound=-1)
    pred = np.zeros((4, losses.flow_width(2, 3, 5) - 1))
    with pytest.raises(
        ConfigError, match=r"Received: pred.shape=\(4, 101\), target.shape=\(4, 2\).*102 outputs"
    ):
        losses.flow_nll(**OPTS)(pred, np.zeros((4, 2)))
    with pytest.raises(ConfigError, match=r"trailing axis"):
        losses.flow_nll(**OPTS)(np.zeros((4, 102)), np.zeros(4))


# --------------------------------------------------------------------------- the distribution


def test_flow_mean_sample_and_batch_indexing() -> None:
    flow = Flow(params(2, batch=(3,), seed=9), **OPTS, loc=[1.0, -1.0], scale=[2.0, 0.5])
    assert flow.batch_shape == (3,) and flow.dim == 2 and len(flow) == 3
    draws = flow.sample(np.random.default_rng(0), n=40_000)
    assert draws.shape == (40_000, 3, 2) and flow.log_prob(draws).shape == (40_000, 3)
    assert flow.sample(np.random.default_rng(0)).shape == (3, 2)
    # the Monte Carlo mean: fixed seed, within a few standard errors of an independent one
    np.testing.assert_array_equal(flow.mean, Flow(flow.params, **OPTS, loc=[1.0, -1.0],
                                                  scale=[2.0, 0.5]).mean)  # fmt: skip
    stderr = draws.std(0) / math.sqrt(10_000)
    assert np.all(np.abs(flow.mean - draws.mean(0)) < 5 * stderr)
    one = flow[1]
    assert one.batch_shape == () and one.sample(np.random.default_rng(1), n=4).shape == (4, 2)
    np.testing.assert_allclose(one.log_prob(draws[:5, 1]), flow.log_prob(draws[:5])[:, 1])
    with pytest.raises(ConfigError, match=r"2 values on its last axis. Received: value.shape"):
        flow.log_prob(np.zeros(3))
    with pytest.raises(ConfigError, match=r"output width must be.*Received: output shape \(7,\)"):
        Flow(np.zeros(7), **OPTS)
    with pytest.raises(ConfigError, match=r"Received: n=0"):
        flow.sample(np.random.default_rng(0), n=0)


@pytest.mark.parametrize("hidden", [0, 4])
def test_one_flow_scores_many_values_without_copies(
    hidden: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`broadcast=True`: a flow's parameters `(n, 1, w)` against `(n, k, d)` values give
    the very numbers of a copy per value; `Flow` takes that path for draws and i.i.d.
    points (several values per flow), in chunks along both axes."""
    opts = {**OPTS, "flow_hidden": hidden}
    width = losses.flow_width(3, OPTS["flow_layers"], OPTS["flow_bins"], hidden)
    pred = 0.4 * np.random.default_rng(1).normal(size=(5, 1, width))
    values = np.random.default_rng(2).normal(size=(5, 7, 3))
    copies = np.repeat(pred, 7, axis=1)
    np.testing.assert_array_equal(
        losses.flow_log_prob(pred, values, **opts, broadcast=True),
        losses.flow_log_prob(copies, values, **opts),
    )
    np.testing.assert_array_equal(
        losses.flow_inverse(pred, values, **opts, broadcast=True),
        losses.flow_inverse(copies, values, **opts),
    )
    with pytest.raises(ConfigError, match=r"Received: pred.shape=\(5, 1, \d+\), target.shape"):
        losses.flow_log_prob(pred, values, **opts)  # the loss's strict shapes by default
    with pytest.raises(ConfigError, match=r"or 1 on a leading axis, with broadcast=True"):
        losses.flow_log_prob(copies, values[:, :1], **opts, broadcast=True)

    flow = Flow(pred[:, 0], **opts, loc=[1.0, -1.0, 0.0], scale=[2.0, 0.5, 1.0])
    points = values.transpose(1, 0, 2)  # (7, 5, 3): seven values per flow
    one_by_one = np.stack([flow.log_prob(p) for p in points])  # one value per flow
    monkeypatch.setattr("pipekit_train.core.distributions._flow._CHUNK", 3 * width)
    np.testing.assert_array_equal(flow.log_prob(points), one_by_one)
    z = np.random.default_rng(3).standard_normal((7, 5, 3))
    draws = flow.sample(np.random.default_rng(3), n=7)
    expected = [flow.loc + flow.scale * losses.flow_inverse(flow.params, zi, **opts) for zi in z]
    np.testing.assert_array_equal(draws, np.stack(expected))


def test_within_a_box_rejects_and_renormalises() -> None:
    flow = Flow(params(2, seed=10), **OPTS, loc=[0.0, 5.0], scale=[1.0, 2.0])
    low, high = np.array([-0.5, 4.0]), np.array([1.0, 6.0])
    box = flow.within(low, high)
    draws = box.sample(np.random.default_rng(0), n=5000)
    assert draws.shape == (5000, 2) and np.all((draws >= low) & (draws <= high))
    free = flow.sample(np.random.default_rng(1), n=50_000)
    inside = np.all((free >= low) & (free <= high), axis=1)
    assert 0.05 < box.acceptance < 0.95
    assert box.acceptance == pytest.approx(inside.mean(), abs=0.015)
    # -inf outside; inside, the density over the box integrates to 1 (up to the MC mass)
    assert box.log_prob(np.array([2.0, 5.0])) == -np.inf
    axes = [np.linspace(a, b, 601) for a, b in zip(low, high, strict=True)]
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    total = np.trapezoid(np.trapezoid(np.exp(box.log_prob(mesh)), axes[1]), axes[0])
    assert total == pytest.approx(1.0, abs=0.03)
    assert np.all((box.mean >= low) & (box.mean <= high))
    with pytest.raises(ConfigError, match=r"`low` must be below `high`"):
        flow.within([1.0, 1.0], [0.0, 2.0])
    with pytest.raises(RejectionError, match=r"acceptance about"):
        flow.within([50.0, 50.0], [51.0, 51.0]).sample(np.random.default_rng(0), n=2)


# --------------------------------------------------------------------------- head and registry


def test_flow_head_is_in_original_units() -> None:
    op, norm = flow_op(), normalizer()
    forward = NeuralForward(op, normalizer=norm, head="flow", **OPTS)
    states = np.array([[1.0, -2.0], [3.0, 0.0], [-1.0, -2.5]], dtype=np.float32)
    flow = forward.distribution(states)
    assert isinstance(flow, Flow) and flow.batch_shape == (3,) and flow.dim == 2

    raw = Flow.from_output(op(norm.apply({"x": states})["x"]), **OPTS)
    scale, offset = np.array([10.0, 0.01]), np.array([100.0, -0.5])
    y = np.array([[101.0, -0.49], [95.0, -0.52], [110.0, -0.5]])
    expected = raw.log_prob((y - offset) / scale) - np.log(scale).sum()
    np.testing.assert_allclose(flow.log_prob(y), expected, rtol=1e-9)
    # the same draws, mapped to original units
    np.testing.assert_allclose(
        flow.sample(np.random.default_rng(0), n=7),
        raw.sample(np.random.default_rng(0), n=7) * scale + offset,
        rtol=1e-12,
    )
    np.testing.assert_allclose(forward(states), flow.mean)
    single = forward.distribution(states[1])
    np.testing.assert_allclose(single.params, flow.params[1])
    np.testing.assert_allclose(single.log_prob(y[1]), flow.log_prob(y)[1])
    # residual: the flow moves by the state
    res = NeuralForward(op, residual=True, head="flow", **OPTS)
    plain = NeuralForward(op, head="flow", **OPTS)
    np.testing.assert_allclose(
        res.distribution(states).sample(np.random.default_rng(2), n=3),
        plain.distribution(states).sample(np.random.default_rng(2), n=3) + states,
        rtol=1e-12,
    )


def test_flow_head_validation() -> None:
    with pytest.raises(ConfigError, match=r"`flow_layers` is only for head='flow'"):
        NeuralForward(flow_op(), head="mixture", n_components=2, flow_layers=3)
    with pytest.raises(ConfigError, match=r"Received: flow_bins=1"):
        NeuralForward(flow_op(), head="flow", flow_bins=1)
    wrong = NeuralForward(flow_op(), head="flow")  # the defaults: 4 layers of 8 bins
    with pytest.raises(
        ConfigError, match=r"flow_layers=4 and flow_bins=8.*Received: output shape \(1, 102\)"
    ):
        wrong(np.zeros(2))
    config = NeuralForward(flow_op(), head="flow", **OPTS).get_config()
    assert config["head"] == "flow" and config["head_options"] == OPTS


def test_flow_head_travels_through_the_registry(tmp_path: Path) -> None:
    op, norm = flow_op(), normalizer()
    registry = LocalModelRegistry(tmp_path / "models")
    with pytest.raises(ConfigError, match=r"unknown keys for head='flow'. Received: \['bins'\]"):
        registry.register("posterior", op, head="flow", head_options={"bins": 5})
    assert registry.versions("posterior") == []  # nothing written
    record = registry.register("posterior", op, normalizer=norm, head="flow", head_options=OPTS)
    assert record.head == "flow" and record.head_options == OPTS

    loaded_record, loaded = registry.load_record_and_model("posterior")
    forward = NeuralForward.from_record(loaded_record, loaded)
    assert forward.head == "flow" and forward.head_options == OPTS
    states = np.array([[0.5, -1.0], [2.0, -2.0]], dtype=np.float32)
    expected = NeuralForward(op, normalizer=norm, head="flow", **OPTS).distribution(states)
    got = forward.distribution(states)
    np.testing.assert_array_equal(got.params, expected.params)
    np.testing.assert_array_equal(
        got.sample(np.random.default_rng(0), 5), expected.sample(np.random.default_rng(0), 5)
    )

    path = tmp_path / "models/posterior/1/manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["head_options"] == OPTS
    manifest["head_options"] = {**OPTS, "flow_layers": 4}
    path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="does not match its digest"):
        registry.load("posterior")


# --------------------------------------------------------------------------- coupled layers

HOPTS = {**OPTS, "flow_hidden": 4}


def coupled_params(
    d: int, scale: float = 0.4, seed: int = 0, batch: tuple[int, ...] = ()
) -> np.ndarray:
    """Random parameters of the coupled flow (`flow_hidden=4`), conditioner included."""
    width = losses.flow_width(d, OPTS["flow_layers"], OPTS["flow_bins"], HOPTS["flow_hidden"])
    return scale * np.random.default_rng(seed).normal(size=(*batch, width))


def embed(plain: np.ndarray, d: int, conditioner: np.ndarray | None = None) -> np.ndarray:
    """Element-wise parameters placed in the coupled layout: each layer's block first, its
    conditioner values (zero, or `conditioner`'s) after it."""
    layers, bins, hidden = OPTS["flow_layers"], OPTS["flow_bins"], HOPTS["flow_hidden"]
    small, big = flow_layer_width(d, bins), flow_layer_width(d, bins, hidden)
    out = np.zeros((*plain.shape[:-1], layers * big))
    for i in range(layers):
        out[..., i * big : i * big + small] = plain[..., i * small : (i + 1) * small]
        if conditioner is not None:
            part = conditioner[..., i * (big - small) : (i + 1) * (big - small)]
            out[..., i * big + small : (i + 1) * big] = part
    return out


def test_coupled_layout_widths() -> None:
    """The conditioner's values follow each element-wise block: `H*d_a + H + P*H + P`."""
    d, k, h = 5, OPTS["flow_bins"], 4
    p = 3 * (3 * k - 1)  # d_b = 3 transformed values
    extra = h * 2 + h + p * h + p
    assert flow_layer_width(d, k, h) == flow_layer_width(d, k) + extra
    assert losses.flow_width(d, 3, k, h) == 3 * flow_layer_width(d, k, h)
    assert losses.flow_width(d, 3, k, 0) == losses.flow_width(d, 3, k)


@pytest.mark.parametrize("d", [2, 3])
def test_zero_conditioner_is_the_element_wise_flow(d: int) -> None:
    plain = params(d, scale=0.8, seed=11, batch=(40,))
    coupled = embed(plain, d)
    theta = np.random.default_rng(12).normal(size=(40, d)) * 2.0
    np.testing.assert_allclose(
        losses.flow_log_prob(coupled, theta, **HOPTS),
        losses.flow_log_prob(plain, theta, **OPTS),
        rtol=1e-13,
        atol=1e-13,
    )
    z = np.random.default_rng(13).normal(size=(40, d)) * 2.0
    np.testing.assert_allclose(
        losses.flow_inverse(coupled, z, **HOPTS), losses.flow_inverse(plain, z, **OPTS), atol=1e-13
    )


@pytest.mark.parametrize("d", [3, 5])
def test_coupled_inverse_and_log_determinant_are_exact(d: int) -> None:
    """float64: `inverse(transform(theta)) == theta`, and the log-determinant equals log|det|
    of a central-difference Jacobian of `flow_transform`."""
    pred = coupled_params(d, scale=0.6, seed=d, batch=(200,))
    theta = np.random.default_rng(20 + d).normal(size=(200, d)) * 2.0  # some beyond the bound
    z, log_det = losses.flow_transform(pred, theta, **HOPTS)
    np.testing.assert_allclose(losses.flow_inverse(pred, z, **HOPTS), theta, atol=1e-9)
    z2 = np.random.default_rng(30 + d).normal(size=(200, d)) * 2.0
    back, _ = losses.flow_transform(pred, losses.flow_inverse(pred, z2, **HOPTS), **HOPTS)
    np.testing.assert_allclose(back, z2, atol=1e-9)
    _assert_log_det_is_the_jacobians(pred[:6], theta[:6], log_det[:6], HOPTS)


def test_the_second_half_depends_on_the_first() -> None:
    """One layer, identity mixing and splines: the first value passes through unchanged
    and the second one's spline moves with it only when the conditioner is nonzero."""
    opts = {**HOPTS, "flow_layers": 1}
    d, small = 2, flow_layer_width(2, OPTS["flow_bins"])
    width = losses.flow_width(d, 1, OPTS["flow_bins"], HOPTS["flow_hidden"])
    pred = np.zeros((2, width))
    pred[:, small:] = np.random.default_rng(14).normal(size=width - small)  # the conditioner
    theta = np.array([[-1.0, 0.5], [1.0, 0.5]])  # the same second value
    z, _ = losses.flow_transform(pred, theta, **opts)
    np.testing.assert_allclose(z[:, 0], theta[:, 0], atol=1e-12)  # identity spline of A
    assert abs(z[0, 1] - z[1, 1]) > 1e-3  # B's spline moved with A
    still, _ = losses.flow_transform(np.zeros((2, width)), theta, **opts)
    np.testing.assert_allclose(still, theta, atol=1e-12)


def test_coupled_flow_has_a_normalised_density_and_follows_it() -> None:
    flow = Flow(coupled_params(2, seed=15), **OPTS, flow_hidden=4)
    assert flow.dim == 2 and flow.options == HOPTS and "flow_hidden=4" in repr(flow)
    draws = flow.sample(np.random.default_rng(0), n=20_000)
    axes = grid_over(draws, 601)
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    cell = math.prod(float(a[1] - a[0]) for a in axes)
    assert np.exp(flow.log_prob(mesh)).sum() * cell == pytest.approx(1.0, abs=2e-3)
    # draws and density agree: the share of draws in a quadrant against its mass
    quad = (mesh[..., 0] < np.median(draws[:, 0])) & (mesh[..., 1] < np.median(draws[:, 1]))
    mass = np.exp(flow.log_prob(mesh))[quad].sum() * cell
    share = np.mean((draws[:, 0] < np.median(draws[:, 0])) & (draws[:, 1] < np.median(draws[:, 1])))
    assert mass == pytest.approx(share, abs=0.02)


def test_flow_hidden_is_refused_when_bad() -> None:
    with pytest.raises(ConfigError, match=r"Received: flow_hidden=-1\. Pass e\.g\."):
        losses.flow_nll(flow_hidden=-1)
    with pytest.raises(ConfigError, match=r"Received: flow_hidden=2\.5"):
        losses.flow_nll(flow_hidden=2.5)
    with pytest.raises(ConfigError, match=r"Received: flow_hidden=True"):
        losses.flow_nll(flow_hidden=True)
    with pytest.raises(
        ConfigError,
        match=r"Received: flow_hidden=16, but the target has 1 value\. Use flow_hidden=0",
    ):
        losses.flow_nll(flow_hidden=16)(np.zeros((4, 100)), np.zeros((4, 1)))
    with pytest.raises(ConfigError, match=r"Received: flow_hidden=16, but the target has 1 value"):
        losses.flow_width(1, flow_hidden=16)
    with pytest.raises(ConfigError, match=r"flow_hidden=4.*flow_width\(2, 3, 5, 4\)"):
        losses.flow_nll(**HOPTS)(np.zeros((4, 102)), np.zeros((4, 2)))
    with pytest.raises(ConfigError, match=r"Received: flow_hidden=-2"):
        NeuralForward(flow_op(), head="flow", flow_hidden=-2)
    with pytest.raises(ConfigError, match=r"flow_bins=5 and flow_hidden=4 the model's output"):
        Flow(np.zeros(102), **OPTS, flow_hidden=4)
    assert losses.flow_nll(**HOPTS).describe() == {"name": "flow_nll", "params": HOPTS}


def test_coupled_flow_head_travels_through_the_registry(tmp_path: Path) -> None:
    """The options with `flow_hidden` are recorded; a record without it reads as 0; the
    loaded `Flow` is in original units."""
    d, hidden = 2, HOPTS["flow_hidden"]
    width = losses.flow_width(d, OPTS["flow_layers"], OPTS["flow_bins"], hidden)
    rng = np.random.default_rng(16)
    op = NumpyLinearOp(FACTORY, seed=0, in_size=2, out_size=width)
    op.model = op.model.replace(
        W=(0.2 * rng.normal(size=(2, width))).astype(np.float32),
        b=(0.3 * rng.normal(size=width)).astype(np.float32),
    )
    norm = normalizer()
    registry = LocalModelRegistry(tmp_path / "models")
    record = registry.register("posterior", op, normalizer=norm, head="flow", head_options=HOPTS)
    assert record.head_options == HOPTS
    forward = NeuralForward.from_record(*registry.load_record_and_model("posterior"))
    assert forward.head_options == HOPTS
    states = np.array([[0.5, -1.0], [2.0, -2.0]], dtype=np.float32)
    flow = forward.distribution(states)
    assert isinstance(flow, Flow) and flow.flow_hidden == hidden and flow.batch_shape == (2,)
    raw = Flow.from_output(op(norm.apply({"x": states})["x"]), **HOPTS)
    scale, offset = np.array([10.0, 0.01]), np.array([100.0, -0.5])
    y = np.array([[101.0, -0.49], [95.0, -0.52]])
    expected = raw.log_prob((y - offset) / scale) - np.log(scale).sum()
    np.testing.assert_allclose(flow.log_prob(y), expected, rtol=1e-9)
    np.testing.assert_allclose(
        flow.sample(np.random.default_rng(0), n=7),
        raw.sample(np.random.default_rng(0), n=7) * scale + offset,
        rtol=1e-12,
    )
    # an element-wise record keeps its options as before (no `flow_hidden` key): read as 0
    plain = registry.register("plain", flow_op(), head="flow", head_options=OPTS)
    assert plain.head_options == OPTS
    loaded = NeuralForward.from_record(*registry.load_record_and_model("plain"))
    assert loaded.distribution(states).flow_hidden == 0
    assert losses.get("flow_nll").params["flow_hidden"] == 0

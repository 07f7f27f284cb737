"""Ensembles trained by a proper score: the losses, the members' noise, the generative
head and the ensemble rollout loss, against hand-written numpy references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipekit_train.core import ConfigError, NeuralForward, Rollout, TrainingLoop, losses
from pipekit_train.core.data import Normalizer
from pipekit_train.core.losses._ensemble import ensemble_params, erf
from pipekit_train.core.rollout import RolloutSpec, member_noise, rollout_loss, rollout_noise
from pipekit_train.core.rollout._train import rollout_spec
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, golden_rollout_task


def _pairwise_crps(x: np.ndarray, y: np.ndarray, denominator: str) -> float:
    """The CRPS of `x (B, M, d)` against `y (B, d)`, every pair written out."""
    b, m, _ = x.shape
    total = 0.0
    for s in range(b):
        skill = np.mean([np.abs(x[s, i] - y[s]) for i in range(m)], axis=0)
        pairs = sum(np.abs(x[s, i] - x[s, j]) for i in range(m) for j in range(m))
        scale = 2 * m * (m - 1) if denominator == "fair" else 2 * m * m
        total += float(np.mean(skill - pairs / scale))
    return total / b


def test_crps_fair_and_standard_match_the_pairwise_sums() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 5, 3)), rng.standard_normal((6, 3))
    assert losses.crps(x, y) == pytest.approx(_pairwise_crps(x, y, "fair"), rel=1e-12)
    standard = losses.crps(alpha=0.0)(x, y)
    assert standard == pytest.approx(_pairwise_crps(x, y, "standard"), rel=1e-12)
    almost = losses.crps(alpha=0.95)(x, y)  # alpha * fair + (1 - alpha) * standard
    want = 0.95 * _pairwise_crps(x, y, "fair") + 0.05 * _pairwise_crps(x, y, "standard")
    assert almost == pytest.approx(want, rel=1e-12)


def test_fair_crps_is_unbiased_for_small_ensembles() -> None:
    """Averaged over many 3-member ensembles of N(0, 1), the fair CRPS is the closed form
    of N(0, 1); the standard one is biased upwards by about 1 / (M sqrt(pi))."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((40_000, 3, 1)), rng.standard_normal((40_000, 1))
    mu = np.zeros((40_000, 2))  # mean 0, log-variance 0
    closed = losses.gaussian_crps(mu, y)
    assert losses.crps(x, y) == pytest.approx(closed, abs=0.01)
    assert losses.crps(alpha=0.0)(x, y) - closed == pytest.approx(
        1 / (3 * math.sqrt(math.pi)), abs=0.02
    )


def test_gaussian_crps_matches_the_closed_form_and_erf_is_accurate() -> None:
    z = np.linspace(-6, 6, 2001)
    want = np.array([math.erf(v) for v in z])
    assert np.max(np.abs(erf(np, z) - want)) < 2e-7
    rng = np.random.default_rng(2)
    mean, log_var, y = rng.standard_normal((3, 50, 4))
    sigma = np.exp(0.5 * log_var)
    t = (y - mean) / sigma
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in t.ravel()]).reshape(t.shape))
    pdf = np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
    closed = sigma * (t * (2 * cdf - 1) + 2 * pdf - 1 / math.sqrt(math.pi))
    got = losses.gaussian_crps(np.concatenate([mean, log_var], axis=-1), y)
    assert got == pytest.approx(closed.mean(), rel=1e-6)


def test_energy_score_matches_pairs_and_is_the_crps_in_one_dimension() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((4, 6, 2, 3)), rng.standard_normal((4, 2, 3))
    flat, truth = x.reshape(4, 6, -1), y.reshape(4, -1)
    want = np.mean(
        [
            np.mean([np.linalg.norm(flat[s, i] - truth[s]) for i in range(6)])
            - sum(np.linalg.norm(flat[s, i] - flat[s, j]) for i in range(6) for j in range(6))
            / (2 * 6 * 5)
            for s in range(4)
        ]
    )
    assert losses.energy_score(x, y) == pytest.approx(want, rel=1e-12)
    one = x[..., :1, :1].reshape(4, 6, 1)
    assert losses.energy_score(one, y[:, :1, 0]) == pytest.approx(
        losses.crps(one, y[:, :1, 0]), rel=1e-12
    )


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: losses.crps(members=1), "members.*>= 2"),
        (lambda: losses.crps(noise_dim=0), "noise_dim.*>= 1"),
        (lambda: losses.crps(alpha=1.5), "alpha.*in \\[0, 1\\]"),
        (lambda: losses.energy_score(members=True), "members"),
    ],
)
def test_bad_ensemble_parameters_are_refused(make, match) -> None:
    with pytest.raises(ConfigError, match=match):
        make()


def test_ensemble_shapes_and_noise_dim_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"\(B, M, \*value\)"):
        losses.crps(np.zeros((4, 3)), np.zeros((4, 3)))
    with pytest.raises(ConfigError, match="at least two members"):
        losses.crps(np.zeros((4, 1, 3)), np.zeros((4, 3)))
    with pytest.raises(ConfigError, match="needs the width of the noise"):
        ensemble_params(losses.crps.describe())
    assert ensemble_params(losses.crps(members=6, noise_dim=3).describe()) == (6, 3)
    assert ensemble_params(losses.mse.describe()) is None


def test_member_noise_is_a_pure_function_of_seed_and_index() -> None:
    a = member_noise(7, 3, (4, 2, 3, 5))
    assert np.array_equal(a, member_noise(7, 3, (4, 2, 3, 5)))
    assert not np.array_equal(a, member_noise(7, 4, (4, 2, 3, 5)))
    assert not np.array_equal(a, member_noise(8, 3, (4, 2, 3, 5)))
    assert np.array_equal(a[2:], member_noise(7, 3, (2, 2, 3, 5), shard=(1, 2)))
    val = member_noise(7, 3, (4, 2, 3, 5), stream="validation")
    assert not np.array_equal(a, val)
    # its own stream: not the input noise of the same batch
    assert not np.allclose(a[:, 0, 0, :], rollout_noise(7, 3, (4, 5), 1.0))
    assert a.dtype == np.float32 and abs(float(a.std()) - 1) < 0.2


def _mlp(seed: int, sizes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        out += [
            rng.uniform(-1, 1, (fan_in, fan_out)) / np.sqrt(fan_in),
            rng.uniform(-0.1, 0.1, fan_out),
        ]
    return out


def _apply(weights: list[np.ndarray], u: np.ndarray) -> np.ndarray:
    h = np.tanh(u @ weights[0] + weights[1])
    return h @ weights[2] + weights[3]


def test_ensemble_rollout_loss_matches_a_hand_written_loop() -> None:
    """Every member rolled out from its own noise through k steps, scored together per
    step: the library's loss and ensemble-mean predictions equal a plain loop."""
    train, _ = golden_rollout_task()
    norm = train.normalizer()
    batch = norm.apply(train.get_batch(np.arange(5)))
    x, y = np.asarray(batch["x"], np.float64), np.asarray(batch["y"], np.float64)
    b, m, k, w = 5, 3, 4, 2
    z = member_noise(0, 0, (b, m, k, w)).astype(np.float64)
    weights = _mlp(0, (2 + w, 8, 2))
    spec = rollout_spec(norm, True, 1, noise_dim=w)
    loss, pred = rollout_loss(
        np,
        spec=spec,
        model_fn=lambda u: _apply(weights, u),
        x=x,
        y=y,
        weights=[1.0, 1.0, 0.5, 0.5],
        backprop="full",
        loss_fn=losses.crps(members=m, noise_dim=w),
        member_noise=z,
    )
    mx, sx = norm.mean["x"], norm.std["x"]
    my, sy = norm.mean["y"], norm.std["y"]
    start = x * sx + mx
    truth, states = start.copy(), np.repeat(start[:, None], m, axis=1)  # (B, M, d)
    total, means, previous = 0.0, [], start
    for i, weight in enumerate([1.0, 1.0, 0.5, 0.5]):
        truth = truth + (y[:, i] * sy + my)
        u = np.concatenate([(states - mx) / sx, z[:, :, i]], axis=-1)
        states = states + (_apply(weights, u) * sy + my)
        total += weight * _pairwise_crps((states - mx) / sx, (truth - mx) / sx, "fair")
        mean = states.mean(axis=1)
        means.append(((mean - previous) - my) / sy)
        previous = mean
    assert float(loss) == pytest.approx(total / 3.0, rel=1e-10)
    np.testing.assert_allclose(pred, np.stack(means, axis=1), rtol=1e-10, atol=1e-12)


def test_one_member_per_row_is_its_absolute_error_and_pairs_are_one_step() -> None:
    """`state.predict`'s path: pairs with one member each (the noise given) predict one
    step; the loss is that member's absolute error (the CRPS of one member)."""
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((6, 2)), rng.standard_normal((6, 2))
    z = rng.standard_normal((6, 1, 1, 3))
    weights = _mlp(1, (5, 8, 2))
    spec = rollout_spec(None, False, 1, noise_dim=3)
    loss, pred = rollout_loss(
        np,
        spec=spec,
        model_fn=lambda u: _apply(weights, u),
        x=x,
        y=y,
        weights=[1.0, 1.0, 1.0],  # a 3-step run: pairs still predict one step
        backprop="full",
        loss_fn=losses.crps(members=4, noise_dim=3),
        member_noise=z,
    )
    out = _apply(weights, np.concatenate([x, z[:, 0, 0]], axis=-1))
    np.testing.assert_allclose(pred[:, 0], out, rtol=1e-12)
    assert float(loss) == pytest.approx(float(np.mean(np.abs(out - y))), rel=1e-12)


def test_ensemble_rollout_loss_refusals() -> None:
    spec = rollout_spec(None, True, 1, noise_dim=2)
    kw = dict(
        spec=spec,
        model_fn=lambda u: u[..., :2],
        x=np.zeros((3, 2)),
        y=np.zeros((3, 2, 2)),
        weights=[1.0, 1.0],
        backprop="full",
        loss_fn=losses.crps(members=2, noise_dim=2),
    )
    with pytest.raises(ConfigError, match="without 'member_noise'"):
        rollout_loss(np, **kw)
    with pytest.raises(ConfigError, match=r"member_noise.shape=\(3, 2, 1, 2\)"):
        rollout_loss(np, **kw, member_noise=np.zeros((3, 2, 1, 2)))  # k' < k
    with pytest.raises(ConfigError, match="diverted chain"):
        rollout_loss(np, **kw, member_noise=np.zeros((3, 2, 2, 2)), reference=lambda s: s)


def test_generative_spec_and_forward() -> None:
    """The generative head's step: zero noise (the central member) or the given draws;
    `NeuralForward` on the host agrees with the spec, and draws per step with a seed."""
    weights = _mlp(2, (5, 8, 2))
    norm = Normalizer(
        mean={"x": np.array([0.5, -1.0]), "y": np.zeros(2)},
        std={"x": np.array([2.0, 3.0]), "y": np.ones(2)},
    )
    spec = RolloutSpec(
        normalizer=norm, residual=True, head="generative", head_options={"noise_dim": 3}
    )
    assert spec.noise_shapes(4, (2,)) == {"normal": (4, 3), "uniform": None}
    assert spec.probe_shape((4, 2)) == (4, 5)
    x = np.random.default_rng(5).standard_normal((4, 2))
    normal = np.random.default_rng(6).standard_normal((4, 3))
    model = lambda u: _apply(weights, u)  # noqa: E731
    central = spec.bind(np, state_shape=(2,), out_shape=(2,))(model, x)
    drawn = spec.bind(np, state_shape=(2,), out_shape=(2,), stochastic=True)(model, x, normal, None)
    u = (x - norm.mean["x"]) / norm.std["x"]
    np.testing.assert_allclose(
        central, x + _apply(weights, np.concatenate([u, np.zeros((4, 3))], -1))
    )
    np.testing.assert_allclose(drawn, x + _apply(weights, np.concatenate([u, normal], -1)))
    forward = NeuralForward(model, normalizer=norm, residual=True, head="generative", noise_dim=3)
    np.testing.assert_allclose(forward(x), central, rtol=1e-12)
    np.testing.assert_allclose(forward(x, noise=normal), drawn, rtol=1e-12)
    a = forward.rollout(x, 5, stochastic=True, seed=3)
    assert np.array_equal(a, forward.rollout(x, 5, stochastic=True, seed=3))
    assert not np.allclose(a[-1], forward.rollout(x, 5)[-1])
    with pytest.raises(ConfigError, match="not a distribution in closed form"):
        forward.distribution(x)
    with pytest.raises(ConfigError, match="noise_dim.*required"):
        NeuralForward(model, head="generative")
    with pytest.raises(ConfigError, match="noise_dim.*required"):
        NeuralForward(model, head="gaussian", noise_dim=2)


def test_an_ensemble_loss_needs_a_rollout_and_the_state_alone() -> None:
    train, val = golden_rollout_task()
    kw = dict(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=2),
        adapter=NumpyAdapter(),
        data=train,
        loss=losses.crps(members=2, noise_dim=2),
        max_steps=1,
    )
    with pytest.raises(ConfigError, match="rollout=Rollout\\(steps=1\\)"):
        TrainingLoop(**kw)
    with pytest.raises(ConfigError, match="needs the width of the noise"):
        TrainingLoop(**{**kw, "loss": "crps", "rollout": Rollout(steps=4, residual=True)})


def test_a_stochastic_cycle_draws_members_and_repeats_with_its_seed() -> None:
    """`Cycle(stochastic=True)` on the host: generative members with fresh noise each step
    (a hook in between), the same seed the same run; refused for a plain callable or a
    point head."""
    from pipekit_train.core import Cycle

    weights = _mlp(3, (4, 8, 2))
    forward = NeuralForward(
        lambda u: _apply(weights, u), residual=True, head="generative", noise_dim=2
    )
    x0 = np.zeros((6, 2))
    seen = []

    def hook(step: int, state: np.ndarray) -> None:
        seen.append(step)

    run = Cycle(forward, 5, hook=hook, stochastic=True, seed=4).run(x0)
    again = Cycle(forward, 5, hook=hook, stochastic=True, seed=4).run(x0)
    assert np.array_equal(run, again) and seen == [1, 2, 3, 4, 5] * 2
    assert float(run[-1].std(axis=0).min()) > 0  # the members spread
    central = Cycle(forward, 5).run(x0)
    assert float(central[-1].std(axis=0).max()) < 1e-12  # zero noise: one member repeated
    with pytest.raises(ConfigError, match="must be a NeuralForward"):
        Cycle(lambda s: s, 3, stochastic=True)
    with pytest.raises(ConfigError, match="needs a Gaussian or mixture head"):
        Cycle(NeuralForward(lambda u: u), 3, stochastic=True)


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_mixture_crps_is_the_crps_of_draws_from_the_mixture(covariance: str) -> None:
    """The closed form against the fair CRPS of many draws from the same mixture (its
    marginals per value), and one component with the diagonal is `gaussian_crps`."""
    from pipekit_train.core.distributions import Mixture
    from pipekit_train.core.distributions._mixture import mixture_from_output
    from pipekit_train.core.losses import mixture_width
    from pipekit_train.core.metrics import crps_ensemble

    rng = np.random.default_rng(7)
    k, d = 3, 2
    pred = rng.normal(0.0, 0.7, (4, mixture_width(k, d, covariance)))
    y = rng.normal(0.0, 1.0, (4, d))
    raw = mixture_from_output(pred, n_components=k, covariance=covariance)
    draws = Mixture(raw.weights, raw.means, raw.scale_tril).sample(rng, 40_000)  # (S, 4, d)
    sampled = float(np.mean(crps_ensemble(draws, y, member_axis=0)))  # the sorted form
    closed = losses.mixture_crps(n_components=k, covariance=covariance)(pred, y)
    assert closed == pytest.approx(sampled, rel=0.01)
    one = np.concatenate([[0.0], pred[0, 1:3], pred[0, 3:5]])[None]  # K=1: mean, log-scale
    gauss = np.concatenate([one[:, 1:3], 2 * one[:, 3:5]], axis=-1)  # log-variance = 2 log-scale
    assert losses.mixture_crps(one, y[:1]) == pytest.approx(
        losses.gaussian_crps(gauss, y[:1]), rel=1e-12
    )


def test_fields_take_noise_channels_at_every_grid_point() -> None:
    """On `(H, W, C)` fields the noise is `w` channels per grid point: the k-step loss of a
    per-pixel model equals the loop written out, member by member."""
    rng = np.random.default_rng(8)
    b, m, k, w = 3, 2, 2, 1
    x = rng.standard_normal((b, 4, 5, 2))
    y = rng.standard_normal((b, k, 4, 5, 2))
    z = rng.standard_normal((b, m, k, 4, 5, w))
    mix = rng.standard_normal((2 + w, 2))

    def model(u: np.ndarray) -> np.ndarray:  # a 1x1 convolution
        return np.tanh(u @ mix)

    spec = rollout_spec(None, False, 3, noise_dim=w)
    assert spec.noise_shapes(6, (4, 5, 2)) == {"normal": (6, 4, 5, 1), "uniform": None}
    loss, pred = rollout_loss(
        np,
        spec=spec,
        model_fn=model,
        x=x,
        y=y,
        weights=[1.0, 1.0],
        backprop="full",
        loss_fn=losses.crps(members=m, noise_dim=w),
        member_noise=z,
    )
    total, states = 0.0, np.repeat(x[:, None], m, axis=1)
    for i in range(k):
        states = model(np.concatenate([states, z[:, :, i]], axis=-1))
        flat = states.reshape(b, m, -1)
        total += _pairwise_crps(flat, y[:, i].reshape(b, -1), "fair")
        np.testing.assert_allclose(pred[:, i], states.mean(axis=1), rtol=1e-12)
    assert float(loss) == pytest.approx(total / k, rel=1e-12)

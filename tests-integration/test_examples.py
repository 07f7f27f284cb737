"""Smoke tests of the worked examples with few steps (the full runs are documented)."""

from __future__ import annotations

from pathlib import Path

import amortized
import chaotic_emulator
import crps_ensemble
import direct
import numpy as np
import pytest
import spread_skill
import toymodels
import two_moons


@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
def test_direct(backend: str, tmp_path: Path) -> None:
    result = direct.main(["--backend", backend, "--steps", "60", "--out", str(tmp_path)])
    assert result["test_rmse"] < 1.0
    assert (tmp_path / backend / "loss.png").exists()
    assert (tmp_path / backend / "metrics.jsonl").read_text().count("\n") >= 60


@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
@pytest.mark.slow
def test_amortized(backend: str, tmp_path: Path) -> None:
    """A reduced budget (8192 simulations, 600 steps): the Gaussian head travels through
    the registry and the intervals are near nominal. The default budget (131072
    simulations, 4000 steps) is calibrated to within 0.02; docs/examples.md has the
    numbers. Measured at this budget (68% / 95%): equinox 0.704 / 0.958, lightning
    0.711 / 0.946, keras 0.692 / 0.950 on 819 test simulations."""
    result = amortized.main(
        ["--backend", backend, "--steps", "600", "--samples", "8192", "--out", str(tmp_path)]
    )
    print(f"{backend}: coverage {result['coverage68']:.3f} / {result['coverage95']:.3f}")
    assert result["head"] == "gaussian" and result["n_test"] == 819
    assert abs(result["coverage68"] - 0.68) < 0.06
    assert abs(result["coverage95"] - 0.95) < 0.03
    assert (tmp_path / backend / "posterior.png").stat().st_size > 50_000
    assert (tmp_path / backend / "registry" / "oscillator-posterior" / "1").is_dir()


def test_two_moons_reference_sampler_is_the_exact_posterior() -> None:
    """The reference draws match the posterior density computed on a grid from the
    likelihood itself (the density of p = x - g(θ): uniform angle, normal radius, the
    1/r polar Jacobian), restricted to the prior box."""
    x = two_moons.observation(two_moons.THETA_OBS[0], seed=100)
    draws = two_moons.reference_posterior(x, 200_000, np.random.default_rng(0))
    assert draws.shape == (200_000, 2) and np.all(np.abs(draws) <= 1.0)
    edges = np.linspace(-1.0, 1.0, 161)
    centres = 0.5 * (edges[1:] + edges[:-1])
    t1, t2 = np.meshgrid(centres, centres, indexing="ij")
    p1 = x[0] + np.abs(t1 + t2) / np.sqrt(2) - 0.25
    p2 = x[1] - (t2 - t1) / np.sqrt(2)
    r, angle = np.hypot(p1, p2), np.arctan2(p2, p1)
    z = (r - two_moons.R_MEAN) / two_moons.R_STD
    density = np.where(np.abs(angle) < np.pi / 2, np.exp(-0.5 * z * z) / r, 0.0)
    density /= density.sum()
    hist, _, _ = np.histogram2d(draws[:, 0], draws[:, 1], bins=(edges, edges))
    hist /= hist.sum()
    # both modes, each with half the mass, and the histogram follows the density cell by cell
    upper = t1 + t2 > 0
    assert hist[upper].sum() == pytest.approx(0.5, abs=0.01)
    assert density[upper].sum() == pytest.approx(0.5, abs=0.01)
    assert 0.5 * np.abs(hist - density).sum() < 0.05  # total variation on the grid


def test_toymodels_logit_scale_multiplies_the_first_outputs() -> None:
    """`n_logits`/`logit_scale` scale the first outputs on every backend; the rest and
    the weights are the plain MLP's (the same seed builds the same weights)."""
    import equinox as eqx
    import jax
    import keras
    import torch

    x = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 2)
    outputs = {}
    for scaled in (False, True):
        opts = {"n_logits": 2, "logit_scale": 0.25} if scaled else {}
        eqx_model = toymodels.equinox_mlp(2, 5, 8, key=jax.random.PRNGKey(0), **opts)
        torch.manual_seed(0)
        torch_model = toymodels.torch_mlp(2, 5, 8, **opts)
        keras.utils.set_random_seed(0)
        keras_model = toymodels.keras_mlp(2, 5, 8, **opts)
        outputs[scaled] = {
            "equinox": np.asarray(jax.vmap(eqx_model)(x)),
            "torch": torch_model(torch.from_numpy(x)).detach().numpy(),
            "keras": np.asarray(keras_model(x)),
        }
        if not scaled:
            assert isinstance(eqx_model, eqx.nn.MLP)
    for name, plain in outputs[False].items():
        got = outputs[True][name]
        np.testing.assert_allclose(got[:, :2], 0.25 * plain[:, :2], rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got[:, 2:], plain[:, 2:], err_msg=name)
    with pytest.raises(ValueError, match="n_logits=6"):
        toymodels.torch_mlp(2, 5, 8, n_logits=6)


def test_two_moons_c2st_tells_apart_and_not() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(1000, 2))
    assert abs(two_moons.c2st(a, rng.normal(size=(1000, 2))) - 0.5) < 0.05
    assert two_moons.c2st(a, rng.normal(size=(1000, 2)) + [3.0, 0.0]) > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
def test_two_moons(backend: str, tmp_path: Path) -> None:
    """A reduced budget (8192 simulations, 600 steps, 1000 posterior samples a side):
    the mixture head reaches both modes of the posterior and lays its components along
    the crescents. Measured at this budget (mean C2ST / worst observation): equinox
    0.536 / 0.556, lightning 0.534 / 0.545, keras 0.512 / 0.523; with dead components
    (each crescent one Gaussian, the plain MLP's failure) the mean was 0.67-0.69, and a
    Gaussian head scores about 0.98. The default budget's numbers are in
    docs/examples.md."""
    result = two_moons.main(
        ["--backend", backend, "--steps", "600", "--samples", "8192",
         "--posterior-samples", "1000", "--out", str(tmp_path)]
    )  # fmt: skip
    print(f"{backend}: C2ST {result['c2st']}")
    assert result["head"] == "mixture"
    assert result["head_options"] == {"n_components": 8, "covariance": "full"}
    assert result["c2st_mean"] < 0.62 and max(result["c2st"]) < 0.7
    # both crescents, each with about half the draws (a Gaussian head scores C2ST ~0.98)
    assert all(abs(share - 0.5) < 0.1 for share in result["mode_share"])
    assert (tmp_path / backend / "mixture" / "posterior.png").stat().st_size > 30_000


@pytest.mark.slow
def test_chaotic_emulator(tmp_path: Path) -> None:
    """A reduced budget (60 updates per run, 30-step rollouts): both emulators train with
    the rollout monitor in their history, beat persistence at lead 1, and the figure is
    written. The measured setting (`--full`) is in docs/guides/rollout-training.md."""
    result = chaotic_emulator.main(
        ["--steps", "60", "--horizon", "30", "--out", str(tmp_path)]
    )  # fmt: skip
    assert set(result) == {"one-step", "curriculum 1→4", "persistence"}
    for label in ("one-step", "curriculum 1→4"):
        assert result[label]["lead_1"] < result["persistence"]["lead_1"]
        assert np.isfinite(result[label]["val_rollout_nrmse_lead_11_30"])
    assert (tmp_path / "equinox" / "error_vs_lead.png").stat().st_size > 10_000


def test_chaotic_emulator_refuses_a_horizon_below_its_lead_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        chaotic_emulator.main(["--horizon", "12", "--out", str(tmp_path)])
    assert "Received: --horizon=12" in capsys.readouterr().err
    assert not (tmp_path / "equinox").exists()  # refused before any work


def test_chaotic_emulator_lead_figure(tmp_path: Path) -> None:
    """The figure draws one line per report against lead time in Lyapunov times."""
    from pipekit_train.core import rollout_validation

    truth = 1.0 + np.arange(31, dtype=np.float64)[None, :, None] * np.ones((1, 1, 20))
    reports = {
        "one-step": rollout_validation(lambda s: s + 1.01, truth, 30),
        "persistence": rollout_validation(lambda s: s, truth, 30),
    }
    fig = chaotic_emulator.lead_figure(reports, tmp_path / "lead.png", 30)
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert [line.get_label() for line in lines[:2]] == ["one-step", "persistence"]
    steps = chaotic_emulator.LYAPUNOV_STEPS
    np.testing.assert_allclose(lines[0].get_xdata(), np.arange(1, 31) / steps)
    np.testing.assert_allclose(lines[1].get_ydata(), reports["persistence"].errors["nrmse"][:, 0])
    assert (tmp_path / "lead.png").stat().st_size > 10_000


def test_spread_skill_measures_the_error_of_the_mean_and_the_spread() -> None:
    """Two cases of 3 members in 2 variables, by hand: the error of the ensemble mean
    against the truth and the root mean unbiased variance over the members."""
    ens = np.array([[[0.0, 0.0], [1.0, 2.0], [2.0, 4.0], [5.0, 5.0], [5.0, 5.0], [5.0, 5.0]]])
    truth = np.array([[[1.0, 0.0], [5.0, 5.0]]])
    error, spread = spread_skill.spread_skill(ens, truth, members=3)
    # case 0: mean (1, 2), error² (0, 4); case 1: exact -> mean over 4 values: 1
    np.testing.assert_allclose(error, [1.0])
    # case 0: variances (1, 4), case 1: (0, 0) -> mean 1.25
    np.testing.assert_allclose(spread, [np.sqrt(1.25)])


def test_enkf_analysis_pulls_the_ensemble_to_the_observations() -> None:
    """With a wide ensemble and a precise observation of two of four variables, the
    analysis mean lands near the observed values, their spread shrinks to about the
    observation noise, and the unobserved variables correlated with them follow."""
    rng = np.random.default_rng(0)
    observed_part = 3.0 * rng.standard_normal((500, 2))  # variables 0 and 1, spread 3
    copies = observed_part + 0.1 * rng.standard_normal((500, 2))  # 2 and 3 follow 0 and 1
    ens = np.concatenate([observed_part, copies], axis=1)
    observation = np.array([1.0, -2.0])
    out = spread_skill.enkf_analysis(ens, observation, np.array([0, 1]), 0.05, 1.0, rng)
    assert out.shape == ens.shape
    np.testing.assert_allclose(out.mean(axis=0)[:2], observation, atol=0.05)
    assert np.all(out.std(axis=0)[:2] < 0.1)  # from about 3
    np.testing.assert_allclose(out.mean(axis=0)[2:], observation, atol=0.1)
    # an observation without weight leaves the inflated prior: the spread grows by the factor
    wide = spread_skill.enkf_analysis(ens, observation, np.array([0, 1]), 1e6, 2.0, rng)
    np.testing.assert_allclose(wide.std(axis=0), 2.0 * ens.std(axis=0), rtol=0.01)


@pytest.mark.slow
def test_spread_skill_example(tmp_path: Path) -> None:
    """A small budget (32 trajectories, 500 updates, 8 cases x 16 members): the Gaussian
    head comes back from the registry, the seeded ensemble starts with no spread and
    spreads as it goes, the error of its mean grows, and the EnKF (with the simulator
    forecasting, as a check of the filter) beats the free ensemble. Measured at this
    budget: spread / error 0.75 at lead 1, 0.61 at lead 26; EnKF analysis RMSE 3.84 with
    the emulator (too weak at this budget to help), 1.14 with the simulator, 3.96 free."""
    result = spread_skill.main(
        ["--steps", "500", "--trajectories", "32", "--length", "100", "--cases", "8",
         "--members", "16", "--horizon", "26", "--cycles", "20", "--out", str(tmp_path)]
    )  # fmt: skip
    assert result["head"] == "gaussian"
    error, spread = result["error"], result["spread"]
    assert error.shape == spread.shape == (27,)
    assert spread[0] == 0.0 and error[0] < 1e-5  # every member starts at the true state
    assert 0.0 < spread[1] < spread[13] < spread[26]
    assert error[1] < error[13] and 0.3 < spread[1] / error[1] < 3.0
    assert [row[0] for row in result["table"]] == [1, 2, 4, 8, 13, 20, 26]
    assert np.isfinite(result["da_rmse"])
    assert result["perfect_da_rmse"] < 0.5 * result["free_da_rmse"]
    assert (tmp_path / "equinox" / "spread_skill.png").stat().st_size > 30_000


def test_crps_ensemble_example_scores_three_emulators(tmp_path: Path) -> None:
    """A few updates of each emulator on Equinox: every method is scored at every lead,
    the ensembles' spread–skill ratios are positive, the deterministic one has none."""
    result = crps_ensemble.main(
        [
            "--seeds",
            "0",
            "--steps",
            "20",
            "--trajectories",
            "12",
            "--length",
            "40",
            "--width",
            "16",
            "--cases",
            "4",
            "--members",
            "3",
            "--crps-steps",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    mean = result["mean"]
    assert set(mean) == {"deterministic", "gaussian", "crps"}
    for method, scores in mean.items():
        assert len(scores["crps"]) == len(crps_ensemble.LEADS), method
        assert np.all(np.isfinite(scores["crps"])) and np.all(np.isfinite(scores["rmse"]))
    assert all(v > 0 for v in mean["crps"]["spread_skill"])
    assert mean["deterministic"]["spread_skill"] == [0.0] * len(crps_ensemble.LEADS)
    assert (tmp_path / "equinox" / "crps_ensemble.json").exists()

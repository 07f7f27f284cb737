"""Rollout metrics: nRMSE, VRMSE, spectral error, lead-time windows, valid prediction time."""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.metrics import (
    lead_windows,
    nrmse,
    rollout_errors,
    spectral_bins,
    spectral_error,
    summarize,
    valid_prediction_time,
    vrmse,
    window_means,
)


def _fields(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(1.0, 2.0, size=shape)


# -- nRMSE and VRMSE ------------------------------------------------------------------------


def test_exact_prediction_scores_zero_and_zero_prediction_scores_one() -> None:
    target = _fields((3, 5, 16, 16, 2))
    assert np.all(np.asarray(nrmse(target, target, spatial_ndim=2)) == 0)
    assert np.all(np.asarray(vrmse(target, target, spatial_ndim=2)) == 0)
    zero = np.asarray(nrmse(np.zeros_like(target), target, spatial_ndim=2))
    assert zero.shape == (3, 5, 2)
    np.testing.assert_allclose(zero, 1.0, rtol=1e-6)
    mean = np.broadcast_to(target.mean(axis=(2, 3), keepdims=True), target.shape)
    np.testing.assert_allclose(np.asarray(vrmse(mean, target, spatial_ndim=2)), 1.0, rtol=1e-6)


def test_definitions_per_channel_against_a_direct_computation() -> None:
    target, pred = _fields((4, 32, 3)), _fields((4, 32, 3), seed=1)
    mse = ((pred - target) ** 2).mean(axis=1)
    want_n = np.sqrt(mse / ((target**2).mean(axis=1) + 1e-7))
    want_v = np.sqrt(mse / (target.var(axis=1) + 1e-7))
    np.testing.assert_allclose(np.asarray(nrmse(pred, target, spatial_ndim=1)), want_n, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(vrmse(pred, target, spatial_ndim=1)), want_v, rtol=1e-12)
    # channels differ in scale: a per-channel error is independent of the others' scale (up to eps)
    scaled_t, scaled_p = target * [1.0, 100.0, 1.0], pred * [1.0, 100.0, 1.0]
    np.testing.assert_allclose(
        np.asarray(nrmse(scaled_p, scaled_t, spatial_ndim=1)), want_n, rtol=1e-6
    )


def test_vector_states_pool_their_variables() -> None:
    target, pred = _fields((6, 20)), _fields((6, 20), seed=2)
    got = np.asarray(nrmse(pred, target, per_channel=False))
    want = np.sqrt(((pred - target) ** 2).mean(axis=1) / ((target**2).mean(axis=1) + 1e-7))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(ConfigError, match=r"spatial_ndim=0, per_channel=True.*per_channel=False"):
        nrmse(pred, target)
    with pytest.raises(ConfigError, match=r"same shape"):
        nrmse(pred, target[:, :10], per_channel=False)


def test_array_api_inputs_keep_their_library_and_dtype() -> None:
    target = _fields((2, 8, 1)).astype(np.float32)
    out = nrmse(target * 0.5, target, spatial_ndim=1)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_allclose(out, 0.5, rtol=1e-5)


# -- spectral error -------------------------------------------------------------------------


@pytest.mark.parametrize("grid", [(64,), (32, 32), (16, 24)])
def test_spectral_bins_of_the_mse_sum_to_the_mse(grid: tuple[int, ...]) -> None:
    target, pred = _fields((3, *grid, 2)), _fields((3, *grid, 2), seed=5)
    ndim = len(grid)
    parts = spectral_error(pred, target, spatial_ndim=ndim, relative=False)
    assert parts.shape == (3, 3, 2)
    axes = tuple(range(1, 1 + ndim))
    np.testing.assert_allclose(parts.sum(axis=1), ((pred - target) ** 2).mean(axis=axes))
    rel = spectral_error(np.zeros_like(target), target, spatial_ndim=ndim)
    np.testing.assert_allclose(rel, 1.0, rtol=1e-6)
    assert np.all(spectral_error(target, target, spatial_ndim=ndim) == 0)


def test_an_error_at_one_wavenumber_lands_in_its_bin() -> None:
    n = 64
    x = np.arange(n)
    target = _fields((2, n, n, 1))
    edges = spectral_bins((n, n))
    assert edges[0] == 0 and np.isinf(edges[-1]) and edges.size == 4
    for mode, expected in ((1, 0), (8, 1), (30, 2)):
        k = 2 * np.pi * mode / n
        wave = np.sin(k * x)[None, :, None, None] * np.ones((2, n, n, 1))
        assert edges[expected] <= k < edges[expected + 1]
        parts = spectral_error(target + wave, target, spatial_ndim=2, relative=False)
        np.testing.assert_allclose(parts[:, expected, 0], 0.5, rtol=1e-9)  # mean(sin²)
        others = np.delete(parts[..., 0], expected, axis=1)
        np.testing.assert_allclose(others, 0.0, atol=1e-12)


def test_spectral_error_refuses_bad_settings() -> None:
    target = _fields((2, 16, 1))
    with pytest.raises(ConfigError, match=r"spatial_ndim=3"):
        spectral_error(target, target, spatial_ndim=3)
    with pytest.raises(ConfigError, match=r"increasing edges"):
        spectral_error(target, target, spatial_ndim=1, bins=[0.0, 1.0, 0.5])
    assert spectral_error(target, target, spatial_ndim=1, bins=5).shape == (2, 5, 1)


# -- lead time --------------------------------------------------------------------------------


def test_lead_windows_cover_the_horizon() -> None:
    assert lead_windows(5) == [(1, 5)]
    assert lead_windows(150) == [(1, 10), (11, 30), (31, 100), (101, 150)]
    assert lead_windows(30) == [(1, 10), (11, 30)]
    with pytest.raises(ConfigError, match=r"bounds=\[10, 5\]"):
        lead_windows(20, bounds=(10, 5))
    means = window_means(np.arange(1.0, 13.0)[:, None], lead_windows(12, bounds=(2, 5)))
    assert {w: float(m[0]) for w, m in means.items()} == {(1, 2): 1.5, (3, 5): 4.0, (6, 12): 9.0}


def test_rollout_errors_and_their_named_summary() -> None:
    target = _fields((4, 12, 16, 2))
    pred = target.copy()
    pred[:, 6:] = 0.0  # exact for leads 1-6, zero afterwards
    errors = rollout_errors(pred, target, spatial_ndim=1)
    assert set(errors) == {"nrmse", "vrmse", "spectral"}
    assert errors["nrmse"].shape == (12, 2) and errors["spectral"].shape == (12, 3, 2)
    np.testing.assert_allclose(errors["nrmse"][:6], 0.0)
    np.testing.assert_allclose(errors["nrmse"][6:], 1.0, rtol=1e-6)
    flat = summarize(
        errors, lead_windows(12, bounds=(6,)), channels=["u", "v"], prefix="val_rollout_"
    )
    assert flat["val_rollout_nrmse_lead_1_6"] == 0.0
    assert flat["val_rollout_nrmse_v_lead_7_12"] == pytest.approx(1.0, rel=1e-6)
    assert flat["val_rollout_nrmse"] == pytest.approx(0.5, rel=1e-6)
    assert flat["val_rollout_spectral_bin2_lead_7_12"] == pytest.approx(1.0, rel=1e-6)
    assert all(isinstance(v, float) for v in flat.values())
    with pytest.raises(ConfigError, match=r"channels=\['u'\]"):
        summarize(errors, channels=["u"])


def test_valid_prediction_time() -> None:
    errors = np.array([[0.1, 0.2, 0.7, 0.1], [0.1, 0.2, 0.3, 0.4], [0.9, 0.1, 0.1, 0.1]])
    np.testing.assert_allclose(valid_prediction_time(errors, 0.5, dt=0.05), [0.1, 0.2, 0.0])
    assert valid_prediction_time(errors[0], 0.5) == 2.0
    assert valid_prediction_time(np.array([0.1, np.nan, 0.1]), 0.5) == 1.0
    with pytest.raises(ConfigError, match=r"dt=0"):
        valid_prediction_time(errors, 0.5, dt=0)

"""SimulationDataset: determinism, keys, invalid-simulation policies and counters."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import SimulationDataset, SimulationError, make_batches, simulator_seed


def prior(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=2)


def forward(theta: np.ndarray) -> np.ndarray:
    return np.array([theta[0] + theta[1], theta[0] * theta[1], np.sin(theta[0])])


def flaky(theta: np.ndarray) -> np.ndarray:
    """Invalid for about a third of the parameter space: NaN or an exception."""
    if theta[0] > 0.6:
        raise RuntimeError("solver diverged")
    if theta[0] < -0.6:
        return np.array([np.nan, 0.0, 0.0])
    return forward(theta)


def always_bad(theta: np.ndarray) -> np.ndarray:
    return np.array([np.inf, 0.0, 0.0])


def test_items_are_deterministic_functions_of_seed_and_index() -> None:
    ds = SimulationDataset(forward, prior, n=20, seed=7)
    s5 = ds[5]
    theta = prior(np.random.default_rng([7, 5]))
    np.testing.assert_array_equal(s5["theta"], theta)
    np.testing.assert_array_equal(s5["x"], forward(theta))
    np.testing.assert_array_equal(ds[5]["x"], SimulationDataset(forward, prior, 20, 7)[5]["x"])
    assert not np.array_equal(SimulationDataset(forward, prior, 20, 8)[5]["x"], s5["x"])
    batch = ds.get_batch(np.array([5, 0, 19]))
    np.testing.assert_array_equal(batch["x"][0], s5["x"])
    assert batch["theta"].shape == (3, 2) and ds.keys == ("theta", "x")
    assert len(ds) == 20
    with pytest.raises(IndexError):
        ds[20]


def test_keys_are_configurable_and_dicts_pass_through() -> None:
    emulator = SimulationDataset(forward, prior, 4, 0, param_key="x", output_key="y")
    assert emulator.keys == ("x", "y")

    def dict_prior(rng: np.random.Generator) -> dict:
        return {"mass": rng.uniform(1, 2, size=1), "k": rng.uniform(1, 2, size=1)}

    def dict_sim(p: dict) -> dict:
        return {"period": 2 * np.pi * np.sqrt(p["mass"] / p["k"]), "obs": p["k"] * 2}

    ds = SimulationDataset(dict_sim, dict_prior, 3, seed=1)
    assert set(ds.keys) == {"mass", "k", "period", "obs"}
    with pytest.raises(ConfigError, match="clashes with a parameter key"):
        SimulationDataset(lambda p: {"k": p["k"]}, dict_prior, 3)[0]


def test_fingerprint_is_stable_and_content_sensitive() -> None:
    a = SimulationDataset(forward, prior, 10, 0)
    assert a.fingerprint() == SimulationDataset(forward, prior, 10, 0).fingerprint()
    assert a.fingerprint() != SimulationDataset(forward, prior, 10, 1).fingerprint()
    assert a.fingerprint() != SimulationDataset(forward, prior, 11, 0).fingerprint()
    scaled = SimulationDataset(forward, functools.partial(prior), 10, 0)
    assert scaled.fingerprint() != a.fingerprint()  # described differently


def test_raise_policy_names_index_and_seed() -> None:
    ds = SimulationDataset(flaky, prior, 50, seed=3)
    bad = next(i for i in range(50) if abs(prior(np.random.default_rng([3, i]))[0]) > 0.6)
    with pytest.raises(SimulationError, match=rf"item {bad} \(seed=3.*on_invalid='resample'"):
        ds[bad]
    assert ds.stats["invalid"] == 1


def test_resample_policy_is_deterministic_and_counted() -> None:
    ds = SimulationDataset(flaky, prior, 60, seed=3, on_invalid="resample")
    batch = ds.get_batch(np.arange(60))
    assert np.all(np.isfinite(batch["x"]))
    assert ds.stats["resampled"] > 0 and ds.stats["invalid"] >= ds.stats["resampled"]
    assert ds.stats["dropped"] == 0
    again = SimulationDataset(flaky, prior, 60, seed=3, on_invalid="resample")
    np.testing.assert_array_equal(again.get_batch(np.arange(60))["x"], batch["x"])
    # a resampled item i comes from default_rng([seed, i, attempt])
    i = next(i for i in range(60) if abs(prior(np.random.default_rng([3, i]))[0]) > 0.6)
    attempt = next(
        a for a in range(1, 11) if abs(prior(np.random.default_rng([3, i, a]))[0]) <= 0.6
    )
    np.testing.assert_array_equal(ds[i]["theta"], prior(np.random.default_rng([3, i, attempt])))
    hopeless = SimulationDataset(always_bad, prior, 3, on_invalid="resample", max_attempts=2)
    with pytest.raises(SimulationError, match="in all 3 attempts"):
        hopeless[0]
    assert hopeless.stats["invalid"] == 3


def test_drop_policy_keeps_valid_items_with_a_stable_mapping() -> None:
    ds = SimulationDataset(flaky, prior, 60, seed=3, on_invalid="drop")
    n_valid = len(ds)
    valid = ds.valid_indices
    assert valid is not None and n_valid == valid.size < 60
    assert ds.stats["dropped"] == 60 - n_valid == ds.stats["invalid"]
    expected = [i for i in range(60) if abs(prior(np.random.default_rng([3, i]))[0]) <= 0.6]
    assert valid.tolist() == expected
    np.testing.assert_array_equal(ds[0]["theta"], prior(np.random.default_rng([3, expected[0]])))
    batches = list(make_batches(ds, 8, shuffle=False, drop_remainder=False, num_epochs=1))
    assert sum(len(b["x"]) for b in batches) == n_valid
    assert np.all(np.isfinite(np.concatenate([b["x"] for b in batches])))
    other = SimulationDataset(flaky, prior, 60, seed=3, on_invalid="drop")
    assert other.fingerprint() == ds.fingerprint()
    with pytest.raises(SimulationError, match="Every one of the 4 simulations was invalid"):
        len(SimulationDataset(always_bad, prior, 4, on_invalid="drop"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, r"`n` must be an int >= 1. Received: n=0"),
        ({"n": 2.5}, r"Received: n=2.5"),
        ({"seed": -1}, r"`seed` must be an int >= 0"),
        ({"on_invalid": "skip"}, r"`on_invalid` must be one of .*Received: on_invalid='skip'"),
        ({"param_key": "x"}, "`param_key` and `output_key` must differ"),
        ({"max_attempts": 0}, "`max_attempts` must be an int >= 1"),
        ({"simulator": 3}, "`simulator` must be callable"),
        ({"sampler": None}, "`sampler` must be a callable"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"simulator": forward, "sampler": prior, "n": 5, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=match):
        SimulationDataset(**args)


# -- stochastic simulators: a per-item generator from (seed, i) -------------------------


def noisy(theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A stochastic simulator: the forward model plus noise drawn from its `rng`."""
    return forward(theta) + 0.1 * rng.standard_normal(3)


def test_a_simulator_with_rng_gets_a_generator_derived_from_seed_and_index() -> None:
    ds = SimulationDataset(noisy, prior, n=30, seed=4)
    assert ds.simulator_takes_rng and not SimulationDataset(forward, prior, 3).simulator_takes_rng
    item = ds[11]
    theta = prior(np.random.default_rng([4, 11]))
    expected = forward(theta) + 0.1 * np.random.default_rng(simulator_seed(4, 11)).standard_normal(
        3
    )
    np.testing.assert_array_equal(item["theta"], theta)
    np.testing.assert_array_equal(item["x"], expected)
    # its stream is not the sampler's: the noise is not a re-draw of the parameters' numbers
    sampler_stream = 0.1 * np.random.default_rng([4, 11]).standard_normal(3)
    assert not np.allclose(item["x"] - forward(theta), sampler_stream)
    # different items and different seeds get different noise
    noise = [ds[i]["x"] - forward(ds[i]["theta"]) for i in range(30)]
    assert len({n.tobytes() for n in noise}) == 30
    other = SimulationDataset(noisy, prior, n=30, seed=5)
    assert not np.array_equal(other[11]["x"], item["x"])


def test_stochastic_items_do_not_depend_on_access_order() -> None:
    in_order = SimulationDataset(noisy, prior, n=25, seed=1).get_batch(np.arange(25))
    fresh = SimulationDataset(noisy, prior, n=25, seed=1)
    order = np.random.default_rng(0).permutation(25)
    for i in order[::-1]:
        np.testing.assert_array_equal(fresh[int(i)]["x"], in_order["x"][i])
    np.testing.assert_array_equal(fresh.get_batch(order)["x"], in_order["x"][order])


def test_a_keyword_only_rng_works_and_resampling_redraws_the_noise() -> None:
    def picky(theta: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        noise = rng.standard_normal()
        if noise > 0.0:
            raise RuntimeError("unlucky noise")
        return np.array([theta[0] + noise])

    ds = SimulationDataset(picky, prior, n=20, seed=0, on_invalid="resample")
    values = ds.get_batch(np.arange(20))["x"][:, 0]
    assert ds.stats["resampled"] > 0  # about half the first draws were invalid
    for i in range(20):  # each item is the first valid (sampler, simulator) attempt
        for attempt in range(11):
            entropy = [0, i] if attempt == 0 else [0, i, attempt]
            noise = np.random.default_rng(simulator_seed(0, i, attempt)).standard_normal()
            if noise <= 0.0:
                theta = prior(np.random.default_rng(entropy))
                assert values[i] == np.float64(theta[0] + noise).astype(values.dtype)
                break
    strict = SimulationDataset(picky, prior, n=20, seed=0)
    bad = next(
        i for i in range(20) if np.random.default_rng(simulator_seed(0, i)).standard_normal() > 0
    )
    with pytest.raises(
        SimulationError, match=rf"simulator rng=np.random.default_rng\(simulator_seed\(0, {bad}\)\)"
    ):
        strict[bad]

"""Trajectories, windows over them, their splits, normalisation and exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import ConfigError, NeuralForward
from pipekit_train.core.data import (
    CachedDataset,
    Normalizer,
    SimulationDataset,
    Trajectories,
    TrajectoryWindows,
    fit_trajectory_normalizer,
    make_batches,
    split_trajectories,
)
from pipekit_train.core.registry import LocalModelRegistry
from pipekit_train.core.testing._numpy_model import NumpyLinearOp


def _states(n: int = 5, t: int = 12, shape: tuple[int, ...] = (3,), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, t, *shape)).astype(np.float32)


def _take(it: Any, n: int) -> list[Any]:
    return [next(it) for _ in range(n)]


# -- windows: contents -------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (8, 2), (4, 6, 2)])
def test_windows_hold_consecutive_states_of_any_field_shape(shape: tuple[int, ...]) -> None:
    states = _states(4, 15, shape)
    windows = TrajectoryWindows(states, k=3, stride=2, step=2)
    per = (15 - 7) // 2 + 1
    assert len(windows) == 4 * per and windows.windows_per_trajectory == per
    idx = np.arange(len(windows))
    batch = windows.get_batch(idx)
    assert batch["x"].shape == (len(idx), *shape) and batch["y"].shape == (len(idx), 3, *shape)
    for w in (0, per - 1, per + 1, len(windows) - 1):
        i, start = divmod(w, per)
        t = start * 2
        np.testing.assert_array_equal(batch["x"][w], states[i, t])
        np.testing.assert_array_equal(batch["y"][w], states[i, [t + 2, t + 4, t + 6]])
        one = windows[w]
        np.testing.assert_array_equal(one["y"], batch["y"][w])
    assert windows.element_spec["y"].shape == (3, *shape)


def test_k1_gives_the_next_state_and_increments_give_residual_targets() -> None:
    states = _states()
    one = TrajectoryWindows(states, k=1)
    sample = one[13]  # trajectory 1, start 2 (11 windows each)
    np.testing.assert_array_equal(sample["x"], states[1, 2])
    np.testing.assert_array_equal(sample["y"], states[1, 3])
    stacked = TrajectoryWindows(states, k=1, stack=True)
    assert stacked[13]["y"].shape == (1, 3)
    inc = TrajectoryWindows(states, k=2, targets="increments")
    sample = inc[13]  # 10 windows each: trajectory 1, start 3
    np.testing.assert_allclose(
        sample["y"], np.stack([states[1, 4] - states[1, 3], states[1, 5] - states[1, 4]])
    )


def test_static_inputs_forcings_and_history_reach_the_model_input() -> None:
    states = _states(3, 10)  # (3, 10, 3)
    theta = np.arange(6.0).reshape(3, 2)
    forcing = np.arange(30.0).reshape(3, 10, 1)
    trajs = Trajectories(states, static={"theta": theta}, forcings={"f": forcing})
    windows = TrajectoryWindows(trajs, k=2, step=2, history=2)
    # 4 windows each (span 7 of 10): (0, t=0) and (1, t=3): the current times are 2 and 5
    batch = windows.get_batch(np.array([0, 7]))
    assert windows.keys == ("x", "y", "forcing")
    assert windows.inputs.in_channels == 2 * 3 + 1 + 2
    for row, (i, t) in enumerate([(0, 2), (1, 5)]):
        want = np.concatenate([states[i, t - 2], states[i, t], forcing[i, t], theta[i]])
        np.testing.assert_array_equal(batch["x"][row], want)
        np.testing.assert_array_equal(batch["y"][row], states[i, [t + 2, t + 4]])
        # each unrolled step's forcing, at the time the step starts from
        np.testing.assert_array_equal(batch["forcing"][row], forcing[i, [t, t + 2]])
    one_step = TrajectoryWindows(trajs, k=1)
    assert one_step.keys == ("x", "y")  # step 0's forcing is in "x"
    np.testing.assert_array_equal(
        one_step[12]["x"], np.concatenate([states[1, 3], forcing[1, 3], theta[1]])
    )
    # a state alone: the input is the state, as before
    assert TrajectoryWindows(states, k=2).element_spec["x"].shape == (3,)


def test_extras_on_a_grid_are_broadcast_or_taken_as_fields() -> None:
    rng = np.random.default_rng(0)
    states = rng.normal(size=(2, 6, 4, 5, 2)).astype(np.float32)
    nu = rng.normal(size=(2, 1))
    mask = rng.normal(size=(2, 4, 5, 1))
    windows = TrajectoryWindows(Trajectories(states, static={"nu": nu, "mask": mask}))
    x = windows[1]["x"]  # trajectory 0, t = 1
    assert x.shape == (4, 5, 4) and x.dtype == np.float32
    np.testing.assert_array_equal(x[..., :2], states[0, 1])
    np.testing.assert_allclose(x[..., 2], np.full((4, 5), nu[0, 0], np.float32))
    np.testing.assert_allclose(x[..., 3], mask[0, ..., 0].astype(np.float32))
    with pytest.raises(
        ConfigError, match=r"static 'bad' with shape \(3, 5, 1\) for states .* \(4, 5, C\)"
    ):
        TrajectoryWindows(Trajectories(states, static={"bad": np.zeros((2, 3, 5, 1))}))


def test_the_windows_normalizer_covers_every_input_channel() -> None:
    rng = np.random.default_rng(1)
    states = rng.normal(3.0, 2.0, size=(4, 30, 2))
    theta = rng.normal(-1.0, 0.5, size=(4, 1))
    f = rng.normal(10.0, 4.0, size=(4, 30, 1))
    trajs = Trajectories(states, static={"theta": theta}, forcings={"f": f})
    norm = TrajectoryWindows(trajs, k=1, history=2, targets="increments").normalizer()
    want_mean = np.concatenate([states.mean((0, 1))] * 2 + [f.mean((0, 1)), theta.mean(0)])
    want_std = np.concatenate([states.std((0, 1))] * 2 + [f.std((0, 1)), theta.std(0)])
    np.testing.assert_allclose(norm.mean["x"], want_mean, rtol=1e-12)
    np.testing.assert_allclose(norm.std["x"], want_std, rtol=1e-12)
    inc = states[:, 1:] - states[:, :-1]
    np.testing.assert_allclose(norm.mean["y"], inc.mean((0, 1)), rtol=1e-12)
    # normalising the whole input equals normalising each piece by its own statistics
    x = TrajectoryWindows(trajs, k=1, history=2).get_batch(np.arange(5))["x"]
    pieces = (x - want_mean) / want_std
    np.testing.assert_allclose(norm.apply({"x": x})["x"], pieces, rtol=1e-12)


def test_a_long_trajectory_is_fitted_in_pieces_along_time(monkeypatch) -> None:
    from pipekit_train.core.data.trajectories import _stats

    rng = np.random.default_rng(2)
    states = rng.normal(size=(2, 50, 3)).cumsum(axis=1)
    whole = fit_trajectory_normalizer(Trajectories(states), step=3)
    monkeypatch.setattr(_stats, "_READ_ELEMENTS", 20)  # 3 states per read, in pieces
    pieces = fit_trajectory_normalizer(Trajectories(states), step=3)
    for key in ("x", "y"):
        np.testing.assert_allclose(pieces.mean[key], whole.mean[key], rtol=1e-12)
        np.testing.assert_allclose(pieces.std[key], whole.std[key], rtol=1e-12)
    inc = states[:, 3:] - states[:, :-3]
    np.testing.assert_allclose(pieces.std["y"], inc.reshape(-1, 3).std(0), rtol=1e-12)


def test_history_longer_than_the_trajectories_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"history=6.*T=6.*shorter history"):
        TrajectoryWindows(_states(2, 6), k=1, history=6)
    with pytest.raises(ConfigError, match=r"`history` must be an int >= 1.*history=0"):
        TrajectoryWindows(_states(2, 6), history=0)


# -- sources: a simulator and caches ----------------------------------------------------


def _trajectory(params: np.ndarray) -> np.ndarray:
    """A 2-variable trajectory of 9 states decaying at rate params[0]."""
    t = np.arange(9.0)[:, None]
    return (np.exp(-params[0] * t) * np.array([1.0, 2.0])).astype(np.float32)


def _sampler(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0.1, 0.5, size=1).astype(np.float32)


def test_windows_from_a_simulator_and_from_caches_agree(tmp_path: Path) -> None:
    sims = SimulationDataset(_trajectory, _sampler, n=6, seed=3)
    from_sim = Trajectories.from_dataset(sims, static=("theta",))
    arrays = np.stack([sims[i]["x"] for i in range(6)])
    theta = np.stack([sims[i]["theta"] for i in range(6)])
    reference = TrajectoryWindows(Trajectories(arrays, static={"theta": theta}), k=3)
    whole = Trajectories.from_dataset(
        CachedDataset.build(sims, tmp_path / "whole.zarr"), static=("theta",)
    )
    rows_cache = CachedDataset.build(
        from_sim.rows(), tmp_path / "rows.zarr", chunk_size=4, memory_budget_bytes=0
    )
    assert not rows_cache.in_memory and len(rows_cache) == 6 * 9
    by_rows = Trajectories.from_rows(rows_cache, length=9, static=("theta",))
    idx = np.array([17, 0, 5, 29, 17])
    want = reference.get_batch(idx)
    for trajs in (from_sim, whole, by_rows):
        got = TrajectoryWindows(trajs, k=3).get_batch(idx)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_bad_sources_are_refused_with_the_fix() -> None:
    sims = SimulationDataset(_trajectory, _sampler, n=4)
    with pytest.raises(ConfigError, match=r"static.*'params'.*keys \['theta', 'x'\]"):
        Trajectories.from_dataset(sims, static=("params",))
    rows = Trajectories(_states(2, 9)).rows()
    with pytest.raises(ConfigError, match=r"length=7.*18 rows"):
        Trajectories.from_rows(rows, length=7)
    one_state = SimulationDataset(np.sin, _sampler, n=4)
    with pytest.raises(ConfigError, match=r"must be a trajectory \(T, \*state_shape\)"):
        Trajectories.from_dataset(one_state)


# -- bad settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, r"Received: k=0"),
        ({"stride": 0}, r"Received: stride=0"),
        ({"step": -1}, r"Received: step=-1"),
        ({"k": 12}, r"spans 13 states, but the trajectories have T=12.*k <= 11"),
        ({"k": 4, "step": 3}, r"spans 13 states.*k <= 3 \(or a smaller step\)"),
        ({"targets": "deltas"}, r"targets='deltas'"),
        ({"k": 3, "stack": False}, r"k=3 steps has 3.*stack=None"),
    ],
)
def test_bad_window_settings_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrajectoryWindows(_states(), **kwargs)


def test_mismatched_extra_inputs_are_refused() -> None:
    states = _states(5, 12)
    with pytest.raises(ConfigError, match=r"static\['theta'\] with shape \(4, 2\).*n_traj=5"):
        Trajectories(states, static={"theta": np.zeros((4, 2))})
    with pytest.raises(ConfigError, match=r"forcings\['f'\] with shape \(5, 11\).*\(5, 12\)"):
        Trajectories(states, forcings={"f": np.zeros((5, 11))})
    with pytest.raises(ConfigError, match=r"'y'"):
        TrajectoryWindows(Trajectories(states, static={"y": np.zeros((5, 1))}))
    with pytest.raises(ConfigError, match=r"'forcing'"):
        TrajectoryWindows(Trajectories(states, forcings={"forcing": np.zeros((5, 12, 1))}))
    with pytest.raises(ConfigError, match=r"states\[\.\.\., None\]"):
        Trajectories(np.zeros((5, 12)))


# -- splits and resume ------------------------------------------------------------------


def test_split_is_by_trajectory_and_never_leaks() -> None:
    windows = TrajectoryWindows(_states(20, 12), k=2, stride=3)
    train, val, test = split_trajectories(windows, (0.6, 0.2, 0.2), seed=4)
    seen = []
    for part in (train, val, test):
        ids = set(part.trajectory_ids(np.arange(len(part))).tolist())
        assert len(part) == len(ids) * windows.windows_per_trajectory
        seen.append(ids)
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    assert set().union(*seen) == set(range(20))
    assert [len(s) for s in seen] == [12, 4, 4]
    again = windows.split((0.6, 0.2, 0.2), seed=4)
    assert again[1].fingerprint() == val.fingerprint() != train.fingerprint()
    # a window of the validation part is the window of its source trajectory
    i = int(val.trajectory_ids([0])[0])
    np.testing.assert_array_equal(val[0]["x"], windows[i * windows.windows_per_trajectory]["x"])


@pytest.mark.parametrize("prefetch", [0, 2])
def test_batches_over_windows_resume_exactly(prefetch: int) -> None:
    trajs = Trajectories(_states(7, 20, (4, 2)), static={"theta": np.arange(7.0)[:, None]})
    windows = TrajectoryWindows(trajs, k=4, stride=2, targets="increments")
    kwargs: dict[str, Any] = dict(seed=5, num_epochs=2, drop_remainder=False, prefetch=prefetch)
    full = list(make_batches(windows, 16, **kwargs))
    first = make_batches(windows, 16, **kwargs)
    taken = _take(first, len(full) // 2 + 1)
    state = json.loads(json.dumps(first.get_state()))
    resumed = make_batches(windows, 16, **kwargs)
    resumed.set_state(state)
    rest = list(resumed)
    assert len(taken) + len(rest) == len(full)
    for got, want in zip(taken + rest, full, strict=True):
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].tobytes() == want[key].tobytes()


def test_fingerprint_follows_content_and_settings() -> None:
    states = _states()
    a = TrajectoryWindows(states, k=2)
    assert a.fingerprint() == TrajectoryWindows(states.copy(), k=2).fingerprint()
    assert a.fingerprint() != TrajectoryWindows(states, k=3).fingerprint()
    changed = states.copy()
    changed[0, 0, 0] += 1
    assert a.fingerprint() != TrajectoryWindows(changed, k=2).fingerprint()


# -- normalisation ------------------------------------------------------------------------


def test_channel_normalizer_of_states_and_increments() -> None:
    rng = np.random.default_rng(1)
    scale = np.array([1.0, 10.0])
    states = (rng.normal(size=(9, 30, 6, 2)) * scale + np.array([0.0, 5.0])).astype(np.float32)
    trajs = Trajectories(states)
    norm = fit_trajectory_normalizer(trajs, residual=True, step=2, batch_size=4)
    x = states.astype(np.float64)
    inc = x[:, 2:] - x[:, :-2]
    np.testing.assert_allclose(norm.mean["x"], x.mean(axis=(0, 1, 2)), rtol=1e-9)
    np.testing.assert_allclose(norm.std["x"], x.std(axis=(0, 1, 2)), rtol=1e-9)
    np.testing.assert_allclose(norm.mean["y"], inc.mean(axis=(0, 1, 2)), atol=1e-12)
    np.testing.assert_allclose(norm.std["y"], inc.std(axis=(0, 1, 2)), rtol=1e-9)
    feature = fit_trajectory_normalizer(trajs, residual=False, per="feature")
    assert feature.mean["x"].shape == (6, 2)
    np.testing.assert_array_equal(feature.std["y"], feature.std["x"])
    windows = TrajectoryWindows(trajs, k=1, step=2, targets="increments")
    assert windows.normalizer() == fit_trajectory_normalizer(trajs, residual=True, step=2)
    # per-channel stats broadcast over a batch of stacked targets
    stacked = TrajectoryWindows(trajs, k=3, targets="increments").get_batch(np.arange(5))
    assert norm.apply(stacked)["y"].shape == (5, 3, 6, 2)
    with pytest.raises(ConfigError, match=r"step=30.*T=30"):
        fit_trajectory_normalizer(trajs, step=30)
    with pytest.raises(ConfigError, match=r"per='grid'"):
        fit_trajectory_normalizer(trajs, per="grid")


def test_normalizer_travels_with_the_model_to_a_residual_forward(tmp_path: Path) -> None:
    states = _states(4, 10, (5, 2))
    norm = fit_trajectory_normalizer(Trajectories(states), residual=True)
    registry = LocalModelRegistry(tmp_path / "registry")

    def zero_increment(batch: np.ndarray) -> np.ndarray:
        return np.zeros_like(batch)

    op = NumpyLinearOp("pipekit_train.core.testing._numpy_model:linear", in_size=2, out_size=2)
    registry.register("traj", op, normalizer=norm)
    record = registry.record("traj")
    assert record.normalizer is not None and Normalizer.from_dict(record.normalizer) == norm
    forward = NeuralForward.from_record(record, zero_increment, residual=True, state_ndim=2)
    # the model predicts a zero normalised increment: the step adds the mean increment
    want = states[:, 0] + norm.mean["y"].astype(np.float32)
    np.testing.assert_allclose(forward(states[:, 0]), want, rtol=1e-6)


def test_windows_over_an_out_of_core_cache_shuffle_chunk_by_chunk(tmp_path: Path) -> None:
    states = _states(12, 50, (4,))
    trajs = Trajectories(states)
    in_memory = TrajectoryWindows(trajs, k=3)
    assert in_memory.chunk_size is None and in_memory.shuffle_window is None

    def windows_over(cache: CachedDataset) -> TrajectoryWindows:
        return TrajectoryWindows(Trajectories.from_rows(cache, length=50), k=3)

    def open_cache() -> CachedDataset:
        # 600 rows of 16 bytes in chunks of 25 rows: a budget of 10 chunks, not in memory
        return CachedDataset(tmp_path / "rows.zarr", memory_budget_bytes=4000, shuffle_window=2)

    CachedDataset.build(trajs.rows(), tmp_path / "rows.zarr", chunk_size=25)
    cache = open_cache()
    windows = windows_over(cache)
    assert (windows.chunk_size, windows.shuffle_window) == (25, 2)
    whole = CachedDataset(tmp_path / "rows.zarr")  # loaded whole, "auto": a full shuffle
    assert whole.in_memory and windows_over(whole).chunk_size is None
    kwargs: dict[str, Any] = dict(seed=3, num_epochs=1, drop_remainder=False)
    epoch = list(make_batches(windows, 16, **kwargs))
    seen = np.concatenate([b["x"] for b in epoch])
    assert len(seen) == len(in_memory)
    # every window once: the same multiset of windows as the in-memory dataset
    want = in_memory.get_batch(np.arange(len(in_memory)))["x"]
    assert sorted(map(bytes, seen)) == sorted(map(bytes, want))
    # a shuffle window (2 chunks of 25 windows) reads a few neighbouring storage chunks:
    # at most 2 reads per storage chunk in the epoch (measured: 42; a full shuffle: 337)
    assert not cache.in_memory and cache.chunk_reads <= 2 * 24, cache.chunk_reads
    # and it resumes exactly
    first = make_batches(windows_over(open_cache()), 16, **kwargs)
    taken = _take(first, 5)
    resumed = make_batches(windows_over(open_cache()), 16, **kwargs)
    resumed.set_state(json.loads(json.dumps(first.get_state())))
    for got, want_batch in zip(taken + list(resumed), epoch, strict=True):
        assert got["y"].tobytes() == want_batch["y"].tobytes()

"""The 2-D field emulator (`examples/field_emulator.py`) on every backend.

A reduced budget (10 simulated trajectories, 150 updates through the example's default
pushforward rollout, a width-8 conv net, 20-step rollouts): the emulator beats the
persistence forecast on each backend, and all three train from one cached dataset (built
once, read out of core). The default budget's numbers are in docs/examples.md. Kill and
resume of a field emulator's rollout training on every adapter is
`test_forced_field.py`'s (streamed from HDF5, with a forcing, a static field and history).
"""

from __future__ import annotations

from pathlib import Path

import field_emulator as fe
import numpy as np
import pytest

from pipekit_train.core.data import CachedDataset, SimulationDataset, Trajectories, make_batches

HERE = Path(__file__).resolve().parent
BACKENDS = ("equinox", "lightning", "keras")


@pytest.fixture(scope="module")
def field_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """10 simulated trajectories (81 states each) in a zarr cache, 2 trajectories a chunk."""
    sims = SimulationDataset(fe.trajectory, fe.sample_initial, n=10, seed=0, output_key="states")
    uri = tmp_path_factory.mktemp("fields") / "cache.zarr"
    CachedDataset.build(sims, uri, chunk_size=2)
    return str(uri)


def test_simulator_conserves_shape_and_is_periodic() -> None:
    rng = np.random.default_rng(0)
    state = fe.initial_state(rng)
    shifted = np.roll(state, (5, -3), axis=(0, 1))
    # periodic grid: a shifted state evolves into the shifted evolution
    np.testing.assert_allclose(
        fe.gray_scott(shifted, 20), np.roll(fe.gray_scott(state, 20), (5, -3), axis=(0, 1))
    )
    batch = np.stack([state, shifted])
    np.testing.assert_array_equal(fe.gray_scott(batch, 3)[0], fe.gray_scott(state, 3))
    assert fe.gray_scott(state).shape == (fe.GRID, fe.GRID, 2)


def test_the_cache_reads_out_of_core(field_cache: str) -> None:
    """A 4 KiB budget reads the cache chunk by chunk; the windows are the same bytes."""
    whole = CachedDataset(field_cache)
    streamed = CachedDataset(field_cache, memory_budget_bytes=4096)
    assert whole.in_memory and not streamed.in_memory
    rollout = fe.rollout_setting("k=4", 100)  # windows of 5 states
    in_memory = fe.windows(Trajectories.from_dataset(whole, state_key="states"), rollout)
    windows = fe.windows(Trajectories.from_dataset(streamed, state_key="states"), rollout)
    assert len(windows) == 10 * (fe.BURN_IN + 1 - 4)
    batches = make_batches(windows, 8, seed=0, shuffle=True)
    for _ in range(len(windows) // 8):  # one epoch
        batch = next(batches)
        assert batch["x"].shape == (8, fe.GRID, fe.GRID, 2)
        assert batch["y"].shape == (8, 4, fe.GRID, fe.GRID, 2)
    assert streamed.chunk_reads >= 10 // 2
    for i in (0, 77, len(windows) - 1):
        for key in ("x", "y"):
            np.testing.assert_array_equal(windows[i][key], in_memory[i][key])


@pytest.mark.slow
def test_one_cache_serves_every_backend(tmp_path: Path) -> None:
    """The example on all three backends: one shared cache, each beats persistence."""
    argv = ["--trajectories", "10", "--steps", "150", "--width", "8", "--rollout", "20"]
    argv += ["--out-of-core", "--out", str(tmp_path)]
    cache = tmp_path / "cache-10.zarr"
    stamps: dict[str, float] | None = None
    for backend in BACKENDS:
        result = fe.main(["--backend", backend, *argv])
        files = {str(p): p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
        assert stamps is None or files == stamps, "the cache was rebuilt for " + backend
        stamps = files
        print(f"{backend}: {result['rollout_error']:.3%} vs {result['persistence_error']:.3%}")
        assert np.isfinite(result["rollout_error"])
        assert result["rollout_error"] < 0.6 * result["persistence_error"], backend
        assert (tmp_path / backend / "rollout.png").stat().st_size > 50_000
        assert (tmp_path / backend / "registry" / "gray-scott-emulator" / "1").is_dir()

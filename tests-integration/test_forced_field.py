"""The forced, parametric field emulator (`examples/forced_field.py`) on every backend.

The simulator writes The Well's HDF5 layout; windows stream out of the file with the
diffusivity as a static input, the source amplitude as a forcing and a history of 2; a
run trained through a rollout of 4 and killed with SIGKILL resumes to the same bytes as
an uninterrupted one on Equinox, `Lightning()`, `Torch()` and Keras (the example end to
end, register → load with its layout → `Cycle` with the forcing, is core's
`test_core_model_inputs.py` on a small model and the example's own run). The default
budget's numbers (forced against unforced, history 2 against 1) are in
docs/guides/data.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forced_field as ff
import numpy as np
import pytest

from pipekit_train.core import Checkpoint

HERE = Path(__file__).resolve().parent
WORKER = HERE / "forced_field_kill_worker.py"
sys.path.insert(0, str(HERE))
from forced_field_kill_worker import loop  # noqa: E402


@pytest.fixture(scope="module")
def forced_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 simulated trajectories of 41 states in The Well's layout."""
    return ff.write_dataset(tmp_path_factory.mktemp("forced") / "train.hdf5", 6, seed=0)


def test_windows_stream_the_simulation_in_the_model_input_layout(forced_file: Path) -> None:
    sim = ff.simulate(6, seed=0)
    windows = ff.windows(forced_file, k=4, history=2)
    assert windows.inputs.in_channels == 5  # 2 states, the amplitude, diffusivity, source
    per = windows.windows_per_trajectory
    batch = windows.get_batch(np.array([0, per + 7]))
    for row, (i, t) in enumerate([(0, 1), (1, 8)]):  # the current time: start + 1
        x = batch["x"][row]
        np.testing.assert_array_equal(x[..., 0], sim["concentration"][i, t - 1])
        np.testing.assert_array_equal(x[..., 1], sim["concentration"][i, t])
        np.testing.assert_array_equal(
            x[..., 2], np.full((ff.GRID, ff.GRID), sim["source_amplitude"][i, t])
        )
        np.testing.assert_array_equal(x[..., 3], sim["diffusivity"][i])
        np.testing.assert_array_equal(x[..., 4], sim["source"][i])
        np.testing.assert_array_equal(
            batch["forcing"][row][:, 0, 0, 0], sim["source_amplitude"][i, t : t + 4]
        )
    unforced = ff.windows(forced_file, k=4, history=1, forced=False)
    assert unforced.inputs.in_channels == 3 and unforced.keys == ("x", "y")


def test_a_forced_step_of_the_simulator_depends_on_its_amplitude() -> None:
    sim = ff.simulate(2, seed=3, length=3)
    c, kappa, g = sim["concentration"][:, 0].astype(np.float64), sim["diffusivity"], sim["source"]
    a = ff.advect_diffuse(c, kappa, g, np.array([0.0, 0.0]))
    b = ff.advect_diffuse(c, kappa, g, np.array([1.0, 1.0]))
    assert np.all(b >= a) and (b - a).max() > 0.1  # the source adds concentration
    rolled = [np.roll(a_, 3, axis=-1) for a_ in (c, kappa, g)]
    shifted = ff.advect_diffuse(*rolled, 0.0)
    np.testing.assert_allclose(shifted, np.roll(a, 3, axis=-1), atol=1e-12)  # periodic


@pytest.mark.slow
@pytest.mark.parametrize("backend", ff.BACKENDS)
def test_kill_resume_of_a_forced_history_2_rollout_run_is_exact(
    backend: str, forced_file: Path, tmp_path: Path
) -> None:
    """SIGKILL after step 9 of 12; the resumed run has the uninterrupted run's bytes."""
    steps, directory = 12, tmp_path / "ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KERAS_BACKEND": "jax"}
    proc = subprocess.run(
        [sys.executable, str(WORKER), backend, str(forced_file), str(directory), str(steps), "9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    policy = Checkpoint(directory, every_n_steps=4, max_to_keep=None)
    resumed = loop(backend, str(forced_file), steps, checkpoint=policy).run()
    reference = loop(backend, str(forced_file), steps).run()
    assert resumed.resumed_from_step in (4, 8)  # the newest committed checkpoint
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    steps_seen, losses = resumed.history.series("loss")
    assert steps_seen == list(range(1, steps + 1))
    np.testing.assert_array_equal(losses, reference.history["loss"])

"""The checks every backend's rollout training passes (`TrainingLoop(rollout=...)`).

Each backend's test file calls them with a factory of fresh model operators (2 inputs,
2 outputs, the same initial weights every call, with `get_config` for a subprocess) and
its adapter:

- `check_rollout_prediction`: the `k`-step prediction inside training is
  `NeuralForward` applied `k` times (`Cycle`), on the same weights;
- `check_one_step_rollout`: `Rollout(steps=1)` trains exactly like one-step training;
- `check_rollout_resume`: a run stopped mid-schedule with input noise and resumed from
  its checkpoint ends with the same bytes and losses as an uninterrupted one;
- `check_rollout_kill_resume`: the same after a SIGKILL (a subprocess, as the
  conformance suite kills its runs), for an ensemble trained by the CRPS
  (`ROLLOUT_RESUME_LOSS`: members, each with noise drawn by core's feed, besides the
  input noise: every stream of the rollout's state);
- `check_rollout_schedule_counts_skipped_updates`: an update dropped by
  `on_nonfinite="skip"` counts on the schedule's clock, as it counts toward `max_steps`;
- `check_rollout_monitor_under_rollout`: a `RolloutMonitor` on a run trained through
  the rollout sees one model application per step (its validation evaluator rolls
  windows out, but applies the model once to pairs).

All but the skip check train on `golden_rollout_task`'s damped-pendulum windows.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipekit_train.core import Checkpoint, NeuralForward, Rollout, TrainingLoop, losses
from pipekit_train.core.data import TrajectoryWindows

from ._fork_server import run_python
from ._golden_rollout import golden_rollout_task

__all__ = [
    "ROLLOUT_RESUME_LOSS",
    "ROLLOUT_RESUME_SPEC",
    "check_one_step_rollout",
    "check_rollout_kill_resume",
    "check_rollout_monitor_under_rollout",
    "check_rollout_prediction",
    "check_rollout_resume",
    "check_rollout_schedule_counts_skipped_updates",
]

ROLLOUT_RESUME_SPEC = Rollout(
    steps=4, residual=True, noise_std=0.05, backprop=2, schedule={0: 1, 3: 2, 6: 4}
)
"""The rollout of the resume checks: a curriculum, input noise and cut backpropagation."""

ROLLOUT_RESUME_LOSS = losses.crps(members=3, noise_dim=2)
"""The kill-resume check's loss: a generative model of the state and 2 noise channels
(4 inputs, 2 outputs), 3 members per sample, scored by the fair CRPS."""

#: `predict(model, batch, normalizer, residual, k) -> predicted targets (B, k, *state)`:
#: the backend's rollout loss on a normalised numpy batch (its `predict`), as numpy.
Predict = Callable[[Any, Mapping[str, np.ndarray], Any, bool, int], np.ndarray]


def _loop(
    make_model: Callable[[], Any],
    adapter: Any,
    data: Any,
    rollout: Rollout | None,
    **overrides: Any,
) -> TrainingLoop:
    kwargs: dict[str, Any] = {
        "model": make_model(),
        "data": data,
        "rollout": rollout,
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "batch_size": 16,
        "max_steps": 5,
        "seed": 3,
        "adapter": adapter,
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def check_rollout_prediction(make_model: Callable[[], Any], predict: Predict) -> None:
    """The k-step prediction inside training equals `Cycle(NeuralForward)` on the weights.

    `predict` runs the backend's rollout loss on a normalised batch; its predicted
    targets, turned back into states, must be `NeuralForward(model, normalizer,
    residual)` applied 1..k times to the raw first states (float tolerance), for a
    residual and a non-residual model.
    """
    from pipekit_train.core.rollout import Cycle

    train, _ = golden_rollout_task()
    for residual in (True, False):
        windows = TrajectoryWindows(
            train.trajectories, k=4, targets="increments" if residual else "states"
        )
        norm = windows.normalizer()
        raw = windows.get_batch(np.arange(6))
        model = make_model()
        pred = np.asarray(predict(model, norm.apply(raw), norm, residual, 4), np.float64)
        assert pred.shape == (6, 4, 2), pred.shape
        pred = pred * norm.std["y"] + norm.mean["y"]  # physical targets
        states = raw["x"][:, None] + np.cumsum(pred, axis=1) if residual else pred
        forward = NeuralForward(model, normalizer=norm, residual=residual)
        want = np.asarray(Cycle(forward, 4).run(raw["x"]))
        np.testing.assert_allclose(
            states, np.moveaxis(want[1:], 0, 1), rtol=1e-5, atol=1e-5, err_msg=f"{residual=}"
        )


def check_one_step_rollout(make_model: Callable[[], Any], adapter: Any) -> None:
    """`Rollout(steps=1)` (no noise, a normalizer, states as targets) is one-step training."""
    train, _ = golden_rollout_task(k=1)
    windows = TrajectoryWindows(train.trajectories, k=1)
    norm = windows.normalizer()
    a = _loop(make_model, adapter, windows, Rollout(steps=1), normalizer=norm).run()
    b = _loop(make_model, adapter, windows, None, normalizer=norm).run()
    np.testing.assert_allclose(a.history["loss"], b.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(a.model(windows.get_batch(np.arange(8))["x"])),
        np.asarray(b.model(windows.get_batch(np.arange(8))["x"])),
        rtol=1e-5,
        atol=1e-6,
    )


def check_rollout_monitor_under_rollout(make_model: Callable[[], Any], adapter: Any) -> None:
    """`RolloutMonitor` on a `Rollout(steps=4)` run: its errors at the last validation are
    those of the trained model's own rollout (`artifact.rollout`, on the host)."""
    from pipekit_train.core import RolloutMonitor

    train, val = golden_rollout_task(k=4)
    monitor = RolloutMonitor(val.trajectories, 8, residual=True)
    artifact = _loop(
        make_model,
        adapter,
        train,
        Rollout(steps=4, residual=True),
        validation=val,
        normalizer=train.normalizer(),
        callbacks=[monitor],
        max_steps=4,
        validate_every_n_steps=4,
    ).run()
    assert monitor.last_report is not None, "the monitor never ran"
    want = artifact.rollout(val.trajectories, 8).metrics
    got = {k.removeprefix("val_"): v for k, v in monitor.last_report.metrics.items()}
    assert set(got) == set(want), (sorted(got), sorted(want))
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, err_msg=name)


def check_rollout_schedule_counts_skipped_updates(
    make_model: Callable[[], Any], adapter: Any
) -> None:
    """A skipped update counts on the rollout schedule's clock.

    Update 1's batch holds a non-finite state, so `on_nonfinite="skip"` drops that update.
    A schedule that turns to `k = 2` at update 2 then trains exactly like one that turns
    at update 1 (both skip update 1), and unlike one that turns at update 3.
    """
    rng = np.random.default_rng(0)
    states = np.cumsum(rng.normal(size=(6, 24, 2)) * 0.2, axis=1).astype(np.float32)
    states[1, 0] = np.nan  # the first window of trajectory 1: in update 1's batch only
    windows = TrajectoryWindows(states, k=2, targets="increments")

    def losses(turn: int) -> list[float]:
        spec = Rollout(steps=2, residual=True, schedule={0: 1, turn: 2})
        loop = _loop(
            make_model, adapter, windows, spec, shuffle=False, on_nonfinite="skip", max_steps=4
        )
        return list(loop.run().history["loss"])

    at_2, at_1, at_3 = losses(2), losses(1), losses(3)
    assert not np.isfinite(at_2[1]) and np.all(np.isfinite(at_2[2:])), at_2
    np.testing.assert_allclose(at_2[2:], at_1[2:], rtol=1e-6)
    assert abs(at_2[2] - at_3[2]) > 1e-3 * abs(at_3[2]), (at_2, at_3)


def check_rollout_resume(make_model: Callable[[], Any], adapter: Any, tmp_path: Path) -> None:
    """Stopped at step 4 (mid-schedule, with noise) and resumed: the bytes and losses of a
    straight run; a resume with another rollout is refused."""
    from pipekit_train.core import CheckpointError

    train, val = golden_rollout_task()
    norm = train.normalizer()
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, async_save=False)
    kw: dict[str, Any] = {
        "normalizer": norm,
        "shuffle": True,
        "validation": val,
        "validate_every_n_steps": 4,
    }
    spec = ROLLOUT_RESUME_SPEC
    _loop(make_model, adapter, train, spec, max_steps=4, checkpoint=policy, **kw).run()
    resumed = _loop(make_model, adapter, train, spec, max_steps=9, checkpoint=policy, **kw).run()
    straight = _loop(make_model, adapter, train, spec, max_steps=9, **kw).run()
    assert resumed.resumed_from_step == 4
    assert resumed.model.serialize_weights() == straight.model.serialize_weights()
    assert resumed.history["loss"] == straight.history["loss"]
    assert resumed.history["val_loss"] == straight.history["val_loss"]
    other = Rollout(steps=4, residual=True, noise_std=0.05, backprop=2)
    try:
        _loop(make_model, adapter, train, other, max_steps=12, checkpoint=policy, **kw).run()
    except CheckpointError as exc:
        assert "rollout" in str(exc), exc
    else:  # pragma: no cover - a failure
        raise AssertionError("a resume with another rollout was not refused")


def check_rollout_kill_resume(
    make_model: Callable[[], Any],
    adapter: Any,
    tmp_path: Path,
    *,
    steps: int = 16,
    kill_at: int = 11,
    env: Mapping[str, str] | None = None,
    preload: Sequence[str] = (),
) -> None:
    """A run killed with SIGKILL mid-schedule (with noise) resumes to the same bytes.

    The run (`ROLLOUT_RESUME_SPEC` with `ROLLOUT_RESUME_LOSS`: `make_model` builds a model
    of 4 inputs, the state's 2 and 2 noise channels, and 2 outputs; checkpoints every 4
    steps) trains in a subprocess
    (`pipekit_train.core.testing._worker`) that kills itself at `kill_at`; the resumed
    run must end with the weights, losses and validation losses of a straight run.
    `preload`: the modules a fork server imports for it (`AdapterConformance.worker_preload`).
    """
    from pipekit_train.core.checkpoint import step_dirs

    directory = str(tmp_path / "ck")
    spec = {
        "model": make_model().get_config(),
        "adapter": None if adapter is None else adapter.get_config(),
        "task": "rollout",
        "rollout": ROLLOUT_RESUME_SPEC.to_json(),
        "loss": ROLLOUT_RESUME_LOSS.describe(),
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "batch_size": 16,
        "max_steps": steps,
        "every_n_steps": 4,
        "validate_every_n_steps": 4,
        "kill_at": kill_at,
        "directory": directory,
        "seed": 3,
        "sys_path": [p for p in sys.path if p],
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = run_python(
        ["-m", "pipekit_train.core.testing._worker", str(spec_path)],
        env={**os.environ, **dict(env or {})},
        preload=(*preload, "pipekit_train.core.testing") if preload else (),
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == -9, (proc.returncode, out[-2000:], err[-4000:])
    policy = Checkpoint(directory, every_n_steps=4, max_to_keep=None)
    assert step_dirs(policy), f"no checkpoint before the kill: {err[-2000:]}"
    train, val = golden_rollout_task()
    kw: dict[str, Any] = {
        "normalizer": train.normalizer(),
        "validation": val,
        "validate_every_n_steps": 4,
        "max_steps": steps,
        "loss": ROLLOUT_RESUME_LOSS,
    }
    resumed = _loop(make_model, adapter, train, ROLLOUT_RESUME_SPEC, checkpoint=policy, **kw).run()
    straight = _loop(make_model, adapter, train, ROLLOUT_RESUME_SPEC, **kw).run()
    assert resumed.resumed_from_step is not None and 0 < resumed.resumed_from_step < steps
    assert resumed.model.serialize_weights() == straight.model.serialize_weights()
    steps_seen, losses = resumed.history.series("loss")
    assert steps_seen == list(range(1, steps + 1))
    np.testing.assert_array_equal(losses, straight.history["loss"])
    np.testing.assert_array_equal(resumed.history["val_loss"], straight.history["val_loss"])

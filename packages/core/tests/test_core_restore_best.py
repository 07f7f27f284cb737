"""`restore_best`: the artifact holds the best checkpoint's weights (numpy reference
backend); the monitored names and `restore_best` are refused before any work when the
run cannot honour them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, SeedGroup, TrainingLoop
from pipekit_train.core.callbacks import EarlyStopping, ReduceLROnPlateau, RolloutMonitor
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.testing import (
    RESTORE_BEST_STEP,
    RESTORE_BEST_STEPS,
    NumpyAdapter,
    NumpyLinearOp,
    ScoreReporter,
    check_restore_best,
    decode_arrays,
    regression_task,
    restore_best_loop,
)


def _model() -> NumpyLinearOp:
    return NumpyLinearOp("pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1)


def _loop(directory: Path, **overrides: Any) -> TrainingLoop:
    return restore_best_loop(_model, NumpyAdapter(), directory, **overrides)


def _saved(directory: Path | str, step: int) -> dict[str, bytes]:
    """The parameters checkpoint `directory/<step>` holds, as bytes."""
    arrays = decode_arrays((Path(directory) / str(step) / "arrays.bin").read_bytes())
    return {k.split("/", 1)[1]: v.tobytes() for k, v in arrays.items() if k.startswith("params/")}


def _held(artifact: Any) -> dict[str, bytes]:
    return {k: np.asarray(v).tobytes() for k, v in artifact.model.model.parameters().items()}


# --------------------------------------------------------------------------- the result


def test_the_artifact_holds_the_best_checkpoint(tmp_path: Path) -> None:
    art = check_restore_best(_model, NumpyAdapter(), tmp_path)
    directory = tmp_path / "ck"
    assert _held(art) == _saved(directory, RESTORE_BEST_STEP)
    assert _held(art) != _saved(directory, RESTORE_BEST_STEPS)  # the last weights differ
    assert art.lineage()["weights_step"] == RESTORE_BEST_STEP


def test_with_a_moving_average_both_models_come_from_the_best_checkpoint(
    tmp_path: Path,
) -> None:
    optimizer = {"name": "adam", "lr": 0.05, "ema": 0.5}
    art = _loop(tmp_path / "ck", optimizer_config=optimizer).run()
    arrays = decode_arrays((tmp_path / "ck" / str(RESTORE_BEST_STEP) / "arrays.bin").read_bytes())
    average = {k.split("/", 2)[2]: v.tobytes() for k, v in arrays.items() if "/ema/" in f"/{k}"}
    assert art.weights_step == RESTORE_BEST_STEP
    assert _held(art) == average
    raw = {k: np.asarray(v).tobytes() for k, v in art.raw_model.model.parameters().items()}
    assert raw == _saved(tmp_path / "ck", RESTORE_BEST_STEP) != average


def test_without_restore_best_the_artifact_holds_the_last_weights(tmp_path: Path) -> None:
    art = _loop(tmp_path / "ck", restore_best=False).run()
    assert art.weights_step == art.steps == RESTORE_BEST_STEPS and art.best_step == 4
    assert step_dirs(tmp_path / "ck") == [RESTORE_BEST_STEPS]  # no save at the improvement
    assert _held(art) == _saved(tmp_path / "ck", RESTORE_BEST_STEPS)


def test_the_best_step_survives_a_stop_and_resume(tmp_path: Path) -> None:
    """Stopped at step 6 and resumed to 10 (the best, step 4, is in the first run): the
    resumed run ends with step 4's weights, those of an uninterrupted run; here through
    `EarlyStopping(restore_best=True)`, whose state resumes too."""

    def loop(steps: int) -> TrainingLoop:
        stopper = EarlyStopping(monitor="val_score", patience=10, restore_best=True)
        return _loop(
            tmp_path / "ck",
            max_steps=steps,
            restore_best=False,
            callbacks=[ScoreReporter(), stopper],
        )

    first = loop(6).run()
    assert first.weights_step == RESTORE_BEST_STEP
    resumed = loop(RESTORE_BEST_STEPS).run()
    straight = _loop(tmp_path / "straight").run()
    assert resumed.resumed_from_step == 6 and resumed.steps == RESTORE_BEST_STEPS
    assert resumed.weights_step == resumed.best_step == RESTORE_BEST_STEP
    assert _held(resumed) == _held(straight) == _saved(tmp_path / "ck", RESTORE_BEST_STEP)


def test_a_best_step_without_its_checkpoint_keeps_the_last_weights(tmp_path: Path) -> None:
    """The first run did not restore the best, so it never saved step 4: warned, and the
    artifact says which weights it holds."""
    _loop(tmp_path / "ck", max_steps=6, restore_best=False).run()
    with pytest.warns(UserWarning) as caught:
        art = _loop(tmp_path / "ck").run()
    messages = [str(w.message) for w in caught]
    assert any("There is no checkpoint of step 4" in m for m in messages), messages
    assert any("best step 4 (`val_score`=1.0) could not be restored" in m for m in messages)
    assert art.best_step == 4 and art.weights_step == RESTORE_BEST_STEPS


def test_no_finite_best_keeps_the_last_weights(tmp_path: Path) -> None:
    scores = dict.fromkeys(range(2, 11, 2), math.nan)
    with pytest.warns(UserWarning, match="no validation gave a finite `val_score`"):
        art = _loop(tmp_path / "ck", callbacks=[ScoreReporter(scores)]).run()
    assert art.best_step is None and art.weights_step == RESTORE_BEST_STEPS


def test_seed_group_members_hold_their_best_checkpoints(tmp_path: Path) -> None:
    """In a group every member restores its own best step (val_loss diverges here, so
    the best comes early)."""
    train, val = regression_task(n_train=64, n_val=16)
    loop = TrainingLoop(
        _model(),
        train,
        val,
        optimizer_config={"name": "sgd", "lr": 0.8},
        batch_size=16,
        max_steps=10,
        validate_every_n_steps=2,
        checkpoint=Checkpoint(tmp_path / "ck", max_to_keep=1, keep_best=1, async_save=False),
        adapter=NumpyAdapter(),
        progress=False,
        restore_best=True,
    )
    arts = SeedGroup(loop, seeds=[0, 1]).run()
    for art in arts:
        assert art.best_step is not None and art.best_step < art.steps
        assert art.weights_step == art.best_step
        assert _held(art) == _saved(art.checkpoint_dir, art.best_step)


def test_retention_ranks_the_earliest_of_equal_scores_first() -> None:
    """A step saved after a validation carries its value: the step that measured it is
    the best; non-finite scores are not ranked."""
    policy = Checkpoint("unused", max_to_keep=1, keep_best=1, lease_timeout=None)
    assert policy.retained([2, 4, 6], {2: 1.0, 4: 0.5, 6: 0.5}) == {4, 6}
    assert policy.retained([2, 4, 6], {2: math.nan, 4: 0.5, 6: math.nan}) == {4, 6}
    top = Checkpoint("unused", max_to_keep=1, keep_best=1, mode="max", lease_timeout=None)
    assert top.retained([2, 4, 6, 8], {2: 1.0, 4: 2.0, 6: 2.0, 8: 0.0}) == {4, 8}


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"checkpoint": None}, r"restore_best=True ends the run .*Received: checkpoint=None"),
        ({"checkpoint": {"keep_best": None}}, r"Received: Checkpoint\(keep_best=None\)"),
        (
            {"checkpoint": {"monitor": "loss"}},
            r"ranks by a training metric. Received: Checkpoint\(monitor='loss'\)",
        ),
        ({"restore_best": "yes"}, r"Received: restore_best='yes'"),
        (
            {
                "restore_best": False,
                "callbacks": [ScoreReporter(), EarlyStopping(restore_best=True)],
            },
            r"Received: EarlyStopping\(monitor='val_loss'\), Checkpoint\(monitor='val_score'\)",
        ),
        (
            {
                "restore_best": False,
                "callbacks": [
                    ScoreReporter(),
                    EarlyStopping(monitor="val_score", mode="max", restore_best=True),
                ],
            },
            r"Received: EarlyStopping\(mode='max'\), Checkpoint\(mode='min'\)",
        ),
        (
            {"callbacks": [ScoreReporter(), EarlyStopping(monitor="val_scor")]},
            r"EarlyStopping\(monitor='val_scor'\) watches a metric that no part of the run "
            r"produces. Received: monitor='val_scor'; the validation produces val_loss, "
            r"val_score\.",
        ),
        (
            {"callbacks": [ScoreReporter(), ReduceLROnPlateau(monitor="val_mae")]},
            r"ReduceLROnPlateau\(monitor='val_mae'\) watches .*add the metric to `metrics=`",
        ),
        (
            {"restore_best": False, "callbacks": []},
            r"Checkpoint\(monitor='val_score'\) watches a metric that no part",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_before_any_work(
    tmp_path: Path, overrides: dict[str, Any], fragment: str
) -> None:
    directory = tmp_path / "ck"
    ck = overrides.get("checkpoint", {})
    if isinstance(ck, dict):
        options = {"keep_best": 1, "monitor": "val_score", **ck}
        overrides["checkpoint"] = Checkpoint(directory, **options)
    with pytest.raises(ConfigError, match=fragment):
        _loop(directory, **overrides)
    assert not directory.exists()


def test_monitors_the_run_produces_are_accepted(tmp_path: Path) -> None:
    """`val_<metric>` of `metrics=`; a name matching a declared pattern; any `val_` name
    when a callback reports validation metrics it does not declare (then the first
    validation checks it, as before)."""

    class Patterned:
        produces = ("val_rollout_*",)

        def validation_metrics(self, state: Any) -> dict[str, float]:
            return {"rollout_nrmse": 1.0}

    class Undeclared:
        def validation_metrics(self, state: Any) -> dict[str, float]:
            return {"other": 1.0}

    _loop(tmp_path / "a", metrics=["mae"], callbacks=[ScoreReporter(), EarlyStopping("val_mae")])
    _loop(
        tmp_path / "b",
        restore_best=False,
        callbacks=[Patterned(), ReduceLROnPlateau("val_rollout_nrmse")],
        checkpoint=None,
    )
    with pytest.raises(ConfigError, match=r"val_score, and names matching val_rollout_\*"):
        _loop(
            tmp_path / "c",
            callbacks=[ScoreReporter(), Patterned(), EarlyStopping("val_rolout_nrmse")],
        )
    late = _loop(
        tmp_path / "d",
        restore_best=False,
        checkpoint=None,
        callbacks=[Undeclared(), EarlyStopping("val_typo")],
    )
    with pytest.raises(ConfigError, match=r"did not produce. Received: monitor='val_typo'"):
        late.run()


def test_core_callbacks_declare_what_they_produce() -> None:
    trajectories = np.cumsum(np.ones((1, 8, 2), np.float32), axis=1)
    assert RolloutMonitor(trajectories, horizon=2).produces == ("val_rollout_*",)
    assert RolloutMonitor(trajectories, horizon=2, prefix="roll_").produces == ("val_roll_*",)
    assert EarlyStopping().produces == () and ReduceLROnPlateau().produces == ()

"""The adapter conformance suite: one test class every backend subclasses.

```python
from pipekit_train.core.testing import AdapterConformance

class TestEquinoxConformance(AdapterConformance):
    def make_model(self, in_size, out_size, seed=0):
        return EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=in_size,
                              out_size=out_size, seed=seed)
```

It checks that loss falls, determinism, exact resume after SIGKILL (to a local folder and
to S3 on a loopback moto server), preemption by a real SIGTERM/SIGUSR1 sent to a training
child (also during an async checkpoint write) and the `max_time` budget, one run per
checkpoint location (a second run refused while a training child holds it, a dead holder
taken over), torn checkpoints, checkpoints at a `memory://` URI,
callback order, writers, retention, early stopping, `ReduceLROnPlateau` across a resume, the NaN guard, the registry
round-trip, and a table of bad inputs that must fail before any work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core._errors import CheckpointError, ConfigError, IntegrityError
from pipekit_train.core.checkpoint._engine import TornCheckpointWarning, step_dirs
from pipekit_train.core.checkpoint._lease import LEASE_DIR, LeaseError, read_lease
from pipekit_train.core.checkpoint._policy import Checkpoint
from pipekit_train.core.checkpoint._store import FencedStepWarning
from pipekit_train.core.distributions._flow_math import flow_width
from pipekit_train.core.train._training_loop import TrainingLoop

from ._fork_server import run_python, spawn_python
from ._s3 import LoopbackS3, loopback_s3
from ._smallfs import SmallFilesystemUnavailable, small_filesystem
from ._tasks import FLOW_HEAD, TASKS, oscillator_task, regression_task, task_loss

__all__ = ["AdapterConformance", "BAD_INPUTS", "HookRecorder"]


class HookRecorder:
    """A callback that records every hook call as `(hook, step)`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def on_train_start(self, state: Any) -> None:
        self.calls.append(("on_train_start", state.step))

    def on_step_end(self, state: Any) -> None:
        self.calls.append(("on_step_end", state.step))

    def on_validation_end(self, state: Any) -> None:
        self.calls.append(("on_validation_end", state.step))

    def on_checkpoint(self, state: Any, path: str) -> None:
        self.calls.append(("on_checkpoint", state.step))

    def on_train_end(self, state: Any, artifact: Any) -> None:
        self.calls.append(("on_train_end", state.step))


class _NoHooks:
    pass


class _NoWrite:
    def flush(self) -> None: ...


class BadInputContext:
    """What a bad-input case builds its values from (see `Make`).

    Attributes:
        suite: the conformance test class instance (its `make_model`, `make_adapter`).
        tmp_path: the test's empty directory; every case must leave it as it found it,
            apart from what the case itself put there (`file`, `checkpoint_dir`).
        train: the shared regression training set (4 inputs, 1 target).
        validation: the shared regression validation set.
    """

    def __init__(self, suite: Any, tmp_path: Path, train: Any, validation: Any):
        self.suite = suite
        self.tmp_path = tmp_path
        self.train = train
        self.validation = validation
        self.prepared: dict[Path, bytes | None] = {}

    def file(self, name: str) -> Path:
        """An existing file under `tmp_path` (part of the case's set-up)."""
        path = self.tmp_path / name
        path.write_bytes(b"not a directory")
        self.prepared[path] = path.read_bytes()
        return path

    def checkpoint_dir(self, name: str, step: int = 4) -> Path:
        """A directory under `tmp_path` holding one (empty) step folder."""
        path = self.tmp_path / name
        (path / str(step)).mkdir(parents=True)
        self.prepared[path] = None
        self.prepared[path / str(step)] = None
        return path

    def dataset(self, n: int = 64, x: int = 4, y: int = 1, *, keys: tuple[str, ...] = ()) -> Any:
        """An `ArrayDataset` of `n` rows with `x` input and `y` target features.

        `keys`: name the two arrays differently (e.g. `("inputs", "y")`).
        """
        from pipekit_train.core.data import ArrayDataset

        rng = np.random.default_rng(0)
        names = keys or ("x", "y")
        arrays = (rng.standard_normal((n, x)), rng.standard_normal((n, y)))
        return ArrayDataset(**{k: a.astype(np.float32) for k, a in zip(names, arrays, strict=True)})


class Make:
    """A bad-input value built when the case runs, inside its `pytest.raises`.

    Args:
        build: `BadInputContext -> value` (it may raise the expected error itself).
        label: shown in the case's repr.
    """

    def __init__(self, build: Callable[[BadInputContext], Any], label: str):
        self.build = build
        self.label = label

    def __repr__(self) -> str:
        return f"<{self.label}>"


def _checkpoint(**kwargs: Any) -> Make:
    def build(ctx: BadInputContext) -> Checkpoint:
        return Checkpoint(ctx.tmp_path / "ck", **kwargs)

    return Make(build, f"Checkpoint(tmp/'ck', {kwargs})")


def _normalizer(mean: dict[str, Any], std: dict[str, Any]) -> Make:
    def build(ctx: BadInputContext) -> Any:
        from pipekit_train.core.data import Normalizer

        return Normalizer(mean, std)

    return Make(build, f"Normalizer(keys={sorted(mean)})")


def _stream(ctx: BadInputContext) -> Any:
    from pipekit_train.core.data import IterableDataset

    batch = ctx.train.get_batch(np.arange(len(ctx.train)))
    rows = [{"x": batch["x"][i], "y": batch["y"][i]} for i in range(len(ctx.train))]
    return IterableDataset(lambda: iter(rows))


def _model_class(ctx: BadInputContext) -> Any:
    return type(ctx.suite.make_model(4, 1, seed=0))


def _early_stopping(ctx: BadInputContext) -> list[Any]:
    from pipekit_train.core.callbacks import EarlyStopping

    return [EarlyStopping("val_loss")]


# (id, overrides of the TrainingLoop keyword arguments, regex the ConfigError must match).
# Every case must raise a `ConfigError` (or subclass) naming what was received, when the
# loop (or the object passed to it) is built: before any work, nothing written to disk.
BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    # sizes and schedules of the run
    ("batch_size_zero", {"batch_size": 0}, "batch_size=0"),
    ("batch_size_negative", {"batch_size": -4}, "batch_size=-4"),
    ("batch_size_float", {"batch_size": 8.0}, r"batch_size=8\.0"),
    ("batch_size_bool", {"batch_size": True}, "batch_size=True"),
    ("batch_size_too_large", {"batch_size": 10_000}, "batch_size=10000, but the dataset has 256"),
    ("max_steps_zero", {"max_steps": 0}, "max_steps=0"),
    ("max_steps_float", {"max_steps": 12.5}, r"max_steps=12\.5"),
    ("no_stopping_rule", {"max_steps": None}, "max_steps=None, max_epochs=None"),
    ("max_epochs_negative", {"max_epochs": -1}, "max_epochs=-1"),
    (
        "max_epochs_on_a_stream",
        {"data": Make(_stream, "IterableDataset"), "max_steps": None, "max_epochs": 2},
        "max_epochs=2",
    ),
    ("validate_every_zero", {"validate_every_n_steps": 0}, "validate_every_n_steps=0"),
    (
        "validate_every_without_validation",
        {"validation": None, "validate_every_n_steps": 5},
        "validate_every_n_steps=5, validation=None",
    ),
    ("log_every_zero", {"log_every_n_steps": 0}, "log_every_n_steps=0"),
    ("accumulate_zero", {"accumulate_grad_batches": 0}, "accumulate_grad_batches=0"),
    ("accumulate_float", {"accumulate_grad_batches": 2.0}, r"accumulate_grad_batches=2\.0"),
    ("shuffle_not_bool", {"shuffle": "yes"}, "shuffle='yes'"),
    ("drop_remainder_not_bool", {"drop_remainder": 1}, "drop_remainder=1"),
    ("sweep_id_not_string", {"sweep_id": 7}, "sweep_id=7"),
    # seeds
    ("negative_seed", {"seed": -1}, "seed=-1"),
    ("seed_string", {"seed": "zero"}, "seed='zero'"),
    ("seed_bool", {"seed": True}, "seed=True"),
    (
        "model_seed_negative",
        {"model": Make(lambda ctx: ctx.suite.make_model(4, 1, seed=-1), "model(seed=-1)")},
        "seed=-1",
    ),
    # the model and the adapter
    ("model_not_a_model", {"model": "linear"}, "model=str"),
    (
        "model_factory_not_importable",
        {
            "model": Make(
                lambda ctx: _model_class(ctx)("no_such_module_xyz:net", in_size=4, out_size=1),
                "ModelOp('no_such_module_xyz:net')",
            )
        },
        "factory='no_such_module_xyz:net'",
    ),
    ("adapter_not_adapter", {"adapter": "equinox"}, "adapter='equinox'"),
    ("sharding_not_a_spec", {"sharding": "bogus"}, "sharding='bogus'"),
    # loss and metrics
    ("unknown_loss", {"loss": "msee"}, "msee"),
    ("loss_not_callable", {"loss": 3}, "loss=3"),
    ("unknown_metric", {"metrics": ["maee"]}, "maee"),
    ("metrics_not_a_list", {"metrics": 3}, "metrics=3"),
    ("metrics_without_validation", {"validation": None, "metrics": ["mae"]}, "validation=None"),
    # the optimizer spec
    (
        "negative_learning_rate",
        {"optimizer_config": {"name": "adam", "lr": -1.0}},
        "learning_rate=-1.0",
    ),
    (
        "nan_learning_rate",
        {"optimizer_config": {"name": "adam", "lr": float("nan")}},
        "learning_rate=nan",
    ),
    (
        "conflicting_lr",
        {"optimizer_config": {"name": "adam", "lr": 0.1, "learning_rate": 0.2}},
        "lr=0.1, learning_rate=0.2",
    ),
    ("unknown_optimizer", {"optimizer_config": {"name": "adamw_typo", "lr": 0.01}}, "adamw_typo"),
    (
        "unknown_optimizer_key",
        {"optimizer_config": {"name": "adam", "lr": 0.01, "beta1": 0.8}},
        "beta1=0.8",
    ),
    ("optimizer_config_not_a_dict", {"optimizer_config": "adam"}, "optimizer_config"),
    (
        "clip_norm_and_clip_value",
        {"optimizer_config": {"name": "adam", "lr": 0.01, "clip_norm": 1.0, "clip_value": 0.5}},
        "clip_norm=1.0, clip_value=0.5",
    ),
    (
        "clip_norm_negative",
        {"optimizer_config": {"name": "adam", "lr": 0.01, "clip_norm": -1.0}},
        "clip_norm=-1.0",
    ),
    (
        "momentum_out_of_range",
        {"optimizer_config": {"name": "sgd", "lr": 0.01, "momentum": 1.5}},
        "momentum=1.5",
    ),
    (
        "weight_decay_negative",
        {"optimizer_config": {"name": "adamw", "lr": 0.01, "weight_decay": -0.1}},
        "weight_decay=-0.1",
    ),
    (
        "accumulation_as_optimizer_option",
        {"optimizer_config": {"name": "adam", "lr": 0.01, "gradient_accumulation_steps": 4}},
        "gradient_accumulation_steps=4",
    ),
    (
        "unknown_schedule",
        {"optimizer_config": {"name": "adam", "lr": {"schedule": "cosinee", "init_value": 0.1}}},
        "cosinee",
    ),
    (
        "schedule_missing_steps",
        {"optimizer_config": {"name": "adam", "lr": {"schedule": "cosine", "init_value": 0.1}}},
        "decay_steps",
    ),
    # the non-finite policy
    ("on_nonfinite_unknown", {"on_nonfinite": "skipp"}, "on_nonfinite='skipp'"),
    (
        "max_consecutive_skips_zero",
        {"on_nonfinite": "skip", "max_consecutive_skips": 0},
        "max_consecutive_skips=0",
    ),
    (
        "max_consecutive_skips_float",
        {"on_nonfinite": "skip", "max_consecutive_skips": 2.5},
        r"max_consecutive_skips=2\.5",
    ),
    (
        "max_consecutive_skips_without_skip",
        {"max_consecutive_skips": 5},
        "max_consecutive_skips=5, on_nonfinite='stop'",
    ),
    # data
    ("data_none", {"data": None}, "data=None"),
    ("data_not_dataset", {"data": [1, 2, 3]}, "data=list"),
    (
        "data_wrong_keys",
        {"data": Make(lambda ctx: ctx.dataset(keys=("inputs", "y")), "inputs/y")},
        r"keys=\['inputs', 'y'\]",
    ),
    (
        "validation_wrong_keys",
        {"validation": Make(lambda ctx: ctx.dataset(8, keys=("x", "target")), "x/target")},
        r"keys=\['target', 'x'\]",
    ),
    (
        "validation_empty",
        {"validation": Make(lambda ctx: ctx.dataset(n=0), "0 rows")},
        r"len\(validation\)=0",
    ),
    (
        "data_feature_width",
        {"data": Make(lambda ctx: ctx.dataset(x=5), "x width 5")},
        r"data\['x'\] with samples of shape \(5,\).*the model expects inputs of shape \(4,\)",
    ),
    (
        "validation_feature_width",
        {"validation": Make(lambda ctx: ctx.dataset(x=5), "x width 5")},
        r"validation\['x'\] with samples of shape \(5,\)",
    ),
    (
        "data_target_width",
        {"data": Make(lambda ctx: ctx.dataset(y=2), "y width 2")},
        r"data\['y'\] with samples of shape \(2,\).*the model predicts samples of shape \(1,\)",
    ),
    (
        "validation_target_width",
        {"validation": Make(lambda ctx: ctx.dataset(y=2), "y width 2")},
        r"validation\['y'\] with samples of shape \(2,\)",
    ),
    ("normalizer_not_a_normalizer", {"normalizer": "zscore"}, "normalizer='zscore'"),
    (
        "normalizer_unknown_key",
        {"normalizer": _normalizer({"inputs": np.zeros(4)}, {"inputs": np.ones(4)})},
        r"normalizer.*\['inputs'\]",
    ),
    (
        "normalizer_feature_shape",
        {"normalizer": _normalizer({"x": np.zeros(5)}, {"x": np.ones(5)})},
        r"normalizer.*\(5,\)",
    ),
    # callbacks and writers
    ("callback_without_hooks", {"callbacks": [_NoHooks()]}, "_NoHooks"),
    ("callbacks_not_a_list", {"callbacks": _NoHooks()}, "callbacks="),
    ("writer_without_write", {"writers": [_NoWrite()]}, "_NoWrite"),
    ("writers_not_a_list", {"writers": "m.jsonl"}, "writers='m.jsonl'"),
    (
        "early_stopping_without_validation",
        {"validation": None, "callbacks": Make(_early_stopping, "[EarlyStopping('val_loss')]")},
        "validation=None",
    ),
    # checkpoints
    ("checkpoint_not_a_policy", {"checkpoint": 5}, "checkpoint=5"),
    ("checkpoint_every_zero", {"checkpoint": _checkpoint(every_n_steps=0)}, "every_n_steps=0"),
    ("checkpoint_max_to_keep_zero", {"checkpoint": _checkpoint(max_to_keep=0)}, "max_to_keep=0"),
    (
        "checkpoint_bad_resume",
        {"checkpoint": _checkpoint(resume="sometimes")},
        "resume='sometimes'",
    ),
    ("checkpoint_bad_mode", {"checkpoint": _checkpoint(mode="biggest")}, "mode='biggest'"),
    (
        "checkpoint_keep_best_without_validation",
        {"validation": None, "checkpoint": _checkpoint(keep_best=1)},
        "validation=None",
    ),
    (
        "checkpoint_unknown_uri",
        {"checkpoint": Make(lambda ctx: Checkpoint("nosuchproto://bucket/run"), "nosuchproto://")},
        "nosuchproto://bucket/run",
    ),
    (
        "checkpoint_path_is_a_file",
        {"checkpoint": Make(lambda ctx: Checkpoint(ctx.file("ck")), "Checkpoint(file)")},
        "existing file",
    ),
    (
        "checkpoint_string_is_a_file",
        {"checkpoint": Make(lambda ctx: str(ctx.file("ck")), "str(file)")},
        "existing file",
    ),
    (
        "checkpoint_resume_never_not_empty",
        {
            "checkpoint": Make(
                lambda ctx: Checkpoint(ctx.checkpoint_dir("ck"), resume="never"), "resume='never'"
            )
        },
        "resume='never'",
    ),
]


class AdapterConformance:
    """Subclass as `Test<Backend>Conformance` and implement `make_model`.

    Attributes:
        optimizer_config: the optimizer every test uses.
        batch_size: the batch size every test uses.
        subprocess_env: extra environment for the kill-and-resume subprocess.
        cloud_resume: whether to run the kill-and-resume test against S3 too (a second
            subprocess; a variant of a backend already covered may switch it off).
        flow_resume: whether to run the kill-and-resume test with the flow head
            (`flow_nll` on `flow_task`; an adapter that trains `mse` only, or a variant of
            a backend already covered, may switch it off).
        rollout_resume: whether to run the kill-and-resume test of rollout training (a
            variant of a backend already covered may switch it off; a backend without
            rollout training is checked to refuse it either way).
        worker_preload: modules (the framework) that the kill-and-resume and preemption
            workers import before they fork from a server process, instead of each
            starting a fresh interpreter (`_fork_server`); empty: a plain subprocess.
        fencing_trial: whether to run the stall-and-takeover trial (a run stalled at a
            save, taken over, woken to write: its late step must never be resumed); a
            variant of a backend already covered may switch it off.
        fencing_trial_s3: whether to run that trial against S3 too (with `cloud_resume`).
    """

    optimizer_config: dict[str, Any] = {"name": "adam", "lr": 0.05}
    batch_size: int = 16
    subprocess_env: dict[str, str] = {}
    resume_steps: int = 24
    kill_at: int = 14
    cloud_resume: bool = True
    flow_resume: bool = True
    rollout_resume: bool = True
    fencing_trial: bool = True
    fencing_trial_s3: bool = True
    worker_preload: tuple[str, ...] = ()
    last_reference: Any = None  # the uninterrupted run of the last `_kill_and_resume`
    s3_bucket: str = "pipekit-conformance"
    small_fs_size: str = "192k"

    # -- hooks for subclasses -----------------------------------------------------------
    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        """Return a model operator for a dense map `in_size → out_size`."""
        raise NotImplementedError

    def make_adapter(self) -> Any:
        """Return the adapter (None: the model's default). Must have `get_config()`."""
        return None

    def tear_checkpoint(self, step_dir: Path) -> None:
        """Damage one saved step the way an interrupted write would (largest file halved)."""
        files = [p for p in step_dir.rglob("*") if p.is_file()]
        biggest = max(files, key=lambda p: p.stat().st_size)
        data = biggest.read_bytes()
        biggest.write_bytes(data[: len(data) // 2])

    # -- helpers ------------------------------------------------------------------------
    def loop(
        self, tmp_path: Path | None = None, *, task: str = "regression", **overrides: Any
    ) -> TrainingLoop:
        train, val = TASKS[task]()
        kwargs: dict[str, Any] = {
            "model": self.make_model(*self._sizes(task), seed=0),
            "data": train,
            "validation": val,
            "loss": task_loss(task),
            "optimizer_config": dict(self.optimizer_config),
            "batch_size": self.batch_size,
            "max_steps": 40,
            "seed": 0,
            "adapter": self.make_adapter(),
            "progress": False,
        }
        kwargs.update(overrides)
        return TrainingLoop(**kwargs)

    @staticmethod
    def _sizes(task: str) -> tuple[int, int]:
        """The model's `(in_size, out_size)` for `task` (the flow's width for `"flow"`)."""
        train, _ = TASKS[task]()
        in_size, out_size = train[0]["x"].shape[-1], train[0]["y"].shape[-1]
        if task == "flow":
            return in_size, flow_width(out_size, FLOW_HEAD["flow_layers"], FLOW_HEAD["flow_bins"])
        return in_size, out_size

    @staticmethod
    def _losses(artifact: Any) -> np.ndarray:
        return np.asarray(artifact.history["loss"], dtype=np.float64)

    # -- training works -----------------------------------------------------------------
    def test_loss_falls_on_regression(self) -> None:
        art = self.loop(max_steps=60).run()
        losses = self._losses(art)
        assert len(losses) == 60
        assert losses[-5:].mean() < 0.25 * losses[:5].mean(), losses
        assert art.steps == 60 and art.backend == self.loop().plan.backend
        assert "val_loss" in art.final_metrics

    def test_loss_falls_on_oscillator(self) -> None:
        art = self.loop(task="oscillator", max_steps=60).run()
        losses = self._losses(art)
        assert losses[-5:].mean() < 0.5 * losses[:5].mean(), losses
        pred = np.asarray(art.model(oscillator_task()[1].get_batch(np.arange(8))["x"]))
        assert pred.shape == (8, 2)

    def test_metrics_and_validation(self) -> None:
        art = self.loop(max_steps=20, metrics=["mae", "rmse"], validate_every_n_steps=10).run()
        steps, _ = art.history.series("val_loss")
        assert steps == [10, 20]
        assert {"val_mae", "val_rmse"} <= set(art.final_metrics)
        assert art.best_step in (10, 20) and art.best_metric == min(art.history["val_loss"])

    def test_same_seed_same_bytes(self) -> None:
        a = self.loop(max_steps=12).run()
        b = self.loop(max_steps=12).run()
        assert a.model.serialize_weights() == b.model.serialize_weights()
        assert a.weights_sha256 == b.weights_sha256

    def test_different_seed_different_bytes(self) -> None:
        a = self.loop(max_steps=6, seed=0).run()
        b = self.loop(max_steps=6, seed=1).run()
        assert a.model.serialize_weights() != b.model.serialize_weights()

    def _worker(self, spec_path: Path) -> dict[str, Any]:
        """`spawn_python`/`run_python` arguments of `pipekit_train.core.testing._worker
        spec_path` (forked from a server when `worker_preload` is set)."""
        preload = (
            (*self.worker_preload, "pipekit_train.core.testing") if self.worker_preload else ()
        )
        return {
            "args": ["-m", "pipekit_train.core.testing._worker", str(spec_path)],
            "env": {**os.environ, **self.subprocess_env},
            "preload": preload,
        }

    # -- exact resume -------------------------------------------------------------------
    def _adapter_config(self) -> dict[str, Any] | None:
        adapter = self.make_adapter()
        return None if adapter is None else adapter.get_config()

    def _kill_and_resume(
        self,
        tmp_path: Path,
        directory: str,
        storage_options: dict[str, Any] | None = None,
        optimizer_config: dict[str, Any] | None = None,
        task: str = "regression",
    ) -> Checkpoint:
        """SIGKILL a run that checkpoints to `directory`, resume it, compare the bytes."""
        optimizer = dict(self.optimizer_config if optimizer_config is None else optimizer_config)
        spec = {
            "model": self.make_model(*self._sizes(task), seed=0).get_config(),
            "adapter": self._adapter_config(),
            "task": task,
            "optimizer_config": optimizer,
            "batch_size": self.batch_size,
            "max_steps": self.resume_steps,
            "every_n_steps": 4,
            "validate_every_n_steps": 8,
            "kill_at": self.kill_at,
            "directory": directory,
            "storage_options": storage_options,
            "seed": 0,
            "sys_path": [p for p in sys.path if p],
        }
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(spec))
        proc = run_python(**self._worker(spec_path), timeout=600)
        out, err = proc.stdout, proc.stderr
        assert proc.returncode == -9, (proc.returncode, out[-2000:], err[-4000:])
        policy = Checkpoint(
            directory, every_n_steps=4, max_to_keep=None, storage_options=storage_options
        )
        assert step_dirs(policy), f"no checkpoint was written before the kill: {err[-2000:]}"
        dead = read_lease(policy)  # the killed run could not release its lease
        assert dead is not None, "the killed run held no lease on its checkpoint location"

        resumed = self.loop(
            task=task,
            max_steps=self.resume_steps,
            checkpoint=policy,
            validate_every_n_steps=8,
            optimizer_config=optimizer,
        ).run()
        assert resumed.resumed_from_step is not None and resumed.resumed_from_step >= 8
        assert read_lease(policy) is None  # taken over at once, released at the end
        reference = self.loop(
            task=task,
            max_steps=self.resume_steps,
            validate_every_n_steps=8,
            optimizer_config=optimizer,
        ).run()
        assert resumed.model.serialize_weights() == reference.model.serialize_weights()
        assert resumed.raw_model.serialize_weights() == reference.raw_model.serialize_weights()
        np.testing.assert_array_equal(resumed.history["val_loss"], reference.history["val_loss"])
        assert resumed.steps == reference.steps == self.resume_steps
        # the history survives the resume: every step's loss is there exactly once
        steps, losses = resumed.history.series("loss")
        assert steps == list(range(1, self.resume_steps + 1))
        np.testing.assert_array_equal(losses, reference.history["loss"])
        self.last_reference = reference  # the uninterrupted run, for a test's own checks
        return policy

    @pytest.mark.slow
    def test_exact_resume_after_sigkill(self, tmp_path: Path) -> None:
        self._kill_and_resume(tmp_path, str(tmp_path / "ckpt"))

    @pytest.mark.slow
    def test_exact_resume_after_sigkill_with_the_flow_head(self, tmp_path: Path) -> None:
        """The flow head (`flow_nll` on a 2-value curved density) resumes to the same bytes."""
        if not self.flow_resume:
            pytest.skip("flow_resume is off for this variant (see the class's flow_resume)")
        self._kill_and_resume(tmp_path, str(tmp_path / "ckpt"), task="flow")
        # the flow's NLL is what was trained: it falls over the (uninterrupted) run
        losses = self._losses(self.last_reference)
        assert np.isfinite(losses).all() and losses[-4:].mean() < losses[:4].mean(), losses

    @pytest.mark.slow
    def test_exact_resume_after_sigkill_with_ema(self, tmp_path: Path) -> None:
        """`optimizer_config["ema"]`: the average is in the checkpoint, the resume exact."""
        from pipekit_train.core.contract._adapter import NotSupportedError

        config = {**self.optimizer_config, "ema": 0.8}
        if not self.loop(max_steps=1).adapter.capabilities.ema:  # refused before any work
            with pytest.raises(NotSupportedError, match="moving average.*ema"):
                self.loop(optimizer_config=config)
            return
        self._kill_and_resume(tmp_path, str(tmp_path / "ckpt"), optimizer_config=config)
        # the artifact's model is the average, not the trained weights
        art = self.loop(max_steps=12, optimizer_config=config).run()
        assert art.model.serialize_weights() != art.raw_model.serialize_weights()

    @pytest.mark.slow
    def test_rollout_exact_resume_after_sigkill(self, tmp_path: Path) -> None:
        """Rollout training of an ensemble (the CRPS) killed mid-schedule (with input
        and member noise) resumes to the same bytes (`check_rollout_kill_resume`); a
        backend without rollout training refuses it before any work."""
        from pipekit_train.core.contract._adapter import NotSupportedError

        from ._golden_rollout import golden_rollout_task
        from ._rollout_training import ROLLOUT_RESUME_SPEC, check_rollout_kill_resume

        def make() -> Any:  # the state's 2 channels and 2 noise channels in
            return self.make_model(4, 2, seed=0)

        supported = self.loop(max_steps=1).adapter.capabilities.rollout
        if supported and not self.rollout_resume:
            pytest.skip("rollout_resume is off for this variant (see the class's rollout_resume)")
        if not supported:
            train, _ = golden_rollout_task()
            with pytest.raises(NotSupportedError, match="Rollout training is not supported"):
                TrainingLoop(
                    model=make(),
                    data=train,
                    rollout=ROLLOUT_RESUME_SPEC,
                    adapter=self.make_adapter(),
                    max_steps=1,
                    progress=False,
                )
            return
        check_rollout_kill_resume(
            make,
            self.make_adapter(),
            tmp_path,
            env=self.subprocess_env,
            preload=self.worker_preload,
        )

    # -- preemption and time budgets ------------------------------------------------------
    def _preempt_and_resume(
        self, tmp_path: Path, *, signum: int, during_save: bool, seed: int
    ) -> dict[str, Any]:
        """Send a real preemption signal to a training child; resume; compare the bytes.

        The child trains `resume_steps` steps slowly with periodic checkpoints far apart;
        the signal comes at a random step. With `during_save` checkpoints come every 5
        steps and the child holds the first one's commit (`hold_first_write` of the
        worker) until its handler has recorded the signal, so the signal arrives while
        that write is in flight; the child must still complete it before `Preempted`.
        The child must end within 30 s with the CLI's preemption status, leaving a
        complete checkpoint at the step it reached; the rerun resumes from it and ends
        with the same weight bytes as an uninterrupted run.
        """
        import random
        import signal as signal_module
        import time

        from pipekit_train.core.run._preemption import PREEMPTED_EXIT_STATUS

        rng = random.Random(seed)
        every = 5 if during_save else 1000
        directory = tmp_path / "ckpt"
        progress, result = tmp_path / "progress.txt", tmp_path / "result.json"
        spec = {
            "model": self.make_model(4, 1, seed=0).get_config(),
            "adapter": self._adapter_config(),
            "task": "regression",
            "optimizer_config": dict(self.optimizer_config),
            "batch_size": self.batch_size,
            "max_steps": self.resume_steps,
            "every_n_steps": every,
            "validate_every_n_steps": 8,
            "mode": "preempt",
            "step_sleep": 0.25,
            "progress": str(progress),
            "result": str(result),
            "directory": str(directory),
            "seed": 0,
            "hold_first_write": during_save,
            "sys_path": [p for p in sys.path if p],
        }
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(spec))
        proc = spawn_python(**self._worker(spec_path))
        target = rng.randint(2, self.resume_steps // 2)
        wanted = "writing 5" if during_save else f"step {target}"
        deadline = time.monotonic() + 600
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                lines = progress.read_text().splitlines() if progress.exists() else []
                if wanted in lines:
                    break
                time.sleep(0.005)
            assert proc.poll() is None, (proc.returncode, proc.communicate()[1][-4000:])
            if not during_save:
                self._second_run_is_refused(directory, holder_pid=proc.pid)
                time.sleep(rng.uniform(0.0, 0.25))  # anywhere inside a step
            before = progress.read_text().splitlines()
            sent = time.monotonic()
            os.kill(proc.pid, signum)
            _, err = proc.communicate(timeout=30)
            elapsed = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == PREEMPTED_EXIT_STATUS, (proc.returncode, err[-4000:])
        assert elapsed < 30, elapsed
        info = json.loads(result.read_text())
        step = info["step"]
        assert info["signal"] == signal_module.Signals(signum).name
        policy = Checkpoint(str(directory), every_n_steps=every, max_to_keep=None)
        assert info["checkpoint"] == policy.step_location(step)
        assert step_dirs(policy)[-1] == step, (step_dirs(policy), step)
        if during_save:
            assert step > 5 and 5 in step_dirs(policy)
            # the write of step 5 was in flight when the signal came, and the run waited
            # for it (and for the preemption's own checkpoint) before `Preempted`
            assert "writing 5" in before and "committed 5" not in before, before
            lines = progress.read_text().splitlines()
            order = [
                "writing 5",
                "signalled during write 5",
                "committed 5",
                f"committed {step}",
                "preempted",
            ]
            assert all(line in lines for line in order), lines
            assert [lines.index(line) for line in order] == sorted(
                lines.index(line) for line in order
            ), lines
        else:
            assert step >= target
        assert step < self.resume_steps
        resumed = self.loop(
            max_steps=self.resume_steps, checkpoint=policy, validate_every_n_steps=8
        ).run()
        assert resumed.resumed_from_step == step
        reference = self.loop(max_steps=self.resume_steps, validate_every_n_steps=8).run()
        assert resumed.model.serialize_weights() == reference.model.serialize_weights()
        steps, losses = resumed.history.series("loss")
        assert steps == list(range(1, self.resume_steps + 1))
        np.testing.assert_array_equal(losses, reference.history["loss"])
        return info

    # -- one run per location: fenced writes ------------------------------------------
    def _stall_trial(
        self, tmp_path: Path, directory: str, storage_options: dict[str, Any] | None
    ) -> None:
        """A worker stalls at its 4th save (step 8, after its lease check); this process
        takes the location over, resumes from step 6 and trains to step 7; the worker
        wakes and writes step 8, the newest step on disk. The next run must skip it (void:
        an older generation wrote it after the takeover) and end with the new holder's
        weights (SHA-256)."""
        from ._lease import stall_and_take_over
        from ._worker import LEASE_LOST_EXIT

        if not self.fencing_trial:
            pytest.skip("fencing_trial is off for this variant (its backend runs it elsewhere)")
        spec = {
            "model": self.make_model(*self._sizes("regression"), seed=0).get_config(),
            "adapter": self._adapter_config(),
            "task": "regression",
            "optimizer_config": dict(self.optimizer_config),
            "batch_size": self.batch_size,
            "seed": 0,
            "sys_path": [p for p in sys.path if p],
        }
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = stall_and_take_over(
                loop=self.loop,
                spawn=lambda path: spawn_python(**self._worker(path)),
                spec=spec,
                workdir=tmp_path,
                directory=directory,
                storage_options=storage_options,
                stall_save=4,
                holder_steps=7,
                timeout=0.5,
                reference=False,  # the new holder resumed: the kill-and-resume tests show
                # that a resumed run is an uninterrupted one, bit for bit
            )
        assert result.stalled_exit == LEASE_LOST_EXIT, result.stalled_stderr[-3000:]
        assert "lost its lease" in result.stalled_stderr
        assert result.resumed_from == 6 and result.late_steps == (8,), result
        assert result.final_resumed_from == 7, result
        assert result.final_sha256 == result.holder_sha256
        fenced = [str(w.message) for w in caught if issubclass(w.category, FencedStepWarning)]
        assert len(fenced) == 1 and "(step 8)" in fenced[0] and "never resumed" in fenced[0]
        assert step_dirs(Checkpoint(directory, storage_options=storage_options)) == [2, 4, 6, 7]

    @pytest.mark.slow
    def test_a_run_taken_over_while_stalled_never_becomes_the_resumed_state(
        self, tmp_path: Path
    ) -> None:
        self._stall_trial(tmp_path, str(tmp_path / "ckpt"), None)

    @pytest.mark.slow
    def test_a_run_taken_over_while_stalled_never_becomes_the_resumed_state_on_s3(
        self, tmp_path: Path, loopback: LoopbackS3
    ) -> None:
        if not (self.cloud_resume and self.fencing_trial_s3):
            pytest.skip("the S3 trial is off for this variant (its backend runs it elsewhere)")
        uri = f"s3://{self.s3_bucket}/{type(self).__name__}-{uuid.uuid4().hex[:8]}/ckpt"
        self._stall_trial(tmp_path, uri, loopback.storage_options)

    def _second_run_is_refused(self, directory: Path, *, holder_pid: int) -> None:
        """A run started on the location of a live training child (another plan: another
        learning rate) is refused within seconds, naming the child, and writes nothing."""
        import time

        policy = Checkpoint(str(directory), every_n_steps=2, max_to_keep=None)
        before = sorted(p.name for p in directory.iterdir())
        optimizer = {**self.optimizer_config, "lr": 0.5 * self.optimizer_config.get("lr", 0.01)}
        t0 = time.monotonic()
        with pytest.raises(LeaseError) as info:
            self.loop(max_steps=40, checkpoint=policy, optimizer_config=optimizer).run()
        assert time.monotonic() - t0 < 30
        message = str(info.value)
        assert f"Received: checkpoint={policy.location!r}, but another run holds it" in message
        assert f"pid {holder_pid}" in message, message
        assert "Stop that run, or pass a different checkpoint location" in message
        after = sorted(p.name for p in directory.iterdir())
        assert set(after) <= set(before) | {str(s) for s in range(1, 1000)}, (before, after)
        holder = read_lease(policy)
        assert holder is not None and holder.pid == holder_pid  # untouched

    def test_a_held_location_refuses_a_second_run_before_any_work(self, tmp_path: Path) -> None:
        """One run per checkpoint location: a live holder (here: this test's parent
        process, named in a planted lease) refuses the run at once; nothing is written."""
        from ._lease import plant_lease

        directory = tmp_path / "held"
        holder = plant_lease(directory, os.getppid())
        rec = HookRecorder()
        policy = Checkpoint(directory, every_n_steps=2)
        with pytest.raises(LeaseError, match=rf"pid {os.getppid()}.*Stop that run"):
            self.loop(max_steps=4, checkpoint=policy, callbacks=[rec]).run()
        assert rec.calls == [], rec.calls  # refused before the run began
        assert sorted(p.name for p in directory.iterdir()) == [LEASE_DIR]
        assert read_lease(policy) == holder

    @pytest.mark.slow
    def test_sigterm_preempts_with_a_checkpoint_and_resumes_exactly(self, tmp_path: Path) -> None:
        import signal as signal_module

        self._preempt_and_resume(
            tmp_path, signum=signal_module.SIGTERM, during_save=False, seed=os.getpid()
        )

    @pytest.mark.slow
    def test_sigusr1_during_an_async_checkpoint_write(self, tmp_path: Path) -> None:
        import signal as signal_module

        self._preempt_and_resume(
            tmp_path, signum=signal_module.SIGUSR1, during_save=True, seed=os.getpid()
        )

    @pytest.mark.slow
    def test_max_time_checkpoints_and_the_rerun_continues(self, tmp_path: Path) -> None:
        import time

        policy = Checkpoint(str(tmp_path / "ckpt"), every_n_steps=10**6, max_to_keep=None)
        t0 = time.monotonic()
        first = self.loop(max_steps=10**7, max_time=2, checkpoint=policy).run()
        wall = time.monotonic() - t0
        assert first.stop_reason == "max_time"
        assert 2 <= first.wall_time_s < 8 and wall < 60, (first.wall_time_s, wall)
        assert 0 < first.steps < 10**7
        assert step_dirs(policy)[-1] == first.steps  # a checkpoint at its last step
        second = self.loop(max_steps=10**7, max_time=1, checkpoint=policy).run()
        assert second.resumed_from_step == first.steps
        assert second.stop_reason == "max_time" and second.steps > first.steps
        assert step_dirs(policy)[-1] == second.steps

    @pytest.fixture(scope="class")
    @classmethod
    def loopback(cls) -> Iterator[LoopbackS3]:
        """A moto S3 server on loopback with `s3_bucket`, shared by the class's tests."""
        for module in ("moto.server", "boto3", "s3fs"):
            pytest.importorskip(module)
        with loopback_s3(cls.s3_bucket) as server:
            yield server

    @pytest.mark.slow
    def test_exact_resume_after_sigkill_on_s3(self, tmp_path: Path, loopback: LoopbackS3) -> None:
        if not self.cloud_resume:
            pytest.skip("cloud_resume is off for this variant (its backend runs it elsewhere)")
        prefix = f"{type(self).__name__}-{uuid.uuid4().hex[:8]}"
        uri = f"s3://{self.s3_bucket}/{prefix}/ckpt"
        policy = self._kill_and_resume(tmp_path, uri, loopback.storage_options)
        assert step_dirs(policy)[-1] == self.resume_steps
        fs, root = policy.filesystem()
        fs.rm(root, recursive=True)

    def test_memory_uri_torn_step_and_retention(self) -> None:
        uri = f"memory://pipekit-conformance/{uuid.uuid4().hex}"
        policy = Checkpoint(uri, every_n_steps=2, max_to_keep=2, async_save=False)
        fs, root = policy.filesystem()
        try:
            self.loop(max_steps=8, checkpoint=policy).run()
            assert step_dirs(policy) == [6, 8]  # retention deleted steps 2 and 4
            found = fs.find(f"{root}/8", detail=True)
            biggest = max(found.values(), key=lambda e: e["size"])["name"]
            data = bytearray(fs.cat_file(biggest))
            data[len(data) // 2] ^= 0xFF
            fs.pipe_file(biggest, bytes(data))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                resumed = self.loop(max_steps=10, checkpoint=policy).run()
            torn = [str(w.message) for w in caught if issubclass(w.category, TornCheckpointWarning)]
            assert len(torn) == 1 and f"{uri}/8" in torn[0], torn
            assert resumed.resumed_from_step == 6
            assert resumed.checkpoint_dir == uri
            reference = self.loop(max_steps=10).run()
            assert resumed.model.serialize_weights() == reference.model.serialize_weights()
            assert step_dirs(policy) == [8, 10]  # step 8 written again, from the right timeline
        finally:
            fs.rm(root, recursive=True)

    def test_torn_latest_checkpoint_is_skipped(self, tmp_path: Path) -> None:
        directory = tmp_path / "ckpt"
        policy = Checkpoint(directory, every_n_steps=4, max_to_keep=None, async_save=False)
        self.loop(max_steps=12, checkpoint=policy).run()
        assert step_dirs(directory)[-3:] == [4, 8, 12]
        self.tear_checkpoint(directory / "12")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = self.loop(max_steps=16, checkpoint=policy).run()
        assert any(issubclass(w.category, TornCheckpointWarning) for w in caught), [
            str(w.message) for w in caught
        ]
        assert resumed.resumed_from_step == 8
        reference = self.loop(max_steps=16).run()
        assert resumed.model.serialize_weights() == reference.model.serialize_weights()

    @pytest.mark.slow
    @pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
    def test_disk_full_mid_run(self, tmp_path: Path, async_save: bool) -> None:
        """A checkpoint disk that fills up: one `CheckpointError`, no partial step, exact rerun."""
        small = tmp_path / "small"
        try:
            mounted = small_filesystem(small, self.small_fs_size)
            mounted.__enter__()
        except SmallFilesystemUnavailable as exc:
            pytest.skip(f"a tmpfs cannot be mounted here: {exc}")
        try:
            policy = Checkpoint(
                small / "ck", every_n_steps=2, max_to_keep=None, async_save=async_save
            )
            with pytest.raises(CheckpointError) as info:
                self.loop(max_steps=2000, checkpoint=policy, validate_every_n_steps=10**6).run()
            message = str(info.value)
            kept = step_dirs(policy)
            assert kept, message
            latest = kept[-1]
            assert f"step {latest + 2} to {small / 'ck' / str(latest + 2)}" in message, message
            assert f"latest complete checkpoint is {small / 'ck' / str(latest)}" in message
            assert "No space left on device" in message or "RESOURCE_EXHAUSTED" in message
            leftovers = sorted(
                p.relative_to(small / "ck").as_posix()
                for p in (small / "ck").rglob("*")
                if not p.relative_to(small / "ck").parts[0].isdigit()
            )
            # no `.tmp-*`, no `*.orbax-checkpoint-tmp*`; the lease's one record (the full
            # disk kept the run from marking it released: the next run takes it over)
            assert leftovers == [LEASE_DIR, f"{LEASE_DIR}/000000000001.json"], leftovers
            roomy = tmp_path / "roomy"
            shutil.copytree(small / "ck", roomy)
        finally:
            mounted.__exit__(None, None, None)
        steps = latest + 4
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = self.loop(
                max_steps=steps,
                checkpoint=Checkpoint(roomy, every_n_steps=2, max_to_keep=None),
                validate_every_n_steps=10**6,
            ).run()
        torn = [str(w.message) for w in caught if issubclass(w.category, TornCheckpointWarning)]
        assert torn == [], torn  # every step left on the full disk was complete
        assert resumed.resumed_from_step == latest
        reference = self.loop(max_steps=steps, validate_every_n_steps=10**6).run()
        assert resumed.model.serialize_weights() == reference.model.serialize_weights()

    def test_resume_must_without_checkpoint_fails(self, tmp_path: Path) -> None:
        from pipekit_train.core._errors import CheckpointError

        with pytest.raises(CheckpointError, match="resume='must'"):
            self.loop(max_steps=4, checkpoint=Checkpoint(tmp_path / "none", resume="must")).run()

    # -- components ---------------------------------------------------------------------
    def test_callback_hook_order_and_counts(self, tmp_path: Path) -> None:
        rec = HookRecorder()
        self.loop(
            max_steps=8,
            validate_every_n_steps=4,
            callbacks=[rec],
            checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=4, async_save=False),
        ).run()
        expected = [("on_train_start", 0)]
        for s in range(1, 9):
            expected.append(("on_step_end", s))
            if s % 4 == 0:
                expected += [("on_validation_end", s), ("on_checkpoint", s)]
        expected.append(("on_train_end", 8))
        assert rec.calls == expected

    def test_writer_output(self, tmp_path: Path) -> None:
        from pipekit_train.core.writers import JsonlWriter, MemoryWriter

        mem = MemoryWriter()
        path = tmp_path / "metrics.jsonl"
        art = self.loop(
            max_steps=10,
            validate_every_n_steps=5,
            writers=[mem, JsonlWriter(str(path))],
            log_every_n_steps=3,
        ).run()
        train_steps = [s for s, m in mem.records if "loss" in m]
        assert train_steps == list(range(1, 11))
        val_steps = [s for s, m in mem.records if "val_loss" in m]
        assert val_steps == [5, 10]
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert [r["step"] for r in rows if "loss" in r] == list(range(1, 11))
        np.testing.assert_allclose(
            [r["loss"] for r in rows if "loss" in r], art.history["loss"], rtol=1e-6
        )

    def test_max_to_keep(self, tmp_path: Path) -> None:
        directory = tmp_path / "ck"
        self.loop(
            max_steps=12,
            checkpoint=Checkpoint(directory, every_n_steps=2, max_to_keep=2, async_save=False),
        ).run()
        assert step_dirs(directory) == [10, 12]

    def test_keep_best(self, tmp_path: Path) -> None:
        directory = tmp_path / "ck"
        # mode="max" keeps the *worst* validation loss: the first one, while loss falls.
        policy = Checkpoint(
            directory,
            every_n_steps=2,
            max_to_keep=1,
            keep_best=1,
            monitor="val_loss",
            mode="max",
            async_save=False,
        )
        art = self.loop(max_steps=12, validate_every_n_steps=2, checkpoint=policy).run()
        val_steps, val = art.history.series("val_loss")
        worst = val_steps[int(np.argmax(val))]
        assert step_dirs(directory) == sorted({worst, 12})

    def test_early_stopping(self) -> None:
        from pipekit_train.core.callbacks import EarlyStopping

        # with mode="max" a falling loss never improves: stop after `patience` validations
        art = self.loop(
            max_steps=40,
            validate_every_n_steps=2,
            callbacks=[EarlyStopping("val_loss", patience=2, mode="max")],
        ).run()
        assert art.steps < 40 and art.steps % 2 == 0
        assert art.stop_reason != "max_steps"

    @pytest.mark.slow
    def test_reduce_lr_on_plateau_resumes_exactly(self, tmp_path: Path) -> None:
        """Reductions at fixed steps on every backend; a resume keeps the wait and the scale.

        `min_delta=10` makes every validation after the first a plateau: with `patience=2`
        the rate halves at steps 12 and 20. A run stopped at step 16 (scale 0.5, one
        validation waited) and resumed from its checkpoint reduces at step 20 too, logs
        the same rates and ends with the same bytes as the uninterrupted run.
        """
        from pipekit_train.core.callbacks import LearningRateLogger, ReduceLROnPlateau
        from pipekit_train.core.contract._adapter import NotSupportedError

        adapter = self.loop(max_steps=1).adapter
        if not adapter.capabilities.lr_scale:  # such a backend refuses before any work
            with pytest.raises(NotSupportedError, match="ReduceLROnPlateau"):
                self.loop(callbacks=[ReduceLROnPlateau()])
            return

        def loop(max_steps: int, checkpoint: Any = None) -> tuple[TrainingLoop, Any]:
            plateau = ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2, min_delta=10.0)
            callbacks = [plateau, LearningRateLogger()]
            return (
                self.loop(
                    max_steps=max_steps,
                    validate_every_n_steps=4,
                    callbacks=callbacks,
                    checkpoint=checkpoint,
                ),
                plateau,
            )

        ref_loop, ref_cb = loop(20)
        reference = ref_loop.run()
        assert ref_cb.reduced_at == [12, 20]
        lrs = np.asarray(reference.history["lr"])
        base = float(lrs[0])
        # each step logs the rate of the next update, before that step's validation
        expected = [base * 0.5 ** sum(s > r for r in (12, 20)) for s in range(1, 21)]
        np.testing.assert_allclose(lrs, expected, rtol=1e-6)
        policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=None)
        first, first_cb = loop(16, policy)
        stopped = first.run()
        assert first_cb.wait == 1 and first_cb.reduced_at == [12]
        second_loop, second_cb = loop(20, policy)
        resumed = second_loop.run()
        assert resumed.resumed_from_step == stopped.steps == 16
        assert second_cb.reduced_at == [12, 20] and second_cb.num_reductions == 2
        np.testing.assert_array_equal(resumed.history["lr"], reference.history["lr"])
        np.testing.assert_array_equal(resumed.history["loss"], reference.history["loss"])
        assert resumed.model.serialize_weights() == reference.model.serialize_weights()

    def test_nan_guard(self, tmp_path: Path) -> None:
        from pipekit_train.core.callbacks import NaNGuard, NonFiniteLossError
        from pipekit_train.core.data import ArrayDataset

        train, _ = regression_task()
        batch = train.get_batch(np.arange(len(train)))
        y = batch["y"].copy()
        y[:] = np.nan
        bad = ArrayDataset(x=batch["x"], y=y)
        with pytest.raises(NonFiniteLossError):
            self.loop(
                data=bad,
                max_steps=10,
                callbacks=[NaNGuard()],
                checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=1),
            ).run()
        assert step_dirs(tmp_path / "ck") == []

    def test_registry_round_trip_and_tamper(self, tmp_path: Path) -> None:
        from pipekit_train.core.registry import LocalModelRegistry

        art = self.loop(max_steps=8).run()
        registry = LocalModelRegistry(tmp_path / "registry")
        record = art.register(registry, "conformance-model")
        loaded = registry.load("conformance-model")
        assert loaded.serialize_weights() == art.model.serialize_weights()
        x = regression_task()[1].get_batch(np.arange(16))["x"]
        np.testing.assert_allclose(
            np.asarray(loaded(x)), np.asarray(art.model(x)), rtol=1e-6, atol=1e-6
        )
        assert record.weights_sha256 == art.weights_sha256
        blob = next((tmp_path / "registry").rglob("weights.bin"))
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        with pytest.raises(IntegrityError):
            registry.load("conformance-model")

    def test_evaluate_matches_numpy_on_the_operators_predictions(self, tmp_path: Path) -> None:
        from pipekit_train.core import evaluate
        from pipekit_train.core.registry import LocalModelRegistry

        art = self.loop(max_steps=8, metrics=["mae"]).run()
        _, test = regression_task(n_train=8, n_val=70, seed=11)
        got = art.evaluate(test, metrics=["mae"], batch_size=16)
        whole = test.get_batch(np.arange(len(test)))
        x, y = whole["x"], whole["y"]
        pred = np.asarray(art.model(x), dtype=np.float64)
        assert got["loss"] == pytest.approx(float(np.mean((pred - y) ** 2)), rel=1e-5)
        assert got["mae"] == pytest.approx(float(np.mean(np.abs(pred - y))), rel=1e-5)
        # the same numbers for the operator loaded back from a registry, with no backend code
        registry = LocalModelRegistry(tmp_path / "registry")
        record = art.register(registry, "evaluated", test_metrics=got)
        assert record.metrics["test_mae"] == pytest.approx(got["mae"])
        loaded = registry.load("evaluated")
        again = evaluate(loaded, test, loss="mse", metrics=["mae"], batch_size=16)
        assert again == pytest.approx(got, rel=1e-6)

    def test_lr_find_suggests_a_rate_where_the_loss_falls(self, tmp_path: Path) -> None:
        from pipekit_train.core import lr_find

        loop = self.loop(checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=5))
        result = lr_find(loop, min_lr=1e-4, max_lr=3.0, num_steps=40)
        rates = np.asarray(result.learning_rates)
        np.testing.assert_allclose(rates[1:] / rates[:-1], (3.0 / 1e-4) ** (1 / 40), rtol=1e-6)
        smoothed = np.asarray(result.smoothed)
        best = int(np.nanargmin(smoothed))
        start = float(np.median(smoothed[: len(smoothed) // 4]))
        assert smoothed[best] < 0.8 * start, smoothed  # the loss falls over the ramp
        assert rates[0] <= result.suggestion <= rates[best]  # ... and the suggestion is there
        assert result.backend == loop.plan.backend
        assert not (tmp_path / "ck").exists()  # the loop's checkpoint directory is untouched

    # -- bad input ----------------------------------------------------------------------
    @staticmethod
    def _mismatched(n: int, in_size: int, out_size: int) -> Any:
        from pipekit_train.core.data import ArrayDataset

        rng = np.random.default_rng(0)
        return ArrayDataset(
            x=rng.standard_normal((n, in_size)).astype(np.float32),
            y=rng.standard_normal((n, out_size)).astype(np.float32),
        )

    @pytest.mark.parametrize("which", ["data", "validation"])
    def test_input_width_mismatch_is_refused_before_work(self, tmp_path: Path, which: str) -> None:
        """The adapter's shape probe: a clear `ConfigError` at construction, nothing on disk."""
        with pytest.raises(ConfigError) as info:
            self.loop(checkpoint=Checkpoint(tmp_path / "ck"), **{which: self._mismatched(32, 5, 1)})
        msg = str(info.value)
        assert f"Received: {which}['x'] with samples of shape (5,)" in msg, msg
        assert "the model expects inputs of shape (4,)" in msg, msg
        assert "in_size=5" in msg, msg
        assert info.value.__cause__ is not None  # the backend's own error is kept
        assert not (tmp_path / "ck").exists()

    @pytest.mark.parametrize("which", ["data", "validation"])
    def test_output_width_mismatch_is_refused_before_work(self, tmp_path: Path, which: str) -> None:
        with pytest.raises(ConfigError) as info:
            self.loop(checkpoint=Checkpoint(tmp_path / "ck"), **{which: self._mismatched(32, 4, 2)})
        msg = str(info.value)
        assert f"Received: {which}['y'] with samples of shape (2,)" in msg, msg
        assert "the model predicts samples of shape (1,)" in msg, msg
        assert "'mse'" in msg, msg
        assert not (tmp_path / "ck").exists()

    @pytest.fixture(scope="class")
    @classmethod
    def bad_input_parts(cls) -> tuple[Any, Any, Any]:
        """The model and data every bad-input case starts from (built once per class)."""
        train, val = regression_task()
        return cls().make_model(4, 1, seed=0), train, val

    @pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
    def test_bad_input(
        self,
        case: tuple[str, dict[str, Any], str],
        bad_input_parts: tuple[Any, Any, Any],
        tmp_path: Path,
    ) -> None:
        """A clear `ConfigError` when the loop is built: no training, nothing on disk."""
        from pipekit_train.core.writers import JsonlWriter

        _, overrides, pattern = case
        model, train, val = bad_input_parts
        ctx = BadInputContext(self, tmp_path, train, val)
        kwargs: dict[str, Any] = {
            "model": model,
            "data": train,
            "validation": val,
            "loss": "mse",
            "optimizer_config": dict(self.optimizer_config),
            "batch_size": self.batch_size,
            "max_steps": 40,
            "seed": 0,
            "adapter": self.make_adapter(),
            "checkpoint": Checkpoint(tmp_path / "ck", every_n_steps=2),
            "writers": [JsonlWriter(str(tmp_path / "m.jsonl"))],
            "progress": False,
        }
        with pytest.raises(ConfigError) as info:
            for key, value in overrides.items():
                kwargs[key] = value.build(ctx) if isinstance(value, Make) else value
            TrainingLoop(**kwargs)
        message = str(info.value)
        assert re.search(pattern, message, re.DOTALL), (pattern, message)
        assert "Received" in message, message
        left = {p: (p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*")}
        assert left == ctx.prepared, "a bad input left files behind (or changed the set-up)"

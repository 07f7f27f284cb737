"""The adapter conformance suite: one test class every backend subclasses.

```python
from pipekit_train.core.testing import AdapterConformance

class TestEquinoxConformance(AdapterConformance):
    def make_model(self, in_size, out_size, seed=0):
        return EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=in_size,
                              out_size=out_size, seed=seed)
```

It checks that loss falls, determinism, exact resume after SIGKILL (to a local folder and
to S3 on a loopback moto server), torn checkpoints, checkpoints at a `memory://` URI,
callback order, writers, retention, early stopping, the NaN guard, the registry
round-trip, and a table of bad inputs that must fail before any work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core._checkpoint import Checkpoint
from pipekit_train.core._checkpointing import TornCheckpointWarning, step_dirs
from pipekit_train.core._errors import ConfigError, IntegrityError
from pipekit_train.core._loop import TrainingLoop

from ._s3 import LoopbackS3, loopback_s3
from ._tasks import oscillator_task, regression_task

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


# (id, overrides applied to the TrainingLoop keyword arguments, fragment of the message)
BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    ("batch_size_zero", {"batch_size": 0}, "batch_size"),
    ("batch_size_negative", {"batch_size": -4}, "batch_size"),
    ("batch_size_float", {"batch_size": 8.0}, "batch_size"),
    ("batch_size_bool", {"batch_size": True}, "batch_size"),
    ("batch_size_too_large", {"batch_size": 10_000}, "batch_size"),
    ("max_steps_zero", {"max_steps": 0}, "max_steps"),
    ("no_stopping_rule", {"max_steps": None}, "max_steps"),
    ("max_epochs_negative", {"max_epochs": -1}, "max_epochs"),
    ("unknown_loss", {"loss": "msee"}, "msee"),
    ("loss_not_callable", {"loss": 3}, "loss"),
    ("unknown_metric", {"metrics": ["maee"]}, "maee"),
    ("negative_learning_rate", {"optimizer_config": {"name": "adam", "lr": -1.0}}, "learning_rate"),
    (
        "nan_learning_rate",
        {"optimizer_config": {"name": "adam", "lr": float("nan")}},
        "learning_rate",
    ),
    (
        "conflicting_lr",
        {"optimizer_config": {"name": "adam", "lr": 0.1, "learning_rate": 0.2}},
        "lr",
    ),
    ("unknown_optimizer", {"optimizer_config": {"name": "adamw_typo", "lr": 0.01}}, "adamw_typo"),
    ("negative_seed", {"seed": -1}, "seed"),
    ("seed_string", {"seed": "zero"}, "seed"),
    ("callback_without_hooks", {"callbacks": [_NoHooks()]}, "callback"),
    ("writer_without_write", {"writers": [_NoWrite()]}, "write"),
    ("data_not_dataset", {"data": [1, 2, 3]}, "data"),
    ("data_wrong_keys", {"data": "__wrong_keys__"}, "'x'"),
    ("metrics_without_validation", {"validation": None, "metrics": ["mae"]}, "validation"),
    (
        "early_stopping_without_validation",
        {"validation": None, "callbacks": "__early_stopping__"},
        "val_loss",
    ),
    ("validate_every_zero", {"validate_every_n_steps": 0}, "validate_every_n_steps"),
    ("checkpoint_every_zero", {"checkpoint": "__every_zero__"}, "every_n_steps"),
    ("checkpoint_bad_resume", {"checkpoint": "__bad_resume__"}, "resume"),
    ("adapter_not_adapter", {"adapter": "equinox"}, "adapter"),
]


class AdapterConformance:
    """Subclass as `Test<Backend>Conformance` and implement `make_model`.

    Attributes:
        optimizer_config: the optimizer every test uses.
        batch_size: the batch size every test uses.
        subprocess_env: extra environment for the kill-and-resume subprocess.
        cloud_resume: whether to run the kill-and-resume test against S3 too (a second
            subprocess; a variant of a backend already covered may switch it off).
    """

    optimizer_config: dict[str, Any] = {"name": "adam", "lr": 0.05}
    batch_size: int = 16
    subprocess_env: dict[str, str] = {}
    resume_steps: int = 24
    kill_at: int = 14
    cloud_resume: bool = True
    s3_bucket: str = "pipekit-conformance"

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
        train, val = (regression_task if task == "regression" else oscillator_task)()
        in_size = train[0]["x"].shape[-1]
        out_size = train[0]["y"].shape[-1]
        kwargs: dict[str, Any] = {
            "model": self.make_model(in_size, out_size, seed=0),
            "data": train,
            "validation": val,
            "loss": "mse",
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

    # -- exact resume -------------------------------------------------------------------
    def _adapter_config(self) -> dict[str, Any] | None:
        adapter = self.make_adapter()
        return None if adapter is None else adapter.get_config()

    def _kill_and_resume(
        self, tmp_path: Path, directory: str, storage_options: dict[str, Any] | None = None
    ) -> Checkpoint:
        """SIGKILL a run that checkpoints to `directory`, resume it, compare the bytes."""
        spec = {
            "model": self.make_model(4, 1, seed=0).get_config(),
            "adapter": self._adapter_config(),
            "task": "regression",
            "optimizer_config": dict(self.optimizer_config),
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
        env = {**os.environ, **self.subprocess_env}
        proc = subprocess.run(
            [sys.executable, "-m", "pipekit_train.core.testing._worker", str(spec_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == -9, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
        policy = Checkpoint(
            directory, every_n_steps=4, max_to_keep=None, storage_options=storage_options
        )
        assert step_dirs(policy), (
            f"no checkpoint was written before the kill: {proc.stderr[-2000:]}"
        )

        resumed = self.loop(
            max_steps=self.resume_steps, checkpoint=policy, validate_every_n_steps=8
        ).run()
        assert resumed.resumed_from_step is not None and resumed.resumed_from_step >= 8
        reference = self.loop(max_steps=self.resume_steps, validate_every_n_steps=8).run()
        assert resumed.model.serialize_weights() == reference.model.serialize_weights()
        assert resumed.steps == reference.steps == self.resume_steps
        # the history survives the resume: every step's loss is there exactly once
        steps, losses = resumed.history.series("loss")
        assert steps == list(range(1, self.resume_steps + 1))
        np.testing.assert_array_equal(losses, reference.history["loss"])
        return policy

    def test_exact_resume_after_sigkill(self, tmp_path: Path) -> None:
        self._kill_and_resume(tmp_path, str(tmp_path / "ckpt"))

    @pytest.fixture(scope="class")
    @classmethod
    def loopback(cls) -> Iterator[LoopbackS3]:
        """A moto S3 server on loopback with `s3_bucket`, shared by the class's tests."""
        for module in ("moto.server", "boto3", "s3fs"):
            pytest.importorskip(module)
        with loopback_s3(cls.s3_bucket) as server:
            yield server

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

    def test_dataset_smaller_than_batch(self) -> None:
        from pipekit_train.core.data import ArrayDataset

        tiny = ArrayDataset(x=np.zeros((3, 4), np.float32), y=np.zeros((3, 1), np.float32))
        with pytest.raises(ConfigError, match=r"batch_size=16, but the dataset has 3 samples"):
            self.loop(data=tiny)

    @pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
    def test_bad_input(self, case: tuple[str, dict[str, Any], str], tmp_path: Path) -> None:
        from pipekit_train.core.callbacks import EarlyStopping
        from pipekit_train.core.data import ArrayDataset
        from pipekit_train.core.writers import JsonlWriter

        _, overrides, fragment = case
        overrides = dict(overrides)
        if overrides.get("data") == "__wrong_keys__":
            overrides["data"] = ArrayDataset(
                inputs=np.zeros((64, 4), np.float32), y=np.zeros((64, 1), np.float32)
            )
        if overrides.get("callbacks") == "__early_stopping__":
            overrides["callbacks"] = [EarlyStopping("val_loss")]
        special = overrides.get("checkpoint")
        if special == "__every_zero__":
            with pytest.raises(ConfigError, match=fragment):
                Checkpoint(tmp_path / "ck", every_n_steps=0)
            assert not any(tmp_path.iterdir())
            return
        if special == "__bad_resume__":
            with pytest.raises(ConfigError, match=fragment):
                Checkpoint(tmp_path / "ck", resume="sometimes")  # type: ignore[arg-type]
            assert not any(tmp_path.iterdir())
            return
        overrides.setdefault("checkpoint", Checkpoint(tmp_path / "ck", every_n_steps=2))
        overrides.setdefault("writers", [JsonlWriter(str(tmp_path / "m.jsonl"))])
        with pytest.raises(ConfigError, match=fragment) as info:
            self.loop(**overrides).run()
        assert "Received" in str(info.value)
        assert list(tmp_path.iterdir()) == [], "a bad input left files behind"

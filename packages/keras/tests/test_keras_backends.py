"""Backend matrix: the whole Keras test set again on torch, and multi-device data parallel
on jax, each in a subprocess (Keras fixes its backend, and jax its devices, at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import keras
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BACKEND = keras.backend.backend()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
    env.update(extra)
    return env


# The fused variant (`steps_per_execution > 1`) is jax-only: on torch its cases skip. Its
# preemption cases (SIGTERM, SIGUSR1 during a write, max_time) test core's lifecycle at a
# fused-call boundary, not Keras's backend, and are left out of the torch pass altogether.
ON_TORCH = "not (FusedSteps and (sigterm or sigusr1 or max_time))"


@pytest.mark.slow
@pytest.mark.skipif(BACKEND == "torch", reason="this is the runner of the torch-backend pass")
def test_torch_backend_passes_the_whole_suite(torch_pass: Callable[..., None]) -> None:
    """Every test in this folder, the conformance suite included, under KERAS_BACKEND=torch,
    in one subprocess (one torch and Keras import, one collection)."""
    torch_pass(str(HERE), "-k", ON_TORCH)


DATA_PARALLEL = textwrap.dedent(
    """
    import json, sys
    import jax, keras, numpy as np
    from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
    from pipekit_train.core.testing import regression_task
    from pipekit_train.keras import KerasModelOp, _bridge

    devices_seen = []
    build = _bridge.build_train_state
    def spy(*args, **kwargs):
        handle = build(*args, **kwargs)
        devices_seen.append(len(handle.model.trainable_variables[0].value.sharding.device_set))
        return handle
    _bridge.build_train_state = spy

    train, val = regression_task()
    def run(sharding, **kw):
        args = dict(
            model=KerasModelOp("pipekit_train.keras.testing:mlp", in_size=4, out_size=1, width=16),
            data=train, validation=val, loss="mse", optimizer_config={"name": "adam", "lr": 0.01},
            batch_size=16, max_steps=20, validate_every_n_steps=10, sharding=sharding, progress=False,
        )
        args.update(kw)
        return TrainingLoop(**args).run()

    single = run(None)
    parallel = run(keras.distribution.DataParallel())
    np.testing.assert_allclose(parallel.history["loss"], single.history["loss"], rtol=1e-4)
    np.testing.assert_allclose(parallel.history["val_loss"], single.history["val_loss"], rtol=1e-4)
    short = run("data_parallel", max_steps=10, checkpoint=Checkpoint(sys.argv[1], every_n_steps=5, async_save=False))
    resumed = run("data_parallel", checkpoint=Checkpoint(sys.argv[1], every_n_steps=5, async_save=False))
    assert resumed.resumed_from_step == 10
    reference = run("data_parallel")
    try:
        run("data_parallel", batch_size=15)
        raise SystemExit("batch_size=15 on 2 devices was accepted")
    except ConfigError as exc:
        assert "batch_size" in str(exc) and "Received" in str(exc), exc
    print(json.dumps({
        "devices": jax.device_count(),
        "devices_seen": devices_seen,
        "resume_equal": resumed.model.serialize_weights() == reference.model.serialize_weights(),
    }))
    """
)


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution is jax-only")
@pytest.mark.slow
def test_data_parallel_on_two_cpu_devices(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DATA_PARALLEL, str(tmp_path / "ck")],
        cwd=ROOT,
        env=_env(KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=2"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices"] == 2
    # single-device run first, then every data-parallel model replicated on both devices
    assert result["devices_seen"][0] == 1 and set(result["devices_seen"][1:]) == {2}
    assert result["resume_equal"]


def test_import_picks_a_supported_backend(tmp_path: Path) -> None:
    """Without KERAS_BACKEND or keras.json, importing the package selects jax (no keras import)."""
    code = "import os, sys, pipekit_train.keras; print(os.environ.get('KERAS_BACKEND'), 'keras' in sys.modules)"
    for extra, expected in (({}, "jax False"), ({"KERAS_BACKEND": "torch"}, "torch False")):
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=_env(HOME=str(tmp_path), KERAS_HOME=str(tmp_path / "keras-home"), **extra),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1] == expected


def test_keras_without_a_usable_backend_names_the_extra(tmp_path: Path) -> None:
    """KERAS_BACKEND=tensorflow (Keras's default) without tensorflow: a clear ImportError."""
    pytest.importorskip("jax")
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - tensorflow is not a dependency of this workspace
        pytest.skip("tensorflow is installed, so KERAS_BACKEND=tensorflow imports fine")
    code = textwrap.dedent(
        """
        from pipekit_train.keras import KerasModelOp
        try:
            KerasModelOp("pipekit_train.keras.testing:linear", in_size=2, out_size=1)
        except ImportError as exc:
            print("IMPORT-ERROR", exc)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(HOME=str(tmp_path), KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="tensorflow"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "IMPORT-ERROR" in out, out
    assert 'pip install "pipekit-train-keras[jax]"' in out
    assert "KERAS_BACKEND='tensorflow'" in out and "tensorflow" in out

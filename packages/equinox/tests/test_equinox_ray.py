"""Equinox on a Ray Train worker group (`pipekit_train.equinox.ray.fit_on_ray`).

A local Ray runtime, shared by this module, runs two CPU workers that join one
`jax.distributed` job (gloo collectives) and train with a `ShardingSpec` over both. The
restart test
SIGKILLs worker 1 at about half of training; Ray restarts the group (`max_failures=1`),
which resumes from pipekit's latest complete checkpoint and must end with the weight
bytes of an uninterrupted two-worker run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train.v2.jax")

from pipekit_train.core import ConfigError  # noqa: E402

MAX_STEPS, EVERY, KILL_AT = 16, 4, 10

RAY_ENV = {
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",  # workers start from this interpreter, not `uv run`
    "PYTHONDONTWRITEBYTECODE": "",
    "RAY_TRAIN_V2_ENABLED": "1",
}


def make_loop(out: str, tag: str, kill_at: int | None) -> Any:
    """The job's loop (built on each worker, after it joined `jax.distributed`)."""
    import jax

    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.testing import RayProbe, regression_task
    from pipekit_train.equinox import EquinoxModelOp, ShardingSpec

    train, val = regression_task()
    directory = str(Path(out) / f"{tag}-ckpt")
    return TrainingLoop(
        model=EquinoxModelOp(
            "pipekit_train.equinox.testing:mlp", in_size=4, out_size=1, width=8, seed=0
        ),
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=MAX_STEPS,
        validate_every_n_steps=8,
        checkpoint=Checkpoint(directory, every_n_steps=EVERY, max_to_keep=None),
        callbacks=[RayProbe(out, tag, kill_at=kill_at, checkpoint=directory, every_n_steps=EVERY)],
        sharding=ShardingSpec(jax.make_mesh((jax.device_count(),), ("data",))),
        progress=False,
    )


def reference_then(out: str, loop: Any) -> Any:
    """On each worker: first the uninterrupted two-worker reference run (once per job:
    not again in the restarted group), then hand `loop` to `fit_on_ray`. One Ray Train
    run then holds both, which saves starting a third worker group."""
    if not all((Path(out) / f"reference-rank{r}.json").exists() for r in (0, 1)):
        reference = make_loop(out, "reference", None).plan
        reference.adapter.run(reference)
    return loop


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[None]:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import it
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in RAY_ENV.items():
                mp.setenv(key, value)
            mp.delenv("XLA_FLAGS", raising=False)  # one CPU device per worker
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
            try:
                yield
            finally:
                ray.shutdown()
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _records(out: Path, tag: str) -> list[dict[str, Any]]:
    return [json.loads((out / f"{tag}-rank{r}.json").read_text()) for r in (0, 1)]


def test_without_ray_train_the_module_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.delitem(sys.modules, "pipekit_train.equinox.ray", raising=False)
    monkeypatch.setitem(sys.modules, "ray.train.v2.jax", None)  # as if Ray Train were not installed
    with pytest.raises(ImportError, match=r"pip install 'pipekit-train-equinox\[ray\]'"):
        importlib.import_module("pipekit_train.equinox.ray")


def test_bad_arguments_fail_before_ray_starts(tmp_path: Path) -> None:
    from pipekit_train.equinox.ray import fit_on_ray

    with pytest.raises(ConfigError, match="loop_factory"):
        fit_on_ray(object())
    with pytest.raises(ConfigError, match="Received: num_workers=0"):
        fit_on_ray(lambda: None, num_workers=0)
    assert not ray.is_initialized()


@pytest.mark.slow  # a Ray Train run of two jax.distributed workers, restarted once (~85 s)
def test_a_killed_worker_is_restarted_and_the_run_ends_as_an_uninterrupted_one(
    tmp_path: Path, ray_runtime: None
) -> None:
    from pipekit_train.core.checkpoint import read_lease
    from pipekit_train.equinox.ray import fit_on_ray

    out = str(tmp_path)
    killed = fit_on_ray(
        lambda: reference_then(out, make_loop(out, "killed", KILL_AT)),
        num_workers=2,
        max_failures=1,
        storage=tmp_path / "ray",
        name="pipekit-ray-restart-jax",
    )
    assert (tmp_path / "killed.killed").exists()  # worker 1 did die
    ref, got = _records(tmp_path, "reference"), _records(tmp_path, "killed")
    assert [r["steps"] for r in got] == [MAX_STEPS] * 2
    resumed_at = KILL_AT // EVERY * EVERY
    assert [r["resumed_from_step"] for r in got] == [resumed_at] * 2
    assert [r["resumed_from_step"] for r in ref] == [None] * 2
    assert got[0]["sha"] == got[1]["sha"] == ref[0]["sha"] == ref[1]["sha"]
    assert {r["job"] for r in got} == {"ray-train:pipekit-ray-restart-jax"}
    # two starts of each worker: at step 0 and, after Ray's restart, at the checkpoint
    starts = (tmp_path / "killed-starts.txt").read_text().split("\n")[:-1]
    assert sorted(int(s.split()[1]) for s in starts) == [0, 0, resumed_at, resumed_at]
    assert read_lease(tmp_path / "killed-ckpt") is None  # released at the end
    # pipekit's checkpoints reached Ray's reporting, with the metrics
    last = str(tmp_path / "killed-ckpt" / str(MAX_STEPS))
    assert killed.metrics["step"] == MAX_STEPS and killed.metrics["pipekit_checkpoint"] == last
    assert "loss" in killed.metrics
    with killed.checkpoint.as_directory() as marker:  # Ray's checkpoint: only the marker
        assert json.loads((Path(marker) / "pipekit.json").read_text())["step"] == MAX_STEPS

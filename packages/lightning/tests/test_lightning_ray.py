"""`Torch()` and `Lightning()` on a Ray Train worker group (`pipekit_train.lightning.ray.fit_on_ray`).

A local Ray runtime, shared by this module, runs two CPU workers (gloo). The restart test
trains `Torch()` data-parallel, SIGKILLs worker 1 at about half of training, with the
checkpoints on `s3://` (a moto server on loopback); Ray restarts the group
(`max_failures=1`), which resumes from pipekit's latest complete checkpoint and must end
with the weight bytes of an uninterrupted two-worker `Torch()` run, which are those of
the same run with `Lightning()` (Ray's DDP strategy) too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train.torch")

from pipekit_train.core import ConfigError  # noqa: E402
from pipekit_train.core.testing import LoopbackS3, loopback_s3  # noqa: E402

MAX_STEPS, EVERY, KILL_AT = 16, 4, 10
BUCKET = "ray-restart"

RAY_ENV = {
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",  # workers start from this interpreter, not `uv run`
    "PYTHONDONTWRITEBYTECODE": "",
    "RAY_TRAIN_V2_ENABLED": "1",
}


def make_loop(
    out: str,
    tag: str,
    kill_at: int | None,
    adapter: str = "torch",
    s3: dict[str, Any] | None = None,
) -> Any:
    """The job's loop (built on each worker); with `s3` (the loopback server's storage
    options) its checkpoints go to `s3://`."""
    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.testing import RayProbe, regression_task
    from pipekit_train.lightning import Lightning, Torch, TorchModelOp

    train, val = regression_task()
    directory = str(Path(out) / f"{tag}-ckpt")
    if s3 is not None:
        directory = f"s3://{BUCKET}/{Path(out).name}/{tag}-ckpt"
    policy = Checkpoint(directory, every_n_steps=EVERY, max_to_keep=None, storage_options=s3)
    return TrainingLoop(
        model=TorchModelOp(
            "pipekit_train.lightning.testing:mlp", in_size=4, out_size=1, width=8, seed=0
        ),
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=MAX_STEPS,
        validate_every_n_steps=8,
        checkpoint=policy,
        callbacks=[RayProbe(out, tag, kill_at=kill_at, checkpoint=policy, every_n_steps=EVERY)],
        adapter=Torch() if adapter == "torch" else Lightning(accelerator="cpu"),
        progress=False,
    )


def reference_then(out: str, loop: Any) -> Any:
    """On each worker: first the uninterrupted two-worker reference runs, `Torch()` and
    `Lightning()` (once per job: not again in the restarted group), then hand `loop` to
    `fit_on_ray`. One Ray Train run then holds all three, which saves starting more
    worker groups."""
    from pipekit_train.lightning.ray import on_ray

    if not all((Path(out) / f"lightning-rank{r}.json").exists() for r in (0, 1)):
        for tag in ("reference", "lightning"):
            reference = on_ray(
                make_loop(out, tag, None, adapter=tag.replace("reference", "torch")).plan
            )
            reference.adapter.run(reference)
    return loop


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[LoopbackS3]:
    """A Ray runtime, started inside a loopback S3 server's environment (credentials, no
    proxy for 127.0.0.1) so that its workers reach the server too."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import it
    try:
        with pytest.MonkeyPatch.context() as mp, loopback_s3(BUCKET) as s3:
            for key, value in RAY_ENV.items():
                mp.setenv(key, value)
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
            try:
                yield s3
            finally:
                ray.shutdown()
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _records(out: Path, tag: str) -> list[dict[str, Any]]:
    return [json.loads((out / f"{tag}-rank{r}.json").read_text()) for r in (0, 1)]


def test_without_ray_train_the_module_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.delitem(sys.modules, "pipekit_train.lightning.ray", raising=False)
    monkeypatch.setitem(sys.modules, "ray.train.torch", None)  # as if Ray Train were not installed
    with pytest.raises(ImportError, match=r"pip install 'pipekit-train-lightning\[ray\]'"):
        importlib.import_module("pipekit_train.lightning.ray")


def test_bad_arguments_fail_before_ray_starts(tmp_path: Path) -> None:
    from pipekit_train.lightning.ray import fit_on_ray

    loop = make_loop(str(tmp_path), "x", None, adapter="torch")
    with pytest.raises(ConfigError, match="loop_factory"):
        fit_on_ray(loop)
    with pytest.raises(ConfigError, match="Received: num_workers=0"):
        fit_on_ray(lambda: loop, num_workers=0)
    with pytest.raises(ConfigError, match="Received: max_failures=-2"):
        fit_on_ray(lambda: loop, max_failures=-2)
    assert not ray.is_initialized()


def test_on_ray_sets_up_lightning_and_keeps_torch_on_the_cpu(tmp_path: Path) -> None:
    import dataclasses

    from pipekit_train.core.testing import NumpyAdapter
    from pipekit_train.lightning.ray import on_ray

    plan = make_loop(str(tmp_path), "x", None).plan
    assert on_ray(plan) is plan  # Torch() without a GPU: data parallel over the group as it is
    lightning = on_ray(make_loop(str(tmp_path), "x", None, adapter="lightning").plan)
    kwargs = lightning.adapter.trainer_kwargs
    assert kwargs["accelerator"] == "cpu" and kwargs["devices"] == "auto"
    assert type(kwargs["strategy"]).__name__ == "RayDDPStrategy"
    with pytest.raises(ConfigError, match=r"Received: adapter=NumpyAdapter"):
        on_ray(dataclasses.replace(plan, adapter=NumpyAdapter()))


@pytest.mark.slow  # a Ray Train run of two workers, restarted once (~100 s)
def test_a_killed_worker_is_restarted_and_the_run_ends_as_an_uninterrupted_one(
    tmp_path: Path, ray_runtime: LoopbackS3
) -> None:
    """The killed run checkpoints to `s3://` (moto on loopback), the reference to a folder."""
    from pipekit_train.core import Checkpoint
    from pipekit_train.core.checkpoint import read_lease
    from pipekit_train.lightning.ray import fit_on_ray

    out, s3 = str(tmp_path), ray_runtime.storage_options
    killed = fit_on_ray(
        lambda: reference_then(out, make_loop(out, "killed", KILL_AT, s3=s3)),
        num_workers=2,
        max_failures=1,
        storage=tmp_path / "ray",
        name="pipekit-ray-restart",
    )
    assert (tmp_path / "killed.killed").exists()  # worker 1 did die
    ref, got = _records(tmp_path, "reference"), _records(tmp_path, "killed")
    assert [r["steps"] for r in got] == [MAX_STEPS] * 2
    resumed_at = KILL_AT // EVERY * EVERY
    assert [r["resumed_from_step"] for r in got] == [resumed_at] * 2
    assert [r["resumed_from_step"] for r in ref] == [None] * 2
    assert got[0]["sha"] == got[1]["sha"] == ref[0]["sha"] == ref[1]["sha"]
    # Torch()'s gradient average is DDP's: the Lightning run ends with the same bytes
    assert [r["sha"] for r in _records(tmp_path, "lightning")] == [ref[0]["sha"]] * 2
    assert {r["job"] for r in got} == {"ray-train:pipekit-ray-restart"}
    # two starts of each worker: at step 0 and, after Ray's restart, at the checkpoint
    starts = (tmp_path / "killed-starts.txt").read_text().split("\n")[:-1]
    assert sorted(int(s.split()[1]) for s in starts) == [0, 0, resumed_at, resumed_at]
    policy = Checkpoint(f"s3://{BUCKET}/{tmp_path.name}/killed-ckpt", storage_options=s3)
    assert read_lease(policy) is None  # released at the end
    # pipekit's checkpoints reached Ray's reporting, with the metrics
    last = policy.step_location(MAX_STEPS)
    assert killed.metrics["step"] == MAX_STEPS and killed.metrics["pipekit_checkpoint"] == last
    assert "loss" in killed.metrics
    with killed.checkpoint.as_directory() as marker:  # Ray's checkpoint: only the marker
        assert json.loads((Path(marker) / "pipekit.json").read_text())["step"] == MAX_STEPS

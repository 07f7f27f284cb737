"""One training job over a Ray Train worker group (the part every backend shares).

Ray Train starts the worker group, sets up the backend's process group, and restarts the
group after a lost worker (`FailureConfig(max_failures=...)`). pipekit keeps what it
already does: its own checkpoints and their exact resume. The two meet here:

- what crosses to the workers is a *loop factory* (a function that builds the
  `TrainingLoop`), never a built loop: a loop holds live datasets, models and, for
  Equinox, a device mesh that only exists after the worker joined `jax.distributed`;
  the factory is pickled by Ray (cloudpickle) and called on every worker;
- every worker sets `PIPEKIT_TRAIN_JOB_ID` to the Ray Train run's name before building
  the loop, so a restarted group takes the run lease over at once while an unrelated
  job on the same checkpoint location is still refused;
- `RayTrainReport` (a callback added on every worker) reports each pipekit checkpoint's
  step and location, with the latest metrics, through `ray.train.report` (no Ray
  checkpoint: pipekit's own checkpoints stay where the loop's `Checkpoint` puts them),
  and the final metrics at the end of training.

The adapter packages hold the backend's half (`pipekit_train.lightning.ray`,
`pipekit_train.equinox.ray`): which Ray trainer, and what a worker does to the plan.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["RayTrainReport", "check_ray_fit", "fit_with_ray_trainer", "ray_train_worker"]

JOB_ENV = "PIPEKIT_TRAIN_JOB_ID"


class RayTrainReport:
    """Report pipekit's checkpoints and metrics to Ray Train (`ray.train.report`).

    Added to the loop's callbacks on every worker by `ray_train_worker`. At each pipekit
    checkpoint every worker reports `{**metrics, "step": step, "pipekit_checkpoint":
    location}` (at the same step, as Ray Train expects); worker 0 attaches a marker
    checkpoint, a folder holding only `pipekit.json` with that step and location, so
    that Ray keeps the report (`Result.metrics`, `Result.checkpoint`) while the weights
    stay in pipekit's own checkpoint. At the end of training the final metrics are
    reported with `"done": 1` (live metrics only: Ray keeps reports with a checkpoint).
    """

    MARKER = "pipekit.json"

    def __init__(self) -> None:
        self._train = optional_import("ray.train", extra="ray", package="pipekit-train-core")

    def _report(self, metrics: Mapping[str, Any], marker: Mapping[str, Any] | None = None) -> None:
        values = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
        if marker is None or self._train.get_context().get_world_rank() != 0:
            self._train.report(values)
            return
        with tempfile.TemporaryDirectory(prefix="pipekit-ray-marker-") as folder:
            (Path(folder) / self.MARKER).write_text(json.dumps(dict(marker)))
            self._train.report(values, checkpoint=self._train.Checkpoint.from_directory(folder))

    def on_checkpoint(self, state: Any, path: str) -> None:
        """Report the checkpoint's step, location and the latest metrics."""
        step = int(state.step)
        self._report(
            {**dict(state.metrics), "step": step, "pipekit_checkpoint": path},
            {"step": step, "pipekit_checkpoint": path},
        )

    def on_train_end(self, state: Any, artifact: Any) -> None:
        """Report the last metrics once training ended."""
        self._report({**dict(state.metrics), "step": int(state.step), "done": 1})


def ray_train_worker(
    loop_factory: Callable[[], Any],
    prepare: Callable[[Any], Any] | None = None,
) -> Any:
    """Build the loop on this Ray Train worker and run it (the training function's body).

    Args:
        loop_factory: builds the `TrainingLoop` (called after the worker joined its
            process group).
        prepare: the backend's change to the frozen plan (e.g. Lightning's Ray strategy),
            or None.

    Returns:
        The run's `TrainingArtifact` on this worker.
    """
    train = optional_import("ray.train", extra="ray", package="pipekit-train-core")
    os.environ[JOB_ENV] = f"ray-train:{train.get_context().get_experiment_name()}"
    loop = loop_factory()
    plan = getattr(loop, "plan", None)
    if plan is None or not hasattr(plan, "adapter"):
        raise ConfigError(
            "The loop factory must return a TrainingLoop. Received: "
            f"loop_factory() -> {type(loop).__name__}. Return TrainingLoop(...) from it."
        )
    if prepare is not None:
        plan = prepare(plan)
    plan = dataclasses.replace(plan, callbacks=(*plan.callbacks, RayTrainReport()))
    plan.adapter.validate(plan)
    return plan.adapter.run(plan)


def check_ray_fit(loop_factory: Any, num_workers: Any, max_failures: Any) -> None:
    """Raise `ConfigError` for bad arguments of a `fit_on_ray` (before Ray starts)."""
    if not callable(loop_factory) or hasattr(loop_factory, "plan"):
        raise ConfigError(
            "`loop_factory` must be a function that builds the TrainingLoop on each worker, "
            f"not a loop. Received: loop_factory={type(loop_factory).__name__}. Pass e.g. "
            "`def make_loop(): return TrainingLoop(...)` (module level, or a closure Ray "
            "can pickle)."
        )
    for field, value, low in (("num_workers", num_workers, 1), ("max_failures", max_failures, -1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(
                f"`{field}` must be an integer >= {low}. Received: {field}={value!r}."
                + (" Use -1 for unlimited restarts." if field == "max_failures" else "")
            )


def _storage_path(storage: str | os.PathLike[str] | None) -> str | None:
    if storage is None:
        return None
    text = os.fspath(storage)
    return text if "://" in text else str(Path(text).resolve())


def fit_with_ray_trainer(
    trainer_cls: Any,
    train_fn: Callable[[], Any],
    *,
    num_workers: int,
    use_gpu: bool,
    max_failures: int,
    storage: str | os.PathLike[str] | None,
    name: str | None,
    resources_per_worker: Mapping[str, float] | None,
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Run `train_fn` on a Ray Train worker group and return Ray's `Result`.

    Args:
        trainer_cls: the Ray trainer (`TorchTrainer`, `JaxTrainer`).
        train_fn: the per-worker training function (no arguments).
        num_workers: processes in the group.
        use_gpu: one GPU per worker.
        max_failures: group restarts Ray may make (`FailureConfig`; -1: unlimited).
        storage: Ray's run folder (`RunConfig(storage_path=...)`; pipekit's checkpoints
            stay at the loop's `Checkpoint`).
        name: the Ray Train run's name (also the run lease's job id); Ray picks one when None.
        resources_per_worker: Ray resources per worker (e.g. `{"CPU": 2}`).
        trainer_kwargs: further arguments of `trainer_cls` (e.g. `torch_config`).
    """
    train = optional_import("ray.train", extra="ray", package="pipekit-train-core")
    scaling = train.ScalingConfig(
        num_workers=num_workers,
        use_gpu=use_gpu,
        resources_per_worker=dict(resources_per_worker) if resources_per_worker else None,
    )
    run_config = train.RunConfig(
        name=name,
        storage_path=_storage_path(storage),
        failure_config=train.FailureConfig(max_failures=max_failures),
    )
    trainer = trainer_cls(
        train_fn, scaling_config=scaling, run_config=run_config, **dict(trainer_kwargs or {})
    )
    return trainer.fit()

"""One `Lightning()` or `Torch()` training job over a Ray Train worker group (`TorchTrainer`).

`fit_on_ray(make_loop, num_workers=2, max_failures=1)` runs the loop that `make_loop()`
builds on every worker of a `TorchTrainer` (gloo on CPU, nccl with `use_gpu=True`): the
loop's `Lightning(...)` adapter trains under Ray's process group with
`ray.train.lightning.RayDDPStrategy` and `RayLightningEnvironment` (its `strategy`,
`devices`, `num_nodes` and `plugins` are Ray's; its other options stay). Model, data,
loss and callbacks are the user's, unchanged; each process trains on its share of every
global batch, as under `Lightning(strategy="ddp")`.

Checkpoints stay pipekit's own (the loop's `Checkpoint`: a local or shared folder, or
`s3://`). After a lost worker Ray restarts the group (`max_failures`), and the new
group resumes from pipekit's latest complete checkpoint; every pipekit checkpoint's step
and location (and the metrics) reach Ray through `ray.train.report`.

A loop whose adapter is `Torch()` trains data-parallel over Ray's process group as it
is (`Torch`'s module docs): each worker takes its part of every global batch and the
gradients are averaged with one all-reduce per update. With `use_gpu=True` a `Torch()`
without a `device` trains on the GPU Ray gave its worker.

Importing this module needs Ray Train: `pip install 'pipekit-train-lightning[ray]'`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pipekit_train.core.adapter import (
    ConfigError,
    check_ray_fit,
    fit_with_ray_trainer,
    optional_import,
    ray_train_worker,
)

from ._adapter import Lightning
from .torch import Torch

_EXTRA = {"extra": "ray", "package": "pipekit-train-lightning"}
_ray_torch = optional_import("ray.train.torch", **_EXTRA)

__all__ = ["fit_on_ray", "on_ray"]

_RAY_OWNED = ("strategy", "devices", "num_nodes", "plugins")


def on_ray(plan: Any) -> Any:
    """The plan with its adapter set up for the Ray worker group.

    Args:
        plan: a `TrainingLoop`'s plan whose adapter is `Lightning(...)` or `Torch(...)`.

    Returns:
        The same plan with a copy of the adapter that trains under Ray's process group
        (`Lightning`: Ray's strategy, environment and devices; `Torch` without a
        `device`: the worker's device).

    Raises:
        ConfigError: the adapter is neither `Lightning()` nor `Torch()`.
    """
    import dataclasses

    adapter = plan.adapter
    if isinstance(adapter, Torch):
        if adapter.device is not None or not torch.cuda.is_available():
            return plan
        on_gpu = copy.copy(adapter)
        on_gpu.device = _ray_torch.get_device()  # the GPU Ray gave this worker
        return dataclasses.replace(plan, adapter=on_gpu)
    if not isinstance(adapter, Lightning):
        raise ConfigError(
            "pipekit_train.lightning.ray runs loops whose adapter is Lightning() or Torch(). "
            f"Received: adapter={type(adapter).__name__}. Use pipekit_train.equinox.ray for "
            "Equinox."
        )
    ray_lightning = optional_import("ray.train.lightning", **_EXTRA)  # imports lightning
    kwargs = {k: v for k, v in adapter.trainer_kwargs.items() if k not in _RAY_OWNED}
    kwargs.update(
        devices="auto",
        strategy=ray_lightning.RayDDPStrategy(),
        plugins=[ray_lightning.RayLightningEnvironment()],
    )
    ray_adapter = copy.copy(adapter)
    ray_adapter.trainer_kwargs = kwargs
    return dataclasses.replace(plan, adapter=ray_adapter)


def fit_on_ray(
    loop_factory: Callable[[], Any],
    *,
    num_workers: int = 2,
    use_gpu: bool = False,
    max_failures: int = 0,
    storage: str | os.PathLike[str] | None = None,
    name: str | None = None,
    resources_per_worker: Mapping[str, float] | None = None,
) -> Any:
    """Train the loop that `loop_factory()` builds on `num_workers` Ray Train workers.

    Connects to the running Ray runtime (or starts a local one, as `ray.train` does).
    `loop_factory` is pickled by Ray and called on every worker after Ray set up the
    process group; it returns a `TrainingLoop` with `adapter=Lightning(...)` (or
    `Torch(...)`, data-parallel over the group) and, for a
    job that should survive a lost worker, a `checkpoint=` every worker reaches (a
    shared folder or `s3://`).

    Args:
        loop_factory: builds the `TrainingLoop` (no arguments).
        num_workers: processes in the group (`batch_size` must split evenly over them).
        use_gpu: one GPU per worker (nccl); otherwise CPU workers with gloo.
        max_failures: group restarts after a lost worker or node (-1: unlimited).
        storage: Ray's run folder (`RunConfig(storage_path=...)`).
        name: the Ray Train run's name; also the run lease's job id, so the restarted
            group takes the checkpoint location over at once. Ray picks one when None.
        resources_per_worker: Ray resources per worker (e.g. `{"CPU": 2}`).

    Returns:
        Ray's `Result`: `result.metrics` holds the last report (`step`, the metrics and,
        after a checkpoint, `pipekit_checkpoint`).

    Raises:
        ConfigError: a bad argument (before Ray starts); on the workers, a loop Ray cannot
            run (e.g. an Equinox adapter).

    Examples:
        >>> from pipekit_train.lightning.ray import fit_on_ray
        >>> def make_loop():  # builds TrainingLoop(...) on each worker
        ...     ...
        >>> callable(make_loop)
        True
        >>> result = fit_on_ray(make_loop, num_workers=2, max_failures=1)  # doctest: +SKIP
    """
    check_ray_fit(loop_factory, num_workers, max_failures)

    def train_fn() -> None:
        ray_train_worker(loop_factory, on_ray)

    return fit_with_ray_trainer(
        _ray_torch.TorchTrainer,
        train_fn,
        num_workers=num_workers,
        use_gpu=use_gpu,
        max_failures=max_failures,
        storage=storage,
        name=name,
        resources_per_worker=resources_per_worker,
    )

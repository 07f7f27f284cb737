"""One Equinox training job over a Ray Train worker group (`JaxTrainer`).

`fit_on_ray(make_loop, num_workers=2, max_failures=1)` runs the loop that `make_loop()`
builds on every worker of Ray's `JaxTrainer` once the workers have joined one
`jax.distributed` job, so a loop with `sharding=ShardingSpec(jax.make_mesh(...))` trains
data-parallel over all of them, exactly as under a hand-launched `jax.distributed` run
(each process feeds its shard of every global batch). Model, data, loss and callbacks are
the user's, unchanged; the factory builds the mesh, which only exists after the join.

On GPU and TPU workers Ray's JAX backend calls `jax.distributed.initialize` itself. On
CPU workers it does not (Ray 2.60: `_JaxBackend.on_start` returns early unless
`use_tpu` or `use_gpu`), so here each worker joins itself: worker 0 picks a coordinator
address, `ray.train.collective.broadcast_from_rank_zero` hands it to the others, and
every worker calls `jax.distributed.initialize` with gloo CPU collectives.

Checkpoints stay pipekit's own (the loop's `Checkpoint`, Orbax) in a folder every worker
reaches (a shared file system: Equinox refuses a URI in a multi-process run). After
a lost worker Ray restarts the group (`max_failures`) and the new group resumes from
pipekit's latest complete checkpoint; each checkpoint's step and location, and the
metrics, reach Ray through `ray.train.report`.

Importing this module needs Ray Train: `pip install 'pipekit-train-equinox[ray]'`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from pipekit_train.core.adapter import (
    check_ray_fit,
    fit_with_ray_trainer,
    optional_import,
    ray_train_worker,
)

_EXTRA = {"extra": "ray", "package": "pipekit-train-equinox"}
_ray_train = optional_import("ray.train", **_EXTRA)
_ray_collective = optional_import("ray.train.collective", **_EXTRA)
_ray_jax = optional_import("ray.train.v2.jax", **_EXTRA)

__all__ = ["fit_on_ray", "join_jax_distributed"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def join_jax_distributed(timeout: int = 300) -> None:
    """Join this Ray Train worker to one `jax.distributed` job with the others (CPU).

    Worker 0 picks the coordinator's address (its node's IP, a free port) and broadcasts
    it; every worker then calls `jax.distributed.initialize` with gloo CPU collectives.
    A group of one worker joins nothing.

    Args:
        timeout: seconds to wait for the other workers (`initialization_timeout`).
    """
    context = _ray_train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    if world == 1:
        return
    address = None
    if rank == 0:
        import ray.util

        address = f"{ray.util.get_node_ip_address()}:{_free_port()}"
    address = _ray_collective.broadcast_from_rank_zero(address)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=world,
        process_id=rank,
        initialization_timeout=timeout,
    )


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
    `loop_factory` is pickled by Ray and called on every worker after the workers joined
    `jax.distributed`; it returns a `TrainingLoop` with the Equinox adapter, usually with
    `sharding=ShardingSpec(jax.make_mesh((jax.device_count(),), ("data",)))`, and, for a
    job that should survive a lost worker, a `checkpoint=` folder every worker reaches (a
    shared file system; an `s3://` location is refused with several processes).

    Args:
        loop_factory: builds the `TrainingLoop` (no arguments).
        num_workers: processes in the group.
        use_gpu: one GPU per worker (Ray's JAX backend joins the workers); otherwise CPU
            workers that `join_jax_distributed`.
        max_failures: group restarts after a lost worker or node (-1: unlimited).
        storage: Ray's run folder (`RunConfig(storage_path=...)`).
        name: the Ray Train run's name; also the run lease's job id, so the restarted
            group takes the checkpoint location over at once. Ray picks one when None.
        resources_per_worker: Ray resources per worker (e.g. `{"CPU": 2}`).

    Returns:
        Ray's `Result`: `result.metrics` holds the last report (`step`, the metrics and,
        after a checkpoint, `pipekit_checkpoint`).

    Raises:
        ConfigError: a bad argument (before Ray starts).

    Examples:
        >>> from pipekit_train.equinox.ray import fit_on_ray
        >>> def make_loop():  # builds TrainingLoop(...) on each worker
        ...     ...
        >>> callable(make_loop)
        True
        >>> result = fit_on_ray(make_loop, num_workers=2, max_failures=1)  # doctest: +SKIP
    """
    check_ray_fit(loop_factory, num_workers, max_failures)

    def train_fn() -> None:
        if not use_gpu:
            join_jax_distributed()
        try:
            ray_train_worker(loop_factory)
        finally:
            if not use_gpu and _ray_train.get_context().get_world_size() > 1:
                import jax

                jax.distributed.shutdown()

    return fit_with_ray_trainer(
        _ray_jax.JaxTrainer,
        train_fn,
        num_workers=num_workers,
        use_gpu=use_gpu,
        max_failures=max_failures,
        storage=storage,
        name=name,
        resources_per_worker=resources_per_worker,
    )

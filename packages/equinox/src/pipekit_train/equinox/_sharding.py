"""`ShardingSpec`: where the state and the batches live on a device mesh.

```python
mesh = jax.make_mesh((jax.device_count(),), ("data",))
TrainingLoop(..., sharding=ShardingSpec(mesh))        # data parallel
```

`model_pspec` places the model (and the optimizer leaves that mirror it, through
`optax.tree_map_params`); `data_pspec` places each batch (its leading axis). `batch_size` is the global
batch. In a multi-process run every process reads its contiguous part of each global
batch (`shard=(jax.process_index(), jax.process_count())`, `batch_size / processes`
rows) and the global batch is assembled with `jax.make_array_from_process_local_data`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import equinox as eqx
from pipekit_train.core.adapter import ConfigError

__all__ = ["Placement", "ShardingSpec"]


@dataclass(frozen=True)
class ShardingSpec:
    """How to shard a training run over a `jax.sharding.Mesh`.

    Args:
        mesh: the device mesh (e.g. `jax.make_mesh((2,), ("data",))`).
        model_pspec: the `PartitionSpec` of the model arrays (default `P()`:
            replicated). A single spec applies to every array it fits (rank at least
            its length, dimensions divisible by the mesh axes) and leaves the others
            replicated; a pytree of `PartitionSpec`s that is a prefix of the model, or a
            callable `(path, array) -> PartitionSpec`, is applied exactly.
        data_pspec: the `PartitionSpec` of each batch array (default `P("data")`:
            the batch axis split over the `data` mesh axis).
    """

    mesh: Mesh
    model_pspec: Any = field(default_factory=PartitionSpec)
    data_pspec: PartitionSpec = field(default_factory=lambda: PartitionSpec("data"))

    def __repr__(self) -> str:
        shape = dict(self.mesh.shape)
        return f"ShardingSpec(mesh={shape}, model_pspec={_describe(self.model_pspec)}, data_pspec={self.data_pspec})"

    def data_axis_size(self) -> int:
        """The number of shards the batch axis is split into."""
        first = self.data_pspec[0] if len(self.data_pspec) else None
        if first is None:
            return 1
        names = first if isinstance(first, tuple) else (first,)
        return math.prod(self.mesh.shape[n] for n in names)

    def validate(self, batch_size: int) -> None:
        """Raise `ConfigError` for a spec that cannot shard this run."""
        if not isinstance(self.mesh, Mesh):
            raise ConfigError(
                "`ShardingSpec.mesh` must be a jax.sharding.Mesh, e.g. jax.make_mesh((2,), ('data',)). "
                f"Received: mesh={self.mesh!r}."
            )
        if not isinstance(self.data_pspec, PartitionSpec):
            raise ConfigError(
                f"`ShardingSpec.data_pspec` must be a PartitionSpec. Received: data_pspec={self.data_pspec!r}."
            )
        axes = set(self.mesh.axis_names)
        specs = [self.data_pspec]
        if isinstance(self.model_pspec, PartitionSpec):
            specs.append(self.model_pspec)
        for spec in specs:
            for entry in spec:
                for name in entry if isinstance(entry, tuple) else (entry,):
                    if name is not None and name not in axes:
                        raise ConfigError(
                            f"`ShardingSpec` names the mesh axis {name!r}, which the mesh does not have. "
                            f"Received: {spec}, mesh axes={sorted(axes)}."
                        )
        size = self.data_axis_size()
        processes = jax.process_count()
        if batch_size % size or batch_size % processes:
            multiple = math.lcm(size, processes)
            raise ConfigError(
                "`batch_size` (the global batch) must split evenly over the "
                f"{size} data shards of the mesh and the {processes} process(es). "
                f"Received: batch_size={batch_size}. Use a multiple of {multiple}."
            )
        if not (callable(self.model_pspec) or isinstance(self.model_pspec, PartitionSpec)):
            leaves = jax.tree.leaves(
                self.model_pspec, is_leaf=lambda x: isinstance(x, PartitionSpec)
            )
            if not all(isinstance(x, PartitionSpec) for x in leaves):
                raise ConfigError(
                    "`ShardingSpec.model_pspec` must be a PartitionSpec, a pytree of PartitionSpecs "
                    f"or a callable. Received: model_pspec={self.model_pspec!r}."
                )


def _describe(spec: Any) -> str:
    if isinstance(spec, PartitionSpec):
        return str(spec)
    if callable(spec):
        return getattr(spec, "__qualname__", type(spec).__name__)
    return "<pytree>"


class Placement:
    """Puts states and batches on devices for one run (single device, mesh, multi-process).

    Args:
        spec: the sharding spec, or None for the default device.
    """

    def __init__(self, spec: ShardingSpec | None):
        self.spec = spec
        self.multiprocess = spec is not None and jax.process_count() > 1
        if spec is None:
            self.replicated = None
            self._data = self._stacked = None
        else:
            self.replicated = NamedSharding(spec.mesh, PartitionSpec())
            self._data = NamedSharding(spec.mesh, spec.data_pspec)
            self._stacked = NamedSharding(spec.mesh, PartitionSpec(None, *spec.data_pspec))

    # -- state -------------------------------------------------------------------------
    def _divides(self, spec: PartitionSpec, x: Any) -> bool:
        assert self.spec is not None
        if len(spec) > np.ndim(x):
            return False
        for dim, entry in zip(np.shape(x), spec, strict=False):
            names = entry if isinstance(entry, tuple) else (entry,)
            size = math.prod(self.spec.mesh.shape[n] for n in names if n is not None)
            if dim % size:
                return False
        return True

    def _param_spec(self, path: Any, x: Any) -> PartitionSpec:
        assert self.spec is not None
        spec = self.spec.model_pspec
        if isinstance(spec, PartitionSpec):
            # One spec for every array: applied where it fits, replicated elsewhere.
            return spec if self._divides(spec, x) else PartitionSpec()
        spec = spec(path, x)
        if not isinstance(spec, PartitionSpec):
            raise ConfigError(
                f"`ShardingSpec.model_pspec` must return a PartitionSpec. Received: {spec!r} for {jax.tree_util.keystr(path)}."
            )
        return spec

    def model_shardings(self, model: Any, keep: Callable[[Any], bool] = eqx.is_array) -> Any:
        """Shardings for the model's `keep` arrays (the structure of `eqx.filter(model, keep)`)."""
        assert self.spec is not None
        spec, mesh = self.spec.model_pspec, self.spec.mesh
        if isinstance(spec, PartitionSpec) or callable(spec):
            return jax.tree_util.tree_map_with_path(
                lambda p, x: NamedSharding(mesh, self._param_spec(p, x)) if keep(x) else None, model
            )

        def expand(s: PartitionSpec, sub: Any) -> Any:
            return jax.tree.map(
                lambda x: (
                    NamedSharding(mesh, s if len(s) <= np.ndim(x) else PartitionSpec())
                    if keep(x)
                    else None
                ),
                sub,
            )

        try:
            return jax.tree.map(expand, spec, model, is_leaf=lambda x: isinstance(x, PartitionSpec))
        except ValueError as exc:
            raise ConfigError(
                f"`ShardingSpec.model_pspec` must be a prefix of the model's structure ({exc}). "
                "Received: a pytree that does not match. Build it with jax.tree.map(lambda _: P(), model)."
            ) from exc

    def state_shardings(self, state: Any, optimizer: Any) -> list[NamedSharding]:
        """Shardings of a `TrainState`'s array leaves, in `flatten_state` order.

        The model follows `model_pspec`; optimizer leaves that mirror a parameter follow
        that parameter (`optax.tree_map_params`); everything else is replicated.
        """
        from ._state import TrainState

        assert isinstance(state, TrainState) and self.spec is not None
        rep: Any = self.replicated  # a sharding where `TrainState` holds an array
        model_sh = self.model_shardings(state.model, eqx.is_array)
        param_sh = self.model_shardings(state.model, eqx.is_inexact_array)
        on_arrays = lambda tree: jax.tree.map(lambda x: rep if eqx.is_array(x) else None, tree)  # noqa: E731
        try:
            opt_sh = optax.tree_map_params(
                optimizer,
                lambda _, s: s,
                state.opt_state,
                param_sh,
                transform_non_params=lambda x: rep if eqx.is_array(x) else None,
                is_leaf=lambda x: isinstance(x, NamedSharding),
            )
            if len(jax.tree.leaves(opt_sh)) != len(
                jax.tree.leaves(eqx.filter(state.opt_state, eqx.is_array))
            ):
                raise ValueError("optimizer state does not mirror the parameters")
        except Exception:  # an optimizer optax cannot map: replicate its state
            opt_sh = on_arrays(state.opt_state)
        shardings = TrainState(
            model_sh,
            opt_sh,
            rep,
            rep,
            None if state.model_state is None else on_arrays(state.model_state),
            None if state.loss_scale is None else on_arrays(state.loss_scale),
        )
        out = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
        expected = len(jax.tree.leaves(eqx.filter(state, eqx.is_array)))
        if len(out) != expected:
            raise RuntimeError(f"internal: {len(out)} shardings for {expected} state arrays")
        return out

    def put_leaves(self, leaves: list[Any], shardings: list[Any] | None) -> list[jax.Array]:
        """Fresh device copies of `leaves` (never aliases of the inputs: the step donates them)."""
        if shardings is None:
            return [jax.numpy.array(x, copy=True) for x in leaves]
        out: list[jax.Array] = []
        for x, sh in zip(leaves, shardings, strict=True):
            host = np.asarray(jax.device_get(x))
            out.append(jax.make_array_from_callback(host.shape, sh, host.__getitem__))
        return out

    # -- batches -----------------------------------------------------------------------
    @property
    def data_sharding(self) -> NamedSharding | None:
        """The sharding of one training batch (None: the default device)."""
        return self._data

    @property
    def stacked_sharding(self) -> NamedSharding | None:
        """The sharding of K stacked training batches."""
        return self._stacked

    def put_batch(self, batch: Mapping[str, np.ndarray], *, stacked: bool = False) -> Any:
        """A training batch (or K stacked batches), ready for the compiled step.

        In one process the numpy arrays are returned as they are: the jitted step
        transfers (and splits, per `data_pspec`) them in its C++ dispatch path, which is
        several times cheaper per call than `jax.device_put`. With several processes the
        global batch is assembled from each process's rows.
        """
        if not self.multiprocess:
            return batch
        sharding = self._stacked if stacked else self._data
        return {
            k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items()
        }

    def put_replicated(self, batch: Mapping[str, np.ndarray]) -> Any:
        """A batch for every device whole (validation, online steps of any size)."""
        if not self.multiprocess:
            return batch
        return {
            k: jax.make_array_from_process_local_data(self.replicated, np.asarray(v))
            for k, v in batch.items()
        }

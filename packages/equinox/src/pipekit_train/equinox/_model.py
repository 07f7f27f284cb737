"""`EquinoxModelOp`: an `eqx.Module` built by an importable factory, as a model operator.

Equinox modules act on one sample (`eqx.nn.Linear`, `eqx.nn.MLP`); the operator and the
train step `jax.vmap` them over the batch with `axis_name="batch"` (what
`eqx.nn.BatchNorm` expects). A factory whose module already takes a batch is declared
with `batched=True`. A channels-first module (`eqx.nn.Conv`, pdequinox's networks: one
sample `(C, *spatial)`) on pipekit-train's channels-last fields is declared with
`layout="channels_last"`: `apply_model` permutes at the module's boundary, on every path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import numpy as np
from jaxtyping import Array, PRNGKeyArray, PyTree

import equinox as eqx
from pipekit_train.core.adapter import (
    ConfigError,
    ModelOpBase,
    RolloutSpec,
    check_layout,
    to_channels_first_axes,
    to_channels_last_axes,
)

from ._rollout import device_rollout
from ._weights import decode_weights, encode_weights

__all__ = ["EquinoxModelOp", "apply_model", "has_stochastic_layers", "takes_key"]


def takes_key(fn: Any, *, unknown: bool = False) -> bool:
    """Whether calling `fn` accepts a `key=` argument (`unknown` when it cannot be told)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return unknown
    return "key" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def has_stochastic_layers(model: Any) -> bool:
    """Whether the model has layers with an `inference` switch (dropout, batch norm)."""
    is_switch = lambda x: hasattr(x, "inference") and isinstance(x, eqx.Module)  # noqa: E731
    return any(is_switch(x) for x in jax.tree_util.tree_leaves(model, is_leaf=is_switch))


def apply_model(
    model: Callable[..., Any],
    x: Array,
    state: eqx.nn.State | None,
    key: PRNGKeyArray | None,
    *,
    batched: bool,
    layout: str | None = None,
) -> tuple[Array, eqx.nn.State | None]:
    """Run `model` on a batch; return `(prediction, new layer state or None)`.

    Per-sample modules are vmapped with `axis_name="batch"`; a key (when given) is split
    into one key per sample; a stateful model is called `model(x, state)` and returns
    `(y, state)`. With `layout="channels_last"` a batch of rank >= 3 is moved to
    channels-first before the module (`(N, *spatial, C) -> (N, C, *spatial)`: each
    vmapped sample is `(C, *spatial)`) and a prediction of rank >= 3 back after it
    (`pipekit_train.core.adapter`: `LAYOUTS`, `check_layout`); any other layout passes the batch unchanged.
    """
    if layout == "channels_last":
        axes = to_channels_first_axes(x.ndim)
        x = x if axes is None else x.transpose(axes)
        pred, new_state = apply_model(model, x, state, key, batched=batched)
        back = to_channels_last_axes(pred.ndim)
        return (pred if back is None else pred.transpose(back)), new_state
    kw = (lambda k: {}) if key is None else (lambda k: {"key": k})
    if batched:
        if state is None:
            return model(x, **kw(key)), None
        return model(x, state, **kw(key))
    if key is None:
        if state is None:
            return jax.vmap(model, axis_name="batch")(x), None
        return jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
    keys = _sharded_like(jax.random.split(key, x.shape[0]), x)
    if state is None:
        return jax.vmap(lambda xi, ki: model(xi, key=ki), axis_name="batch")(x, keys), None
    return jax.vmap(
        lambda xi, s, ki: model(xi, s, key=ki),
        axis_name="batch",
        in_axes=(0, None, 0),
        out_axes=(0, None),
    )(x, state, keys)


def _sharded_like(keys: Array, x: Array) -> Array:
    """Per-sample keys placed like the batch axis of `x`.

    On a mesh with explicit axes (`jax.make_mesh`'s default) a batch assembled from
    several processes carries its sharding in its type, and `vmap` needs every mapped
    input sharded alike. The key values do not depend on the placement (jax's
    partitionable threefry), so every sample gets the same key on any device count.
    """
    sharding = getattr(jax.typeof(x), "sharding", None)
    spec = getattr(sharding, "spec", None)
    if sharding is None or not spec or spec[0] is None:
        return keys
    target = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(spec[0]))
    return jax.sharding.reshard(keys, target)


class EquinoxModelOp(ModelOpBase):
    """An Equinox model operator.

    ```python
    op = EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=2, out_size=1, width=64, seed=0)
    y = op(np.zeros((8, 2), np.float32))  # jitted, inference mode; y.shape == (8, 1)
    ```

    Args:
        factory: `"module:function"` or an importable callable; called as
            `factory(**kwargs, key=jax.random.PRNGKey(seed))` and returning an
            `eqx.Module`, or `(module, state)` when built with `eqx.nn.make_with_state`
            (BatchNorm and other stateful layers).
        seed: the seed of the initialisation key.
        batched: the module takes a whole batch (default False: it takes one sample and
            is vmapped).
        layout: None (default: the module's own layout, inputs as they are),
            `"channels_last"` (a channels-first module on pipekit-train's channels-last
            fields: inputs and predictions of rank >= 3 are permuted at the module's
            boundary, in training, evaluation, prediction and the device rollout alike)
            or `"channels_first"` (a channels-first module on channels-first data: inputs
            as they are; declared, so channels-last data is refused before any work).
            The same option, with the same meaning, as `TorchModelOp`'s and
            `KerasModelOp`'s.
        **kwargs: JSON keyword arguments of the factory.

    Attributes:
        model: the `eqx.Module`.
        model_state: the `eqx.nn.State`, or None for stateless models.
        layout: the `layout` argument.

    A pdequinox/APEBench network (one sample `(C, N)` on a 1-D grid) trains on
    `TrajectoryWindows` of `(N, C)` states with no wrapper:

    ```python
    op = EquinoxModelOp("my_project.nets:conv", layout="channels_last", seed=0)
    op(np.zeros((8, 160, 1), np.float32)).shape  # (8, 160, 1); the module saw (1, 160)
    ```
    """

    backend: ClassVar[str] = "equinox"
    framework: ClassVar[str | None] = "equinox"
    framework_label: ClassVar[str] = "Equinox"
    framework_model: ClassVar[str] = "an `eqx.Module`"
    factory_takes_key: ClassVar[bool] = True
    layout: str | None = None

    def __init__(
        self,
        factory: str | Callable[..., Any],
        *,
        seed: int = 0,
        batched: bool = False,
        layout: str | None = None,
        **kwargs: Any,
    ):
        if not isinstance(batched, bool):
            raise ConfigError(f"`batched` must be True or False. Received: batched={batched!r}.")
        self.batched = batched
        self.layout = None if layout is None else check_layout(layout, owner="EquinoxModelOp")
        self.model_state: eqx.nn.State | None = None
        self._infer: Callable[[np.ndarray], Any] | None = None
        self._rollouts: dict[Any, Any] = {}
        super().__init__(factory, seed=seed, **kwargs)

    # -- building ----------------------------------------------------------------------
    def _build(self, factory: Callable[..., Any], kwargs: dict[str, Any], seed: int) -> Any:
        if not takes_key(factory, unknown=True):
            no_key = ConfigError(
                "An Equinox factory must take a keyword argument `key` (the PRNG key of the "
                f"initialisation). Received: factory={self.factory!r}. Add `*, key` to its signature."
            )
            # Without a `key` it may be another framework's factory: build it once to say so.
            try:
                foreign = factory(**kwargs)
            except Exception as exc:
                raise no_key from exc
            self.check_model(foreign)
            raise no_key
        out = factory(**kwargs, key=jax.random.PRNGKey(seed))
        self.check_model(out)
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], eqx.nn.State):
            out, self.model_state = out
        if not isinstance(out, eqx.Module):
            raise ConfigError(
                "An Equinox factory must return an `eqx.Module` (or `(module, state)` from "
                f"`eqx.nn.make_with_state`). Received: factory={self.factory!r} returned {type(out).__name__}."
            )
        return out

    def get_config(self) -> dict[str, Any]:
        """`{"type", "backend", "factory", "kwargs", "seed"}` plus `batched` when True and
        `layout` when set (so a config without them, and its resume key, is as before)."""
        config = super().get_config()
        if self.batched:
            config["batched"] = True
        if self.layout is not None:
            config["layout"] = self.layout
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EquinoxModelOp:
        """Rebuild (with freshly initialised weights) from `get_config()`."""
        return cls(
            config["factory"],
            seed=config.get("seed", 0),
            batched=bool(config.get("batched", False)),
            layout=config.get("layout"),
            **config.get("kwargs", {}),
        )

    def with_model(self, model: Any, model_state: eqx.nn.State | None = None) -> EquinoxModelOp:
        """A copy of this operator holding `model` (and `model_state` for stateful models)."""
        new = super().with_model(model)
        assert isinstance(new, EquinoxModelOp)
        if model_state is not None:
            new.model_state = model_state
        new._infer = None
        new._rollouts = {}
        return new

    # -- inference ---------------------------------------------------------------------
    def _tree(self) -> PyTree:
        return self.model if self.model_state is None else (self.model, self.model_state)

    def _compile(self) -> Callable[[np.ndarray], Any]:
        arrays, static = eqx.partition(self._tree(), eqx.is_array)
        batched, layout = self.batched, self.layout

        @jax.jit
        def infer(arrays: PyTree, x: Array) -> Array:
            tree = eqx.combine(arrays, static)
            model, state = (tree, None) if self.model_state is None else tree
            model = eqx.nn.inference_mode(model)
            return apply_model(model, x, state, None, batched=batched, layout=layout)[0]

        return lambda x: infer(arrays, x)

    def __call__(self, inputs: Any) -> np.ndarray:
        """Batched inference in inference mode on a numpy array; returns numpy."""
        if self._infer is None:
            self._infer = self._compile()
        x = np.asarray(inputs)
        if x.dtype == np.float64:
            x = x.astype(np.float32)
        return np.asarray(self._infer(x))

    def rollout(
        self,
        state: Any,
        n_steps: int,
        *,
        spec: RolloutSpec | None = None,
        keep: str | int = "all",
        chunk: int | None = None,
        stochastic: bool = False,
        seed: int = 0,
    ) -> np.ndarray:
        """Advance a batch of states `n_steps` steps without leaving the device.

        Each segment of at most `chunk` steps is one jitted `lax.fori_loop` over the core
        rollout step (`spec.bind(jax.numpy)`: normalise → model → head mean →
        de-normalise → residual), in inference mode; the finiteness check runs inside it.
        `NeuralForward(op, ...).rollout(...)` calls this with its spec.

        Args:
            state: one state or a batch `(n, *state)` (numpy or jax).
            n_steps: the number of steps.
            spec: the step's normalizer, residual and head (None: `next = model(state)`).
            keep: `"all"` (steps `0..n`), an int `k` (steps `0, k, 2k, ...`) or `"last"`.
            chunk: the most steps per compiled segment (None: bounded by memory).
            stochastic: draw each step from the predicted distribution (Gaussian and
                mixture heads) instead of taking its mean.
            seed: the seed of the draws (`jax.random.fold_in(key(seed), step)`: the same
                seed gives the same rollout, whatever `chunk`).

        Returns:
            The stored states in the model's dtype, `(len(kept), n, *state)` (no `n` axis
            for one state).

        Raises:
            ConfigError: bad arguments, or a model output that does not fit the state
                (before any step).
            NonFiniteStateError: a state became NaN/inf (names the first step and member).
        """
        stateful, batched, layout = self.model_state is not None, self.batched, self.layout

        def forward(tree: PyTree) -> Callable[[Array], Array]:
            model, layer_state = tree if stateful else (tree, None)
            model = eqx.nn.inference_mode(model)
            return lambda x: apply_model(
                model, x, layer_state, None, batched=batched, layout=layout
            )[0]

        cache = self.__dict__.setdefault("_rollouts", {})
        return device_rollout(
            self._tree(),
            forward,
            cache,
            state,
            n_steps,
            spec=spec,
            keep=keep,
            chunk=chunk,
            stochastic=stochastic,
            seed=seed,
        )

    # -- weights -----------------------------------------------------------------------
    def serialize_weights(self) -> bytes:
        """The weights (and layer state) via `eqx.tree_serialise_leaves`: same weights, same bytes."""
        return encode_weights(self._tree())

    def _load_weights(self, blob: bytes) -> None:
        tree = decode_weights(blob, self._tree(), factory=self.factory)
        if self.model_state is None:
            self.model = tree
        else:
            self.model, self.model_state = tree
        self._infer = None
        self._rollouts = {}

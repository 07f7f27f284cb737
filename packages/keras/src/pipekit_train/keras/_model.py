"""`KerasModelOp`: a `keras.Model` built by an importable factory, as a pipekit model operator."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipekit_train.core.adapter import (
    ConfigError,
    ModelOpBase,
    RolloutSpec,
    check_layout,
    to_channels_first_axes,
    to_channels_last_axes,
)

from . import _weights
from ._keras_backend import backend_name
from ._rollout import device_rollout

if TYPE_CHECKING:
    import keras

__all__ = ["KerasModelOp", "build_model", "model_variables", "model_weights", "output_model_op"]

# Above this many rows `__call__` runs `model.predict` in chunks instead of one batch.
_PREDICT_CHUNK = 4096


@contextlib.contextmanager
def dtype_policy_scope(precision: str | None) -> Iterator[None]:
    """Temporarily set Keras's global dtype policy (layers read it when they are created)."""
    import keras

    if precision is None:
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_model(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    seed: int,
    *,
    precision: str | None = None,
    owner: str = "KerasModelOp",
    check: Callable[[Any], None] | None = None,
    layout: str | None = None,
) -> keras.Model:
    """Call `factory(**kwargs)` under `keras.utils.set_random_seed(seed)` and build it.

    A model without an `Input` is built from an `in_size` keyword argument when there is
    one (`model.build((None, in_size))`). With `layout="channels_last"` the model is
    wrapped by `channels_last_model`.

    `check` (the operator's `check_model`) sees what the factory returned first, so
    another framework's model is refused in that framework's terms.

    Raises:
        ConfigError: the factory does not return a `keras.Model`, or the model cannot be
            built without an input shape.
    """
    import keras

    with dtype_policy_scope(precision):
        keras.utils.set_random_seed(int(seed))
        model = factory(**kwargs)
        if check is not None:
            check(model)
        if not isinstance(model, keras.Model):
            raise ConfigError(
                f"The `{owner}` factory must return a `keras.Model`. "
                f"Received: a {type(model).__name__} from factory={getattr(factory, '__name__', factory)!r}. "
                "Return e.g. keras.Sequential([keras.Input((in_size,)), keras.layers.Dense(out_size)])."
            )
        if not model.built:
            in_size = kwargs.get("in_size")
            if isinstance(in_size, int) and not isinstance(in_size, bool):
                model.build((None, in_size))
            else:
                raise ConfigError(
                    f"The model from the `{owner}` factory is not built and its input shape is "
                    f"unknown. Received: kwargs={kwargs!r}. Start the model with "
                    "`keras.Input(shape)` or pass an `in_size` keyword argument."
                )
        if layout == "channels_last":
            model = channels_last_model(model, owner=owner)
    return model


def channels_last_model(model: keras.Model, *, owner: str = "KerasModelOp") -> keras.Model:
    """A functional model taking channels-last fields around a channels-first `model`.

    `Input((*spatial, C))` -> `Permute` to `(C, *spatial)` -> `model` -> `Permute` of a
    prediction of rank >= 3 (batch included) back to `(*spatial, C_out)`: the boundary
    permutes of `layout="channels_last"` (`pipekit_train.core.adapter`: `LAYOUTS`, `check_layout`) as layers
    without weights, so the weights, their order and their bytes are `model`'s own and
    every path (`fit`, `predict`, `stateless_call`, the device rollout) sees them. A model
    on vectors (a sample of rank 1) is returned as it is.

    Raises:
        ConfigError: `model` has not exactly one `keras.Input`.
    """
    import keras

    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs or len(inputs) != 1:
        raise ConfigError(
            f"layout='channels_last' needs a model with one `keras.Input` (its channels-first "
            f"sample shape, (C, *spatial)). Received: a {type(model).__name__} from the "
            f"`{owner}` factory with {len(inputs or [])} inputs. Start the model with "
            "keras.Input((C, *spatial)), or drop `layout` and build it channels-last."
        )
    sample = tuple(inputs[0].shape)[1:]
    to_first = to_channels_first_axes(len(sample) + 1)
    if to_first is None:
        return model
    x = keras.Input((*sample[1:], sample[0]), dtype=inputs[0].dtype)
    # autocast=False: a transpose keeps the dtype it is given (under a mixed precision
    # policy the model's own layers cast, as without the wrapper)
    y = model(keras.layers.Permute(to_first[1:], autocast=False)(x))
    to_last = to_channels_last_axes(len(y.shape))
    if to_last is not None:
        y = keras.layers.Permute(to_last[1:], autocast=False)(y)
    return keras.Model(x, y, name=f"{model.name}_channels_last")


def model_weights(model: keras.Model) -> list[Any]:
    """The variables that make up a model's weights (trainable + non-trainable, no RNG state)."""
    return list(model.weights)


def model_variables(model: keras.Model) -> list[Any]:
    """Every model variable a resumed run needs: weights plus RNG seed-generator states."""
    return list(model.trainable_variables) + list(model.non_trainable_variables)


class KerasModelOp(ModelOpBase):
    """A Keras 3 model operator (jax or torch Keras backend).

    The factory is called under `keras.utils.set_random_seed(seed)`, so the same config
    gives the same initial weights; a model whose factory does not start with
    `keras.Input(...)` is built from an `in_size` keyword argument.

    Weights travel as safetensors bytes of the weight arrays in the model's variable
    order (byte-identical for equal weights; `.weights.h5` is not, since it embeds
    auto-generated layer names).

    Args:
        factory: an importable callable returning a `keras.Model`, or its
            `"module:function"` path.
        seed: the seed the model is built under.
        layout: None (default: the model's own layout, inputs as they are: Keras layers
            are channels-last by default), `"channels_last"` (a channels-first model,
            e.g. built with `data_format="channels_first"` or ported from torch or
            pdequinox, on pipekit-train's channels-last fields: `channels_last_model`
            wraps it in weightless `Permute` layers at its boundary, so training,
            evaluation, prediction and the device rollout all see the permutation) or
            `"channels_first"` (a channels-first model on channels-first data, declared:
            channels-last data is refused before any work). The same option, with the same
            meaning, as `TorchModelOp`'s and `EquinoxModelOp`'s. A permute rather than
            Keras's `data_format`: the option then takes any channels-first model,
            including ones whose layers have no `data_format`.
        **kwargs: JSON keyword arguments forwarded to the factory.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.keras import KerasModelOp
        >>> op = KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1)
        >>> op(np.zeros((2, 4), np.float32)).shape
        (2, 1)
    """

    backend: ClassVar[str] = "keras"
    framework: ClassVar[str | None] = "keras"
    framework_label: ClassVar[str] = "Keras"
    framework_model: ClassVar[str] = "a `keras.Model`"
    layout: str | None = None

    def __init__(
        self,
        factory: str | Callable[..., Any],
        *,
        seed: int = 0,
        layout: str | None = None,
        **kwargs: Any,
    ):
        # Fail with the extra to install, before the factory (which may import keras) is
        # imported, when Keras has no usable backend.
        backend_name()
        if layout is not None:
            layout = check_layout(layout, owner=type(self).__name__)
        self.layout = layout
        super().__init__(factory, seed=seed, **kwargs)

    def _build(self, factory: Callable[..., Any], kwargs: dict[str, Any], seed: int) -> Any:
        return build_model(
            factory,
            kwargs,
            seed,
            owner=type(self).__name__,
            check=self.check_model,
            layout=self.layout,
        )

    def get_config(self) -> dict[str, Any]:
        """`ModelOpBase.get_config()`, plus `"layout"` when set (configs without it, and
        their resume keys, are as before)."""
        config = super().get_config()
        if self.layout is not None:
            config["layout"] = self.layout
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> KerasModelOp:
        """Rebuild the operator (freshly initialised, with its layout) from `get_config()`."""
        return cls(
            config["factory"],
            seed=config.get("seed", 0),
            layout=config.get("layout"),
            **config.get("kwargs", {}),
        )

    def build_model(self, *, precision: str | None = None) -> keras.Model:
        """A fresh model from this operator's config (under `precision`) holding its weights."""
        model = build_model(
            self._factory_fn,
            self.kwargs,
            self.seed,
            precision=precision,
            owner=type(self).__name__,
            layout=self.layout,
        )
        arrays = _weights.arrays_of("w", model_variables(self.model))
        _weights.assign_arrays(
            "w", model_variables(model), arrays, what="The operator's weights", cast=True
        )
        return model

    def __call__(self, inputs: Any) -> np.ndarray:
        """Batched inference: `model.predict_on_batch`, chunked for large inputs."""
        x = np.asarray(inputs)
        if len(x) <= _PREDICT_CHUNK:
            out = self.model.predict_on_batch(x)
        else:
            out = self.model.predict(x, batch_size=_PREDICT_CHUNK, verbose=0)
        return np.asarray(out)

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
        """Advance a batch of states `n_steps` steps without leaving the backend's device.

        On the jax backend each segment of at most `chunk` steps is one jitted
        `lax.fori_loop` of the core rollout step around `model.stateless_call`; on the
        torch backend a `torch.inference_mode()` loop on tensors. The step is `spec.bind`
        (normalise → model → head mean → de-normalise → residual), with the model in
        inference mode (`training=False`). `NeuralForward(op, ...).rollout(...)` calls
        this with its spec.

        Args:
            state: one state or a batch `(n, *state)`.
            n_steps: the number of steps.
            spec: the step's normalizer, residual and head (None: `next = model(state)`).
            keep: `"all"` (steps `0..n`), an int `k` (steps `0, k, 2k, ...`) or `"last"`.
            chunk: the most steps per segment (None: bounded by memory).
            stochastic: draw each step from the predicted distribution (Gaussian and
                mixture heads) instead of taking its mean.
            seed: the seed of the draws (jax: `fold_in(key(seed), step)`; torch: a
                seeded `torch.Generator`).

        Returns:
            The stored states in the model's compute dtype, `(len(kept), n, *state)` (no
            `n` axis for one state).

        Raises:
            ConfigError: bad arguments, or a model output that does not fit the state
                (before any step).
            NonFiniteStateError: a state became NaN/inf (names the first step and member).
        """
        cache = self.__dict__.setdefault("_rollouts", {})
        return device_rollout(
            self.model,
            state,
            n_steps,
            cache=cache,
            spec=spec,
            keep=keep,
            chunk=chunk,
            stochastic=stochastic,
            seed=seed,
        )

    def serialize_weights(self) -> bytes:
        """The weights as deterministic safetensors bytes (keys `w/<index>`)."""
        return _weights.encode_weights(model_weights(self.model))

    def _load_weights(self, blob: bytes) -> None:
        _weights.decode_weights(blob, model_weights(self.model))


def output_model_op(op: Any, model: keras.Model) -> Any:
    """A new operator like `op` (default dtype policy, not compiled) holding `model`'s weights."""
    out = type(op).from_config(op.get_config())
    arrays = _weights.arrays_of("w", model_weights(model))
    _weights.assign_arrays(
        "w", model_weights(out.model), arrays, what="The trained model", cast=True
    )
    return out

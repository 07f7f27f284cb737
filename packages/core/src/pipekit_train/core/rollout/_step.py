"""The rollout step, written once against the Python array API: normalise → model →
head mean → de-normalise → residual.

`RolloutSpec` says how a model's output becomes the next state (what `NeuralForward`
holds: the normalizer, `residual`, the head). `RolloutSpec.bind(xp, ...)` turns it into
`step(model_fn, x) -> next x` for one array library (`xp` from
`array_api_compat.array_namespace`): numpy on the host, `jax.numpy` inside a jitted
`lax.scan`, torch on tensors. Every backend's device rollout and the host loop call this
one function, so they compute the same thing. Nothing here imports a backend.

The normalizer enters as per-feature constants: the core `Normalizer`'s mean and std, or,
for any other object with `apply(dict)`/`invert(dict)`, the affine map read off it by
probing (`apply(0)`, `apply(1)`), which is checked to be affine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError, PipekitError
from pipekit_train.core.distributions import _mixture_math as layout
from pipekit_train.core.distributions._heads import check_head, check_head_options
from pipekit_train.core.distributions._mixture import mixture_dim
from pipekit_train.core.spec._steppers import check_correction

__all__ = ["AffineMap", "NonFiniteStateError", "RolloutSpec", "non_finite_error"]


class NonFiniteStateError(PipekitError, FloatingPointError):
    """A rollout's state became NaN or infinite (the rollout diverged).

    Attributes:
        step: the first step whose state is not finite (None if not known).
        member: the first ensemble member with a non-finite value at that step (None
            when the state is not a batch).
        who: what produced the state (`"forward"` or `"hook"`).
    """

    step: int | None = None
    member: int | None = None
    who: str = "forward"


def non_finite_error(
    step: int, who: str = "forward", member: int | None = None
) -> NonFiniteStateError:
    """The `NonFiniteStateError` for the first bad `step` (and ensemble `member`, when known)."""
    where = "" if member is None else f", first in ensemble member {member}"
    error = NonFiniteStateError(
        f"The state became non-finite (NaN or inf) at step {step} (after `{who}`){where}. "
        "The forward operator diverged; use a smaller time step, a stabler model or "
        "fewer steps."
    )
    error.step, error.member, error.who = int(step), None if member is None else int(member), who
    return error


@dataclass(frozen=True)
class AffineMap:
    """`x -> (x - mean) / std` (forward) and its inverse `y -> y * std + mean`, per feature.

    `mean` and `std` are float64 arrays that broadcast against one state (or output).
    """

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def probe(cls, normalizer: Any, key: str, shape: tuple[int, ...], *, invert: bool) -> AffineMap:
        """The affine map of `normalizer.apply` (or `.invert`) on `key` for batches of `shape`.

        The core `Normalizer` gives its `mean`/`std` directly; another object is probed
        with zeros and ones and checked on a third input.

        Raises:
            ConfigError: the normalizer is not affine per feature.
        """
        means = getattr(normalizer, "mean", None)
        stds = getattr(normalizer, "std", None)
        if isinstance(means, Mapping) and isinstance(stds, Mapping) and key in means:
            return cls(np.asarray(means[key], np.float64), np.asarray(stds[key], np.float64))
        fn = normalizer.invert if invert else normalizer.apply

        def run(value: np.ndarray) -> np.ndarray:
            return np.asarray(fn({key: value})[key], dtype=np.float64)

        zero = np.zeros((1, *shape))
        b = run(zero)
        a = run(np.ones_like(zero)) - b
        probe = np.random.default_rng(0).uniform(-2.0, 2.0, zero.shape)
        if np.any(a == 0) or not np.allclose(run(probe), probe * a + b, rtol=1e-6, atol=1e-9):
            raise ConfigError(
                "A device rollout needs an affine normalizer (per feature `(x - mean) / std`). "
                f"Received: normalizer={type(normalizer).__name__} whose "
                f"`{'invert' if invert else 'apply'}` on {key!r} is not affine. Use the core "
                "`Normalizer`, or roll out on the host with `Cycle`."
            )
        if invert:  # y -> y * a + b  ==  y * std + mean
            return cls(b[0], a[0])
        return cls(-b[0] / a[0], 1.0 / a[0])  # x * a + b  ==  (x - mean) / std


@dataclass(frozen=True)
class RolloutSpec:
    """How a model's output becomes the next state (what `NeuralForward` holds).

    Args:
        normalizer: `None`, or an object with `apply(dict)`/`invert(dict)` (affine per
            feature for a device rollout; see `AffineMap`).
        residual: the model predicts the increment (`next = state + prediction`).
        head: `"point"`, `"gaussian"` (the step uses the mean), `"mixture"` (the
            mixture mean) or `"generative"` (a model of the normalised state with
            `noise_dim` noise channels appended on the last axis: zero noise, the central
            member, unless the step is stochastic, which draws standard normal noise).
        head_options: the mixture's `{"n_components", "covariance"}`, the generative
            head's `{"noise_dim"}`.
        state_key: the normalizer key of the state.
        output_key: the normalizer key of the model's (mean) output.
        state_ndim: the axes of one state (1 for vectors, 3 for `(H, W, C)` fields).
        inputs: the model input's layout (`ModelInputs`: history, forcings, static
            inputs) or None for the state alone. With a layout the bound step takes the
            model's whole input in physical units (`(*spatial, C_in)`), normalises it as
            `state_key`, and returns the next state; `ModelInputs.advance` builds the
            next input.
        coarse_stepper: a coarse stepper the model corrects (`fn(state) -> next state`
            on a batch of physical states, in the array library of the arrays the bound
            step runs on), or None. See `correction`.
        correction: with `c = coarse_stepper(x)` and `p(u)` the de-normalised prediction
            for input `u`: `"parallel"` is `next = c + p(x)` (needs `residual=True`),
            `"sequential"` is `next = p(c)` (`c + p(c)` with `residual=True`). None
            without a coarse stepper.
    """

    normalizer: Any = None
    residual: bool = False
    head: str = "point"
    head_options: dict[str, Any] | None = None
    state_key: str = "x"
    output_key: str = "y"
    state_ndim: int = 1
    inputs: Any = None
    coarse_stepper: Any = None
    correction: str | None = None
    _maps: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_head(self.head)
        object.__setattr__(self, "head_options", check_head_options(self.head, self.head_options))
        if self.inputs is not None and self.inputs.trivial:
            object.__setattr__(self, "inputs", None)
        check_correction(self.correction, self.coarse_stepper, self.residual, owner="RolloutSpec")
        if self.coarse_stepper is not None and not callable(self.coarse_stepper):
            raise ConfigError(
                "`coarse_stepper` must be a callable fn(state) -> next state. Received: "
                f"coarse_stepper={self.coarse_stepper!r:.80}."
            )
        if self.head == "generative" and (self.inputs is not None or self.coarse_stepper):
            given = "inputs=ModelInputs(...)" if self.inputs is not None else "coarse_stepper"
            raise ConfigError(
                "A generative model (head='generative') takes the state and its noise "
                f"alone for now. Received: head='generative' with {given}. Train it on "
                "windows of the state alone, without a coarse stepper."
            )
        if self.coarse_stepper is not None and self.inputs is not None:
            raise ConfigError(
                "A coarse stepper advances the state alone, so it does not correct a model "
                "that sees history, forcings or static inputs yet. Received: "
                "coarse_stepper=... with inputs=ModelInputs(...). Drop one of them."
            )

    def state_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one state for model inputs of `input_shape` (the input itself
        without a layout)."""
        return tuple(input_shape) if self.inputs is None else tuple(self.inputs.state_shape)

    @property
    def noise_channels(self) -> int:
        """The noise channels a generative model takes after the state's (0 otherwise)."""
        if self.head != "generative":
            return 0
        assert self.head_options is not None
        return int(self.head_options["noise_dim"])

    def probe_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the model's input for inputs of `input_shape` (batch axis
        included): the noise channels appended on the last axis for a generative head."""
        w = self.noise_channels
        shape = tuple(int(d) for d in input_shape)
        return shape if not w else (*shape[:-1], shape[-1] + w)

    def input_shape(self, state_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one model input for states of `state_shape` (the state itself
        without a layout)."""
        return tuple(state_shape) if self.inputs is None else tuple(self.inputs.input_shape)

    # -- shapes ----------------------------------------------------------------------------
    def check_state(self, state: Any) -> np.ndarray:
        """`state` as a batch of states `(n, *one_state)` (a single state gains the axis).

        Raises:
            ConfigError: the state has neither `state_ndim` nor `state_ndim + 1` axes, or
                is not finite.
        """
        x = np.asarray(state)
        n = self.state_ndim
        if x.ndim not in (n, n + 1) or x.size == 0:
            raise ConfigError(
                f"`state` must be one state ({n}-D) or a non-empty batch of states "
                f"({n + 1}-D). Received: state.shape={x.shape}."
                + ("" if n > 1 else " For (H, W, C) fields use NeuralForward(..., state_ndim=3).")
            )
        if not np.issubdtype(x.dtype, np.inexact):
            x = x.astype(np.float64)
        if not np.all(np.isfinite(x)):
            raise ConfigError(
                "The initial `state` must be finite. Received: a state with NaN or inf entries."
            )
        return x[None] if x.ndim == n else x

    def mean_shape(self, out_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one prediction (the head's mean) for a model output of `out_shape`.

        Raises:
            ConfigError: the output does not have the head's layout.
        """
        out_shape = tuple(int(s) for s in out_shape)
        if self.head == "gaussian":
            if not out_shape or out_shape[-1] % 2:
                raise ConfigError(
                    "With `head='gaussian'` the model must output a mean and a log-variance "
                    "per target value (an even-sized last axis). Received: output shape "
                    f"{out_shape}. Use head='point', or a model with 2*k outputs."
                )
            return (*out_shape[:-1], out_shape[-1] // 2)
        if self.head == "mixture":
            assert self.head_options is not None
            d = mixture_dim(out_shape[-1] if out_shape else 0, **self.head_options)
            if d is None or len(out_shape) != 1:
                k, cov = self.head_options["n_components"], self.head_options["covariance"]
                raise ConfigError(
                    f"With `head='mixture'`, n_components={k} and covariance={cov!r} the "
                    "model's output must be a vector of width mixture_width(K, d, covariance). "
                    f"Received: output shape {out_shape}. Check `n_components` and "
                    "`covariance` against the loss the model was trained with."
                )
            return (d,)
        return out_shape

    def check_output(self, state_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        """Check, before any step, that the model's output fits the state (shapes of one sample).

        Raises:
            ConfigError: the output does not have the head's layout, or its mean does not
                have the state's shape (a rollout feeds the prediction back as the state).
        """
        mean = self.mean_shape(out_shape)
        if tuple(mean) != tuple(state_shape):
            if self.residual:
                raise ConfigError(
                    "With `residual=True` the model must predict an increment of the state's "
                    f"shape. Received: state shape {tuple(state_shape)}, prediction shape "
                    f"{tuple(mean)}. Use residual=False or a model with out_size == in_size."
                )
            raise ConfigError(
                "A rollout feeds each prediction back as the next state, so the model must "
                f"predict a state of the input's shape. Received: state shape "
                f"{tuple(state_shape)}, prediction shape {tuple(mean)}. Use a model with "
                "out_size == in_size."
            )

    def maps(
        self, state_shape: tuple[int, ...], mean_shape: tuple[int, ...]
    ) -> tuple[AffineMap | None, AffineMap | None]:
        """The input and output `AffineMap`s (None without a normalizer), cached per shape."""
        if self.normalizer is None:
            return None, None
        cache_key = (tuple(state_shape), tuple(mean_shape))
        if cache_key not in self._maps:
            in_shape = self.input_shape(tuple(state_shape))
            self._maps[cache_key] = (
                AffineMap.probe(self.normalizer, self.state_key, in_shape, invert=False),
                AffineMap.probe(self.normalizer, self.output_key, tuple(mean_shape), invert=True),
            )
        return self._maps[cache_key]

    # -- sampling --------------------------------------------------------------------------
    def check_stochastic(self) -> None:
        """Refuse a stochastic rollout on a point head (it predicts no distribution).

        Raises:
            ConfigError: `head="point"`.
        """
        if self.head == "point":
            raise ConfigError(
                "A stochastic rollout samples each step from the predicted distribution, so "
                "it needs a Gaussian or mixture head. Received: head='point'. Construct "
                "NeuralForward(..., head='gaussian') (or head='mixture', n_components=K) for "
                "a model trained with `gaussian_nll` (`mixture_nll`), or roll out the mean."
            )

    def noise_shapes(self, n: int, out_shape: tuple[int, ...]) -> dict[str, tuple[int, ...] | None]:
        """The shapes of one step's random draws for `n` states: `{"normal", "uniform"}`
        (for a generative head, the noise channels of every grid point)."""
        mean = self.mean_shape(out_shape)
        if self.head == "generative":
            return {"normal": (n, *mean[:-1], self.noise_channels), "uniform": None}
        k = (self.head_options or {}).get("n_components", 1)
        return {
            "normal": (n, *mean),
            "uniform": (n, int(k)) if self.head == "mixture" else None,
        }

    def _sampler(self, xp: Any, components: Any) -> Callable[[Any, Any, Any], Any]:
        """`sample(out, normal, uniform)`: a draw from the raw output's distribution,
        in normalised units."""
        if self.head == "gaussian":

            def gaussian(out: Any, normal: Any, uniform: Any) -> Any:
                k = out.shape[-1] // 2
                return out[..., :k] + xp.exp(0.5 * out[..., k:]) * normal

            return gaussian
        assert self.head_options is not None
        n_comp, cov = self.head_options["n_components"], self.head_options["covariance"]

        def mixture(out: Any, normal: Any, uniform: Any) -> Any:
            d = mixture_dim(int(out.shape[-1]), n_comp, cov)
            assert d is not None
            logits, means, log_scales, lower = layout.split(xp, out, n_comp, d, cov)
            gumbel = -xp.log(-xp.log(uniform))  # Gumbel-max: a draw of the component
            chosen = xp.argmax(layout.log_softmax(xp, logits) + gumbel, axis=-1)
            one_hot = xp.astype(
                xp.expand_dims(xp.astype(chosen, out.dtype), axis=-1) == components, out.dtype
            )
            pick = xp.expand_dims(one_hot, axis=-1)
            mu = xp.sum(pick * means, axis=-2)
            scale = xp.exp(xp.sum(pick * log_scales, axis=-2))
            if lower is None:
                return mu + scale * normal
            low = xp.sum(pick * lower, axis=-2)  # the chosen Cholesky factor's lower entries
            rows = []
            for i in range(d):  # (L @ normal)_i, row by row (d is small)
                zi = scale[..., i] * normal[..., i]
                for j in range(i):
                    zi = zi + low[..., i * (i - 1) // 2 + j] * normal[..., j]
                rows.append(zi)
            return mu + xp.stack(rows, axis=-1)

        return mixture

    # -- the step --------------------------------------------------------------------------
    def head_mean(self, xp: Any, out: Any) -> Any:
        """The prediction (the head's mean) of a batch of raw outputs, in normalised units."""
        if self.head == "gaussian":
            return out[..., : out.shape[-1] // 2]
        if self.head == "mixture":
            assert self.head_options is not None
            k = self.head_options["n_components"]
            d = mixture_dim(int(out.shape[-1]), k, self.head_options["covariance"])
            assert d is not None
            logits, means, _, _ = layout.split(xp, out, k, d, self.head_options["covariance"])
            weights = xp.exp(layout.log_softmax(xp, logits))
            return xp.sum(xp.expand_dims(weights, axis=-1) * means, axis=-2)
        return out

    def bind(
        self,
        xp: Any,
        *,
        state_shape: tuple[int, ...],
        out_shape: tuple[int, ...],
        constant: Callable[[np.ndarray], Any] | None = None,
        stochastic: bool = False,
    ) -> Callable[..., Any]:
        """The step `step(model_fn, x) -> next x` for arrays of namespace `xp`.

        With `stochastic=True` the step draws the next state from the predicted
        distribution instead of taking its mean: `step(model_fn, x, normal, uniform)`,
        where the backend passes standard normal draws of shape `noise_shapes(n, ...)
        ["normal"]` and, for a mixture, uniform draws in `[0, 1)` of shape
        `noise_shapes(...)["uniform"]` (the component is chosen by the Gumbel-max trick).
        The array API has no random numbers, so the backend's own generator makes them.

        Args:
            xp: the array-API namespace of the states.
            state_shape: the shape of one state.
            out_shape: the shape of the model's output for one state.
            constant: turns a float64 numpy constant into an array of the states' library,
                dtype and device (default: `xp.asarray`).
            stochastic: sample each step (Gaussian and mixture heads).

        Raises:
            ConfigError: the output does not fit the head or the state, or a stochastic
                step on a point head (before any step).
        """
        self.check_output(state_shape, out_shape)
        if stochastic:
            self.check_stochastic()
        to = constant or xp.asarray
        into, out = self.maps(tuple(state_shape), self.mean_shape(out_shape))
        in_mean = in_std = out_mean = out_std = None
        if into is not None and out is not None:
            in_mean, in_std = to(into.mean), to(into.std)
            out_mean, out_std = to(out.mean), to(out.std)
        residual, head_mean = self.residual, self.head_mean
        if self.inputs is not None:
            return self._bind_inputs(xp, to, in_mean, in_std, out_mean, out_std, stochastic)
        if self.head == "generative":
            return self._bind_generative(xp, in_mean, in_std, out_mean, out_std, stochastic)
        if self.coarse_stepper is not None:
            return self._bind_corrected(xp, to, in_mean, in_std, out_mean, out_std, stochastic)

        if stochastic:
            k = (self.head_options or {}).get("n_components", 1)
            components = to(np.arange(k, dtype=np.float64))
            sample = self._sampler(xp, components)

            def stochastic_step(
                model_fn: Callable[[Any], Any], x: Any, normal: Any, uniform: Any
            ) -> Any:
                inputs = x if in_mean is None else (x - in_mean) / in_std
                pred = sample(model_fn(inputs), normal, uniform)
                if out_mean is not None:
                    pred = pred * out_std + out_mean
                return x + pred if residual else pred

            return stochastic_step

        if self.head == "point" and in_mean is not None:
            # the common case without the head's call (torch runs this eagerly, per step)
            if residual:

                def point_residual(model_fn: Callable[[Any], Any], x: Any) -> Any:
                    return x + (model_fn((x - in_mean) / in_std) * out_std + out_mean)

                return point_residual

            def point(model_fn: Callable[[Any], Any], x: Any) -> Any:
                return model_fn((x - in_mean) / in_std) * out_std + out_mean

            return point

        def step(model_fn: Callable[[Any], Any], x: Any) -> Any:
            inputs = x if in_mean is None else (x - in_mean) / in_std
            pred = head_mean(xp, model_fn(inputs))
            if out_mean is not None:
                pred = pred * out_std + out_mean
            return x + pred if residual else pred

        return step

    def _bind_generative(
        self, xp: Any, in_mean: Any, in_std: Any, out_mean: Any, out_std: Any, stochastic: bool
    ) -> Callable[..., Any]:
        """The step of a generative model: `step(model_fn, x, normal, uniform)` with the
        noise `normal` (`noise_shapes(...)["normal"]`; `uniform` is unused), or
        `step(model_fn, x)` with zero noise (the central member) when not stochastic."""
        residual, w = self.residual, self.noise_channels

        def step(model_fn: Callable[[Any], Any], x: Any, *noise: Any) -> Any:
            inputs = x if in_mean is None else (x - in_mean) / in_std
            if noise:
                z = noise[0]
            else:  # on the inputs' device and dtype, traced or eager alike
                z = xp.broadcast_to(xp.zeros_like(inputs[..., :1]), (*inputs.shape[:-1], w))
            pred = model_fn(xp.concat([inputs, z], axis=-1))
            if out_mean is not None:
                pred = pred * out_std + out_mean
            return x + pred if residual else pred

        if stochastic:
            return step
        return lambda model_fn, x: step(model_fn, x)

    def _draws(self, xp: Any, to: Callable[[np.ndarray], Any]) -> Callable[[Any, Any, Any], Any]:
        """`sample(out, normal, uniform)` of this head, its constants made by `to`."""
        k = (self.head_options or {}).get("n_components", 1)
        return self._sampler(xp, to(np.arange(k, dtype=np.float64)))

    def _bind_inputs(
        self,
        xp: Any,
        to: Callable[[np.ndarray], Any],
        in_mean: Any,
        in_std: Any,
        out_mean: Any,
        out_std: Any,
        stochastic: bool,
    ) -> Callable[..., Any]:
        """The step of a model with a `ModelInputs` layout: `step(model_fn, u)` from the
        whole input `u` (physical units) to the next state."""
        channels = self.inputs.state_channels
        residual, head_mean = self.residual, self.head_mean
        sample = self._draws(xp, to) if stochastic else None

        def step(model_fn: Callable[[Any], Any], u: Any, *noise: Any) -> Any:
            out = model_fn(u if in_mean is None else (u - in_mean) / in_std)
            pred = head_mean(xp, out) if sample is None else sample(out, *noise)
            if out_mean is not None:
                pred = pred * out_std + out_mean
            return u[..., channels] + pred if residual else pred

        return step

    def _bind_corrected(
        self,
        xp: Any,
        to: Callable[[np.ndarray], Any],
        in_mean: Any,
        in_std: Any,
        out_mean: Any,
        out_std: Any,
        stochastic: bool,
    ) -> Callable[..., Any]:
        """The step of a model that corrects `coarse_stepper` (see `correction`):
        `step(model_fn, x)` (and the draws, stochastic) from the state to the next state."""
        coarse, parallel = self.coarse_stepper, self.correction == "parallel"
        residual, head_mean = self.residual, self.head_mean
        sample = self._draws(xp, to) if stochastic else None

        def step(model_fn: Callable[[Any], Any], x: Any, *noise: Any) -> Any:
            c = coarse(x)
            u = x if parallel else c
            out = model_fn(u if in_mean is None else (u - in_mean) / in_std)
            pred = head_mean(xp, out) if sample is None else sample(out, *noise)
            if out_mean is not None:
                pred = pred * out_std + out_mean
            return c + pred if residual else pred

        return step

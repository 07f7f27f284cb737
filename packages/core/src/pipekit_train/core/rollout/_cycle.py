"""`NeuralForward` and `Cycle`: trained models as forward operators, and closed-loop rollouts.

A *forward operator* maps a state to the next state. A simulator is one; so is a trained
emulator wrapped in `NeuralForward`. `Cycle` advances a state with any forward operator
for `n_steps` and returns the trajectory, optionally calling a hook after every step
(e.g. to assimilate observations).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed
from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import object_path
from pipekit_train.core.data._normalizer import normalizer_to_dict
from pipekit_train.core.distributions._flow import Flow, flow_from_output
from pipekit_train.core.distributions._gaussian import Gaussian
from pipekit_train.core.distributions._heads import check_head, check_head_options
from pipekit_train.core.distributions._mixture import Mixture, mixture_from_output
from pipekit_train.core.spec._steppers import check_correction, resolve_stepper

from ._segments import check_hook_steps, drive, prepare_rollout
from ._step import NonFiniteStateError, RolloutSpec, non_finite_error

__all__ = ["Cycle", "NeuralForward", "NonFiniteStateError"]


def _describe(obj: Any) -> Any:
    """A JSON description of a callable: its config if it has one, else its import path."""
    if obj is None:
        return None
    get_config = getattr(obj, "get_config", None)
    if callable(get_config):
        return get_config()
    try:
        return object_path(
            obj if isinstance(obj, type) or hasattr(obj, "__qualname__") else type(obj)
        )
    except ConfigError:
        return repr(obj)


def _normalizer_json(normalizer: Any) -> Any:
    try:
        return normalizer_to_dict(normalizer)
    except ConfigError:
        return type(normalizer).__name__


def _recorded_inputs(record: Any) -> Any:
    """The `ModelInputs` a registered run recorded in its lineage's plan (None: none)."""
    lineage = getattr(record, "lineage", None)
    plan = lineage.get("plan") if isinstance(lineage, Mapping) else None
    data = plan.get("inputs") if isinstance(plan, Mapping) else None
    if data is None:
        return None
    from pipekit_train.core.data.trajectories._inputs import ModelInputs

    return ModelInputs.from_json(data)


def _recorded_correction(record: Any) -> tuple[Any, Any]:
    """`(coarse stepper path, correction)` a registered run trained with (None, None: none)."""
    lineage = getattr(record, "lineage", None)
    plan = lineage.get("plan") if isinstance(lineage, Mapping) else None
    rollout = plan.get("rollout") if isinstance(plan, Mapping) else None
    if not isinstance(rollout, Mapping) or rollout.get("coarse_stepper") is None:
        return None, None
    return rollout["coarse_stepper"], rollout.get("correction")


class NeuralForward:
    """A trained model operator used as a forward operator: state → next state.

    Per call: the state (one state of shape `(d,)`, or a batch `(n, d)`) is normalised
    with `normalizer.apply({state_key: batch})[state_key]`, passed through the model,
    de-normalised with `normalizer.invert({output_key: pred})[output_key]`, and — with
    `residual=True` — added to the input state (the model predicts the increment).

    With the defaults the keys are the training keys: inputs are normalised as `"x"`,
    predictions inverted as `"y"`, so the normalizer fitted on the training data
    (`pipekit_train.core.data.Normalizer`, or any object with `apply(batch)` /
    `invert(batch)` on dicts of arrays) is used unchanged.

    **Gaussian head.** With `head="gaussian"` the model's output holds a mean and a
    log-variance per target value (`out[..., :k]` and `out[..., k:]`, the layout
    `gaussian_nll` trains, in normalised units). `distribution(state)` returns a
    `Gaussian` in the target's original units: the mean de-normalised as above, the
    standard deviation `exp(log_var / 2)` scaled by the normalizer's scale of
    `output_key` (`invert(1) - invert(0)` per feature; the core `Normalizer` is affine,
    so this is its `std`). Calling the forward returns the mean, so it still drives a
    `Cycle`. `NeuralForward.from_record(record, model_op)` reads the head and the
    normalizer from the registry record.

    **Mixture head.** With `head="mixture"` (and `n_components=K`, `covariance="diag"` or
    `"full"`, as the model was trained with `losses.mixture_nll`) the output holds a
    Gaussian mixture in normalised units (layout in `pipekit_train.core.distributions._mixture_math`).
    `distribution(state)` returns a `Mixture` in original units: the component means
    de-normalised, each Cholesky factor's rows scaled by the normalizer's scale (so the
    covariances are `diag(s) L L^T diag(s)`), the weights unchanged. Calling the forward
    returns the mixture mean.

    **Flow head.** With `head="flow"` (and `flow_layers`, `flow_bins`, `flow_bound`,
    `flow_hidden` as the model was trained with `losses.flow_nll`; left out, `flow_nll`'s
    defaults) the output holds every parameter of a conditional normalizing flow in normalised units
    (layout in `pipekit_train.core.distributions._flow_math`). `distribution(state)` returns a `Flow`
    in original units: its `loc`/`scale` are the normalizer's affine map of the output
    (`invert(0)` and `invert(1) - invert(0)`; plus the state with `residual=True`), so
    `log_prob` carries the `-sum(log|scale|)` Jacobian. Calling the forward returns the
    flow's Monte Carlo mean (`Flow.mean`, a fixed seed).

    Args:
        model_op: a model operator, `model_op(batch) -> batch` on numpy arrays.
        normalizer: `None`, or an object with `apply(dict)` and `invert(dict)`.
        residual: if True the model's output is an increment added to the input state.
        state_key: the normalizer key of the input state (default `"x"`).
        output_key: the normalizer key of the model's output (default `"y"`).
        head: `"point"` (the output is the prediction), `"gaussian"` (mean and
            log-variance), `"mixture"` or `"flow"` (see above).
        n_components: the number of mixture components (`head="mixture"` only).
        covariance: `"diag"` or `"full"` (`head="mixture"` only).
        flow_layers: the flow's layers (`head="flow"` only; default 4).
        flow_bins: the spline bins per layer and value (`head="flow"` only; default 8).
        flow_bound: the splines' interval `[-flow_bound, flow_bound]` in normalised
            units (`head="flow"` only; default 3.0).
        flow_hidden: the coupling conditioner's hidden units per layer (`head="flow"`
            only; default 0, element-wise layers).
        noise_dim: the noise channels of a generative model (`head="generative"` only,
            required there).
        state_ndim: the number of axes of one state: 1 for a vector `(d,)` (default), 3
            for a channels-last 2-D field `(H, W, C)`. An input with `state_ndim + 1` axes
            is a batch of states.
        inputs: the model input's layout (`ModelInputs`, e.g. `artifact.inputs` or
            `windows.inputs`) when the model sees history, forcings or static inputs;
            each call then takes them as keywords (`history=`, `static=`, `forcing=`),
            builds the input in that layout and normalises it as `state_key`. `state_ndim`
            follows from it. None: the model sees the state alone.
        coarse_stepper: a coarse stepper the model corrects (a model trained with
            `Rollout(coarse_stepper=..., correction=...)`): `fn(state) -> next state` on
            a batch of physical states; a module-level function or its import string.
            Point heads and models of the state alone only.
        correction: how the model corrects it, as at training: `"parallel"` (`next =
            coarse(x) + model(x)`, with `residual=True`) or `"sequential"` (`next =
            model(coarse(x))`, or `coarse(x) + model(coarse(x))` with `residual=True`);
            see `Rollout`.

    **Generative head.** With `head="generative"` (and `noise_dim=w`, as trained by
    `losses.crps(noise_dim=w)` or `energy_score`) the model maps the normalised state with
    `w` noise channels appended on its last axis to a point prediction: one member of
    an ensemble per noise. `forward(state)` takes zero noise (the central member),
    `forward(state, noise=z)` the noise `z` (`(*spatial, w)` per state, standard
    normal draws for a member), and `rollout(..., stochastic=True, seed=s)` draws fresh
    noise for every member at every step, on the model's device.

    **Solver in the loop.** With a coarse stepper every step calls it on the arrays of
    the path that runs: `forward(state)`, `Cycle`'s per-step loop and the host
    `rollout` call it with numpy arrays (its output taken with `np.asarray`); the
    device rollout of an Equinox, Lightning/`Torch()` or Keras model operator (and
    `Cycle` when it takes that path) calls it inside the backend's loop with the
    backend's arrays, as training did. A stepper written once with the array API
    (`array_api_compat.array_namespace(state)`) serves both; a numpy-only one needs the
    host path (`Cycle` with a per-step hook, or `forward(state)` in a loop).

    **Forced and parametric models.** With `inputs`, `forward(state, history=...,
    static=..., forcing=...)` advances the state: `history` holds the `h - 1` states
    before it, oldest first (`(h - 1, *state)`, or `(n, h - 1, *state)` for a batch),
    `static` the trajectory's static inputs and `forcing` the forcings at the step's
    start time (`{key: value}`, with a leading `n` axis for a batch). `Cycle` supplies
    them step by step (`Cycle(forward, n, forcings=..., static=...)`).

    Examples:
        ```python
        record, op = registry.load_record_and_model("oscillator")
        forward = NeuralForward.from_record(record, op)  # normalizer and head from the record
        trajectory = Cycle(forward, n_steps=100).run(x0)

        posterior = NeuralForward.from_record(*registry.load_record_and_model("amortized"))
        dist = posterior.distribution(observations)  # Gaussian, original units
        low, high = dist.interval(0.95)
        ```
    """

    def __init__(
        self,
        model_op: Callable[[np.ndarray], Any],
        normalizer: Any = None,
        residual: bool = False,
        state_key: str = "x",
        output_key: str = "y",
        head: str = "point",
        state_ndim: int = 1,
        *,
        n_components: int | None = None,
        covariance: str | None = None,
        flow_layers: int | None = None,
        flow_bins: int | None = None,
        flow_bound: float | None = None,
        flow_hidden: int | None = None,
        noise_dim: int | None = None,
        inputs: Any = None,
        coarse_stepper: Any = None,
        correction: str | None = None,
    ):
        if inputs is not None and not hasattr(inputs, "assemble"):
            raise ConfigError(
                "`inputs` must be a `ModelInputs` (e.g. `windows.inputs`) or None. Received: "
                f"inputs={inputs!r:.80}."
            )
        self.inputs = None if inputs is None or inputs.trivial else inputs
        if self.inputs is not None:
            state_ndim = len(self.inputs.state_shape)
        if not callable(model_op):
            raise ConfigError(
                f"`model_op` must be a callable model operator. Received: model_op={model_op!r}."
            )
        if normalizer is not None and not (
            callable(getattr(normalizer, "apply", None))
            and callable(getattr(normalizer, "invert", None))
        ):
            raise ConfigError(
                "`normalizer` must have `apply(batch)` and `invert(batch)` methods. "
                f"Received: normalizer={type(normalizer).__name__}. Pass a Normalizer or None."
            )
        if not isinstance(residual, bool):
            raise ConfigError(f"`residual` must be a bool. Received: residual={residual!r}.")
        for field, key in (("state_key", state_key), ("output_key", output_key)):
            if not isinstance(key, str) or not key:
                raise ConfigError(
                    f"`{field}` must be a non-empty string. Received: {field}={key!r}."
                )
        if isinstance(state_ndim, bool) or not isinstance(state_ndim, int) or state_ndim < 1:
            raise ConfigError(
                f"`state_ndim` must be a positive int (the axes of one state). Received: "
                f"state_ndim={state_ndim!r}. Use 1 for vectors, 3 for (H, W, C) fields."
            )
        self.state_ndim = state_ndim
        self.model_op = model_op
        self.normalizer = normalizer
        self.residual = residual
        self.state_key = state_key
        self.output_key = output_key
        self.head = check_head(head)
        if self.head != "mixture" and (n_components is not None or covariance is not None):
            raise ConfigError(
                "`n_components` and `covariance` are only for head='mixture'. Received: "
                f"n_components={n_components!r}, covariance={covariance!r}, head={head!r}. "
                "Pass head='mixture', or leave them out."
            )
        if self.head == "mixture" and n_components is None:
            raise ConfigError(
                "head='mixture' needs the number of components. Received: n_components=None. "
                "Pass n_components=K (as in mixture_nll(n_components=K) at training)."
            )
        flow = {
            "flow_layers": flow_layers,
            "flow_bins": flow_bins,
            "flow_bound": flow_bound,
            "flow_hidden": flow_hidden,
        }
        given = {k: v for k, v in flow.items() if v is not None}
        if self.head != "flow" and given:
            raise ConfigError(
                f"`{next(iter(given))}` is only for head='flow'. Received: "
                + ", ".join(f"{k}={v!r}" for k, v in given.items())
                + f", head={head!r}. Pass head='flow', or leave them out."
            )
        if (self.head == "generative") != (noise_dim is not None):
            raise ConfigError(
                "`noise_dim` is required with head='generative' and only there. Received: "
                f"noise_dim={noise_dim!r}, head={head!r}. Pass head='generative', "
                "noise_dim=w for a model of (state, w noise channels), as trained by "
                "crps(noise_dim=w)."
            )
        options: dict[str, Any] | None = None
        if self.head == "generative":
            options = {"noise_dim": noise_dim}
        elif self.head == "mixture":
            options = {"n_components": n_components, "covariance": covariance or "diag"}
        elif self.head == "flow":
            options = given
        self.head_options = check_head_options(self.head, options)
        self._check_coarse(coarse_stepper, correction)

    def _check_coarse(self, coarse_stepper: Any, correction: Any) -> None:
        """Set `coarse_stepper` (resolved), its import path and `correction` (checked)."""
        check_correction(correction, coarse_stepper, self.residual, owner="NeuralForward")
        self.coarse_stepper: Any = None
        self.coarse_stepper_name: str | None = None
        self.correction = correction
        if coarse_stepper is None:
            return
        self.coarse_stepper, self.coarse_stepper_name = resolve_stepper(
            "coarse_stepper", coarse_stepper
        )
        if self.head != "point" or self.inputs is not None:
            given = f"head={self.head!r}" if self.head != "point" else "inputs=ModelInputs(...)"
            raise ConfigError(
                "A forward that corrects a coarse stepper steps with a point prediction of "
                f"the state alone. Received: coarse_stepper=... with {given}. Use "
                "head='point' and a model of the state alone, or drop coarse_stepper."
            )

    @classmethod
    def from_record(
        cls,
        record: Any,
        model_op: Callable[[np.ndarray], Any],
        *,
        residual: bool = False,
        state_key: str = "x",
        output_key: str = "y",
        state_ndim: int = 1,
        inputs: Any = None,
        coarse_stepper: Any = None,
        correction: str | None = None,
    ) -> NeuralForward:
        """A forward operator for a registered model, with its normalizer and head.

        Args:
            record: the model's `ModelRecord` (from `registry.load_record_and_model`).
            model_op: the loaded model operator of the same version.
            residual: as for the constructor.
            state_key: as for the constructor.
            output_key: as for the constructor.
            state_ndim: as for the constructor.
            inputs: as for the constructor; default: the layout the run recorded in the
                record's lineage (`lineage["plan"]["inputs"]`), if any.
            coarse_stepper: as for the constructor; default: the coarse stepper the run
                was trained to correct (its import path in `lineage["plan"]["rollout"]`),
                if any.
            correction: as for the constructor; default: the run's.

        Raises:
            ConfigError: the record names a head this version does not know.
        """
        head = check_head(
            "point" if getattr(record, "head", None) is None else record.head, field="record.head"
        )
        options = check_head_options(
            head, getattr(record, "head_options", None), field="record.head_options"
        )
        if coarse_stepper is None and correction is None:
            coarse_stepper, correction = _recorded_correction(record)
        return cls(
            model_op,
            normalizer=record.load_normalizer(),
            residual=residual,
            state_key=state_key,
            output_key=output_key,
            head=head,
            **(options or {}),
            state_ndim=state_ndim,
            inputs=inputs if inputs is not None else _recorded_inputs(record),
            coarse_stepper=coarse_stepper,
            correction=correction,
        )

    def _batch(self, state: Any) -> tuple[np.ndarray, bool]:
        x = np.asarray(state)
        n = self.state_ndim
        if x.ndim not in (n, n + 1):
            raise ConfigError(
                f"`state` must be one state ({n}-D) or a batch of states ({n + 1}-D). "
                f"Received: state.shape={x.shape}."
                + ("" if n > 1 else " For (H, W, C) fields use NeuralForward(..., state_ndim=3).")
            )
        return (x[None], True) if x.ndim == n else (x, False)

    def model_input(
        self,
        state: Any,
        *,
        history: Any = None,
        static: Mapping[str, Any] | None = None,
        forcing: Mapping[str, Any] | None = None,
    ) -> np.ndarray:
        """The model's input for `state` in `inputs`' layout, in original units (the state
        itself without a layout): a batch `(n, *spatial, C_in)`.

        Raises:
            ConfigError: a missing or misshapen history, static input or forcing.
        """
        batch, single = self._batch(state)
        return self._input(batch, single, history, static, forcing)

    def _input(
        self,
        batch: np.ndarray,
        single: bool,
        history: Any,
        static: Mapping[str, Any] | None,
        forcing: Mapping[str, Any] | None,
    ) -> np.ndarray:
        layout = self.inputs
        if layout is None:
            given = [name for name, v in (("static", static), ("forcing", forcing)) if v]
            given = (["history"] if history is not None else []) + given
            if given:
                raise ConfigError(
                    f"This forward's model sees the state alone. Received: {', '.join(given)}. "
                    "Construct NeuralForward(..., inputs=windows.inputs) for a model trained "
                    "with them."
                )
            return batch
        h = layout.history
        states = [batch]
        if h > 1:
            if history is None:
                raise ConfigError(
                    f"The model sees history={h} states. Received: history=None. Pass the "
                    f"{h - 1} state(s) before `state`, oldest first: history=(…, {h - 1}, "
                    "*state_shape)."
                )
            past = np.asarray(history, dtype=batch.dtype)
            past = past[None] if single else past
            if past.shape != (batch.shape[0], h - 1, *batch.shape[1:]):
                raise ConfigError(
                    f"`history` must hold the {h - 1} state(s) before `state`. Received: "
                    f"history with shape {np.shape(history)} for a state of shape "
                    f"{batch.shape[1:] if not single else batch.shape[1:]}."
                )
            states = [past[:, j] for j in range(h - 1)] + [batch]

        def lead(values: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
            out = {}
            for key, value in (values or {}).items():
                a = np.asarray(value, dtype=batch.dtype)
                out[key] = a[None] if single else a
            return out

        return np.asarray(layout.assemble(np, states, lead(static), lead(forcing)))

    def _model(self, batch: np.ndarray, noise: Any = None) -> Any:
        inputs = batch
        if self.normalizer is not None:
            inputs = np.asarray(self.normalizer.apply({self.state_key: batch})[self.state_key])
        if self.head == "generative":
            assert self.head_options is not None
            w = int(self.head_options["noise_dim"])
            want = (*inputs.shape[:-1], w)
            z = np.zeros(want, inputs.dtype) if noise is None else np.asarray(noise, inputs.dtype)
            if z.shape != want:
                if z.shape == want[1:]:
                    z = np.broadcast_to(z, want)
                else:
                    raise ConfigError(
                        f"`noise` must be (*spatial, noise_dim={w}) per state. Received: "
                        f"noise.shape={np.shape(noise)} for states of shape "
                        f"{tuple(batch.shape[1:])}."
                    )
            inputs = np.concatenate([inputs, z], axis=-1)
        elif noise is not None:
            raise ConfigError(
                f"`noise` is for a generative model (head='generative'). Received: noise=... "
                f"with head={self.head!r}."
            )
        return self.model_op(inputs)

    def _invert(self, pred: np.ndarray) -> np.ndarray:
        if self.normalizer is None:
            return pred
        return np.asarray(self.normalizer.invert({self.output_key: pred})[self.output_key])

    def _add_state(self, batch: np.ndarray, pred: np.ndarray) -> np.ndarray:
        if not self.residual:
            return pred
        if pred.shape != batch.shape:
            raise ConfigError(
                "With `residual=True` the model must predict an increment of the state's shape. "
                f"Received: state shape {batch.shape[1:]}, prediction shape {pred.shape[1:]}. "
                "Use residual=False or a model with out_size == in_size."
            )
        return batch + pred

    def _gaussian(self, batch: np.ndarray, u: np.ndarray | None = None) -> Gaussian:
        out = np.asarray(self._model(batch if u is None else u))
        if out.ndim < 2 or out.shape[-1] % 2:
            raise ConfigError(
                "With `head='gaussian'` the model must output a mean and a log-variance "
                "per target value (an even-sized last axis). Received: output shape "
                f"{out.shape[1:]}. Use head='point', or a model with 2*k outputs."
            )
        k = out.shape[-1] // 2
        mean_n, log_var = out[..., :k], out[..., k:]
        mean = self._invert(mean_n)
        std = np.exp(0.5 * log_var.astype(np.float64))
        if self.normalizer is not None:
            probe = np.ones(mean_n.shape, dtype=np.float64)
            scale = self._invert(probe) - self._invert(np.zeros_like(probe))
            std = std * np.abs(scale)
        return Gaussian(self._add_state(batch, mean.astype(np.float64)), std)

    def _mixture(self, batch: np.ndarray, u: np.ndarray | None = None) -> Mixture:
        assert self.head_options is not None
        out = np.asarray(self._model(batch if u is None else u))
        raw = mixture_from_output(out, **self.head_options)
        n, k, d = raw.means.shape
        means = self._invert(raw.means.reshape(n * k, d)).astype(np.float64).reshape(n, k, d)
        tril = raw.scale_tril
        if self.normalizer is not None:
            probe = np.ones((1, d), dtype=np.float64)
            scale = (self._invert(probe) - self._invert(np.zeros_like(probe)))[0]
            tril = tril * scale[:, None]  # diag(scale) @ L: row i scaled by scale[i]
        if self.residual:
            if d != batch.shape[-1]:
                self._add_state(batch, means[:, 0])  # raises the residual shape error
            means = means + batch[:, None, :]
        return Mixture(raw.weights, means, tril)

    def _flow(self, batch: np.ndarray, u: np.ndarray | None = None) -> Flow:
        assert self.head_options is not None
        out = np.asarray(self._model(batch if u is None else u))
        raw = flow_from_output(out, **self.head_options)
        d = raw.dim
        probe = np.zeros((1, d), dtype=np.float64)
        loc = self._invert(probe).astype(np.float64)[0]
        scale = (self._invert(np.ones_like(probe)) - self._invert(probe)).astype(np.float64)[0]
        if self.residual:
            if d != batch.shape[-1]:
                self._add_state(batch, np.zeros((len(batch), d)))  # the residual shape error
            loc = loc + batch.astype(np.float64)
        return Flow(raw.params, **self.head_options, loc=loc, scale=scale)

    def distribution(
        self,
        state: Any,
        *,
        history: Any = None,
        static: Mapping[str, Any] | None = None,
        forcing: Mapping[str, Any] | None = None,
    ) -> Gaussian | Mixture | Flow:
        """The predicted distribution for one state `(d,)` or a batch `(n, d)`, in original
        units: a `Gaussian` (`head="gaussian"`), a `Mixture` (`head="mixture"`) or a
        `Flow` (`head="flow"`).

        Raises:
            ConfigError: the forward has `head="point"` (no distribution is predicted),
                or the model's output does not have the head's layout.
        """
        if self.head == "generative":
            raise ConfigError(
                "A generative model predicts members, not a distribution in closed form. "
                "Received: distribution() with head='generative'. Draw members with "
                "rollout(states, n, stochastic=True, seed=s) or forward(state, noise=z)."
            )
        if self.head == "point":
            raise ConfigError(
                "`distribution()` needs a Gaussian, mixture or flow head. Received: head='point'. "
                "Construct NeuralForward(..., head='gaussian') for a model trained with "
                "`gaussian_nll` (or head='mixture', n_components=K for `mixture_nll`, "
                "head='flow' for `flow_nll`), or "
                "call the forward for the point prediction."
            )
        batch, single = self._batch(state)
        u = self._input(batch, single, history, static, forcing)
        dist: Gaussian | Mixture | Flow
        if self.head == "gaussian":
            dist = self._gaussian(batch, u)
        elif self.head == "mixture":
            dist = self._mixture(batch, u)
        else:
            dist = self._flow(batch, u)
        return dist[0] if single else dist

    def __call__(
        self,
        state: Any,
        *,
        history: Any = None,
        static: Mapping[str, Any] | None = None,
        forcing: Mapping[str, Any] | None = None,
        noise: Any = None,
    ) -> np.ndarray:
        """Advance one state `(d,)` or a batch of states `(n, d)` by one step.

        With a Gaussian head this is the predicted mean (`distribution(state).mean`).
        `history`, `static` and `forcing` are for a model with `inputs` (see the class);
        `noise` for a generative head (zero noise, the central member, when None).
        """
        batch, single = self._batch(state)
        if self.coarse_stepper is not None:
            pred = self._corrected(batch)
            return pred[0] if single else pred
        u = self._input(batch, single, history, static, forcing)
        if self.head == "gaussian":
            pred = self._gaussian(batch, u).mean
        elif self.head == "mixture":
            pred = self._mixture(batch, u).mean
        elif self.head == "flow":
            pred = self._flow(batch, u).mean
        else:
            if noise is not None and single:
                noise = np.asarray(noise)[None]
            pred = self._add_state(batch, self._invert(np.asarray(self._model(u, noise))))
        return pred[0] if single else pred

    def _corrected(self, batch: np.ndarray) -> np.ndarray:
        """One step of a model that corrects the coarse stepper, on the host."""
        coarse = np.asarray(self.coarse_stepper(batch))
        if coarse.shape != batch.shape:
            raise ConfigError(
                "`coarse_stepper` must return the next states in the shape of the states it "
                f"is given. Received: a batch of shape {batch.shape} mapped to shape "
                f"{coarse.shape}. Return fn(state).shape == state.shape."
            )
        pred = self._invert(
            np.asarray(self._model(batch if self.correction == "parallel" else coarse))
        )
        return coarse + pred if self.residual else pred

    def draw(self, state: Any, rng: np.random.Generator, **inputs: Any) -> Any:
        """One stochastic step of a batch of members on the host: a draw from the predicted
        distribution (Gaussian, mixture and flow heads), or the step with fresh standard
        normal noise for every member (a generative head). `inputs`: `history`, `static`,
        `forcing` for a model with `inputs`."""
        if self.head == "generative":
            assert self.head_options is not None
            w = int(self.head_options["noise_dim"])
            return self(state, noise=rng.standard_normal((*np.shape(state)[:-1], w)))
        return self.distribution(state, **inputs).sample(rng)

    # -- multi-step rollouts ---------------------------------------------------------------
    def rollout_spec(self) -> RolloutSpec:
        """The `RolloutSpec` of this forward (normalizer, residual, head, keys), the per-step
        definition every device rollout runs."""
        key = (
            id(self.normalizer),
            self.residual,
            self.head,
            repr(self.head_options),
            self.state_key,
            self.output_key,
            self.state_ndim,
            id(self.inputs),
            id(self.coarse_stepper),
            self.correction,
        )
        cached = getattr(self, "_spec", None)
        if cached is None or cached[0] != key or cached[1].normalizer is not self.normalizer:
            spec = RolloutSpec(
                normalizer=self.normalizer,
                residual=self.residual,
                head=self.head,
                head_options=self.head_options,
                state_key=self.state_key,
                output_key=self.output_key,
                state_ndim=self.state_ndim,
                inputs=self.inputs,
                coarse_stepper=self.coarse_stepper,
                correction=self.correction,
            )
            self._spec = cached = (key, spec)
        return cached[1]

    @property
    def on_device(self) -> bool:
        """Whether `rollout` runs on the model's device: the model operator has a
        `rollout` method and the normalizer is `None` or the core `Normalizer` (mean/std
        for the state and output keys), and the model sees the state alone. Otherwise
        `rollout` loops on the host."""
        if self.inputs is not None or not callable(getattr(self.model_op, "rollout", None)):
            return False
        if self.normalizer is None:
            return True
        means = getattr(self.normalizer, "mean", None)
        stds = getattr(self.normalizer, "std", None)
        return all(
            isinstance(m, dict) and self.state_key in m and self.output_key in m
            for m in (means, stds)
        )

    def rollout(
        self,
        state: Any,
        n_steps: int,
        *,
        keep: str | int = "all",
        chunk: int | None = None,
        stochastic: bool = False,
        seed: int = 0,
    ) -> np.ndarray:
        """Advance one state or a batch (an ensemble) `n_steps` steps on the model's device.

        With a model operator that has a device rollout (`EquinoxModelOp`,
        `LightningModelOp`, `KerasModelOp`) the states stay on the device: one compiled
        loop (jax) or one no-grad loop on tensors (torch) per segment of at most `chunk`
        steps, the finiteness check included; the states `keep` asks for come back.
        Point heads step with the prediction, Gaussian and mixture heads with the mean.
        Without one (or with a normalizer other than the core `Normalizer`) the same
        steps run on the host with `self(state)`.

        **Stochastic ensembles.** With `stochastic=True` (Gaussian and mixture heads) each
        step draws every member's next state from its predicted distribution, so the
        ensemble's spread is the model's own uncertainty; a generative head draws fresh
        noise for every member at every step. The draws come from the
        backend's generator seeded with `seed` (jax: `fold_in(key(seed), step)`; torch: a
        seeded `torch.Generator`; the host path: `np.random.default_rng(seed)` with
        `distribution(state).sample`): the same seed repeats the rollout exactly on the
        same backend and device, whatever `chunk`.

        Args:
            state: one state `(*state)` or a batch `(n, *state)`.
            n_steps: the number of steps.
            keep: `"all"` (steps `0..n`, as `Cycle` returns), an int `k` (steps `0, k,
                2k, ...`) or `"last"` (step `n` only).
            chunk: the most steps per device segment (None: as many as keep one
                segment's stored states under 64 MiB).
            stochastic: sample each step from the predicted distribution (refused on a
                point head).
            seed: the seed of the draws (a non-negative int).

        Returns:
            The states at the kept steps, `(len(kept), n, *state)` (no `n` axis for one
            state), in the model's dtype on the device path.

        Raises:
            ConfigError: a state of the wrong shape or not finite, bad `n_steps`, `keep`,
                `chunk` or `seed`, a stochastic rollout on a point head, or a model whose
                output does not fit the state (all before any step).
            NonFiniteStateError: a state became NaN/inf; names the first step and member.

        Examples:
            ```python
            forward = NeuralForward(op, normalizer=norm, residual=True)
            ensemble = x0 + 0.01 * rng.standard_normal((64, 8))
            last = forward.rollout(ensemble, 100_000, keep="last")  # (1, 64, 8)
            ```
        """
        if self.inputs is not None:
            raise ConfigError(
                "A model that sees history, forcings or static inputs is rolled out by `Cycle`, "
                "which supplies them step by step. Received: NeuralForward(inputs=...)."
                "rollout(...). Use Cycle(forward, n_steps, forcings=..., static=...)"
                ".run(state, history=...)."
            )
        if self.on_device:
            return self.model_op.rollout(  # type: ignore[attr-defined]  # checked by on_device
                state,
                n_steps,
                spec=self.rollout_spec(),
                keep=keep,
                chunk=chunk,
                stochastic=stochastic,
                seed=seed,
            )
        return self._host_rollout(
            state, n_steps, keep=keep, chunk=chunk, stochastic=stochastic, seed=seed
        )

    def _host_rollout(
        self,
        state: Any,
        n_steps: int,
        *,
        keep: str | int,
        chunk: int | None,
        stochastic: bool,
        seed: int,
    ) -> np.ndarray:
        spec, x0, single, segmented = prepare_rollout(
            state,
            n_steps,
            self.rollout_spec(),
            keep,
            chunk,
            itemsize=8,
            stochastic=stochastic,
            seed=seed,
        )
        n = x0.shape[0]
        rng = np.random.default_rng(seed)

        def advance(x: np.ndarray) -> np.ndarray:
            return np.asarray(self.draw(x, rng) if stochastic else self(x))

        def run(x: np.ndarray, first: int, length: int, stride: int) -> Any:
            stored = []
            for i in range(1, length + 1):
                x = advance(x)
                if x.shape != x0.shape:
                    raise ConfigError(
                        "`forward` must return a state of the input's shape. Received: shape "
                        f"{x.shape} at step {first + i}, expected {x0.shape}."
                    )
                ok = np.isfinite(x).reshape(n, -1).all(axis=1)
                if not ok.all():
                    return x, None, (i, int(np.argmin(ok)))
                if i % stride == 0:
                    stored.append(x)
            return x, np.stack(stored) if stored else x[:0][None], None

        return drive(segmented, x0, x0, run, np.asarray, single=single)

    def get_config(self) -> dict[str, Any]:
        """JSON description: the model's config, the normalizer's JSON and the options."""
        model_config = (
            self.model_op.get_config()
            if hasattr(self.model_op, "get_config")
            else _describe(self.model_op)
        )
        return {
            "type": object_path(type(self)),
            "model": model_config,
            "normalizer": _normalizer_json(self.normalizer),
            "residual": self.residual,
            "state_key": self.state_key,
            "output_key": self.output_key,
            "head": self.head,
            **({"head_options": self.head_options} if self.head_options else {}),
            **({"state_ndim": self.state_ndim} if self.state_ndim != 1 else {}),
            **({"inputs": self.inputs.to_json()} if self.inputs is not None else {}),
            **(
                {"coarse_stepper": self.coarse_stepper_name, "correction": self.correction}
                if self.coarse_stepper is not None
                else {}
            ),
        }

    def __repr__(self) -> str:
        head = "" if self.head == "point" else f", head={self.head!r}"
        if self.head_options:
            head += "".join(f", {k}={v!r}" for k, v in self.head_options.items())
        if self.coarse_stepper is not None:
            head += f", coarse_stepper={self.coarse_stepper_name!r}, correction={self.correction!r}"
        return f"NeuralForward({self.model_op!r}, residual={self.residual}{head})"


class Cycle:
    """The closed loop: advance a state with a forward operator and return the trajectory.

    A `StatefulOperator`: `run(state)` returns an array of shape `(n_steps + 1, *state.shape)`
    whose row 0 is the initial state and row `k` the state after step `k` (after the hook).

    **The device path.** With a `NeuralForward` whose model operator rolls out on its
    device (`NeuralForward.on_device`), `run` hands the steps to `forward.rollout`: the
    state (an ensemble, too) stays on the device, the finiteness check runs there, and
    the trajectory comes back once per segment. It takes this path whenever nothing
    needs the host every step: no hook, or a hook at given steps (`hook_steps`), where
    the segments between those steps run on the device. A per-step hook (`hook` without
    `hook_steps`) or any other forward runs the host loop.

    Args:
        forward: any callable state → next state of the same shape (a simulator, a
            `NeuralForward` on any backend).
        n_steps: the number of steps (a positive int).
        hook: optional `hook(step, state) -> state | None`, called after each step
            (`step` = 1..n_steps), or only at `hook_steps`, with the new state; a returned
            array replaces the state (e.g. after assimilating an observation), `None`
            keeps it.
        hook_steps: where the hook runs: an int `m` (every `m` steps) or increasing steps
            in `[1, n_steps]` (observation times). None: every step.
        forcings: the forcings of a forced model, `{key: values}` with one value per step
            (`(n_steps, ...)`, or `(n_steps, n, ...)` for a batch; row `j` drives step
            `j + 1`, from the state at `j`), or a function `forcings(j) -> {key: value}` of
            the step index `j = 0..n_steps-1` (e.g. an analytic insolation at `t0 + j * dt`).
            Passed to `forward` as `forcing=` at each step.
        static: the static inputs of a parametric model, `{key: value}` (a leading `n` axis
            for a batch), passed to `forward` as `static=` at each step.
        stochastic: a stochastic ensemble (a `NeuralForward` with a Gaussian, mixture or
            generative head): every step draws each member's next state (from the
            predicted distribution, or with fresh noise for a generative model) instead of
            taking the mean (the central member). The device path draws as
            `forward.rollout(..., stochastic=True)` does, each segment between hook steps
            with its own seed derived from `seed` and its first step (the first segment
            with `seed` itself); the host path from `np.random.default_rng(seed)`. The same
            seed repeats a run on the same path and backend.
        seed: the seed of the draws (a non-negative int).

    With a `NeuralForward` whose model sees history (`inputs.history = h > 1`), `run`
    takes the `h - 1` states before the initial one (`run(state, history=...)`) and keeps
    the last `h - 1` states as the history of each step. Any other forward receives the
    keywords that are given (`forcing=`, `static=`, `history=`), so a forced simulator runs
    in the same loop.

    Raises:
        ConfigError: bad arguments (`hook_steps` outside `[1, n_steps]`, not increasing,
            or without a hook), forcings that do not cover the `n_steps` horizon, or
            forcings and static inputs that a `NeuralForward`'s model does not take (or
            lacks).
        NonFiniteStateError: (from `run`) a state became NaN/inf; the message names the
            step (and, for an ensemble, the first bad member).

    Examples:
        ```python
        def analysis(step, ensemble):  # e.g. an ensemble Kalman filter update, in numpy
            return ensemble + gain @ (observations[step] - ensemble)

        forecast = Cycle(forward, n_steps=500, hook=analysis, hook_steps=25).run(ensemble)
        ```
    """

    def __init__(
        self,
        forward: Callable[[np.ndarray], Any],
        n_steps: int,
        hook: Callable[[int, np.ndarray], Any] | None = None,
        *,
        hook_steps: Any = None,
        forcings: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
        static: Mapping[str, Any] | None = None,
        stochastic: bool = False,
        seed: int = 0,
    ):
        if not callable(forward):
            raise ConfigError(
                f"`forward` must be a callable state -> next state. Received: forward={forward!r}."
            )
        if not isinstance(stochastic, bool):
            raise ConfigError(
                f"`stochastic` must be True or False. Received: stochastic={stochastic!r}."
            )
        if stochastic:
            if not isinstance(forward, NeuralForward):
                raise ConfigError(
                    "A stochastic Cycle draws members from a trained model's head, so "
                    "`forward` must be a NeuralForward. Received: stochastic=True with "
                    f"forward={type(forward).__name__}. Pass NeuralForward(..., head=...)."
                )
            forward.rollout_spec().check_stochastic()
        self.stochastic = stochastic
        self.seed = check_seed(seed)
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
            raise ConfigError(f"`n_steps` must be a positive int. Received: n_steps={n_steps!r}.")
        if hook is not None and not callable(hook):
            raise ConfigError(
                f"`hook` must be a callable hook(step, state) or None. Received: hook={hook!r}."
            )
        if hook_steps is not None and hook is None:
            raise ConfigError(
                f"`hook_steps` needs a `hook`. Received: hook=None, hook_steps={hook_steps!r}. "
                "Pass hook=..., or leave hook_steps out."
            )
        self.forward = forward
        self.n_steps = int(n_steps)
        self.hook = hook
        self.hook_steps: list[int] | None = (
            None if hook_steps is None else check_hook_steps(hook_steps, self.n_steps)
        )
        self.forcings = self._check_forcings(forcings)
        self.static = None if static is None else dict(static)
        if static is not None and not isinstance(static, Mapping):
            raise ConfigError(
                f"`static` must be a dict of static inputs or None. Received: static={static!r:.80}."
            )
        self._check_inputs()

    def _check_forcings(self, forcings: Any) -> Any:
        if forcings is None or callable(forcings):
            return forcings
        if not isinstance(forcings, Mapping):
            raise ConfigError(
                "`forcings` must be a dict {key: values per step}, a function of the step index, "
                f"or None. Received: forcings={type(forcings).__name__}."
            )
        out = {}
        for key, values in forcings.items():
            a = np.asarray(values)
            if a.ndim < 1 or a.shape[0] < self.n_steps:
                raise ConfigError(
                    f"The forcings must cover the rollout horizon: one value per step. Received: "
                    f"forcings[{key!r}] with shape {a.shape} for n_steps={self.n_steps}. Pass "
                    f"at least {self.n_steps} values along the first axis (or a function of the "
                    "step index)."
                )
            out[key] = a
        return out

    def _check_inputs(self) -> None:
        """A `NeuralForward` with a layout gets every forcing and static input it needs."""
        layout = (
            getattr(self.forward, "inputs", None)
            if isinstance(self.forward, NeuralForward)
            else None
        )
        if isinstance(self.forward, NeuralForward) and layout is None:
            if self.forcings is not None or self.static:
                raise ConfigError(
                    "This forward's model sees the state alone. Received: "
                    + ("forcings " if self.forcings is not None else "")
                    + ("static" if self.static else "")
                    + ". Construct NeuralForward(..., inputs=windows.inputs) for a model "
                    "trained with them, or drop them."
                )
            return
        if layout is None:
            return
        want_static = [k for k, _ in layout.static]
        if want_static and sorted(self.static or {}) != sorted(want_static):
            raise ConfigError(
                f"The model takes the static inputs {want_static}. Received: static with keys "
                f"{sorted(self.static or {})}. Pass Cycle(..., static={{...}}) with those keys."
            )
        want = [k for k, _ in layout.forcings]
        if want and self.forcings is None:
            raise ConfigError(
                f"The model is forced by {want}. Received: forcings=None. Pass "
                "Cycle(..., forcings={key: values per step}) covering the horizon, or a "
                "function of the step index."
            )
        if want and isinstance(self.forcings, Mapping) and sorted(self.forcings) != sorted(want):
            raise ConfigError(
                f"The model is forced by {want}. Received: forcings with keys "
                f"{sorted(self.forcings)}. Pass exactly those keys."
            )

    def _forcing_at(self, j: int) -> dict[str, Any] | None:
        if self.forcings is None:
            return None
        if callable(self.forcings):
            return dict(self.forcings(j))
        return {key: values[j] for key, values in self.forcings.items()}

    @property
    def on_device(self) -> bool:
        """Whether `run` takes the device path (see the class docstring)."""
        return (
            isinstance(self.forward, NeuralForward)
            and self.forward.on_device
            and (self.hook is None or self.hook_steps is not None)
            and self.forcings is None
            and not self.static
        )

    def run(self, state: Any, history: Any = None) -> np.ndarray:
        """Roll the state forward `n_steps` times and return the trajectory.

        Args:
            state: the initial state (any shape; `forward` must keep it). Integer states
                are promoted to float64.
            history: the states before `state`, oldest first, `(h - 1, *state.shape)`,
                for a model that sees `h` states (see the class); None otherwise.

        Returns:
            The trajectory, shape `(n_steps + 1, *state.shape)`, including the initial
            state, in the initial state's (floating) dtype.

        Raises:
            ConfigError: the initial state is not finite or a step changes the shape.
            NonFiniteStateError: a state became NaN or infinite.
        """
        x0 = np.asarray(state)
        if not np.issubdtype(x0.dtype, np.inexact):
            x0 = x0.astype(np.float64)
        if not np.all(np.isfinite(x0)):
            raise ConfigError(
                "The initial `state` must be finite. Received: a state with NaN or inf entries."
            )
        trajectory = np.empty((self.n_steps + 1, *x0.shape), dtype=x0.dtype)
        trajectory[0] = x0
        batched = isinstance(self.forward, NeuralForward) and x0.ndim == self.forward.state_ndim + 1
        past = self._history(history, x0)
        if self.on_device and past is None:
            return self._run_on_device(trajectory, batched)
        hook_at = None if self.hook_steps is None else set(self.hook_steps)
        rng = np.random.default_rng(self.seed) if self.stochastic else None
        current = trajectory[0].copy()  # never hand the caller's array to `forward`
        for step in range(1, self.n_steps + 1):
            kwargs: dict[str, Any] = {}
            if past is not None:
                # (h - 1, *state) oldest first; a batch's history is (n, h - 1, *state)
                kwargs["history"] = np.stack(past, axis=1 if batched else 0)
            if self.static:
                kwargs["static"] = self.static
            forcing = self._forcing_at(step - 1)
            if forcing is not None:
                kwargs["forcing"] = forcing
            nxt = np.asarray(self._advance(current, kwargs, rng))
            nxt = self._check(nxt, x0.shape, step, "forward", batched)
            if self.hook is not None and (hook_at is None or step in hook_at):
                nxt = self._call_hook(step, nxt, x0.shape, batched)
            trajectory[step] = nxt
            if past is not None:
                past = [*past[1:], current] if past else []
            current = trajectory[step].copy()  # the forward may not alias the trajectory
        return trajectory

    def _advance(self, state: np.ndarray, kwargs: dict[str, Any], rng: Any) -> Any:
        """One host step: the forward, or a draw of a stochastic ensemble's members."""
        if rng is None:
            return self.forward(state, **kwargs)
        assert isinstance(self.forward, NeuralForward)
        return self.forward.draw(state, rng, **kwargs)

    def _history(self, history: Any, x0: np.ndarray) -> list[np.ndarray] | None:
        """The states before `x0` as a list, oldest first (None: the forward takes none)."""
        layout = (
            getattr(self.forward, "inputs", None)
            if isinstance(self.forward, NeuralForward)
            else None
        )
        h = 1 if layout is None else layout.history
        if history is None:
            if h > 1:
                raise ConfigError(
                    f"The model sees history={h} states. Received: history=None. Pass "
                    f"run(state, history=...) with the {h - 1} state(s) before `state`, "
                    "oldest first."
                )
            return None
        past = np.asarray(history, dtype=x0.dtype)
        if layout is not None and past.shape != (h - 1, *x0.shape):
            raise ConfigError(
                f"`history` must hold the {h - 1} state(s) before `state`, oldest first. "
                f"Received: history with shape {past.shape}, expected {(h - 1, *x0.shape)}."
            )
        return [past[j].copy() for j in range(past.shape[0])]

    def _run_on_device(self, trajectory: np.ndarray, batched: bool) -> np.ndarray:
        forward = self.forward
        assert isinstance(forward, NeuralForward)
        stops = [*(self.hook_steps or []), self.n_steps]
        start = 0
        for stop in dict.fromkeys(stops):  # the last hook step may be n_steps itself
            if stop > start:
                draws: dict[str, Any] = {}
                if self.stochastic:  # each segment its own draws; the first: `seed`'s
                    seed = self.seed
                    if start:
                        seed = int(np.random.SeedSequence([self.seed, start]).generate_state(1)[0])
                    draws = {"stochastic": True, "seed": seed}
                try:
                    segment = forward.rollout(trajectory[start], stop - start, keep="all", **draws)
                except NonFiniteStateError as exc:
                    member = exc.member if batched else None
                    raise non_finite_error(start + (exc.step or 1), "forward", member) from None
                trajectory[start + 1 : stop + 1] = segment[1:]
            if self.hook_steps is not None and stop in self.hook_steps:
                shape = trajectory.shape[1:]
                trajectory[stop] = self._call_hook(stop, trajectory[stop].copy(), shape, batched)
            start = stop
        return trajectory

    def _call_hook(
        self, step: int, state: np.ndarray, shape: tuple[int, ...], batched: bool
    ) -> np.ndarray:
        assert self.hook is not None
        hooked = self.hook(step, state)
        if hooked is None:
            return state
        return self._check(np.asarray(hooked), shape, step, "hook", batched)

    @staticmethod
    def _check(
        x: np.ndarray, shape: tuple[int, ...], step: int, who: str, batched: bool = False
    ) -> np.ndarray:
        if x.shape != shape:
            raise ConfigError(
                f"`{who}` must return a state of the input's shape. Received: shape {x.shape} "
                f"at step {step}, expected {shape}."
            )
        finite = np.isfinite(x)
        if not np.all(finite):
            member = None
            if batched:
                member = int(np.argmin(finite.reshape(shape[0], -1).all(axis=1)))
            raise non_finite_error(step, who, member)
        return x

    def get_config(self) -> dict[str, Any]:
        """JSON description: `n_steps` and descriptions of `forward` and `hook` (and
        `hook_steps`, `stochastic` and `seed` when given)."""
        config = {
            "type": object_path(type(self)),
            "n_steps": self.n_steps,
            "forward": _describe(self.forward),
            "hook": _describe(self.hook),
        }
        if self.hook_steps is not None:
            config["hook_steps"] = list(self.hook_steps)
        if self.stochastic:
            config["stochastic"], config["seed"] = True, self.seed
        return config

    def __repr__(self) -> str:
        return f"Cycle({self.forward!r}, n_steps={self.n_steps})"

"""Toy models and simulators shared by the worked examples.

Model factories are referenced by import string (`"toymodels:equinox_mlp"`), so a
registry can rebuild them from JSON; each backend's library is imported only inside
its own factory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipekit_train.core import model_factory

# -- the damped oscillator ------------------------------------------------------------------
# SI units: position x in m, velocity v in m/s, time in s, angular frequency ω in rad/s.

DT = 0.1  # the simulator's time step [s]
OMEGA = 2.0  # angular frequency [rad/s]


def oscillator_step(
    state: np.ndarray, omega: float = OMEGA, zeta: float = 0.1, dt: float = DT
) -> np.ndarray:
    """One semi-implicit Euler step of `x'' + 2ζωx' + ω²x = 0` on `[..., (x [m], v [m/s])]`.

    `omega` in rad/s, `zeta` (damping ratio) dimensionless, `dt` in s.
    """
    state = np.asarray(state, dtype=np.float64)
    x, v = state[..., 0], state[..., 1]
    v_next = v + dt * (-2.0 * zeta * omega * v - omega**2 * x)
    return np.stack([x + dt * v_next, v_next], axis=-1)


def sample_state(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random oscillator state: position and velocity in [-1, 1]."""
    return {"x": rng.uniform(-1.0, 1.0, size=2).astype(np.float32)}


def one_step(params: dict[str, np.ndarray]) -> np.ndarray:
    """Simulator for `SimulationDataset`: the next state of the state in `params["x"]`."""
    return oscillator_step(params["x"]).astype(np.float32)


def trajectory(
    omega: float, zeta: float, n_steps: int = 40, x0: float = 1.0, dt: float = 0.1
) -> np.ndarray:
    """Positions of a damped oscillator started at `(x0, 0)`.

    The same semi-implicit Euler steps as `oscillator_step`, on Python floats: a 40-step
    trajectory takes tens of microseconds instead of a millisecond of small-array numpy
    calls, so simulating tens of thousands of them is quick.
    """
    x, v = float(x0), 0.0
    damping, stiffness = 2.0 * zeta * omega, omega * omega
    out = []
    for _ in range(n_steps):
        v = v + dt * (-damping * v - stiffness * x)
        x = x + dt * v
        out.append(x)
    return np.asarray(out, dtype=np.float32)


# -- model factories, one per backend --------------------------------------------------------


def _output_scale(out_size: int, n_logits: int, logit_scale: float) -> np.ndarray:
    """The per-output factor of the MLPs: `logit_scale` on the first `n_logits`, else 1."""
    if not 0 <= n_logits <= out_size:
        raise ValueError(
            f"`n_logits` must be between 0 and out_size={out_size}. Received: "
            f"n_logits={n_logits}. Pass the number of mixture components K."
        )
    scale = np.ones(out_size, dtype=np.float32)
    scale[:n_logits] = logit_scale
    return scale


# The optional `n_logits` / `logit_scale` of the MLPs below multiply the first `n_logits`
# outputs (a mixture head's weight logits, `losses.mixture_nll`'s layout) by a fixed
# `logit_scale`. With Adam each weight moves about `lr` per step whatever its gradient, so
# a factor of 0.1 makes the mixture weights move ten times slower than the means and
# scales: components settle where the data is before the weights pick winners, instead of
# dying early (weight -> 0; see docs/examples.md, two_moons). Left at 0 the model is the plain MLP.


@model_factory
def equinox_mlp(
    in_size: int,
    out_size: int,
    width: int = 64,
    depth: int = 2,
    n_logits: int = 0,
    logit_scale: float = 1.0,
    *,
    key: Any,
) -> Any:
    """An Equinox MLP on one sample (`(in,) -> (out,)`; the adapter vmaps it over the batch).

    `eqx.nn.MLP` with tanh activations, as `pipekit_train.equinox.testing.mlp` builds it
    (Equinox's own initial values, with fewer compiled draws).
    """
    import equinox as eqx

    from pipekit_train.equinox.testing import mlp as testing_mlp

    mlp = testing_mlp(in_size, out_size, width, depth, "tanh", key=key)
    if n_logits == 0:
        return mlp
    scale = _output_scale(out_size, n_logits, logit_scale)
    return eqx.nn.Sequential([mlp, eqx.nn.Lambda(lambda y: y * scale)])


@model_factory
def torch_mlp(
    in_size: int,
    out_size: int,
    width: int = 64,
    depth: int = 2,
    n_logits: int = 0,
    logit_scale: float = 1.0,
) -> Any:
    """A torch MLP with tanh activations."""
    import torch

    class Scale(torch.nn.Module):
        def __init__(self, scale: np.ndarray) -> None:
            super().__init__()
            self.register_buffer("scale", torch.from_numpy(scale), persistent=False)

        def forward(self, y: Any) -> Any:
            return y * self.scale

    layers: list[Any] = []
    size = in_size
    for _ in range(depth):
        layers += [torch.nn.Linear(size, width), torch.nn.Tanh()]
        size = width
    layers.append(torch.nn.Linear(size, out_size))
    if n_logits:
        layers.append(Scale(_output_scale(out_size, n_logits, logit_scale)))
    return torch.nn.Sequential(*layers)


@model_factory
def keras_mlp(
    in_size: int,
    out_size: int,
    width: int = 64,
    depth: int = 2,
    n_logits: int = 0,
    logit_scale: float = 1.0,
) -> Any:
    """A Keras MLP with tanh activations, initialised like the torch and Equinox ones.

    Keras's `Dense` defaults to a Glorot-uniform kernel and a zero bias; torch and Equinox
    draw both uniform in `±1/sqrt(fan_in)`. `dense` picks the latter, so the three
    backends start from the same family (the emulator's rollout error then matches).
    """
    import keras

    from pipekit_train.keras.testing import dense

    inputs = keras.Input((in_size,))
    h, fan_in = inputs, in_size
    for _ in range(depth):
        h, fan_in = dense(width, fan_in, "tanh")(h), width
    out = dense(out_size, fan_in)(h)
    if n_logits:
        out = keras.ops.multiply(out, _output_scale(out_size, n_logits, logit_scale))
    return keras.Model(inputs, out)


def model_op(
    backend: str,
    in_size: int,
    out_size: int,
    width: int = 64,
    depth: int = 2,
    seed: int = 0,
    **options: Any,
) -> Any:
    """The model operator of `backend` wrapping the matching MLP factory.

    `options` go to the factory as they are (`n_logits`, `logit_scale`).
    """
    if backend == "equinox":
        from pipekit_train.equinox import EquinoxModelOp

        return EquinoxModelOp(
            "toymodels:equinox_mlp",
            in_size=in_size,
            out_size=out_size,
            width=width,
            depth=depth,
            seed=seed,
            **options,
        )
    if backend == "lightning":
        from pipekit_train.lightning import TorchModelOp

        return TorchModelOp(
            "toymodels:torch_mlp",
            in_size=in_size,
            out_size=out_size,
            width=width,
            depth=depth,
            seed=seed,
            **options,
        )
    if backend == "keras":
        import os

        os.environ.setdefault("KERAS_BACKEND", "jax")
        from pipekit_train.keras import KerasModelOp

        return KerasModelOp(
            "toymodels:keras_mlp",
            in_size=in_size,
            out_size=out_size,
            width=width,
            depth=depth,
            seed=seed,
            **options,
        )
    raise SystemExit(
        f"--backend must be equinox, lightning or keras. Received: backend={backend!r}."
    )

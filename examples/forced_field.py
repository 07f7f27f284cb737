"""Forced, parametric field emulator: 2-D advection–diffusion from a The Well-layout HDF5 file.

    uv run examples/forced_field.py                        # equinox, default settings
    uv run examples/forced_field.py --backend lightning    # or torch, keras
    uv run examples/forced_field.py --compare              # the table of the guide

A concentration `c` on a periodic 32×32 grid is carried by a uniform wind, diffuses with
a **diffusivity field** `kappa(x, y)` drawn per trajectory (a static input), decays, and
is fed by a **source** `g(x, y)` (a Gaussian bump placed per trajectory, static too) whose
**amplitude** `a(t)` oscillates with a frequency and phase of its own per trajectory (a
forcing: one value per time step, not predictable from the field):

    c_t = -w · ∇c + ∇ · (kappa ∇c) - lambda c + a(t) g(x, y)

The simulator writes its trajectories to an HDF5 file in The Well's layout
(`t0_fields/concentration` `(n, T, H, W)`, the constant fields `t0_fields/diffusivity`
and `t0_fields/source` `(n, H, W)`, the time-varying scalar `scalars/source_amplitude`
`(n, T)`), and training streams windows out of it with `read_well`: the state is the
concentration, the diffusivity and source shape static inputs, the amplitude a forcing.
The model sees the last two states, the forcing and the static fields as one
channels-last input (`ModelInputs`: 5 channels),
and is trained through a rollout of 4 steps (`Rollout(steps=4)`); `Cycle` then rolls it
out from held-out states with the amplitude supplied for the horizon, next to the
simulator.

`--compare` trains the same conv net three ways on Equinox (forced with history 2, without
its forcing, forced with history 1) and prints the held-out rollout error at the horizon:
the table in `docs/guides/data.md`.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipekit_train.core import (
    Cycle,
    LocalModelRegistry,
    NeuralForward,
    Rollout,
    TrainingLoop,
    TrajectoryWindows,
)
from pipekit_train.core.data import read_well
from pipekit_train.core.testing import write_well_file

GRID = 32  # cells per side
WIND = (0.3, 0.2)  # uniform advection velocity [cells per unit time], (x, y)
DECAY = 0.05  # [per unit time]
DT = 0.5  # the simulator's explicit Euler step
INNER = 4  # simulator steps per emulator step (the stored time step is INNER * DT)
LENGTH = 41  # stored states per trajectory
BACKENDS = ("equinox", "lightning", "torch", "keras")


def source_shape(centres: np.ndarray, size: int = GRID) -> np.ndarray:
    """Periodic Gaussian bumps `(n, H, W)` of width 3 cells at `centres` `(n, 2)` (`g`)."""
    i = np.arange(size)
    d = np.abs(i[None, :] - centres[:, :, None])  # (n, 2, size)
    d = np.minimum(d, size - d)
    return np.exp(-(d[:, 0, :, None] ** 2 + d[:, 1, None, :] ** 2) / (2 * 3.0**2))


def _roll_diff(c: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    return np.roll(c, -1, axis=axis) - c, c - np.roll(c, 1, axis=axis)


def advect_diffuse(
    c: np.ndarray, kappa: np.ndarray, g: np.ndarray, amplitude: Any, n: int = INNER
) -> np.ndarray:
    """Advance fields `c (..., H, W)` by `n` Euler steps, the source `g` held at `amplitude`."""
    a = np.asarray(amplitude, dtype=np.float64)[..., None, None]
    k_x = 0.5 * (kappa + np.roll(kappa, -1, axis=-1))  # diffusivity on the cell faces
    k_y = 0.5 * (kappa + np.roll(kappa, -1, axis=-2))
    for _ in range(n):
        fwd_x, back_x = _roll_diff(c, -1)
        fwd_y, back_y = _roll_diff(c, -2)
        advection = WIND[0] * back_x + WIND[1] * back_y  # upwind (the wind is positive)
        diffusion = k_x * fwd_x - np.roll(k_x * fwd_x, 1, axis=-1)
        diffusion = diffusion + k_y * fwd_y - np.roll(k_y * fwd_y, 1, axis=-2)
        c = c + DT * (-advection + diffusion - DECAY * c + a * g)
    return c


def simulate(n: int, seed: int, length: int = LENGTH, size: int = GRID) -> dict[str, np.ndarray]:
    """`n` trajectories: concentration `(n, T, H, W)`, diffusivity and source shape
    `(n, H, W)`, amplitude `(n, T)` (its value at each stored time, held over the emulator
    step that starts there)."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 2 * np.pi, size, endpoint=False)
    kx, ky = rng.integers(1, 4, (2, n, 1, 1))
    px, py = rng.uniform(0, 2 * np.pi, (2, n, 1, 1))
    kappa = 0.12 + 0.08 * np.sin(kx * x[None, None, :] + px) * np.cos(ky * x[None, :, None] + py)
    omega = rng.uniform(0.1, 0.4, (n, 1))
    phase = rng.uniform(0.0, 2 * np.pi, (n, 1))
    times = INNER * DT * np.arange(length)
    amplitude = 0.5 * (1.0 + np.sin(omega * times[None, :] + phase))
    g = source_shape(rng.integers(0, size, (n, 2)), size)
    c = rng.uniform(0.0, 1.0, (n, 1, 1)) * source_shape(rng.integers(0, size, (n, 2)), size)
    states = [c]
    for t in range(length - 1):
        c = advect_diffuse(c, kappa, g, amplitude[:, t])
        states.append(c)
    return {
        "concentration": np.stack(states, axis=1).astype(np.float32),
        "diffusivity": kappa.astype(np.float32),
        "source": g.astype(np.float32),
        "source_amplitude": amplitude.astype(np.float32),
        "time": times,
    }


def write_dataset(path: Path, n: int, seed: int) -> Path:
    """Simulate `n` trajectories and write them in The Well's layout."""
    sim = simulate(n, seed)
    return write_well_file(
        path,
        fields={
            "concentration": sim["concentration"],
            "diffusivity": sim["diffusivity"],
            "source": sim["source"],
        },
        scalars={"source_amplitude": sim["source_amplitude"]},
        constant=("diffusivity", "source"),
        time=sim["time"],
        n_spatial_dims=2,
        dataset_name="advection_diffusion_forced",
    )


def windows(path: Path, *, k: int, history: int, forced: bool = True) -> TrajectoryWindows:
    """Windows of `k` steps over the file: concentration the state, diffusivity and source
    shape static, the amplitude a forcing (dropped with `forced=False`)."""
    trajs = read_well(
        path,
        fields=("concentration",),
        static=("diffusivity", "source"),
        forcings=("source_amplitude",) if forced else (),
    )
    return TrajectoryWindows(trajs, k=k, targets="increments", history=history)


def model_op(backend: str, in_channels: int, width: int = 16, depth: int = 3) -> Any:
    """The backend's periodic `conv_net`: `in_channels` in, the concentration's increment out."""
    kwargs: dict[str, Any] = {
        "in_channels": in_channels,
        "out_channels": 1,
        "width": width,
        "depth": depth,
        "seed": 0,
    }
    if backend == "equinox":
        from pipekit_train.equinox import EquinoxModelOp

        return EquinoxModelOp("pipekit_train.equinox.testing:conv_net", **kwargs)
    if backend in ("lightning", "torch"):
        from pipekit_train.lightning import TorchModelOp

        return TorchModelOp(
            "pipekit_train.lightning.testing:conv_net", layout="channels_last", **kwargs
        )
    if backend == "keras":
        os.environ.setdefault("KERAS_BACKEND", "jax")
        from pipekit_train.keras import KerasModelOp

        return KerasModelOp("pipekit_train.keras.testing:conv_net", **kwargs)
    raise SystemExit(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")


def adapter(backend: str) -> Any:
    """The backend's adapter (`Torch()` for "torch", else the package's default)."""
    if backend == "torch":
        from pipekit_train.lightning import Torch

        return Torch()
    return None


def training_loop(
    backend: str,
    train: TrajectoryWindows,
    val: TrajectoryWindows,
    *,
    steps: int,
    rollout: Rollout | None,
    batch_size: int = 16,
    width: int = 16,
    depth: int = 3,
    checkpoint: Any = None,
    callbacks: Any = (),
) -> TrainingLoop:
    """The example's training description, the same on every backend."""
    return TrainingLoop(
        model=model_op(backend, train.inputs.in_channels, width=width, depth=depth),
        data=train,
        validation=val,
        normalizer=train.normalizer(),
        rollout=rollout,
        loss="mse",
        optimizer_config={
            "name": "adam",
            "lr": {
                "schedule": "warmup_cosine",
                "init_value": 0.0,
                "peak_value": 3e-3,
                "warmup_steps": max(1, steps // 20),
                "decay_steps": steps,
                "end_value": 3e-5,
            },
        },
        batch_size=batch_size,
        max_steps=steps,
        validate_every_n_steps=max(1, steps // 4),
        checkpoint=checkpoint,
        callbacks=list(callbacks),
        adapter=adapter(backend),
        seed=0,
        progress=False,
    )


def rollout_errors(
    forward: NeuralForward, held_out: Path, horizon: int, start: int = 4
) -> np.ndarray:
    """The relative L2 error per lead of `Cycle` rollouts of the held-out trajectories
    (from state `start`, with the amplitude supplied for the horizon), against the file."""
    trajs = read_well(held_out, fields=("concentration",), static=("diffusivity", "source"))
    whole = trajs.get_batch(np.arange(len(trajs)))
    amp = read_well(
        held_out, fields=("concentration",), static=(), forcings=("source_amplitude",)
    ).get_batch(np.arange(len(trajs)))["source_amplitude"]
    states = whole["x"]  # (n, T, H, W, 1)
    h = forward.inputs.history if forward.inputs is not None else 1
    kwargs: dict[str, Any] = {}
    if forward.inputs is not None and forward.inputs.static:
        kwargs["static"] = {k: whole[k] for k in ("diffusivity", "source")}
    if forward.inputs is not None and forward.inputs.forcings:
        kwargs["forcings"] = {"source_amplitude": np.swapaxes(amp[:, start:], 0, 1)}
    cycle = Cycle(forward, horizon, **kwargs)
    past = np.swapaxes(states[:, start - h + 1 : start], 0, 1) if h > 1 else None
    emulated = cycle.run(states[:, start], history=past)
    truth = np.swapaxes(states[:, start : start + horizon + 1], 0, 1)
    err = np.sqrt(((emulated - truth) ** 2).sum(axis=(2, 3, 4)))
    return (err / np.sqrt((truth**2).sum(axis=(2, 3, 4)))).mean(axis=1)


def train_and_roll(
    backend: str,
    data: Path,
    held_out: Path,
    *,
    steps: int,
    horizon: int,
    history: int,
    forced: bool,
    out: Path,
    width: int = 16,
    depth: int = 3,
) -> dict[str, float]:
    """Train one setting, register it, load it back and roll it out: the errors at leads."""
    train = windows(data, k=4, history=history, forced=forced)
    val = windows(held_out, k=4, history=history, forced=forced)
    artifact = training_loop(
        backend,
        train,
        val,
        steps=steps,
        rollout=Rollout(steps=4, residual=True),
        width=width,
        depth=depth,
    ).run()
    registry = LocalModelRegistry(out / "registry")
    artifact.register(registry, "forced-field")
    record, model = registry.load_record_and_model("forced-field")
    forward = NeuralForward.from_record(record, model, residual=True)  # inputs from the record
    assert forward.inputs == train.inputs
    errors = rollout_errors(forward, held_out, horizon)
    return {
        "val_loss": float(artifact.final_metrics["val_loss"]),
        "error_lead_1": float(errors[1]),
        "error_horizon": float(errors[-1]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="equinox", choices=BACKENDS)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--trajectories", type=int, default=40)
    parser.add_argument("--horizon", type=int, default=30, help="emulator steps rolled out")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--compare", action="store_true", help="the guide's table (Equinox)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "forced_field"))
    args = parser.parse_args(argv)
    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    data = write_dataset(root / "train.hdf5", args.trajectories, seed=0)
    held_out = write_dataset(root / "held_out.hdf5", max(2, args.trajectories // 8), seed=1)
    size = {"width": args.width, "depth": args.depth}
    common = {"steps": args.steps, "horizon": args.horizon, **size}
    if not args.compare:
        result = train_and_roll(
            args.backend, data, held_out, history=2, forced=True, out=root / args.backend, **common
        )
        print(
            f"{args.backend}: {args.horizon}-step rollouts of held-out trajectories, relative "
            f"error {result['error_lead_1']:.2%} at lead 1, {result['error_horizon']:.2%} at "
            f"lead {args.horizon}"
        )
        return result
    rows = {}
    for name, history, forced in (
        ("forced, history 2", 2, True),
        ("no forcing, history 2", 2, False),
        ("forced, history 1", 1, True),
    ):
        rows[name] = train_and_roll(
            "equinox",
            data,
            held_out,
            history=history,
            forced=forced,
            out=root / name.replace(", ", "-").replace(" ", "_"),
            **common,
        )
    print(f"| model | val loss | error lead 1 | error lead {args.horizon} |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['val_loss']:.2e} | {r['error_lead_1']:.2%} | {r['error_horizon']:.2%} |"
        )
    return rows


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    main()

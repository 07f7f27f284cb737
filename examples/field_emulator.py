"""Field emulator: learn five steps of 2-D Gray–Scott reaction–diffusion with a conv net.

    uv run examples/field_emulator.py                      # equinox, default settings
    uv run examples/field_emulator.py --backend lightning
    uv run examples/field_emulator.py --backend keras --out-of-core
    uv run examples/field_emulator.py --training pushforward

Simulate (numpy, 32×32 periodic grid, two fields u and v) → cache (zarr, chunked; with
`--out-of-core` it is read chunk by chunk instead of loaded whole) → train a periodic conv
net on channels-last fields `(N, H, W, C)` to predict the change over one emulator step →
register → load → `NeuralForward` (with the per-channel `Normalizer` that travelled with
it) → `Cycle` rollout of 50 steps from held-out states, next to the simulator's own.

The cache lives under `--out` (not per backend): the same cached dataset serves all
three backends. The network is the testing factory `conv_net` of each backend (same
architecture, same initialisation family); on Lightning it runs channels-first inside
`TorchModelOp(..., layout="channels_last")`, so the data is never permuted by hand.
Writes `rollout.png` and `loss.png` under `--out/<backend>`.

The training data are 48 simulated trajectories of the first 80 emulator steps (cached,
split by trajectory), trained on windows of them. `--training` picks how
(`rollout_settings.py`); the default is one step at a time, because at this budget and
horizon no rollout-training setting helped. Measured with the defaults on Equinox (one
seed; 50-step relative trajectory error, persistence 37.5%): one-step 3.50%,
input noise 5.49%, k = 4 6.14%, pushforward 6.48%, curriculum 1→4 9.01%. Over 400
steps with training windows that cover them, pushforward and k = 4 did help
(`docs/guides/rollout-training.md`): which setting helps depends on the horizon.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from rollout_settings import SETTINGS, rollout_setting, window_length

from pipekit_train.core import (
    Checkpoint,
    Cycle,
    LocalModelRegistry,
    NeuralForward,
    Rollout,
    TrainingLoop,
    TrajectoryWindows,
)
from pipekit_train.core.data import (
    CachedDataset,
    Normalizer,
    SimulationDataset,
    Trajectories,
    fit_trajectory_normalizer,
)

# -- the simulator: Gray–Scott reaction–diffusion on a periodic grid --------------------------
# u_t = Du ∇²u − u v² + F (1 − u),   v_t = Dv ∇²v + u v² − (F + k) v
# dimensionless: grid spacing 1, time step DT; u is the substrate, v the autocatalyst.

GRID = 32  # cells per side
DU, DV = 0.2, 0.1  # diffusivities [cell² per unit time]
FEED, KILL = 0.04, 0.06  # feed rate F and kill rate k [per unit time]
DT = 1.0  # the simulator's (explicit Euler) time step
INNER = 5  # simulator steps per emulator step
BURN_IN = 80  # training states are drawn after 0..BURN_IN emulator steps of evolution
START = 10  # rollouts start from held-out states after START emulator steps
TRAINING = "one-step"  # the default rollout-training setting (see the module doc)


def _laplacian(a: np.ndarray) -> np.ndarray:
    """The periodic 5-point Laplacian over the last two axes."""
    pad = [(0, 0)] * (a.ndim - 2) + [(1, 1), (1, 1)]
    p = np.pad(a, pad, mode="wrap")
    return p[..., :-2, 1:-1] + p[..., 2:, 1:-1] + p[..., 1:-1, :-2] + p[..., 1:-1, 2:] - 4.0 * a


def gray_scott(state: np.ndarray, n_steps: int = INNER) -> np.ndarray:
    """Advance channels-last fields `(..., H, W, 2)` (u, v) by `n_steps` Euler steps (float64)."""
    state = np.asarray(state, dtype=np.float64)
    u, v = state[..., 0], state[..., 1]
    for _ in range(n_steps):
        uvv = u * v * v
        u, v = (
            u + DT * (DU * _laplacian(u) - uvv + FEED * (1.0 - u)),
            v + DT * (DV * _laplacian(v) + uvv - (FEED + KILL) * v),
        )
    return np.stack([u, v], axis=-1)


def initial_state(rng: np.random.Generator, size: int = GRID) -> np.ndarray:
    """The homogeneous state (u, v) = (1, 0) seeded with 2–5 Gaussian patches of v, plus noise."""
    state = np.zeros((size, size, 2))
    state[..., 0] = 1.0
    yy, xx = np.mgrid[0:size, 0:size]
    for _ in range(rng.integers(2, 6)):
        cx, cy, r = rng.uniform(0, size), rng.uniform(0, size), rng.uniform(2.0, 5.0)
        dx = (xx - cx + size / 2) % size - size / 2  # periodic distance
        dy = (yy - cy + size / 2) % size - size / 2
        patch = np.exp(-(dx**2 + dy**2) / (2 * r * r))
        state[..., 0] -= 0.5 * patch
        state[..., 1] += 0.25 * patch
    return state + rng.normal(0.0, 0.01, state.shape)


def sample_initial(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A training trajectory's initial state (the simulator's parameters)."""
    return {"x0": initial_state(rng).astype(np.float32)}


def trajectory(params: dict[str, np.ndarray]) -> np.ndarray:
    """Simulator output for training: the states after 0..BURN_IN emulator steps of
    evolution from `params["x0"]`, `(BURN_IN + 1, H, W, 2)`."""
    states = [np.asarray(params["x0"], dtype=np.float64)]
    for _ in range(BURN_IN):
        states.append(gray_scott(states[-1]))
    return np.stack(states).astype(np.float32)


def windows(trajectories: Trajectories, rollout: Rollout | None) -> TrajectoryWindows:
    """Windows of `k + 1` consecutive states over `trajectories`, targets the increments."""
    return TrajectoryWindows(trajectories, k=window_length(rollout), targets="increments")


def training_data(
    cache: CachedDataset, rollout: Rollout | None
) -> tuple[TrajectoryWindows, TrajectoryWindows, Normalizer]:
    """Training and validation windows of the cached trajectories, split by trajectory
    (never by window), and their per-channel statistics (pooled over the grid)."""
    train, val = Trajectories.from_dataset(cache, state_key="states").split((0.9, 0.1), seed=0)
    normalizer = fit_trajectory_normalizer(train, residual=True)
    return windows(train, rollout), windows(val, rollout), normalizer


def model_op(backend: str, width: int = 16, depth: int = 3, seed: int = 0) -> Any:
    """The backend's periodic `conv_net` on channels-last (u, v) fields."""
    kwargs: dict[str, Any] = {
        "in_channels": 2,
        "out_channels": 2,
        "width": width,
        "depth": depth,
        "seed": seed,
    }
    if backend == "equinox":
        from pipekit_train.equinox import EquinoxModelOp

        return EquinoxModelOp("pipekit_train.equinox.testing:conv_net", **kwargs)
    if backend == "lightning":
        from pipekit_train.lightning import TorchModelOp

        return TorchModelOp(
            "pipekit_train.lightning.testing:conv_net", layout="channels_last", **kwargs
        )
    if backend == "keras":
        os.environ.setdefault("KERAS_BACKEND", "jax")
        from pipekit_train.keras import KerasModelOp

        return KerasModelOp("pipekit_train.keras.testing:conv_net", **kwargs)
    raise SystemExit(f"unknown backend {backend!r}: use equinox, lightning or keras")


def held_out_states(n: int = 3, seed: int = 12345) -> np.ndarray:
    """`n` initial states not in the training set, evolved for START emulator steps."""
    rng = np.random.default_rng(seed)
    states = np.stack([initial_state(rng) for _ in range(n)])
    return gray_scott(states, START * INNER).astype(np.float32)


def rollout_error(emulated: np.ndarray, simulated: np.ndarray) -> float:
    """Relative trajectory error ‖emulated − simulated‖ / ‖simulated‖ over all fields and steps."""
    return float(np.linalg.norm(emulated - simulated) / np.linalg.norm(simulated))


def error_growth(emulated: np.ndarray, simulated: np.ndarray) -> np.ndarray:
    """Per step and state: ‖emulated − simulated‖ / ‖simulated‖ over the grid, `(steps+1, n)`."""
    axes = (2, 3, 4)
    diff = np.sqrt(((emulated - simulated) ** 2).sum(axis=axes))
    return diff / np.sqrt((simulated**2).sum(axis=axes))


def rollout_figure(
    simulated: np.ndarray, emulated: np.ndarray, backend: str, error: float, persistence: float
) -> Any:
    """True vs emulated v at four times for one held-out state, the difference, error growth.

    Args:
        simulated, emulated: trajectories `(n_steps + 1, n_states, H, W, 2)`, as `Cycle.run`
            returns them for a batch of states.
        backend: the emulator's backend (for the title).
        error: the relative trajectory error (for the title).
        persistence: the same error of the persistence forecast (the state never changes).

    Returns:
        A matplotlib `Figure` (Agg canvas; no pyplot state).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_steps = simulated.shape[0] - 1
    times = [0, n_steps // 5, n_steps // 2, n_steps]
    fig = Figure(figsize=(15, 8.2), dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(3, 7, width_ratios=[1, 1, 1, 1, 0.06, 0.45, 2.3], wspace=0.12)
    v_sim, v_emu = simulated[:, 0, ..., 1], emulated[:, 0, ..., 1]
    vmax = float(max(v_sim.max(), v_emu.max()))
    dmax = float(np.abs(v_emu - v_sim)[times].max()) or 1.0
    rows = [
        ("simulator v", v_sim, "viridis", (0.0, vmax)),
        (f"emulator v ({backend})", v_emu, "viridis", (0.0, vmax)),
        ("emulator − simulator", v_emu - v_sim, "RdBu_r", (-dmax, dmax)),
    ]
    for r, (label, fields, cmap, (lo, hi)) in enumerate(rows):
        for c, t in enumerate(times):
            ax = fig.add_subplot(grid[r, c])
            image = ax.imshow(fields[t], cmap=cmap, vmin=lo, vmax=hi, origin="lower")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"step {t} (t = {t * INNER * DT:g})", fontsize=9)
            if c == 0:
                ax.set_ylabel(label, fontsize=9)
        fig.colorbar(image, cax=fig.add_subplot(grid[r, 4]))
    err = fig.add_subplot(grid[:, 6])
    growth = error_growth(emulated, simulated)
    still = error_growth(np.broadcast_to(simulated[:1], simulated.shape), simulated)
    steps = np.arange(n_steps + 1)
    for i in range(growth.shape[1]):
        err.plot(steps[1:], growth[1:, i], color=f"C{i}", label=f"emulator, state {i}")
        err.plot(steps[1:], still[1:, i], color=f"C{i}", ls=":", label=f"persistence, state {i}")
    err.set(
        xlabel=f"emulator step ({INNER} simulator steps each)",
        ylabel="relative field error ‖Δ(u, v)‖ / ‖(u, v)‖",
        yscale="log",
        title="error growth (dotted: persistence forecast)",
    )
    err.grid(True, alpha=0.3)
    err.legend(fontsize=7, ncol=2, loc="lower right")
    fig.suptitle(
        f"Gray–Scott on a {simulated.shape[2]}×{simulated.shape[3]} periodic grid "
        f"(F = {FEED:g}, k = {KILL:g}): {backend} emulator vs simulator, {n_steps} steps from "
        f"{simulated.shape[1]} held-out states; relative trajectory error {error:.2%} "
        f"(persistence {persistence:.1%}). Images: state 0.",
        fontsize=10,
    )
    return fig


def training_loop(
    backend: str,
    train: Any,
    val: Any,
    normalizer: Normalizer,
    *,
    steps: int,
    rollout: Rollout | None = None,
    batch_size: int = 32,
    width: int = 16,
    depth: int = 3,
    checkpoint: Checkpoint | None = None,
    callbacks: Any = (),
) -> TrainingLoop:
    """The example's training description (conv net, MSE on the normalised increment, Adam
    with warm-up cosine, trained through `rollout`), the same on every backend.

    `train` and `val` are trajectory windows of the rollout's length (`windows`).
    """
    return TrainingLoop(
        model=model_op(backend, width=width, depth=depth, seed=0),
        data=train,
        validation=val,
        normalizer=normalizer,
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
        validate_every_n_steps=max(1, steps // 5),
        checkpoint=checkpoint,
        callbacks=list(callbacks),
        seed=0,
        progress=False,
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="equinox", choices=["equinox", "lightning", "keras"])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument(
        "--trajectories", type=int, default=48, help=f"simulated, {BURN_IN + 1} states each"
    )
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--training",
        default=TRAINING,
        choices=SETTINGS,
        help=f"how to train through the rollout (rollout_settings.py; default {TRAINING!r})",
    )
    parser.add_argument("--rollout", type=int, default=50, help="emulator steps rolled out")
    parser.add_argument(
        "--out-of-core",
        action="store_true",
        help="read the cache chunk by chunk (a 4 MiB memory budget) instead of loading it",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "field_emulator"))
    args = parser.parse_args(argv)
    if args.trajectories < 10:
        parser.error(
            f"Received: --trajectories={args.trajectories}, but a tenth of them (at least one) "
            "is held out for validation. Use --trajectories 10 or more."
        )
    root = Path(args.out)
    out = root / args.backend
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time; the cache is kept
    out.mkdir(parents=True, exist_ok=True)

    # 1. simulate on demand, deterministic per (seed, index): one trajectory of BURN_IN + 1
    # states per item; cache to zarr, 4 trajectories a chunk. The cache is shared by every
    # backend (a rebuild of the same source is a no-op).
    sims = SimulationDataset(
        trajectory, sample_initial, n=args.trajectories, seed=0, output_key="states"
    )
    read: dict[str, Any] = {"memory_budget_bytes": 4 * 2**20} if args.out_of_core else {}
    uri = root / f"cache-{args.trajectories}.zarr"
    cache = CachedDataset.build(sims, uri, chunk_size=4, **read)

    # 2. train the conv net on the normalised increment, through the rollout (`--training`)
    rollout = rollout_setting(args.training, args.steps)
    train, val, norm = training_data(cache, rollout)
    loop = training_loop(
        args.backend,
        train,
        val,
        norm,
        steps=args.steps,
        rollout=rollout,
        batch_size=args.batch_size,
        width=args.width,
        depth=args.depth,
        checkpoint=Checkpoint(out / "checkpoints", every_n_steps=max(1, args.steps // 3)),
    )
    artifact = loop.run()
    print(artifact.summary())

    # 3. hand over: register, load it back (SHA-256 verified), wrap as a forward operator
    registry = LocalModelRegistry(out / "registry")
    record = artifact.register(registry, "gray-scott-emulator")
    loaded_record, model = registry.load_record_and_model("gray-scott-emulator")
    assert model.serialize_weights() == artifact.model.serialize_weights()
    forward = NeuralForward.from_record(loaded_record, model, residual=True, state_ndim=3)

    # 4. roll out from held-out states, next to the simulator (both take a batch of fields)
    x0 = held_out_states()
    simulated = Cycle(lambda s: gray_scott(s).astype(np.float32), args.rollout).run(x0)
    emulated = Cycle(forward, args.rollout).run(x0)
    error = rollout_error(emulated, simulated)
    persistence = rollout_error(np.broadcast_to(simulated[:1], simulated.shape), simulated)
    rollout_figure(simulated, emulated, args.backend, error, persistence).savefig(
        out / "rollout.png"
    )
    artifact.history.plot(out / "loss.png")
    print(f"registered {record.name} v{record.version} at {record.uri}")
    print(
        f"{args.rollout}-step rollout from {len(x0)} held-out states: relative trajectory "
        f"error = {error:.3%} (persistence forecast: {persistence:.1%})"
    )
    print(f"figures: {out / 'rollout.png'}, {out / 'loss.png'}")
    return {"rollout_error": error, "persistence_error": persistence, **artifact.final_metrics}


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    main()

"""Side-by-side: the Keras adapter (`TrainingLoop` + `Keras()`) vs plain `model.fit`.

Same model factory, same arrays, same batch size, optimizer and `steps_per_execution`,
jax backend by default. Each run trains `epochs` passes of `steps_per_epoch` steps; the
first pass is warm-up (build, XLA compile) and the rest is timed in-run: by Keras
`on_epoch_end` for plain `fit` (which keeps Keras's default callback dispatch), by a core
`on_step_end` callback for the adapter. Steps/s, best of `--repeats` (interleaved, so
load from other processes hits both sides alike).

Baselines:
- `fit`: plain `model.fit(x, y, batch_size, shuffle=True, verbose=0)`.
- `fit+cb`: the same with a no-op `on_train_batch_end` callback (Keras then dispatches
  callbacks synchronously, as it does for the adapter; see LIBRARY-NOTES).

Usage:
    uv run python benchmarks/bench_keras.py                 # jax (or $KERAS_BACKEND)
    uv run python benchmarks/bench_keras.py --backend torch # torch (steps_per_execution=1 only)
    uv run python benchmarks/bench_keras.py --quick --json /tmp/keras.json   # run_all convention

`--quick` runs the same cases, best of 2 runs of 3 epochs (1 warm-up + 2 timed) instead
of best of 3 runs of 4 epochs (explicit `--repeats` / `--epochs` win). `--json PATH`
also writes one row per loop, case and `steps_per_execution` (the convention in
`benchmarks/run_all.py`): steps/s, with `ratio` = that rate ÷ plain `fit`'s (the
reference; > 1: faster than it). No target is set. The backend is chosen per process
(`--backend` or `KERAS_BACKEND`, read before keras is imported); run the script once per
backend.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from _shared import apply_quick, row, write_rows


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Keras adapter vs plain model.fit")
    p.add_argument(
        "--backend", default=os.environ.get("KERAS_BACKEND", "jax"), choices=["jax", "torch"]
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4, help="passes per run (the first is warm-up)")
    p.add_argument(
        "--quick", action="store_true", help="best of 2 runs of 3 epochs instead of 3 of 4"
    )
    p.add_argument("--json", help="also write the result rows (run_all format) to this path")
    args = p.parse_args()
    apply_quick(p, args, {"repeats": 2, "epochs": 3})
    return args


ARGS = parse()
os.environ["KERAS_BACKEND"] = ARGS.backend

import keras  # noqa: E402
import numpy as np  # noqa: E402

from pipekit_train.core import TrainingLoop  # noqa: E402
from pipekit_train.core.data import ArrayDataset  # noqa: E402
from pipekit_train.keras import Keras, KerasModelOp  # noqa: E402

FACTORY = "pipekit_train.keras.testing:mlp"  # ReLU MLP in → width × depth → out

CASES = [
    # name, factory kwargs, steps per epoch, batch
    (
        "MLP 8-256-256-1 b256",
        {"in_size": 8, "out_size": 1, "width": 256, "depth": 2, "activation": "relu"},
        100,
        256,
    ),
    (
        "MLP 2-32-1 b32",
        {"in_size": 2, "out_size": 1, "width": 32, "depth": 1, "activation": "relu"},
        300,
        32,
    ),
]


class EpochTimer(keras.callbacks.Callback):
    """Times at the end of each epoch (keeps Keras's default batch dispatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_epoch_end(self, epoch, logs=None):  # noqa: D102
        # wait for the device: without a per-step callback nothing else blocks
        keras.ops.convert_to_numpy(self.model.trainable_variables[0].value)
        self.times.append(time.perf_counter())


class NoOp(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: D102
        pass


class StepTimer:
    """A core callback: time at the end of the warm-up pass and at the last step."""

    def __init__(self, warm: int, total: int) -> None:
        self.warm, self.total, self.times = warm, total, []

    def on_step_end(self, state) -> None:  # noqa: D102
        if state.step in (self.warm, self.total):
            self.times.append(time.perf_counter())


def data(rows: int, in_size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, in_size)).astype(np.float32)
    y = np.sin(x).sum(axis=1, keepdims=True).astype(np.float32)
    return x, y


def run_plain(
    kwargs: dict, x: np.ndarray, y: np.ndarray, batch: int, spe: int, k: int, cb: bool
) -> float:
    model = KerasModelOp(FACTORY, seed=0, **kwargs).model
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", steps_per_execution=k)
    timer = EpochTimer()
    callbacks = [timer, NoOp()] if cb else [timer]
    model.fit(
        x, y, batch_size=batch, epochs=ARGS.epochs, shuffle=True, verbose=0, callbacks=callbacks
    )
    return (ARGS.epochs - 1) * spe / (timer.times[-1] - timer.times[0])


def run_adapter(kwargs: dict, x: np.ndarray, y: np.ndarray, batch: int, spe: int, k: int) -> float:
    total = ARGS.epochs * spe
    timer = StepTimer(spe, total)
    TrainingLoop(
        model=KerasModelOp(FACTORY, seed=0, **kwargs),
        data=ArrayDataset(x=x, y=y),
        loss="mse",
        optimizer_config={"name": "adam", "lr": 1e-3},
        batch_size=batch,
        max_steps=total,
        adapter=Keras(steps_per_execution=k),
        callbacks=[timer],
        progress=False,
    ).run()
    return (total - spe) / (timer.times[-1] - timer.times[0])


def result_rows(
    name: str, spe: int, k: int, plain: float, plain_cb: float, ours: float
) -> list[dict[str, Any]]:
    """The rows of one case and `steps_per_execution` (see run_all.py)."""
    backend = keras.backend.backend()
    metric = (
        f"steps/s, best of {ARGS.repeats} ({ARGS.epochs - 1} timed epochs of {spe} steps; "
        "ratio: ÷ plain model.fit)"
    )
    loops = [
        ("plain model.fit", plain, "reference"),
        (
            "model.fit + no-op batch callback",
            plain_cb,
            "synchronous callback dispatch, as for the adapter",
        ),
        ("adapter (TrainingLoop + Keras)", ours, f"{ours / plain_cb:.2f}x fit + no-op callback"),
    ]
    return [
        row(
            "keras",
            f"{name}, {backend}, steps_per_execution={k}: {label}",
            metric,
            value,
            "steps/s",
            ratio=value / plain,
            note=note,
            digits=1,
        )
        for label, value, note in loops
    ]


def main() -> None:
    ks = (1, 10) if ARGS.backend == "jax" else (1,)
    print(
        f"keras {keras.__version__}, backend {keras.backend.backend()}, best of {ARGS.repeats}, "
        f"{ARGS.epochs - 1} timed epochs after 1 warm-up epoch"
    )
    header = f"{'case':22s} {'K':>3s} {'fit':>8s} {'fit+cb':>8s} {'adapter':>8s} {'adapter/fit':>12s} {'adapter/fit+cb':>15s}"
    print(header)
    print("-" * len(header))
    rows: list[dict[str, Any]] = []
    for name, kwargs, spe, batch in CASES:
        x, y = data(spe * batch, kwargs["in_size"])
        for k in ks:
            plain = plain_cb = ours = 0.0
            for _ in range(ARGS.repeats):
                plain = max(plain, run_plain(kwargs, x, y, batch, spe, k, False))
                plain_cb = max(plain_cb, run_plain(kwargs, x, y, batch, spe, k, True))
                ours = max(ours, run_adapter(kwargs, x, y, batch, spe, k))
            print(
                f"{name:22s} {k:3d} {plain:8.0f} {plain_cb:8.0f} {ours:8.0f} {ours / plain:12.2f} {ours / plain_cb:15.2f}",
                flush=True,
            )
            rows += result_rows(name, spe, k, plain, plain_cb, ours)
    print("(steady-state steps/s; higher is better)")
    if ARGS.json:
        write_rows(ARGS.json, rows)


if __name__ == "__main__":
    main()

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
from typing import Any

from _shared import Clock, apply_quick, keras_epoch_ticks, make_parser, mlp_op, row, write_rows


def parse() -> argparse.Namespace:
    p = make_parser(__doc__, quick_help="best of 2 runs of 3 epochs instead of 3 of 4", repeats=3)
    p.add_argument(
        "--backend", default=os.environ.get("KERAS_BACKEND", "jax"), choices=["jax", "torch"]
    )
    p.add_argument("--epochs", type=int, default=4, help="passes per run (the first is warm-up)")
    args = p.parse_args()
    apply_quick(p, args, {"repeats": 2, "epochs": 3})
    return args


ARGS = parse()
os.environ["KERAS_BACKEND"] = ARGS.backend

import keras  # noqa: E402
import numpy as np  # noqa: E402

from pipekit_train.core import TrainingLoop  # noqa: E402
from pipekit_train.core.data import ArrayDataset  # noqa: E402
from pipekit_train.keras import Keras  # noqa: E402

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


class NoOp(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: D102
        pass


def data(rows: int, in_size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, in_size)).astype(np.float32)
    y = np.sin(x).sum(axis=1, keepdims=True).astype(np.float32)
    return x, y


def run_plain(
    kwargs: dict, x: np.ndarray, y: np.ndarray, batch: int, spe: int, k: int, cb: bool
) -> float:
    model = mlp_op("keras", **kwargs).model  # testing:mlp, in → width × depth → out
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", steps_per_execution=k)
    clock = Clock(spe, ARGS.epochs * spe)  # the first epoch warms up
    ticks = keras_epoch_ticks(clock, spe)
    callbacks = [ticks, NoOp()] if cb else [ticks]
    model.fit(
        x, y, batch_size=batch, epochs=ARGS.epochs, shuffle=True, verbose=0, callbacks=callbacks
    )
    return clock.rate()


def run_adapter(kwargs: dict, x: np.ndarray, y: np.ndarray, batch: int, spe: int, k: int) -> float:
    clock = Clock(spe, ARGS.epochs * spe)  # the first pass warms up
    TrainingLoop(
        model=mlp_op("keras", **kwargs),
        data=ArrayDataset(x=x, y=y),
        loss="mse",
        optimizer_config={"name": "adam", "lr": 1e-3},
        batch_size=batch,
        max_steps=clock.total,
        adapter=Keras(steps_per_execution=k),
        callbacks=[clock],
        progress=False,
    ).run()
    return clock.rate()


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

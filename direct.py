"""Direct regression: an MLP learns y = sin(2·x0) + x1² − 0.5·x2 on synthetic data.

    uv run examples/direct.py --backend equinox --steps 1500

Swap `--backend` for `lightning` or `keras`: the data, loss, optimizer, callbacks,
writers and checkpoint policy stay the same.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import toymodels

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.callbacks import EarlyStopping
from pipekit_train.core.data import ArrayDataset, split
from pipekit_train.core.writers import JsonlWriter


def make_data(n: int = 4096, seed: int = 0) -> ArrayDataset:
    """The synthetic regression task."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(n, 3)).astype(np.float32)
    y = np.sin(2 * x[:, :1]) + x[:, 1:2] ** 2 - 0.5 * x[:, 2:3] + 0.02 * rng.standard_normal((n, 1))
    return ArrayDataset(x=x, y=y.astype(np.float32))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="equinox", choices=["equinox", "lightning", "keras"])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "direct"))
    args = parser.parse_args(argv)
    out = Path(args.out) / args.backend
    out.mkdir(parents=True, exist_ok=True)

    train, val, test = split(make_data(), (0.8, 0.1, 0.1), seed=0)
    loop = TrainingLoop(
        model=toymodels.model_op(args.backend, in_size=3, out_size=1, width=64, seed=0),
        data=train,
        validation=val,
        loss="mse",
        metrics=["mae", "r2"],
        optimizer_config={"name": "adam", "lr": 3e-3},
        batch_size=64,
        max_steps=args.steps,
        validate_every_n_steps=max(1, args.steps // 10),
        callbacks=[EarlyStopping("val_loss", patience=5)],
        writers=[JsonlWriter(str(out / "metrics.jsonl"))],
        checkpoint=Checkpoint(
            out / "checkpoints", every_n_steps=max(1, args.steps // 3), resume="auto"
        ),
        seed=0,
    )
    artifact = loop.run()
    batch = test.get_batch(np.arange(len(test)))
    pred = np.asarray(artifact.model(batch["x"]))
    test_rmse = float(np.sqrt(np.mean((pred - batch["y"]) ** 2)))
    artifact.history.plot(out / "loss.png")
    print(artifact.summary())
    print(
        f"test RMSE = {test_rmse:.4f} (target std {float(batch['y'].std()):.3f}); loss curves: {out / 'loss.png'}"
    )
    return {"test_rmse": test_rmse, **artifact.final_metrics}


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    main()

"""One TrainingLoop description on all three backends reaches the same loss.

A linear model on the core regression task (same data, loss, optimizer, seed, batch size
and steps; the same batch order from the shared grain engine). Weight initialisation is
each framework's own, so the check is on the converged loss: every backend must end
within 2e-3 of the others (the noise floor is 1e-4).
"""

from __future__ import annotations

import numpy as np
import toymodels  # noqa: F401  (puts the examples on the path for the conftest)

from pipekit_train.core import TrainingLoop
from pipekit_train.core.data import make_batches
from pipekit_train.core.testing import regression_task

TOLERANCE = 2e-3


def _model(backend: str):  # type: ignore[no-untyped-def]
    if backend == "equinox":
        from pipekit_train.equinox import EquinoxModelOp

        return EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=1, seed=0)
    if backend == "lightning":
        from pipekit_train.lightning import LightningModelOp

        return LightningModelOp(
            "pipekit_train.lightning.testing:linear", in_size=4, out_size=1, seed=0
        )
    from pipekit_train.keras import KerasModelOp

    return KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1, seed=0)


def test_same_description_same_loss_on_every_backend() -> None:
    train, val = regression_task()
    finals = {}
    for backend in ("equinox", "lightning", "keras"):
        art = TrainingLoop(
            model=_model(backend),
            data=train,
            validation=val,
            loss="mse",
            optimizer_config={"name": "adam", "lr": 0.05},
            batch_size=32,
            max_steps=300,
            seed=0,
            progress=False,
        ).run()
        finals[backend] = art.final_metrics["val_loss"]
    print("final val_loss per backend:", finals)
    values = np.array(list(finals.values()))
    assert values.max() < 5e-3
    assert values.max() - values.min() < TOLERANCE


def test_the_batch_order_is_shared() -> None:
    train, _ = regression_task()
    a = [b["x"] for _, b in zip(range(20), make_batches(train, 32, seed=7), strict=False)]
    b = [b["x"] for _, b in zip(range(20), make_batches(train, 32, seed=7), strict=False)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)

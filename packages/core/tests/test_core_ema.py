"""`optimizer_config["ema"]`: parsed once in core; the numpy reference keeps the average."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipekit_train.core import ConfigError, TrainingLoop, evaluate
from pipekit_train.core.adapter import optimizer_spec
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task


def test_ema_is_a_decay_or_a_dict_with_one() -> None:
    assert optimizer_spec({"name": "adam", "ema": 0.999}).ema == 0.999
    assert optimizer_spec({"name": "sgd", "ema": {"decay": 0.5}}).ema == 0.5
    assert optimizer_spec({"name": "adam", "ema": 0}).ema == 0.0
    assert optimizer_spec({"name": "adam", "ema": 0.9}).to_config()["ema"] == 0.9
    # unset: the canonical config (and every digest of it) is what it was before `ema`
    assert "ema" not in optimizer_spec({"name": "adam"}).to_config()
    assert optimizer_spec({"name": "adam"}).ema is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (1.5, "Received: ema=1.5, but the decay must be in [0, 1)"),
        (1, "Received: ema=1, but the decay must be in [0, 1)"),
        (-0.1, "Received: ema=-0.1"),
        (True, "Received: ema=True"),
        ("0.9", "Received: ema='0.9'"),
        ({"decay": 2.0}, "Received: ema=2.0"),
        ({"decay": 0.9, "every": 2}, "takes one key, `decay`"),
    ],
)
def test_bad_ema_is_refused_naming_the_value(value: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        optimizer_spec({"name": "adam", "ema": value})
    assert fragment in str(info.value)


def _loop(steps: int, ema: float | None = None, **kw: Any) -> TrainingLoop:
    train, val = regression_task(n_train=128, in_size=2)
    config: dict[str, Any] = {"name": "adam", "lr": 0.05}
    if ema is not None:
        config["ema"] = ema
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=1),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config=config,
        batch_size=16,
        max_steps=steps,
        validate_every_n_steps=steps,
        adapter=NumpyAdapter(),
        progress=False,
        **kw,
    )


def test_the_bad_value_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match="ema=1.5"):
        _loop(4, ema=1.5)


def test_numpy_reference_keeps_the_average_of_every_update() -> None:
    decay, steps = 0.7, 6
    art = _loop(steps, ema=decay).run()
    # the hand-written average over the trained weights after each update
    params = [_loop(1).plan.model.model.parameters()]  # the initial weights
    params += [_loop(k).run().model.model.parameters() for k in range(1, steps + 1)]
    ema = {k: v.astype(np.float64) for k, v in params[0].items()}
    for p in params[1:]:
        ema = {k: decay * ema[k] + (1 - decay) * p[k] for k in ema}
    got = art.model.model.parameters()
    for key, value in ema.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-7)
    # the raw model is the trained weights, byte for byte
    assert art.raw_model.serialize_weights() == _loop(steps).run().model.serialize_weights()
    assert art.raw_model is not art.model
    # validation used the average: its val_loss is the average's loss, not the raw one's
    _, val = regression_task(n_train=128, in_size=2)
    assert art.final_metrics["val_loss"] == pytest.approx(
        evaluate(art.model, val, loss="mse", batch_size=16)["loss"], rel=1e-6
    )
    raw_loss = evaluate(art.raw_model, val, loss="mse", batch_size=16)["loss"]
    assert abs(art.final_metrics["val_loss"] - raw_loss) > 1e-6


def test_without_ema_the_raw_model_is_the_model() -> None:
    art = _loop(3).run()
    assert art.raw_model is art.model

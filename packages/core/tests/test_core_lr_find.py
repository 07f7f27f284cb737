"""`lr_find`: the learning-rate range test on core's run (numpy reference backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop, lr_find
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task
from pipekit_train.core.train._lr_find import suggest


def _loop(tmp_path: Path | None = None, **overrides: object) -> TrainingLoop:
    train, val = regression_task(n_train=512, n_val=64, in_size=3)
    kwargs: dict = {
        "model": NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1),
        "data": train,
        "validation": val,
        "optimizer_config": {"name": "sgd", "lr": 0.01},
        "batch_size": 32,
        "max_steps": 1000,
        "adapter": NumpyAdapter(),
        "progress": False,
    }
    if tmp_path is not None:
        kwargs["checkpoint"] = Checkpoint(tmp_path / "ck", every_n_steps=5)
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def test_the_ramp_is_geometric_and_the_suggestion_lies_where_the_loss_falls(
    tmp_path: Path,
) -> None:
    result = lr_find(_loop(tmp_path), min_lr=1e-4, max_lr=10.0, num_steps=60)
    rates = np.asarray(result.learning_rates)
    assert rates[0] == pytest.approx(1e-4)
    ratios = rates[1:] / rates[:-1]
    np.testing.assert_allclose(ratios, (10.0 / 1e-4) ** (1 / 60), rtol=1e-9)
    # plain SGD on a linear model diverges at large rates: the test stops early
    assert result.stopped_early and len(result.losses) < 60
    smoothed = np.asarray(result.smoothed)
    best = int(np.nanargmin(smoothed))
    assert result.learning_rates[0] < result.suggestion <= result.learning_rates[best]
    i = result.learning_rates.index(result.suggestion)
    assert smoothed[i + 1] < smoothed[i - 1]  # falling at the suggestion
    assert smoothed[best] < 0.5 * smoothed[0]
    assert not (tmp_path / "ck").exists()  # the loop's checkpoint directory is untouched


def test_plot(tmp_path: Path) -> None:
    result = lr_find(_loop(), min_lr=1e-3, max_lr=1.0, num_steps=20)
    path = result.plot(tmp_path / "lr.png")
    assert Path(path).stat().st_size > 5000


def test_suggest_on_a_known_curve() -> None:
    lrs = list(np.logspace(-5, 0, 51))
    # flat, then a steep fall centred at 1e-2, then a rise
    x = np.log10(lrs)
    loss = list(1 / (1 + np.exp(4 * (x + 2))) + np.where(x > -0.8, 5 * (x + 0.8) ** 2, 0))
    assert suggest(lrs, loss) == pytest.approx(1e-2, rel=0.3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_lr": 0}, r"Received: min_lr=0"),
        ({"min_lr": 1.0, "max_lr": 0.5}, r"min_lr=1.0, max_lr=0.5"),
        ({"num_steps": 2}, r"Received: num_steps=2"),
        ({"smoothing": 1.0}, r"Received: smoothing=1.0"),
        ({"diverge_factor": 1}, r"Received: diverge_factor=1"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        lr_find(_loop(), **kwargs)

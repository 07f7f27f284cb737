"""Shared fixtures of the pipekit-train-equinox tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipekit_train.core import TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.equinox import EquinoxModelOp


@pytest.fixture(scope="session")
def regression() -> tuple[Any, Any]:
    """The conformance regression task: `(train, validation)`, 4 → 1."""
    return regression_task()


@pytest.fixture
def make_loop(regression: tuple[Any, Any]) -> Callable[..., TrainingLoop]:
    """`make_loop(factory="linear", model_kwargs=None, **loop_overrides)` on the regression task."""

    def make(
        factory: str = "linear", model_kwargs: dict[str, Any] | None = None, **overrides: Any
    ) -> TrainingLoop:
        train, val = regression
        kwargs: dict[str, Any] = {
            "model": EquinoxModelOp(
                f"pipekit_train.equinox.testing:{factory}",
                in_size=4,
                out_size=1,
                seed=0,
                **(model_kwargs or {}),
            ),
            "data": train,
            "validation": val,
            "loss": "mse",
            "optimizer_config": {"name": "adam", "lr": 0.02},
            "batch_size": 16,
            "max_steps": 20,
            "seed": 0,
            "progress": False,
        }
        kwargs.update(overrides)
        return TrainingLoop(**kwargs)

    return make

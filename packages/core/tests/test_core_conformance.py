"""The conformance suite, run against the pure-numpy reference adapter."""

from __future__ import annotations

from typing import Any

from pipekit_train.core.testing import AdapterConformance, NumpyAdapter, NumpyLinearOp


class TestNumpyConformance(AdapterConformance):
    optimizer_config = {"name": "adam", "lr": 0.05}

    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        return NumpyLinearOp(
            "pipekit_train.core.testing._numpy_model:linear",
            in_size=in_size,
            out_size=out_size,
            seed=seed,
        )

    def make_adapter(self) -> Any:
        # gradient noise draws from the run's RNG, so exact resume covers RNG state
        return NumpyAdapter(gradient_noise=1e-3)

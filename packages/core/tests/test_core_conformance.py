"""The conformance suite, run against the pure-numpy reference adapter."""

from __future__ import annotations

from typing import Any

from pipekit_train.core.testing import AdapterConformance, NumpyAdapter, NumpyLinearOp


class TestNumpyConformance(AdapterConformance):
    # the kill-and-resume workers fork from a server that imported these
    worker_preload = ("pipekit_train.core", "grain")

    optimizer_config = {"name": "adam", "lr": 0.05}
    flow_resume = False  # NumpyAdapter's analytic gradients are mse's only

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


def test_the_bad_input_table() -> None:
    """At least 45 distinct cases (each runs on every backend's conformance class)."""
    from pipekit_train.core.testing import BAD_INPUTS

    ids = [case[0] for case in BAD_INPUTS]
    assert len(ids) >= 45 and len(set(ids)) == len(ids)

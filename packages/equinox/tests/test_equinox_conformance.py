"""The core adapter conformance suite, run against the Equinox adapter."""

from __future__ import annotations

from typing import Any

from pipekit_train.core.testing import AdapterConformance
from pipekit_train.equinox import Equinox, EquinoxModelOp


class TestEquinoxConformance(AdapterConformance):
    # the kill-and-resume workers fork from a server that imported these
    worker_preload = ("pipekit_train.equinox", "equinox", "optax", "orbax.checkpoint", "grain")

    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        return EquinoxModelOp(
            "pipekit_train.equinox.testing:linear", in_size=in_size, out_size=out_size, seed=seed
        )


class TestEquinoxFusedConformance(AdapterConformance):
    """The same suite with 4 steps fused per compiled call."""

    # the kill-and-resume workers fork from a server that imported these
    worker_preload = ("pipekit_train.equinox", "equinox", "optax", "orbax.checkpoint", "grain")

    cloud_resume = False  # the S3 kill-and-resume runs once, in TestEquinoxConformance
    flow_resume = False  # so does the flow head's
    fencing_trial = False  # and the stall-and-takeover trial

    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        return EquinoxModelOp(
            "pipekit_train.equinox.testing:linear", in_size=in_size, out_size=out_size, seed=seed
        )

    def make_adapter(self) -> Any:
        return Equinox(steps_per_execution=4)

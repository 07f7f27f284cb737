"""The shared adapter conformance suite, on the Keras backend of this process.

`uv run pytest` runs it on jax (also with `steps_per_execution=4`);
`test_keras_backends.py` runs this file again with `KERAS_BACKEND=torch` in a subprocess.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pipekit_train.core.testing import AdapterConformance
from pipekit_train.keras import Keras, KerasModelOp


class TestKerasConformance(AdapterConformance):
    # the kill-and-resume workers fork from a server that imported these
    worker_preload = ("keras", "pipekit_train.keras", "grain")

    subprocess_env = {"KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "jax")}
    # The S3 kill-and-resume subprocess runs once for Keras, on jax; the torch pass
    # covers the same store with the memory:// and local kill-and-resume tests.
    cloud_resume = os.environ.get("KERAS_BACKEND", "jax") == "jax"
    # the stall trial on S3: core's DirectoryCheckpointer on an fsspec store, which this
    # adapter saves through, runs there in the numpy reference's suite
    fencing_trial_s3 = False

    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        return KerasModelOp(
            "pipekit_train.keras.testing:linear", in_size=in_size, out_size=out_size, seed=seed
        )


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("KERAS_BACKEND", "jax") != "jax", reason="steps_per_execution > 1 is jax-only"
)
class TestKerasFusedStepsConformance(TestKerasConformance):
    """The suite again with `steps_per_execution=4`: same steps, same events, same bytes."""

    cloud_resume = False  # runs once, in TestKerasConformance
    flow_resume = False  # so does the flow head's kill-and-resume
    fencing_trial = False  # and the stall-and-takeover trial
    rollout_resume = (
        False  # and rollout training's (fused rollout updates: test_keras_rollout_training)
    )

    def make_adapter(self) -> Any:
        return Keras(steps_per_execution=4)

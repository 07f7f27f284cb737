"""The core conformance suite against the Lightning adapter."""

from __future__ import annotations

from typing import Any

from pipekit_train.core.testing import AdapterConformance
from pipekit_train.lightning import TorchModelOp


class TestLightningConformance(AdapterConformance):
    # the kill-and-resume workers fork from a server that imported these
    worker_preload = ("lightning.pytorch", "pipekit_train.lightning", "grain")
    # the stall trial on S3: core's DirectoryCheckpointer on an fsspec store, which this
    # adapter saves through, runs there in the numpy reference's suite
    fencing_trial_s3 = False

    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        return TorchModelOp(
            "pipekit_train.lightning.testing:linear", in_size=in_size, out_size=out_size, seed=seed
        )

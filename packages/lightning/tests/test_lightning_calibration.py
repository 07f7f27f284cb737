"""`CalibrationMonitor` on torch and Lightning: calibration every n updates through the run's evaluator
(`pipekit_train.core.testing.check_calibration_monitor`)."""

from __future__ import annotations

import pytest

from pipekit_train.core.testing import check_calibration_monitor
from pipekit_train.lightning import Lightning, Torch, TorchModelOp


@pytest.mark.parametrize("adapter", ["torch", "lightning"])
def test_monitor_logs_and_matches_the_artifact(adapter: str) -> None:
    check_calibration_monitor(
        TorchModelOp(
            "pipekit_train.lightning:deep_set",
            point_size=2,
            out_size=4,
            width=16,
            embed_size=8,
            depth=1,
            seed=0,
        ),
        Torch() if adapter == "torch" else Lightning(accelerator="cpu"),
    )

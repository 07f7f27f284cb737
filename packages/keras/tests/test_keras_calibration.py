"""`CalibrationMonitor` on Keras: calibration every n updates through the run's evaluator
(`pipekit_train.core.testing.check_calibration_monitor`)."""

from __future__ import annotations

from pipekit_train.core.testing import check_calibration_monitor
from pipekit_train.keras import KerasModelOp


def test_monitor_logs_and_matches_the_artifact() -> None:
    check_calibration_monitor(
        KerasModelOp(
            "pipekit_train.keras:deep_set",
            point_size=2,
            out_size=4,
            width=16,
            embed_size=8,
            depth=1,
            seed=0,
        )
    )

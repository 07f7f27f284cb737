"""`CalibrationMonitor` on Equinox: calibration every n updates through the run's evaluator
(`pipekit_train.core.testing.check_calibration_monitor`)."""

from __future__ import annotations

from pipekit_train.core.testing import check_calibration_monitor
from pipekit_train.equinox import EquinoxModelOp


def test_monitor_logs_and_matches_the_artifact() -> None:
    check_calibration_monitor(
        EquinoxModelOp(
            "pipekit_train.equinox:deep_set",
            point_size=2,
            out_size=4,
            width=16,
            embed_size=8,
            depth=1,
            seed=0,
        )
    )

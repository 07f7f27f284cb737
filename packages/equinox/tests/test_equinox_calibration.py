"""`CalibrationMonitor` on Equinox: calibration every n updates through the run's evaluator.

The monitor reads the model mid-run through `RunState.predict` (validation's evaluator);
at the last step its report must equal `artifact.calibration` on the same simulations
(the same weights read through the artifact's operator), and its scalars must reach the
metric writers at the steps asked for.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import (
    ArrayDataset,
    CalibrationMonitor,
    MemoryWriter,
    Normalizer,
    TrainingLoop,
    losses,
)
from pipekit_train.equinox import EquinoxModelOp


def _sets(n: int, seed: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(n, 2))
    x = theta[:, None, :] + rng.normal(size=(n, 10, 2))
    return ArrayDataset(x=x.astype(np.float32), y=theta.astype(np.float32))


def _run(**adapter: object) -> None:
    train, held_out = _sets(2000, 0), _sets(200, 1)
    monitor = CalibrationMonitor(held_out, every_n_steps=100, num_samples=50, seed=3)
    writer = MemoryWriter()
    artifact = TrainingLoop(
        model=EquinoxModelOp(
            "pipekit_train.equinox:deep_set",
            point_size=2,
            out_size=4,
            width=16,
            embed_size=8,
            depth=1,
            seed=0,
        ),
        data=train,
        loss=losses.gaussian_nll,
        normalizer=Normalizer.fit(train, keys=("y",)),
        optimizer_config={"name": "adam", "lr": 3e-3},
        batch_size=64,
        max_steps=200,
        callbacks=[monitor],
        writers=[writer],
        progress=False,
        seed=0,
        **adapter,
    ).run()
    steps, values = writer.series("cal_coverage_hpd_68")
    assert steps == [100, 200] and all(0.0 <= v <= 1.0 for v in values)
    assert "cal_tarp_atc" in writer.names() and "cal_calibrated" in writer.names()
    assert monitor.last_report is not None
    final = monitor.last_report.metrics()
    expected = artifact.calibration(held_out, num_samples=50, seed=3).metrics()
    coverage = [k for k in expected if k.startswith("coverage_")]
    assert {k: final[k] for k in coverage} == pytest.approx(
        {k: expected[k] for k in coverage}, abs=0.011
    )


def test_monitor_logs_and_matches_the_artifact() -> None:
    _run()

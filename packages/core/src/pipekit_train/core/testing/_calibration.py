"""The cross-backend check of `CalibrationMonitor` (each adapter package runs it)."""

from __future__ import annotations

from typing import Any

from ._embeddings import point_sets

__all__ = ["check_calibration_monitor"]


def check_calibration_monitor(model: Any, adapter: Any = None) -> None:
    """`CalibrationMonitor` on a backend: calibration every n updates through the run's
    evaluator.

    Trains `model` (a set embedding of 10 points of size 2 with a Gaussian head of width
    4, e.g. the backend's `deep_set(point_size=2, out_size=4, ...)`) for 200 updates. The
    monitor's scalars must reach the metric writers at steps 100 and 200, and its last
    report must equal `artifact.calibration` on the same simulations (the same weights
    read through the artifact's operator) to within one simulation's coverage.
    """
    from pipekit_train.core import (
        CalibrationMonitor,
        MemoryWriter,
        Normalizer,
        TrainingLoop,
        losses,
    )

    train, held_out = point_sets(2000, 0), point_sets(200, 1)
    monitor = CalibrationMonitor(held_out, every_n_steps=100, num_samples=50, seed=3)
    writer = MemoryWriter()
    artifact = TrainingLoop(
        model=model,
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
        adapter=adapter,
    ).run()
    steps, values = writer.series("cal_coverage_hpd_68")
    if steps != [100, 200] or not all(0.0 <= v <= 1.0 for v in values):
        raise AssertionError(f"cal_coverage_hpd_68 at steps {steps}: {values}")
    for name in ("cal_tarp_atc", "cal_calibrated"):
        if name not in writer.names():
            raise AssertionError(f"{name} never reached the writers: {writer.names()}")
    if monitor.last_report is None:
        raise AssertionError("the monitor kept no report")
    final = monitor.last_report.metrics()
    expected = artifact.calibration(held_out, num_samples=50, seed=3).metrics()
    for key in (k for k in expected if k.startswith("coverage_")):
        if abs(final[key] - expected[key]) > 0.011:
            raise AssertionError(
                f"{key}: the monitor's {final[key]!r} differs from the artifact's {expected[key]!r}"
            )

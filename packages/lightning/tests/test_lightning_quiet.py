"""A Lightning run prints no banners ("GPU available: …", "TPU available: …", "stopped: max_steps")."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pipekit_train.core import TrainingLoop
from pipekit_train.lightning import Lightning, TorchModelOp

pytestmark = pytest.mark.usefixtures("lightning_module")

BANNERS = ("GPU available", "TPU available", "LOCAL_RANK:", "💡 Tip", "`Trainer.fit` stopped")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def _collect_logs() -> Iterator[list[str]]:
    """Every record that reaches Lightning's loggers (whether or not they propagate)."""
    collect = _Collect()
    loggers = [logging.getLogger(n) for n in ("", "lightning.pytorch", "lightning.fabric")]
    for logger in loggers:
        logger.addHandler(collect)
    try:
        yield collect.lines
    finally:
        for logger in loggers:
            logger.removeHandler(collect)


def test_run_prints_no_device_banners(regression: Any, capfd: pytest.CaptureFixture[str]) -> None:
    import lightning as L

    train, val = regression
    with _collect_logs() as lines:
        TrainingLoop(
            model=TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
            data=train,
            validation=val,
            optimizer_config={"name": "adam", "lr": 1e-2},
            batch_size=16,
            max_steps=3,
            seed=0,
            adapter=Lightning(accelerator="cpu"),
            progress=False,
        ).run()
    out, err = capfd.readouterr()
    for banner in BANNERS:
        assert banner not in out + err, out + err
        assert not [line for line in lines if banner in line], lines

    # The capture sees the banners where they are not filtered: a Trainer built directly
    # still logs them (the filter is scoped to the adapter's run).
    with _collect_logs() as lines:
        L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    capfd.readouterr()
    assert [line for line in lines if line.startswith("GPU available")], lines

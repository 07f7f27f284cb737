"""Metric writers: where training metrics go.

A writer implements `write(step, metrics)`, `flush()` and `close()` (`MetricWriter`) and
receives host floats. `TensorBoardWriter`, `MlflowWriter` and `WandbWriter` import their
libraries only when built (extras `tensorboard`, `mlflow`, `wandb`). Wrap any writer in
`AsyncWriter` to do the device→host transfer and the I/O in a background thread.
"""

from ._async import AsyncWriter
from ._files import CsvWriter, JsonlWriter
from ._memory import MemoryWriter
from ._mlflow import MlflowWriter
from ._protocol import MetricWriter, check_writer
from ._tensorboard import TensorBoardWriter
from ._wandb import WandbWriter

__all__ = [
    "AsyncWriter",
    "CsvWriter",
    "JsonlWriter",
    "MemoryWriter",
    "MetricWriter",
    "MlflowWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "check_writer",
]

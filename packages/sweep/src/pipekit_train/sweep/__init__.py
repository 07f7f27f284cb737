"""pipekit-train-sweep: hyperparameter sweeps over `TrainingLoop` trials.

`ParameterGrid` (a Cartesian product in a documented order) or any iterable of param
dicts, or an `OptunaSearch`, is the search space; `HyperSweep` runs one `TrainingLoop`
per parameter set — serially, in local worker processes (`ProcessExecutor`, optionally
with a few trials per GPU) or as Ray tasks (`RayExecutor`, with CPUs, whole or
fractional GPUs and custom resources per trial) — records every finished trial in a
journal so a killed sweep resumes, and ranks the trials in a `SweepResult`.
"""

import importlib.metadata as _metadata

from ._executors import ProcessExecutor, RayExecutor, SerialExecutor
from ._grid import ParameterGrid
from ._lock import TrialDirectoryInUseError
from ._optuna import OptunaPruningCallback, OptunaSearch
from ._result import SweepResult, TrialFailedError, TrialResult
from ._sweep import HyperSweep, load_result

__version__ = _metadata.version("pipekit-train-sweep")

__all__ = [
    "HyperSweep",
    "OptunaPruningCallback",
    "OptunaSearch",
    "ParameterGrid",
    "ProcessExecutor",
    "RayExecutor",
    "SerialExecutor",
    "SweepResult",
    "TrialDirectoryInUseError",
    "TrialFailedError",
    "TrialResult",
    "__version__",
    "load_result",
]

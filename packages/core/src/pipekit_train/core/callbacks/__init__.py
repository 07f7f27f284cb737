"""Callbacks: duck-typed hooks the runtime calls during training.

A callback implements any subset of `on_train_start(state)`, `on_step_end(state)`,
`on_validation_end(state)`, `on_checkpoint(state, path)` and
`on_train_end(state, artifact)`; the runtime dispatches with `getattr(cb, hook, None)`.
`ReduceLROnPlateau` changes the learning rate through the run's learning-rate scale
(`RunState.set_lr_scale`), the same way on every backend.
Callbacks that keep progress (`EarlyStopping`) implement `state_dict()` /
`load_state_dict()` so a resumed run continues exactly.

Two callbacks measure the model itself: `RolloutMonitor` (an emulator's rollout errors at
every validation) and `CalibrationMonitor` (a posterior's calibration every `n` updates).
They read the model as a forward operator (`pipekit_train.core.rollout`), so this room
sits above `rollout` (and below `run`, which dispatches the hooks).
"""

from ._calibration_monitor import CalibrationMonitor
from ._early_stopping import EarlyStopping
from ._lambda import LambdaCallback
from ._lr_logger import LearningRateLogger
from ._nan_guard import NaNGuard, NonFiniteLossError
from ._plateau import ReduceLROnPlateau
from ._progress import ProgressBar
from ._protocol import Callback, RunStateView
from ._rollout_monitor import RolloutMonitor

__all__ = [
    "CalibrationMonitor",
    "Callback",
    "EarlyStopping",
    "LambdaCallback",
    "LearningRateLogger",
    "NaNGuard",
    "NonFiniteLossError",
    "ProgressBar",
    "ReduceLROnPlateau",
    "RolloutMonitor",
    "RunStateView",
]

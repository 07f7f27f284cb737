"""Callbacks: duck-typed hooks the runtime calls during training.

A callback implements any subset of `on_train_start(state)`, `on_step_end(state)`,
`on_validation_end(state)`, `on_checkpoint(state, path)` and
`on_train_end(state, artifact)`; the runtime dispatches with `getattr(cb, hook, None)`.
`ReduceLROnPlateau` changes the learning rate through the run's learning-rate scale
(`RunState.set_lr_scale`), the same way on every backend.
Callbacks that keep progress (`EarlyStopping`) implement `state_dict()` /
`load_state_dict()` so a resumed run continues exactly.
"""

from ._early_stopping import EarlyStopping
from ._lambda import LambdaCallback
from ._lr_logger import LearningRateLogger
from ._nan_guard import NaNGuard, NonFiniteLossError
from ._plateau import ReduceLROnPlateau
from ._progress import ProgressBar
from ._protocol import Callback, RunStateView

__all__ = [
    "Callback",
    "EarlyStopping",
    "LambdaCallback",
    "LearningRateLogger",
    "NaNGuard",
    "NonFiniteLossError",
    "ProgressBar",
    "ReduceLROnPlateau",
    "RunStateView",
]

"""The step backend behind core's `OnlineTrainer` for Keras models.

`OnlineTrainer(KerasModelOp(...))` asks `Keras().step_backend(plan)` for this object and
calls `eval_batch` (predict before the update) and `train_step` (one
`model.train_on_batch`, Keras's compiled step) per call; the state is a `TrainState`
(compiled model + built optimizer) checkpointed like a `TrainingLoop`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core.adapter import DirectoryCheckpointer, Plan, StepBackend

from ._checkpoint import checkpointer
from ._ema import swapped_in
from ._state import TrainState, build_train_state, learning_rate, output_model_ops, predict
from ._tracker import eval_loss, last_loss

__all__ = ["KerasStepBackend"]


class KerasStepBackend(StepBackend[TrainState]):
    """`init_state`/`put`/`train_step`/`eval_batch`/`model_op`/`checkpointer` for Keras.

    Args:
        plan: the online trainer's plan.
        precision: a Keras dtype policy name, or None.
        jit_compile: forwarded to `model.compile`.
    """

    name = "keras"

    def __init__(self, plan: Plan, *, precision: str | None = None, jit_compile: Any = "auto"):
        self.plan = plan
        self.precision = precision
        self.jit_compile = jit_compile

    def init_state(self) -> TrainState:
        """A compiled copy of the model with a built optimizer (torch RNG seeded)."""
        state = build_train_state(
            self.plan, precision=self.precision, steps_per_execution=1, jit_compile=self.jit_compile
        )
        state.start_rng()
        return state

    def put(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Batches stay numpy: Keras moves them to the device inside its step."""
        return batch

    def train_step(
        self, state: TrainState, batch: Mapping[str, np.ndarray]
    ) -> tuple[TrainState, dict[str, Any]]:
        """One optimizer step (`model.train_on_batch`); returns this step's loss."""
        logs = state.model.train_on_batch(batch["x"], batch["y"], return_dict=True)
        return state, {"loss": last_loss(logs)}

    def eval_batch(
        self, state: TrainState, batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, float]:
        """`(predictions, mean loss)` with the current weights (their moving average with
        `optimizer_config["ema"]`)."""
        with swapped_in(state.optimizer):
            pred = predict(state, np.asarray(batch["x"]))
        return pred, eval_loss(self.plan.loss, pred, np.asarray(batch["y"]))

    def learning_rate(self, state: TrainState) -> float | None:
        """The optimizer's current learning rate."""
        return learning_rate(state)

    def fetch(self, values: Sequence[Any]) -> list[np.ndarray]:
        """Values are host numpy already."""
        return [np.asarray(v) for v in values]

    def model_op(self, state: TrainState) -> Any:
        """A new `KerasModelOp` holding the current weights (or their moving average)."""
        return output_model_ops(self.plan.model, state)[0]

    def raw_model_op(self, state: TrainState) -> Any:
        """The trained weights when `model_op` holds the moving average (else None)."""
        return output_model_ops(self.plan.model, state)[1]

    def checkpointer(self) -> DirectoryCheckpointer:
        """Core's atomic directory store for `plan.checkpoint`."""
        assert self.plan.checkpoint is not None
        return checkpointer(self.plan.checkpoint)

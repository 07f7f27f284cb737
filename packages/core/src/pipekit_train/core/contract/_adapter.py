"""The adapter contract: the base classes a backend implements.

An adapter turns a frozen `Plan` into a `TrainingArtifact`. Core owns everything around
the step (batching, the per-step sequence, validation and checkpoint schedules,
retention, resume, callbacks, writers, history, the artifact); an adapter only builds the
backend's model and optimizer from the canonical spec, runs train and eval steps, moves
numpy batches onto its device and saves/restores its state.

There are two ways to be an adapter:

- **Step-based** (`StepAdapter`, in `pipekit_train.core.adapter`): implement a
  `StepBackend` (init, put, train step, eval step, checkpointer, model operator) and
  core's `run_step_loop` does the rest. Equinox
  and the numpy reference adapter work this way; so would Flax NNX or plain PyTorch.
- **Loop-owning** (`Adapter`): the backend runs its own loop (Lightning's `Trainer.fit`,
  Keras's `model.fit`); the adapter opens a `RunLifecycle` (`with RunLifecycle(...) as
  run:`), starts it, binds its callables, calls `end_of_update` from the backend's
  per-batch hook and ends with `finish`.

Optional capabilities are declared in `Capabilities`; the defaults of the optional
methods raise `NotSupportedError` naming the backend.

Shape probes: an adapter that can evaluate its model cheaply (abstractly, or on one row)
implements `Adapter.output_shape` (and, where the model declares it,
`Adapter.expected_input_shape`); `TrainingLoop` then checks at construction that the
data's inputs fit the model and that the predictions fit the targets (`check_shapes`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.spec._policies import Precision

if TYPE_CHECKING:
    from pipekit_train.core.artifact._artifact import TrainingArtifact
    from pipekit_train.core.checkpoint._engine import Checkpointer
    from pipekit_train.core.spec._plan import Plan

__all__ = ["Adapter", "Capabilities", "NotSupportedError", "StepBackend"]

StateT = TypeVar("StateT")


class NotSupportedError(ConfigError):
    """A plan asks for something this backend does not offer (raised before any work)."""


@dataclass(frozen=True)
class Capabilities:
    """What an adapter offers beyond the required members.

    Attributes:
        native_data: accepts its framework's own loaders (`Adapter.accepts_data`); a
            step-based backend then supplies their batches (`StepBackend.native_batches`).
        online: has a step backend for `OnlineTrainer` (`Adapter.step_backend`).
        fused_steps: can fuse several optimizer steps into one call (an adapter whose
            `steps_per_execution` is above 1 must declare it).
        sharding: accepts a `sharding=` spec on the loop.
        accumulation: supports `TrainingLoop(accumulate_grad_batches=k)` (a step-based
            backend then receives `k` stacked batches per update in `train_steps`).
        precisions: the canonical precision names it runs (`Precision` values); the
            adapter's `spec_precision` must be one of them.
        skip_nonfinite: honours `TrainingLoop(on_nonfinite="skip")`: when a step's
            training loss (with accumulation: the loss of any of its batches) is not
            finite, the step leaves the parameters and the optimizer state (including its
            step count) as they were and layer state (e.g. BatchNorm statistics) is not
            updated from that batch; the step still counts. The run counts the skips,
            stops after `max_consecutive_skips` and postpones checkpoints.
        grad_norm: honours `TrainingLoop(log_grad_norm=True)`: every update's metrics
            hold `grad_norm` (see `pipekit_train.core.adapter.global_grad_norm`).
        lr_scale: applies core's learning-rate scale (`RunState.set_lr_scale`, used by
            `ReduceLROnPlateau`): the step trains at `schedule(step) * scale`. A
            step-based backend implements `StepBackend.with_lr_scale`; a loop-owning
            adapter binds a hook with `RunLifecycle.bind(lr_scale=...)`.
        ema: keeps the moving average of the weights of `optimizer_config["ema"]` (from
            the initial weights, once per optimizer update; validation and the artifact
            use it, `StepBackend.raw_model_op` gives the trained weights).
        rollout: trains through the rollout (`TrainingLoop(rollout=Rollout(...))`): the
            step minimises core's `rollout_loss` (see `pipekit_train.core.Rollout`).
        rollout_checkpointing: honours `Rollout(gradient_checkpointing=True)`: each
            unrolled step's model application is recomputed in the backward pass instead
            of keeping its activations (same loss and updates, less memory).
        rollout_steppers: calls the steppers of a `Rollout` (`ref_stepper` of the
            diverted chain, `coarse_stepper` of a correction) inside its step, with its
            own arrays (`rollout_loss(reference=...)`, `rollout_spec(coarse_stepper=...)`),
            and probes them before any work (`Adapter.stepper_shape`).
        seed_groups: trains the members of a `SeedGroup` (independent runs that differ
            only in their seed) in lockstep, in one program (`Adapter.run_group`); each
            member keeps its own checkpoints, validation and artifact, and equals its
            single run. Without it a group's members train one after another.
    """

    native_data: bool = False
    online: bool = False
    fused_steps: bool = False
    sharding: bool = False
    accumulation: bool = False
    precisions: tuple[str, ...] = ("float32",)
    skip_nonfinite: bool = False
    grad_norm: bool = False
    lr_scale: bool = False
    ema: bool = False
    rollout: bool = False
    rollout_checkpointing: bool = False
    rollout_steppers: bool = False
    seed_groups: bool = False

    @classmethod
    def full(cls, **overrides: Any) -> Capabilities:
        """Every capability, with every canonical precision (`overrides` turn some off)."""
        from pipekit_train.core.spec._optimizer import PRECISIONS

        values: dict[str, Any] = {f.name: True for f in fields(cls) if f.type in ("bool", bool)}
        values["precisions"] = PRECISIONS
        values.update(overrides)
        return cls(**values)


class Adapter(abc.ABC):
    """A training backend: `run(plan) -> TrainingArtifact`.

    Subclasses set `name` and `capabilities`, implement `run` and `get_config`, and may
    override `validate` with the backend's own checks (core then holds the plan against
    the declared capabilities).

    Attributes:
        name: the backend name recorded in plans and artifacts.
        capabilities: what the backend supports (see `Capabilities`).
        steps_per_execution: how many optimizer steps the adapter fuses into one call
            (set by adapters with such an option; above 1 needs
            `Capabilities.fused_steps`).
        spec_precision: the canonical `Precision` the adapter was configured with (set
            by adapters with a precision option; must be in `Capabilities.precisions`);
            None for a framework-native precision with no canonical meaning.
    """

    name: ClassVar[str] = "adapter"
    capabilities: ClassVar[Capabilities] = Capabilities()
    steps_per_execution: int = 1
    spec_precision: Precision | None = Precision.FLOAT32
    native_loaders: ClassVar[str] = ""
    """What `accepts_data` takes, for error messages (e.g. "a grain MapDataset")."""

    def _unsupported(self, what: str, received: str, fix: str) -> NotSupportedError:
        return NotSupportedError(
            f"{what} is not supported by the {self.name!r} backend. Received: {received}. {fix}"
        )

    def validate(self, plan: Plan) -> None:
        """Backend checks of the plan: raise `ConfigError` for anything it cannot run.

        Called by `TrainingLoop` at construction, before any work is done, and before
        core checks the plan against `capabilities` (`pipekit_train.core.train`). The
        default accepts the plan.
        """
        return None

    def check_native_data(self, field: str, data: Any, plan: Plan) -> None:
        """Backend checks of a native loader `accepts_data` took (`field`: data/validation).

        The default accepts it as is.
        """
        return None

    def validate_online(self, plan: Plan) -> None:
        """Backend checks for `OnlineTrainer` (after core's capability checks; default: none)."""
        return None

    def reports_own_validation_metrics(self, plan: Plan) -> bool:
        """Whether the backend's own validation (a framework loop over the user's code)
        may add `val_` metrics core cannot name before the run.

        Then the monitored `val_` names are checked at the first validation, not when the
        `TrainingLoop` is built (`pipekit_train.core.train`). The default is False: the
        validation reports `val_loss`, the plan's metrics and the callbacks' names.
        """
        return False

    @abc.abstractmethod
    def run(self, plan: Plan) -> TrainingArtifact:
        """Train according to the plan and return the artifact."""

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """JSON description of the adapter's options (recorded in the plan)."""

    def run_group(self, plans: Sequence[Plan]) -> list[TrainingArtifact]:
        """Train the member plans of a `SeedGroup`; one artifact per plan, in order.

        The plans differ only in their seed, their model's seed and their checkpoint
        location. The default trains them one after another, each as its own run
        (`run`): the artifacts and checkpoints are the single runs', a rerun resumes each
        member from its own checkpoints, and a preempted member stops the group. Backends
        that declare `Capabilities.seed_groups` train them in lockstep in one program
        (a step-based one through `StepAdapter.group_backend`).
        """
        return [self.run(plan) for plan in plans]

    def accepts_data(self, data: Any) -> bool:
        """Whether `data` is one of this backend's native loaders (default: none)."""
        return False

    def step_backend(self, plan: Plan) -> StepBackend[Any]:
        """The step backend for `OnlineTrainer` (and `run_step_loop`)."""
        raise self._unsupported(
            "A step backend",
            f"adapter={self!r}",
            "Use a backend that declares Capabilities(online=True).",
        )

    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The shape of the model's prediction for a batch of inputs of `input_shape`.

        A cheap probe (an abstract evaluation, or a forward pass of one row) with no
        effect on the model, its training mode or any RNG. `TrainingLoop` calls it at
        construction, after `validate`, with `(batch_size, *sample_shape)` of the
        data's `x` and its `dtype`.

        Returns:
            The prediction's shape, batch axis first; None when the backend cannot
            probe this model or the prediction is not one array (then nothing is
            checked). The default is None.

        Raises:
            Exception: whatever the backend raises when the model cannot take such
                inputs (core turns it into a `ConfigError` naming the data).
        """
        return None

    def stepper_shape(
        self, stepper: Any, state_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The shape of `stepper`'s output for a batch of zero states of `state_shape`
        (batch axis first), called on this backend's own arrays.

        A cheap probe (an abstract evaluation, or one call on zeros) before any work:
        `TrainingLoop` calls it for each stepper of `Rollout(...)` and refuses one that
        changes the shape.

        Returns:
            The output's shape; None when the backend cannot probe (nothing is checked).
            The default is None.

        Raises:
            Exception: whatever the stepper raises on such states (core turns it into a
                `ConfigError` naming the stepper).
        """
        return None

    def expected_input_shape(self, model: Any) -> tuple[int, ...] | None:
        """The per-sample input shape the model declares (e.g. a Keras `Input`), if known.

        Only used to word the error of a failed `output_shape` probe; the default is None.
        """
        return None


class StepBackend(abc.ABC, Generic[StateT]):
    """A backend that trains one (or K fused) optimizer step(s) per call.

    The state (`StateT`) is whatever the backend hands around (model, optimizer state,
    RNG, step); core never looks inside it.

    Attributes:
        steps_per_execution: the most steps `train_steps` fuses (1: never called).
        data_shard: `(index, count)` of this process among the data-parallel processes:
            it trains on part `index` of `count` of every global batch of
            `plan.batch_size` (see `make_batches`).
        is_chief: whether this process writes metrics and checkpoint metadata.
        prefetch: how many groups of batches a background thread prepares and puts on the
            device ahead of the step (0: none, the batches are taken as the step needs
            them). Worth it where the step runs asynchronously on an accelerator: the
            host-to-device copy and the data pipeline overlap the device's work. The
            batches, their order and the saved data position are the same either way.
    """

    steps_per_execution: int = 1
    prefetch: int = 0
    data_shard: tuple[int, int] = (0, 1)
    is_chief: bool = True

    @abc.abstractmethod
    def init_state(self) -> StateT:
        """Build the initial training state (model, optimizer state, RNG, step)."""

    @abc.abstractmethod
    def put(self, batch: Mapping[str, np.ndarray]) -> Any:
        """Move a numpy batch (or a stacked group of batches) onto the device."""

    @abc.abstractmethod
    def train_step(self, state: StateT, batch: Any) -> tuple[StateT, Mapping[str, Any]]:
        """One optimizer step; the metrics (at least `loss`) may stay on the device."""

    @abc.abstractmethod
    def eval_batch(self, state: StateT, batch: Mapping[str, np.ndarray]) -> tuple[Any, Any]:
        """`(predictions, mean loss)` on one validation batch."""

    @abc.abstractmethod
    def model_op(self, state: StateT) -> Any:
        """The trained model operator for `state`."""

    @abc.abstractmethod
    def checkpointer(self) -> Checkpointer:
        """The checkpoint engine for `plan.checkpoint`."""

    def raw_model_op(self, state: StateT) -> Any:
        """The operator with the trained (not averaged) weights, when `model_op` returns
        the moving average (`optimizer_config["ema"]`); None otherwise (the default)."""
        return None

    def train_steps(self, state: StateT, stacked: Any) -> tuple[StateT, Mapping[str, Any]]:
        """K fused steps over K stacked batches; each metric has shape `(K,)`.

        Called when `steps_per_execution > 1`, and for every update when the plan
        accumulates gradients (`plan.accumulate_grad_batches = m > 1`): then `stacked`
        holds `K * m` batches, each `m` consecutive ones make one update, and each
        metric has one value per batch (shape `(K * m,)`; core averages per update).
        """
        raise NotSupportedError(
            f"{type(self).__name__} does not fuse steps. Received: steps_per_execution="
            f"{self.steps_per_execution}. Use steps_per_execution=1."
        )

    def stack(self, batches: Sequence[Any]) -> Any:
        """K (or `K * m`) batches already on the device (each from `put`) as the value
        `train_steps` takes.

        Optional: a backend that implements it lets a prefetching step loop
        (`prefetch > 0`) copy every batch to the device ahead on its thread, and stack
        them on the device, for fused and accumulated steps too; without it the loop
        stacks the host batches and puts the stack once.
        """
        raise NotSupportedError(
            f"{type(self).__name__} does not stack device batches. Received: "
            f"{len(batches)} batches."
        )

    def fetch(self, values: Sequence[Any]) -> Sequence[Any]:
        """Device values to host numpy arrays, in one call where the backend can."""
        return [np.asarray(v) for v in values]

    def learning_rate(self, state: StateT) -> float | None:
        """The learning rate of the next step, if known."""
        return None

    def with_lr_scale(self, state: StateT, scale: float) -> StateT:
        """`state` training at `schedule(step) * scale` from the next step on.

        Called (for backends declaring `Capabilities.lr_scale`) before the first step with
        the restored scale and whenever a callback changes it; `learning_rate(state)`
        then reports the scaled rate.
        """
        raise NotSupportedError(
            f"{type(self).__name__} has no learning-rate scale. Received: scale={scale!r}. "
            "Drop the callback that changes the learning rate (e.g. ReduceLROnPlateau)."
        )

    def agree(self, flags: Sequence[bool]) -> Sequence[bool]:
        """Multi-process runs: element-wise "any process" of `flags` (one all-reduce).

        Called at every step boundary so that a stop request, a preemption signal or a
        time budget on one process stops every process at the same step. The default
        (one process) returns `flags`.
        """
        return flags

    def native_batches(
        self, data: Any, data_state: Mapping[str, Any] | None
    ) -> Iterator[Mapping[str, np.ndarray]]:
        """The training batches of a native loader (one the adapter's `accepts_data` took).

        `run_step_loop` calls this instead of core's batching when `plan.data` is not a
        core dataset. The iterator yields numpy batch dicts (`{"x": ..., "y": ...}`,
        already batched) without end (repeat epochs), positioned by `data_state` (a
        resume; None: the start). If it has `get_state() -> dict` (JSON-able) and
        `set_state`, its state goes into every checkpoint and a resume is exact;
        otherwise a resume restarts the loader from its beginning (with a warning).
        """
        raise NotSupportedError(
            f"{type(self).__name__} has no native data loaders. Received: "
            f"data={type(data).__name__}. Use a pipekit dataset (e.g. ArrayDataset)."
        )

    def native_eval_batches(self, data: Any) -> Iterator[Mapping[str, np.ndarray]]:
        """One pass over a native validation loader, as numpy batch dicts."""
        raise NotSupportedError(
            f"{type(self).__name__} has no native data loaders. Received: "
            f"validation={type(data).__name__}. Use a pipekit dataset (e.g. ArrayDataset)."
        )


# --------------------------------------------------------------------------- shape probes

# Model keyword arguments that usually set the input / output width (for the hint).

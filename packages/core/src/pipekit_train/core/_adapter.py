"""The adapter contract: the base classes a backend implements.

An adapter turns a frozen `Plan` into a `TrainingArtifact`. Core owns everything around
the step (batching, the per-step sequence, validation and checkpoint schedules,
retention, resume, callbacks, writers, history, the artifact); an adapter only builds the
backend's model and optimizer from the canonical spec, runs train and eval steps, moves
numpy batches onto its device and saves/restores its state.

There are two ways to be an adapter:

- **Step-based** (`StepAdapter`): implement a `StepBackend` (init, put, train step, eval
  step, checkpointer, model operator) and core's `run_step_loop` does the rest. Equinox
  and the numpy reference adapter work this way; so would Flax NNX or plain PyTorch.
- **Loop-owning** (`Adapter`): the backend runs its own loop (Lightning's `Trainer.fit`,
  Keras's `model.fit`); the adapter builds a `RunContext`, resumes with
  `restore_or_start`, and calls `RunContext.after_steps` from the backend's per-batch
  hook.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from ._errors import ConfigError

if TYPE_CHECKING:
    from ._artifact import TrainingArtifact
    from ._checkpointing import Checkpointer
    from ._plan import Plan

__all__ = ["Adapter", "Capabilities", "NotSupportedError", "StepAdapter", "StepBackend"]

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
        fused_steps: can fuse several optimizer steps into one call.
        sharding: accepts a `sharding=` spec on the loop.
        accumulation: supports `TrainingLoop(accumulate_grad_batches=k)` (a step-based
            backend then receives `k` stacked batches per update in `train_steps`).
        precisions: the canonical precision names it runs.
    """

    native_data: bool = False
    online: bool = False
    fused_steps: bool = False
    sharding: bool = False
    accumulation: bool = False
    precisions: tuple[str, ...] = ("float32",)


class Adapter(abc.ABC):
    """A training backend: `run(plan) -> TrainingArtifact`.

    Subclasses set `name` and `capabilities`, implement `run` and `get_config`, and may
    override `validate` (call `super().validate(plan)` first: it checks the plan
    against the declared capabilities).

    Attributes:
        name: the backend name recorded in plans and artifacts.
        capabilities: what the backend supports (see `Capabilities`).
    """

    name: ClassVar[str] = "adapter"
    capabilities: ClassVar[Capabilities] = Capabilities()
    native_loaders: ClassVar[str] = ""
    """What `accepts_data` takes, for error messages (e.g. "a grain MapDataset")."""

    def _unsupported(self, what: str, received: str, fix: str) -> NotSupportedError:
        return NotSupportedError(
            f"{what} is not supported by the {self.name!r} backend. Received: {received}. {fix}"
        )

    def validate(self, plan: Plan) -> None:
        """Raise `ConfigError` for anything in the plan this backend cannot run.

        Called by `TrainingLoop` at construction, before any work is done. The base
        implementation checks the plan against `capabilities`.
        """
        caps = self.capabilities
        if plan.sharding is not None and not caps.sharding:
            raise self._unsupported(
                "`sharding`",
                f"sharding={plan.sharding!r}",
                "Drop it; this backend distributes through its own options.",
            )
        if plan.accumulate_grad_batches > 1 and not caps.accumulation:
            raise self._unsupported(
                "Gradient accumulation",
                f"accumulate_grad_batches={plan.accumulate_grad_batches}",
                "Use a larger batch_size instead.",
            )
        from ._plan import is_core_dataset

        for field in ("data", "validation"):
            data = getattr(plan, field)
            if data is None or is_core_dataset(data):
                continue
            if not (caps.native_data and self.accepts_data(data)):
                accepted = f", or {self.native_loaders}" if self.native_loaders else ""
                raise ConfigError(
                    f"`{field}` must be a pipekit dataset (ArrayDataset, SimulationDataset, "
                    f"CachedDataset, IterableDataset, a split){accepted} on the {self.name!r} "
                    f"backend. Received: {field}={type(data).__name__}."
                )
            self.check_native_data(field, data, plan)

    def check_native_data(self, field: str, data: Any, plan: Plan) -> None:
        """Backend checks of a native loader `accepts_data` took (`field`: data/validation).

        The default accepts it as is.
        """
        return None

    def validate_online(self, plan: Plan) -> None:
        """Checks for `OnlineTrainer` (the default refuses when `online` is not declared)."""
        if not self.capabilities.online:
            raise self._unsupported(
                "Online training (OnlineTrainer)",
                f"adapter={self!r}",
                "Use a TrainingLoop, or a backend with an online step backend.",
            )

    @abc.abstractmethod
    def run(self, plan: Plan) -> TrainingArtifact:
        """Train according to the plan and return the artifact."""

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """JSON description of the adapter's options (recorded in the plan)."""

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

    def expected_input_shape(self, model: Any) -> tuple[int, ...] | None:
        """The per-sample input shape the model declares (e.g. a Keras `Input`), if known.

        Only used to word the error of a failed `output_shape` probe; the default is None.
        """
        return None


class StepAdapter(Adapter):
    """An adapter whose whole loop is core's `run_step_loop` over its `StepBackend`.

    Subclasses implement `step_backend(plan)` (and `get_config`); `run` is provided.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(online=True)

    @abc.abstractmethod
    def step_backend(self, plan: Plan) -> StepBackend[Any]:
        """The `StepBackend` of one run."""

    def run(self, plan: Plan) -> TrainingArtifact:
        """Train with core's step driver and return the artifact."""
        from ._driver import run_step_loop

        return run_step_loop(plan, self.step_backend(plan))


class StepBackend(abc.ABC, Generic[StateT]):
    """A backend that trains one (or K fused) optimizer step(s) per call.

    The state (`StateT`) is whatever the backend hands around (model, optimizer state,
    RNG, step); core never looks inside it.

    Attributes:
        steps_per_execution: the most steps `train_steps` fuses (1: never called).
        data_shard: `(index, count)` of this process's slice of the data.
        is_chief: whether this process writes metrics and checkpoint metadata.
    """

    steps_per_execution: int = 1
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

    def fetch(self, values: Sequence[Any]) -> Sequence[Any]:
        """Device values to host numpy arrays, in one call where the backend can."""
        return [np.asarray(v) for v in values]

    def learning_rate(self, state: StateT) -> float | None:
        """The learning rate of the next step, if known."""
        return None

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
_IN_KWARGS = ("in_size", "in_features", "input_size", "input_dim", "in_dim", "n_inputs")
_OUT_KWARGS = ("out_size", "out_features", "output_size", "output_dim", "out_dim", "n_outputs")


def _same_shape_loss(loss: Any) -> bool:
    """Whether `loss` certainly needs pred and target of the same shape.

    True for the built-in `mse`, `mae`, `huber` and `binary_cross_entropy` (and weighted
    sums of them only); False for the losses that change shapes (`cross_entropy` with
    integer labels, `gaussian_nll` with 2x the target's width), per-key losses and any
    user callable (its shape rules are its own).
    """
    from .losses import Loss, PerKeyLoss, WeightedLoss
    from .losses import _losses as builtin

    if isinstance(loss, PerKeyLoss):
        return False
    if isinstance(loss, WeightedLoss):
        return bool(loss.terms) and all(_same_shape_loss(term) for _, term in loss.terms)
    if isinstance(loss, Loss):
        return loss.fn in (
            builtin._mse,
            builtin._mae,
            builtin._huber,
            builtin._binary_cross_entropy,
        )
    return False


def _size_kwarg(model: Any, names: tuple[str, ...]) -> tuple[str, int] | None:
    kwargs = getattr(model, "kwargs", None)
    if not isinstance(kwargs, Mapping):
        return None
    for name in names:
        value = kwargs.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return name, value
    return None


def _describe_model(model: Any, size: tuple[str, int] | None) -> str:
    factory = getattr(model, "factory", None)
    text = type(model).__name__ + (f" {factory!r}" if isinstance(factory, str) else "")
    return text + (f" with {size[0]}={size[1]}" if size is not None else "")


def _sample_spec(data: Any) -> tuple[Any, Any] | None:
    """`(x, y)` of the first sample as objects with `.shape`/`.dtype`, or None to skip."""
    spec = None
    try:
        spec = getattr(data, "element_spec", None)
    except Exception:
        spec = None
    if isinstance(spec, Mapping) and "x" in spec and "y" in spec:
        x, y = spec["x"], spec["y"]
    else:
        sample = data[0]
        if not isinstance(sample, Mapping) or "x" not in sample or "y" not in sample:
            return None
        x, y = sample["x"], sample["y"]
    if not all(hasattr(a, "shape") and hasattr(a, "dtype") for a in (x, y)):
        return None  # dicts or other structures: not probed
    return x, y


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_shapes(adapter: Adapter, plan: Plan) -> None:
    """Probe the model with the shapes of `data` and `validation` (see `Adapter.output_shape`).

    Called by `TrainingLoop` at construction, after `adapter.validate(plan)`. Only core
    datasets with a length are probed (streams and native loaders are not); nothing is
    checked where the adapter cannot probe (`output_shape` returns None).

    Raises:
        ConfigError: the model cannot take the data's inputs (the backend's error is the
            `__cause__`), or its predictions and the targets differ in shape for a loss
            that needs them equal (`mse`, `mae`, `huber`, `binary_cross_entropy`).
    """
    from ._plan import is_core_dataset

    model = plan.model
    same_shape = _same_shape_loss(plan.loss)
    probed: dict[tuple[tuple[int, ...], np.dtype], tuple[int, ...] | None] = {}
    for name in ("data", "validation"):
        data = getattr(plan, name)
        if data is None or not is_core_dataset(data) or not hasattr(data, "__len__"):
            continue
        spec = _sample_spec(data)
        if spec is None:
            continue
        x, y = spec
        x_shape = tuple(int(d) for d in x.shape)
        y_shape = tuple(int(d) for d in y.shape)
        batch = (plan.batch_size, *x_shape)
        key = (batch, np.dtype(x.dtype))
        if key in probed:  # validation usually has the training data's shapes
            out = probed[key]
        else:
            try:
                out = adapter.output_shape(model, batch, np.dtype(x.dtype))
            except Exception as exc:
                raise _input_error(adapter, model, name, x_shape, np.dtype(x.dtype), exc) from exc
            probed[key] = out
        if out is None or not same_shape:
            continue
        out = tuple(int(d) for d in out)
        if out != (plan.batch_size, *y_shape):
            raise _target_error(model, plan.loss, name, out[1:], y_shape)


def _input_error(
    adapter: Adapter,
    model: Any,
    name: str,
    x_shape: tuple[int, ...],
    dtype: np.dtype,
    exc: Exception,
) -> ConfigError:
    size = _size_kwarg(model, _IN_KWARGS)
    try:
        expected = adapter.expected_input_shape(model)
    except Exception:
        expected = None
    if expected is None and size is not None and len(x_shape) == 1:
        expected = (size[1],)
    received = f"Received: {name}['x'] with samples of shape {x_shape}"
    described = _describe_model(model, size)
    if expected is not None and tuple(expected) != x_shape:
        fix = "Make the data match the model"
        if size is not None and len(x_shape) == 1:
            fix += f", or build the model with {size[0]}={x_shape[0]}"
        return ConfigError(
            f"`{name}` does not fit the model. {received}, but the model expects inputs of "
            f"shape {tuple(expected)} ({described}). {fix}."
        )
    return ConfigError(
        f"`{name}` does not fit the model: the model ({described}) fails on a batch of its "
        f"inputs. {received} ({dtype}); the backend raised: {_first_line(exc)}. Make the data match "
        "the model's input (the original error is chained above)."
    )


def _target_error(
    model: Any, loss: Any, name: str, pred: tuple[int, ...], target: tuple[int, ...]
) -> ConfigError:
    size = _size_kwarg(model, _OUT_KWARGS)
    label = getattr(loss, "name", None) or getattr(loss, "__name__", None) or repr(loss)
    fix = f"Make {name}['y'] match the model's output"
    if size is not None and len(target) == 1 and len(pred) == 1:
        fix += f", or build the model with {size[0]}={target[0]}"
    elif len(pred) == len(target) + 1 and pred[-1] == 1:
        fix += " (e.g. give y a trailing axis of size 1)"
    return ConfigError(
        f"`{name}` targets do not fit the model's predictions for the loss {label!r}, which "
        f"needs pred and target of the same shape. Received: {name}['y'] with samples of "
        f"shape {target}, but the model predicts samples of shape {pred} "
        f"({_describe_model(model, size)}). {fix}."
    )

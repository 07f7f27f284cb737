"""`Keras`: the pipekit-train adapter that trains with Keras 3's own `model.fit`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core.adapter import Adapter, Capabilities, ConfigError, positive_int

from ._keras_backend import backend_name
from ._precision import native_precision

if TYPE_CHECKING:
    from pipekit_train.core.adapter import Plan, TrainingArtifact

__all__ = ["Keras"]


class Keras(Adapter):
    """Train a `KerasModelOp` with `model.fit` on the jax or torch Keras backend.

    Batches come from core's batch iterator (the same order as every backend for the
    same seed); the loss is core's `loss(pred, target)` wrapped as a Keras loss (a
    `keras.losses.Loss` passed as `loss=` is used as is); the optimizer comes from
    `optimizer_config`. Core callbacks, writers, validation and checkpoints are driven from
    a Keras callback; checkpoints (model, optimizer, RNG seed-generator states, data
    position, run state) go to core's atomic directory store and resume exactly.

    Args:
        jit_compile: forwarded to `model.compile` (`"auto"`: XLA on jax, eager on torch;
            `True` on torch means `torch.compile`).
        steps_per_execution: run up to this many steps per compiled call between callbacks
            (jax backend only; Keras requires 1 on torch). Every step's loss is still
            recorded, and validation/checkpoints land on the same steps as with 1.
        precision: `"float32"` (the default), `"bfloat16-mixed"` or `"float16-mixed"`
            (core's names, the same on every backend; float16 adds Keras's loss scaling),
            or a Keras dtype policy such as `"mixed_bfloat16"`.

    Multi-device: pass `sharding=keras.distribution.DataParallel(...)` (or
    `sharding="data_parallel"` for all local devices) to `TrainingLoop` (jax backend).

    Examples:
        >>> from pipekit_train.core import TrainingLoop
        >>> from pipekit_train.core.testing import regression_task
        >>> from pipekit_train.keras import Keras, KerasModelOp
        >>> train, val = regression_task()
        >>> loop = TrainingLoop(
        ...     model=KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1),
        ...     data=train, loss="mse", optimizer_config={"name": "adam", "lr": 1e-2},
        ...     batch_size=32, max_steps=100, adapter=Keras(steps_per_execution=10),
        ... )
        >>> artifact = loop.run()
        >>> artifact.steps
        100
    """

    name = "keras"
    native_loaders = "a keras.utils.PyDataset"
    capabilities = Capabilities.full(seed_groups=False)

    def __init__(
        self,
        *,
        jit_compile: bool | str = "auto",
        steps_per_execution: int = 1,
        precision: str | None = None,
    ):
        if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
            raise ConfigError(
                f"`jit_compile` must be True, False or 'auto'. Received: jit_compile={jit_compile!r}."
            )
        steps_per_execution = positive_int("steps_per_execution", steps_per_execution, example="10")
        native, self.spec_precision = native_precision(precision)
        self.jit_compile = jit_compile
        self.steps_per_execution = steps_per_execution
        self.precision = native

    def get_config(self) -> dict[str, Any]:
        """`{"type": "pipekit_train.keras:Keras", "kwargs": {...}}` (JSON)."""
        return {
            "type": "pipekit_train.keras:Keras",
            "kwargs": {
                "jit_compile": self.jit_compile,
                "steps_per_execution": self.steps_per_execution,
                "precision": self.precision,
            },
        }

    def __repr__(self) -> str:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in self.get_config()["kwargs"].items())
        return f"Keras({kwargs})"

    # -- data ----------------------------------------------------------------------------
    def accepts_data(self, data: Any) -> bool:
        """Whether `data` is a `keras.utils.PyDataset` (or a `tf.data.Dataset`, with TensorFlow).

        A PyDataset's `__getitem__(i)` returns `(x, y)` batches; it is iterated in this
        process (its workers are not used) and its position `(epoch, index)` goes into
        every checkpoint (exact on resume when its batches depend only on the index and the
        number of finished epochs). A `tf.data.Dataset` is repeated; a resume restarts it.
        """
        from ._data import is_native_loader

        return is_native_loader(data)

    # -- validation ----------------------------------------------------------------------
    def validate_online(self, plan: Plan) -> None:
        """Checks shared by `TrainingLoop` and `OnlineTrainer` (model, backend, optimizer)."""
        from ._model import KerasModelOp
        from ._optim import check_optimizer_config

        if not isinstance(plan.model, KerasModelOp):
            raise ConfigError(
                "The Keras adapter trains `KerasModelOp` models. "
                f"Received: model={type(plan.model).__name__}. Wrap the model factory: "
                "KerasModelOp('my_module:make_model', ...)."
            )
        backend = backend_name()
        if backend == "torch" and self.steps_per_execution > 1:
            raise ConfigError(
                "Keras requires `steps_per_execution=1` on the torch backend. "
                f"Received: steps_per_execution={self.steps_per_execution}, KERAS_BACKEND='torch'. "
                "Use Keras(steps_per_execution=1) or the jax backend."
            )
        check_optimizer_config(plan.optimizer_config)

    def validate(self, plan: Plan) -> None:
        """Raise `ConfigError` for anything this adapter cannot run, before any work
        (core checks the plan against `capabilities` after this)."""
        self.validate_online(plan)
        self.distribution(plan)
        if plan.rollout is not None:
            from ._model import KerasModelOp
            from ._rollout import check_rollout_model

            assert isinstance(plan.model, KerasModelOp)  # validate_online checked it
            check_rollout_model(plan.model.model, plan.rollout)
        if plan.log_grad_norm and plan.on_nonfinite == "skip":
            raise ConfigError(
                "On Keras, `log_grad_norm` does not combine with skipping non-finite steps "
                "(a dropped update rewinds the optimizer state holding the norms). Received: "
                "log_grad_norm=True, on_nonfinite='skip'. Drop one of them."
            )
        if plan.log_grad_norm and self.spec_precision == "float16-mixed":
            raise ConfigError(
                "On Keras, `log_grad_norm` does not combine with float16 loss scaling (an "
                "update with non-finite gradients is not applied, so it records no norm). "
                "Received: log_grad_norm=True, precision='float16-mixed'. Use "
                "'bfloat16-mixed' or 'float32'."
            )

    def check_native_data(self, field: str, data: Any, plan: Plan) -> None:
        """A PyDataset: non-empty, `(x, y)` batches (and a length for validation)."""
        from ._data import check_native

        check_native(data, field)

    def distribution(self, plan: Plan) -> Any:
        """The `keras.distribution.Distribution` for `plan.sharding` (None: one device)."""
        sharding = plan.sharding
        if sharding is None:
            return None
        import keras

        if backend_name() != "jax":
            raise ConfigError(
                "`sharding` needs the jax Keras backend (keras.distribution is jax-only). "
                f"Received: sharding={sharding!r}, KERAS_BACKEND={backend_name()!r}."
            )
        if sharding == "data_parallel":
            sharding = keras.distribution.DataParallel()
        if not isinstance(
            sharding, (keras.distribution.DataParallel, keras.distribution.ModelParallel)
        ):
            raise ConfigError(
                "`sharding` must be a `keras.distribution.DataParallel` or `ModelParallel` "
                "(e.g. keras.distribution.DataParallel()) or 'data_parallel'. "
                f"Received: sharding={sharding!r}."
            )
        mesh = getattr(sharding, "device_mesh", None)
        batch_dim = getattr(sharding, "batch_dim_name", None)
        if mesh is not None and batch_dim in getattr(mesh, "axis_names", ()):
            devices = int(mesh.shape[list(mesh.axis_names).index(batch_dim)])
            if plan.batch_size % devices:
                raise ConfigError(
                    f"`batch_size` must divide evenly over the {devices} devices of the "
                    f"{batch_dim!r} mesh axis. Received: batch_size={plan.batch_size}. "
                    f"Use a multiple of {devices}."
                )
        return sharding

    # -- shape probe ---------------------------------------------------------------------
    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = "float32"
    ) -> tuple[int, ...] | None:
        """The prediction's shape, from `model.compute_output_spec` (symbolic: no FLOPs).

        Keras runs it stateless (jax: `jax.eval_shape`; torch: meta tensors), so no
        weight, RNG state or training mode changes. None for a model with several
        outputs, and for one with layers not built yet (a subclassed model whose layers
        take their input width at the first call: the probe would build them); Keras's
        error when the model cannot take such inputs.
        """
        import keras

        from ._model import KerasModelOp

        if not isinstance(model, KerasModelOp):
            return None
        layers = getattr(model.model, "_flatten_layers", None)
        if layers is None or not all(layer.built for layer in layers(include_self=True)):
            return None
        kind = np.dtype(dtype)
        name = "float32" if np.issubdtype(kind, np.floating) else kind.name
        spec = model.model.compute_output_spec(keras.KerasTensor(tuple(input_shape), dtype=name))
        shape = getattr(spec, "shape", None)
        if shape is None or any(d is None for d in shape):
            return None
        return tuple(int(d) for d in shape)

    def stepper_shape(
        self, stepper: Any, state_shape: tuple[int, ...], dtype: Any = "float32"
    ) -> tuple[int, ...] | None:
        """The stepper's output shape on a batch of the backend's zero states (jax:
        abstract, `jax.eval_shape`; torch: one call without autograd)."""
        from ._rollout import stepper_shape

        return stepper_shape(stepper, state_shape, dtype)

    def expected_input_shape(self, model: Any) -> tuple[int, ...] | None:
        """The per-sample shape of the model's single `keras.Input`, when it has one."""
        from ._model import KerasModelOp

        if not isinstance(model, KerasModelOp):
            return None
        try:
            inputs = model.model.inputs
        except (AttributeError, ValueError):
            return None
        if not inputs or len(inputs) != 1:
            return None
        shape = tuple(inputs[0].shape)[1:]
        if any(d is None for d in shape):
            return None
        return tuple(int(d) for d in shape)

    # -- running -------------------------------------------------------------------------
    def run(self, plan: Plan) -> TrainingArtifact:
        """Train per the plan with `model.fit` and return the artifact."""
        from ._bridge import FitSession

        session = FitSession(
            plan,
            precision=self.precision,
            steps_per_execution=self.steps_per_execution,
            jit_compile=self.jit_compile,
            distribution=self.distribution(plan),
        )
        return session.run()

    def step_backend(self, plan: Plan) -> Any:
        """The step backend core's `OnlineTrainer` uses (one `train_on_batch` per call)."""
        from ._step_backend import KerasStepBackend

        return KerasStepBackend(plan, precision=self.precision, jit_compile=self.jit_compile)

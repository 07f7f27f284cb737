"""`TrainingLoop`: validate a training description up front, freeze it, run it."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._adapter import Adapter
from ._artifact import TrainingArtifact
from ._checkpoint import Checkpoint
from ._checkpointing import has_checkpoints
from ._errors import ConfigError
from ._plan import Plan, is_core_dataset, steps_per_epoch
from ._policies import NonFinitePolicy, nonfinite_policy
from ._preemption import DEFAULT_PREEMPTION_SIGNALS, resolve_max_time, resolve_signals
from ._runtime import HOOKS
from ._shapes import check_shapes
from ._spec import resolve_optimizer_config

__all__ = ["TrainingLoop"]

_DEFAULT_MAX_SKIPS = 10


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if not _is_int(value) or value < 1:
        fix = " or None" if allow_none else ""
        raise ConfigError(f"`{name}` must be a positive int{fix}. Received: {name}={value!r}.")
    return int(value)


def _resolve_loss(loss: Any) -> Callable[..., Any]:
    from . import losses

    if isinstance(loss, str) or callable(loss):
        return losses.get(loss)
    raise ConfigError(
        f"`loss` must be a loss name (e.g. 'mse') or a callable `loss(pred, target)`. Received: loss={loss!r}."
    )


def _resolve_metrics(metrics: Any) -> dict[str, Callable[..., Any]]:
    from . import metrics as metric_lib

    if metrics is None:
        return {}
    if isinstance(metrics, str) or callable(metrics):
        metrics = [metrics]
    if isinstance(metrics, Mapping):
        return {str(k): metric_lib.get(v) for k, v in metrics.items()}
    if not isinstance(metrics, Sequence):
        raise ConfigError(
            f"`metrics` must be a list of metric names or callables. Received: metrics={metrics!r}."
        )
    out: dict[str, Callable[..., Any]] = {}
    for m in metrics:
        fn = metric_lib.get(m)
        out[m if isinstance(m, str) else getattr(fn, "__name__", repr(fn))] = fn
    return out


def _check_dataset(
    name: str, data: Any, batch_size: int, drop_remainder: bool, adapter: Any
) -> None:
    if data is None:
        if name == "data":
            raise ConfigError("`data` is required. Received: data=None.")
        return
    if not is_core_dataset(data):
        return  # a native loader: `Adapter.validate` checks it
    if not hasattr(data, "__len__"):
        return  # a stream
    n = len(data)
    if n == 0:
        raise ConfigError(f"`{name}` is empty. Received: len({name})=0.")
    if name == "data" and drop_remainder and batch_size > n:
        raise ConfigError(
            f"`batch_size` must not exceed the number of training samples. Received: batch_size="
            f"{batch_size}, but the dataset has {n} samples. Use batch_size <= {n} or drop_remainder=False."
        )
    sample = data[0]
    if not isinstance(sample, Mapping) or "x" not in sample or "y" not in sample:
        raise ConfigError(_keys_message(name, sample))


def _keys_message(name: str, sample: Any) -> str:
    """The error for samples without `x`/`y`, naming the one-line fix."""
    head = (
        f"`{name}` samples must be dicts with the model input under 'x' and the target under 'y'."
    )
    if not isinstance(sample, Mapping):
        return (
            f"{head} Received: a {type(sample).__name__}. Store arrays as "
            "ArrayDataset(x=inputs, y=targets) or yield {'x': ..., 'y': ...} samples."
        )
    keys = sorted(map(str, sample))
    fix = f"{name} = as_supervised({name}, input="
    if {"theta", "x"} <= set(keys):  # a SimulationDataset's default keys
        how = (
            f"{fix}'theta', target='x') for an emulator (parameters -> outputs), or "
            f"{fix}'x', target='theta') for amortized inference (observations -> parameters)"
        )
    elif len(keys) >= 2:
        a, b = keys[0], keys[1]
        how = f"{fix}{a!r}, target={b!r}) or {fix}{b!r}, target={a!r})"
    else:
        how = f"{fix}..., target=...) once the samples hold both an input and a target"
    return (
        f"{head} Received: keys={keys}. Say which key is which with one line "
        f"(`as_supervised` is in pipekit_train.core.data): {how}."
    )


def _check_normalizer(normalizer: Any, name: str, data: Any) -> None:
    """A fitted normalizer's keys and feature shapes must fit the samples of `data`."""
    mean = getattr(normalizer, "mean", None)
    if not isinstance(mean, Mapping) or data is None or not is_core_dataset(data):
        return
    if not hasattr(data, "__len__") or len(data) == 0:
        return  # a stream: its samples are not looked at before training
    sample = data[0]
    missing = sorted(str(k) for k in mean if k not in sample)
    if missing:
        raise ConfigError(
            f"`normalizer` was fitted on keys {missing} that the `{name}` samples do not have. "
            f"Received: normalizer keys={sorted(mean)}, {name} keys={sorted(sample)}. Fit it "
            f"on this data, e.g. Normalizer.fit({name}, keys=('x', 'y'))."
        )
    for key, values in mean.items():
        feature = tuple(np.shape(values))
        shape = tuple(np.shape(sample[key]))
        if len(shape) < len(feature) or shape[len(shape) - len(feature) :] != feature:
            raise ConfigError(
                f"`normalizer` was fitted on `{key}` features of shape {feature}, but the "
                f"`{name}` samples of `{key}` have shape {shape}. Received: normalizer with "
                f"mean[{key!r}] of shape {feature}. Fit it on this data."
            )


def _check_callbacks(callbacks: Any) -> tuple[Any, ...]:
    if callbacks is None:
        return ()
    if not isinstance(callbacks, Sequence) or isinstance(callbacks, str):
        raise ConfigError(f"`callbacks` must be a list. Received: callbacks={callbacks!r}.")
    for cb in callbacks:
        if not any(callable(getattr(cb, hook, None)) for hook in HOOKS):
            raise ConfigError(
                f"Each callback must implement at least one of {list(HOOKS)}. Received: {cb!r}."
            )
    return tuple(callbacks)


def _check_writers(writers: Any) -> tuple[Any, ...]:
    if writers is None:
        return ()
    if not isinstance(writers, Sequence) or isinstance(writers, str):
        raise ConfigError(
            f"`writers` must be a list of metric writers. Received: writers={writers!r}."
        )
    for w in writers:
        if not callable(getattr(w, "write", None)):
            raise ConfigError(
                f"Each writer must have `write(step, metrics)`. Received: {w!r}. "
                "Use a MetricWriter such as JsonlWriter('metrics.jsonl')."
            )
    return tuple(writers)


class TrainingLoop:
    """One training description that runs on any backend.

    Everything is validated at construction (nothing touches disk until `run()`), then
    frozen into a `Plan`. The adapter defaults to the model operator's own
    (`EquinoxModelOp` → `Equinox()`, `LightningModelOp` → `Lightning()`, ...).

    Args:
        model: a model operator (`EquinoxModelOp`, `LightningModelOp`, `KerasModelOp`)
            or a backend-native model the chosen adapter accepts.
        data: the training dataset (samples `{"x": ..., "y": ...}`; rename other keys
            with `as_supervised(data, input=..., target=...)`) or a native loader.
        validation: an optional validation dataset.
        loss: a loss name (`"mse"`), a `Loss`, or a callable `loss(pred, target)`.
        metrics: validation metric names or callables.
        optimizer_config: `{"name": "adam", "lr": 1e-3, ...}` (`lr` and `learning_rate`
            both accepted; schedules as `{"schedule": "cosine", ...}`), or a
            backend-native optimizer.
        batch_size: samples per batch (per optimizer step, unless accumulating).
        max_steps: stop after this many optimizer steps.
        max_epochs: stop after this many passes over the data (sized datasets).
        callbacks: objects implementing any of the `Callback` hooks.
        writers: metric writers.
        checkpoint: a `Checkpoint` policy (or a directory path for the defaults).
        seed: the seed of the data order and of the backend's RNG streams.
        adapter: the backend adapter; inferred from `model` when None.
        sharding: a backend-specific sharding spec (e.g. Equinox `ShardingSpec`).
        validate_every_n_steps: validation schedule (default: every epoch and at the end).
        log_every_n_steps: metrics are fetched from the device and written in groups of
            this many steps.
        accumulate_grad_batches: gradient accumulation: each optimizer update averages the
            gradients of this many consecutive batches of `batch_size`. Steps (`max_steps`,
            logging, validation and checkpoint cadence, schedules) count updates, and a
            step's `loss` is the mean over its batches, the same on every backend.
        on_nonfinite: what a non-finite training loss does. `"stop"` (the default) ends
            the run with `NonFiniteLossError` naming the first such step; no checkpoint is
            ever written from a state whose loss history contains it, so the last good
            checkpoint survives rotation and resumes exactly. `"skip"` drops the update of a
            step whose loss is not finite (parameters, optimizer state and layer state stay
            as they were; the batch is consumed and the step counted), records the running
            number of skipped steps as the metric `nonfinite_skipped` on each skipped step,
            and stops with `NonFiniteLossError` after `max_consecutive_skips` consecutive
            skips; a checkpoint due on a skipped step is postponed to the next step whose
            loss is finite. `"ignore"` trains on.
        max_consecutive_skips: with `on_nonfinite="skip"`, how many consecutive skipped
            steps end the run (default 10). Only valid with `"skip"`.
        shuffle: shuffle the training data each epoch.
        drop_remainder: drop the last partial batch of each epoch.
        sweep_id: set by sweeps; recorded on the artifact.
        normalizer: a fitted `Normalizer`: every training and validation batch passes
            through `normalizer.apply` (so validation metrics are in normalised units),
            and it travels with the trained model to the registry, where `NeuralForward`
            applies it around the model.
        progress: show a progress bar (default: only on a TTY).
        preemption_signals: the signals that preempt the run (default SIGTERM and
            SIGUSR1; names like `"SIGTERM"` or `signal.Signals`; `[]` disables). On one,
            the run finishes its current step (or fused group), checkpoints it, waits
            until every save is durable, restores the previous handlers and raises
            `Preempted`. SIGINT stays `KeyboardInterrupt`. See the checkpoints guide.
        max_time: a wall-clock budget for this run (seconds, a `datetime.timedelta` or
            `"DD:HH:MM:SS"`): when it is spent the run checkpoints and stops with
            `artifact.stop_reason == "max_time"`; a rerun resumes with a fresh budget.
        log_grad_norm: record the metric `grad_norm` every optimizer update: the global
            L2 norm of the gradient the update uses, before clipping (with accumulation:
            of the accumulated gradient). Off by default; the backend must support it.
    """

    def __init__(
        self,
        model: Any,
        data: Any,
        validation: Any = None,
        *,
        loss: Any = "mse",
        metrics: Any = None,
        optimizer_config: Any = None,
        batch_size: int = 32,
        max_steps: int | None = None,
        max_epochs: int | None = None,
        callbacks: Sequence[Any] | None = None,
        writers: Sequence[Any] | None = None,
        checkpoint: Checkpoint | str | os.PathLike[str] | None = None,
        seed: int = 0,
        adapter: Any = None,
        sharding: Any = None,
        validate_every_n_steps: int | None = None,
        log_every_n_steps: int = 50,
        accumulate_grad_batches: int = 1,
        on_nonfinite: NonFinitePolicy | str = "stop",
        max_consecutive_skips: int | None = None,
        shuffle: bool = True,
        drop_remainder: bool = True,
        sweep_id: str | None = None,
        normalizer: Any = None,
        progress: bool | None = None,
        preemption_signals: Sequence[Any] | None = DEFAULT_PREEMPTION_SIGNALS,
        max_time: float | str | datetime.timedelta | None = None,
        log_grad_norm: bool = False,
    ):
        batch_size = _positive_int("batch_size", batch_size)  # type: ignore[assignment]  # not None without allow_none
        signals = resolve_signals(preemption_signals)
        budget = resolve_max_time(max_time)
        max_steps = _positive_int("max_steps", max_steps, allow_none=True)
        max_epochs = _positive_int("max_epochs", max_epochs, allow_none=True)
        if max_steps is None and max_epochs is None:
            raise ConfigError(
                "Set `max_steps` or `max_epochs` so the run knows when to stop. "
                "Received: max_steps=None, max_epochs=None."
            )
        validate_every_n_steps = _positive_int(
            "validate_every_n_steps", validate_every_n_steps, allow_none=True
        )
        log_every_n_steps = _positive_int("log_every_n_steps", log_every_n_steps)  # type: ignore[assignment]  # not None without allow_none
        accumulate_grad_batches = _positive_int("accumulate_grad_batches", accumulate_grad_batches)  # type: ignore[assignment]  # not None without allow_none
        on_nonfinite = nonfinite_policy(on_nonfinite)
        max_consecutive_skips = _positive_int(
            "max_consecutive_skips", max_consecutive_skips, allow_none=True
        )
        if max_consecutive_skips is not None and on_nonfinite != "skip":
            raise ConfigError(
                "`max_consecutive_skips` only applies with on_nonfinite='skip'. Received: "
                f"max_consecutive_skips={max_consecutive_skips}, "
                f"on_nonfinite={on_nonfinite.value!r}. "
                "Drop it, or set on_nonfinite='skip'."
            )
        if on_nonfinite is NonFinitePolicy.SKIP and max_consecutive_skips is None:
            max_consecutive_skips = _DEFAULT_MAX_SKIPS
        if not _is_int(seed) or seed < 0:
            raise ConfigError(f"`seed` must be a non-negative int. Received: seed={seed!r}.")
        flags = (("shuffle", shuffle), ("drop_remainder", drop_remainder))
        for flag, value in (*flags, ("log_grad_norm", log_grad_norm)):
            if not isinstance(value, bool):
                raise ConfigError(f"`{flag}` must be True or False. Received: {flag}={value!r}.")
        if sweep_id is not None and not isinstance(sweep_id, str):
            raise ConfigError(f"`sweep_id` must be a string. Received: sweep_id={sweep_id!r}.")
        if normalizer is not None and not (
            callable(getattr(normalizer, "apply", None))
            and callable(getattr(normalizer, "invert", None))
        ):
            raise ConfigError(
                f"`normalizer` must be a fitted Normalizer (with apply/invert). Received: normalizer={normalizer!r}."
            )
        if adapter is None:
            default = getattr(model, "default_adapter", None)
            if not callable(default):
                raise ConfigError(
                    "`model` must be a model operator (EquinoxModelOp, LightningModelOp, KerasModelOp) "
                    f"or `adapter=` must be given. Received: model={type(model).__name__}, adapter=None."
                )
            adapter = default()
        if not isinstance(adapter, Adapter):
            raise ConfigError(
                "`adapter` must be a backend adapter (a `pipekit_train.core.adapter.Adapter`) such "
                f"as Equinox(), Lightning() or Keras(). Received: adapter={adapter!r}."
            )
        if isinstance(checkpoint, (str, os.PathLike)):
            checkpoint = Checkpoint(checkpoint)
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise ConfigError(
                f"`checkpoint` must be a Checkpoint policy or a directory. Received: checkpoint={checkpoint!r}."
            )
        if checkpoint is not None and checkpoint.resume == "never" and has_checkpoints(checkpoint):
            raise ConfigError(
                f"`Checkpoint.resume='never'` but {checkpoint.location} already holds checkpoints. "
                f"Received: resume='never', directory={str(checkpoint.directory)!r}. Use "
                "resume='auto' to continue from them, or an empty directory."
            )
        _check_dataset("data", data, batch_size, drop_remainder, adapter)
        _check_dataset("validation", validation, batch_size, False, adapter)
        if validate_every_n_steps is not None and validation is None and is_core_dataset(data):
            raise ConfigError(
                "`validate_every_n_steps` schedules validation, but there is no validation data. "
                f"Received: validate_every_n_steps={validate_every_n_steps}, validation=None. "
                "Pass validation=..., or drop validate_every_n_steps."
            )
        if normalizer is not None:
            _check_normalizer(normalizer, "data", data)
            _check_normalizer(normalizer, "validation", validation)
        loss_fn = _resolve_loss(loss)
        metric_fns = _resolve_metrics(metrics)
        if metric_fns and validation is None:
            raise ConfigError(
                f"`metrics` are computed on validation data, but `validation` is None. "
                f"Received: metrics={list(metric_fns)}, validation=None. Pass validation=... "
                "or drop the metrics."
            )
        callbacks = _check_callbacks(callbacks)
        writers = _check_writers(writers)
        for cb in callbacks:
            monitor = getattr(cb, "monitor", None)
            if isinstance(monitor, str) and monitor.startswith("val_") and validation is None:
                raise ConfigError(
                    f"`{type(cb).__name__}` monitors {monitor!r}, which needs validation data. "
                    "Received: validation=None. Pass validation=... or monitor 'loss'."
                )
        if (
            checkpoint is not None
            and checkpoint.keep_best
            and checkpoint.monitor.startswith("val_")
            and validation is None
        ):
            raise ConfigError(
                f"`Checkpoint.keep_best` ranks by {checkpoint.monitor!r}, which needs validation data. "
                "Received: validation=None."
            )
        spe = steps_per_epoch(data, batch_size, drop_remainder, accumulate_grad_batches)
        total = max_steps
        if max_epochs is not None:
            if spe is None:
                if max_steps is None:
                    raise ConfigError(
                        "`max_epochs` needs a dataset with a length; this data is a stream. "
                        f"Received: max_epochs={max_epochs}. Use max_steps instead."
                    )
            else:
                total = max_epochs * spe if total is None else min(total, max_epochs * spe)
        self.plan = Plan(
            model=model,
            data=data,
            validation=validation,
            loss=loss_fn,
            metrics=metric_fns,
            optimizer_config=resolve_optimizer_config(optimizer_config),
            batch_size=batch_size,
            max_steps=max_steps,
            max_epochs=max_epochs,
            total_steps=total,
            steps_per_epoch=spe,
            callbacks=callbacks,
            writers=writers,
            checkpoint=checkpoint,
            seed=int(seed),
            adapter=adapter,
            sharding=sharding,
            validate_every_n_steps=validate_every_n_steps,
            log_every_n_steps=log_every_n_steps,
            accumulate_grad_batches=accumulate_grad_batches,
            on_nonfinite=on_nonfinite,
            max_consecutive_skips=max_consecutive_skips,
            shuffle=shuffle,
            drop_remainder=drop_remainder,
            sweep_id=sweep_id,
            normalizer=normalizer,
            progress=progress,
            preemption_signals=signals,
            max_time=budget,
            log_grad_norm=log_grad_norm,
        )
        adapter.validate(self.plan)
        check_shapes(adapter, self.plan)  # probe the model with the data's shapes

    @property
    def adapter(self) -> Any:
        """The adapter that will run the plan."""
        return self.plan.adapter

    def get_config(self) -> dict[str, Any]:
        """The frozen JSON plan."""
        return self.plan.to_json()

    def run(self) -> TrainingArtifact:
        """Train (resuming from the latest complete checkpoint if any) and return the artifact."""
        return self.plan.adapter.run(self.plan)

    def __repr__(self) -> str:
        return f"TrainingLoop(backend={self.plan.backend!r}, total_steps={self.plan.total_steps})"

"""The one path from a training description to a `Plan`, and core's checks of a plan.

`TrainingLoop` and `OnlineTrainer` both build their plan here (`build_plan`,
`online_plan`): every argument is validated before any work, with the field, the value
and the fix in the message. `check_plan` and `check_online` then hold the plan against
what the adapter declares it can do (`Capabilities`), after the adapter's own checks.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed, positive_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.checkpoint._engine import has_checkpoints
from pipekit_train.core.checkpoint._policy import Checkpoint
from pipekit_train.core.contract._adapter import Adapter
from pipekit_train.core.data import is_core_dataset
from pipekit_train.core.metrics import resolve_metrics
from pipekit_train.core.run._dispatch import HOOKS
from pipekit_train.core.spec._lr_scale import adjusts_learning_rate
from pipekit_train.core.spec._optimizer import resolve_optimizer_config
from pipekit_train.core.spec._plan import Plan, steps_per_epoch
from pipekit_train.core.spec._policies import NonFinitePolicy, nonfinite_policy
from pipekit_train.core.spec._signals import resolve_max_time, resolve_signals

from ._monitors import check_monitors, check_restore_best
from ._rollout import check_rollout, check_steppers, model_inputs

__all__ = [
    "build_plan",
    "check_callbacks",
    "check_online",
    "check_plan",
    "check_writers",
    "online_plan",
    "resolve_adapter",
    "resolve_loss",
]

_DEFAULT_MAX_SKIPS = 10


def resolve_adapter(model: Any, adapter: Any) -> Adapter:
    """The adapter to run `model`: `adapter`, or the model operator's default one."""
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
    return adapter


def resolve_loss(loss: Any) -> Callable[..., Any]:
    from pipekit_train.core import losses

    if isinstance(loss, str) or callable(loss):
        return losses.get(loss)
    raise ConfigError(
        f"`loss` must be a loss name (e.g. 'mse') or a callable `loss(pred, target)`. Received: loss={loss!r}."
    )


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


def check_callbacks(callbacks: Any) -> tuple[Any, ...]:
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


def check_writers(writers: Any) -> tuple[Any, ...]:
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


def build_plan(
    model: Any,
    data: Any,
    validation: Any = None,
    *,
    loss: Any,
    metrics: Any,
    optimizer_config: Any,
    batch_size: int,
    max_steps: int | None,
    max_epochs: int | None,
    callbacks: Sequence[Any] | None,
    writers: Sequence[Any] | None,
    checkpoint: Checkpoint | str | os.PathLike[str] | None,
    seed: int,
    adapter: Any,
    sharding: Any,
    validate_every_n_steps: int | None,
    log_every_n_steps: int,
    accumulate_grad_batches: int,
    on_nonfinite: NonFinitePolicy | str,
    max_consecutive_skips: int | None,
    shuffle: bool,
    drop_remainder: bool,
    sweep_id: str | None,
    normalizer: Any,
    progress: bool | None,
    preemption_signals: Sequence[Any] | None,
    max_time: float | str | datetime.timedelta | None,
    log_grad_norm: bool,
    rollout: Any = None,
    restore_best: bool = False,
) -> Plan:
    """Validate a `TrainingLoop` description (its arguments, documented there) into a `Plan`.

    Raises:
        ConfigError: a bad argument, before any work.
    """
    batch_size = positive_int("batch_size", batch_size)
    signals = resolve_signals(preemption_signals)
    budget = resolve_max_time(max_time)
    max_steps = positive_int("max_steps", max_steps, allow_none=True)
    max_epochs = positive_int("max_epochs", max_epochs, allow_none=True)
    if max_steps is None and max_epochs is None:
        raise ConfigError(
            "Set `max_steps` or `max_epochs` so the run knows when to stop. "
            "Received: max_steps=None, max_epochs=None."
        )
    validate_every_n_steps = positive_int(
        "validate_every_n_steps", validate_every_n_steps, allow_none=True
    )
    log_every_n_steps = positive_int("log_every_n_steps", log_every_n_steps)
    accumulate_grad_batches = positive_int("accumulate_grad_batches", accumulate_grad_batches)
    on_nonfinite = nonfinite_policy(on_nonfinite)
    max_consecutive_skips = positive_int(
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
    seed = check_seed(seed)
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
    adapter = resolve_adapter(model, adapter)
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
    loss_fn = resolve_loss(loss)
    rollout = check_rollout(rollout, data, validation, loss_fn)
    inputs = model_inputs(data, validation)
    metric_fns = resolve_metrics(metrics)
    if metric_fns and validation is None:
        raise ConfigError(
            f"`metrics` are computed on validation data, but `validation` is None. "
            f"Received: metrics={list(metric_fns)}, validation=None. Pass validation=... "
            "or drop the metrics."
        )
    callbacks = check_callbacks(callbacks)
    writers = check_writers(writers)
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
    restore_best = check_restore_best(restore_best, checkpoint, callbacks)
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
    return Plan(
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
        rollout=rollout,
        inputs=inputs,
        restore_best=restore_best,
    )


def online_plan(
    model: Any,
    *,
    loss: Any,
    optimizer_config: Any,
    seed: int,
    checkpoint: Checkpoint | None,
    adapter: Any,
    callbacks: Sequence[Any] | None,
    preemption_signals: Sequence[Any] | None,
) -> Plan:
    """Validate an `OnlineTrainer` description (its arguments, documented there) into a `Plan`.

    An online plan has no dataset (batches arrive one call at a time), no length, no
    validation and no writers; a non-finite loss is reported, never a reason to stop.

    Raises:
        ConfigError: a bad argument, before any work.
    """
    signals = resolve_signals(preemption_signals)
    seed = check_seed(seed)
    adapter = resolve_adapter(model, adapter)
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise ConfigError(
            f"`checkpoint` must be a Checkpoint. Received: checkpoint={checkpoint!r}."
        )
    plan = Plan(
        model=model,
        data=None,
        validation=None,
        loss=resolve_loss(loss),
        metrics={},
        optimizer_config=resolve_optimizer_config(optimizer_config),
        batch_size=1,
        max_steps=None,
        max_epochs=None,
        total_steps=None,
        steps_per_epoch=None,
        callbacks=check_callbacks(callbacks),
        writers=(),
        checkpoint=checkpoint,
        seed=seed,
        adapter=adapter,
        progress=False,
        on_nonfinite=NonFinitePolicy.IGNORE,  # an online step reports its loss; it never stops
        preemption_signals=signals,
    )
    if adjusts_learning_rate(plan):
        names = [type(cb).__name__ for cb in plan.callbacks]
        raise ConfigError(
            "OnlineTrainer runs no validation, so a callback that changes the learning rate "
            f"on a plateau never acts. Received: callbacks={names}. Drop it, or train "
            "with a TrainingLoop and validation data."
        )
    return plan


# --------------------------------------------------------------------------- capabilities


def _check_own_options(adapter: Adapter) -> None:
    """The adapter's own options against its declared `capabilities`."""
    caps = adapter.capabilities
    fused = adapter.steps_per_execution
    if fused != 1 and not caps.fused_steps:
        raise adapter._unsupported(
            "Fusing optimizer steps",
            f"steps_per_execution={fused!r}",
            "Use steps_per_execution=1; this backend runs one step per call.",
        )
    precision = adapter.spec_precision
    if precision is not None and precision not in caps.precisions:
        raise adapter._unsupported(
            f"Precision {str(precision)!r}",
            f"precision={str(precision)!r}",
            f"Use one of {[str(p) for p in caps.precisions]}.",
        )


def check_plan(adapter: Adapter, plan: Plan) -> None:
    """Hold a plan against what `adapter` declares (`Capabilities`), before any work.

    Called by `TrainingLoop` after `adapter.validate(plan)`.

    Raises:
        NotSupportedError: the plan asks for something the backend does not offer.
        ConfigError: data the backend cannot read; a monitored `val_` metric no part of
            the run produces (`check_monitors`).
    """
    caps = adapter.capabilities
    _check_own_options(adapter)
    if plan.sharding is not None and not caps.sharding:
        raise adapter._unsupported(
            "`sharding`",
            f"sharding={plan.sharding!r}",
            "Drop it; this backend distributes through its own options.",
        )
    if plan.accumulate_grad_batches > 1 and not caps.accumulation:
        raise adapter._unsupported(
            "Gradient accumulation",
            f"accumulate_grad_batches={plan.accumulate_grad_batches}",
            "Use a larger batch_size instead.",
        )
    if plan.log_grad_norm and not caps.grad_norm:
        raise adapter._unsupported(
            "The `grad_norm` metric",
            "log_grad_norm=True",
            "Drop it, or use a backend that declares Capabilities(grad_norm=True).",
        )
    config = plan.optimizer_config
    ema = config.get("ema") if isinstance(config, Mapping) else None
    if ema is not None and not caps.ema:
        raise adapter._unsupported(
            "A moving average of the weights",
            f"optimizer_config['ema']={ema!r}",
            "Drop `ema`, or use a backend that declares Capabilities(ema=True).",
        )
    if plan.on_nonfinite == "skip" and not caps.skip_nonfinite:
        raise adapter._unsupported(
            "Skipping non-finite steps",
            "on_nonfinite='skip'",
            "Use on_nonfinite='stop' (the default) or 'ignore'.",
        )
    if adjusts_learning_rate(plan) and not caps.lr_scale:
        names = [
            type(cb).__name__
            for cb in plan.callbacks
            if getattr(cb, "adjusts_learning_rate", False)
        ]
        raise adapter._unsupported(
            "Changing the learning rate from a callback",
            f"callbacks={names}",
            "Drop the callback, or use a backend that declares Capabilities(lr_scale=True).",
        )
    if plan.rollout is not None and not caps.rollout:
        raise adapter._unsupported(
            "Rollout training",
            f"rollout=Rollout(steps={plan.rollout.steps})",
            "It runs on Equinox(), Lightning(), Torch() and Keras(); drop `rollout` here.",
        )
    if plan.rollout is not None and plan.rollout.gradient_checkpointing:
        if not caps.rollout_checkpointing:
            raise adapter._unsupported(
                "Gradient checkpointing of the unrolled steps",
                "rollout=Rollout(..., gradient_checkpointing=True)",
                "Use gradient_checkpointing=False (the same loss, more memory), or a "
                "backend that declares Capabilities(rollout_checkpointing=True) (Equinox(), "
                "Lightning(), Torch(), Keras()).",
            )
    if plan.rollout is not None and plan.rollout.steppers:
        if not caps.rollout_steppers:
            fields = ", ".join(f"{name}=..." for name in plan.rollout.steppers)
            raise adapter._unsupported(
                "A solver in the rollout (the diverted chain's reference, a coarse stepper)",
                f"rollout=Rollout(..., {fields})",
                "Drop the stepper, or use a backend that declares "
                "Capabilities(rollout_steppers=True) (Equinox(), Lightning(), Torch(), "
                "Keras()).",
            )
        check_steppers(adapter, plan)
    for field in ("data", "validation"):
        data = getattr(plan, field)
        if data is None or is_core_dataset(data):
            continue
        if not (caps.native_data and adapter.accepts_data(data)):
            accepted = f", or {adapter.native_loaders}" if adapter.native_loaders else ""
            raise ConfigError(
                f"`{field}` must be a pipekit dataset (ArrayDataset, SimulationDataset, "
                f"CachedDataset, IterableDataset, a split){accepted} on the {adapter.name!r} "
                f"backend. Received: {field}={type(data).__name__}."
            )
        adapter.check_native_data(field, data, plan)
    check_monitors(adapter, plan)


def check_online(adapter: Adapter, plan: Plan) -> None:
    """Hold an online plan against the adapter: it needs a step backend (`online`).

    Raises:
        NotSupportedError: the adapter has no online step backend, or its own options
            exceed its capabilities.
    """
    _check_own_options(adapter)
    if not adapter.capabilities.online:
        raise adapter._unsupported(
            "Online training (OnlineTrainer)",
            f"adapter={adapter!r}",
            "Use a TrainingLoop, or a backend with an online step backend.",
        )

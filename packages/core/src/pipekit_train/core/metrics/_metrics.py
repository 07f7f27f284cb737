"""The built-in metrics and their registry, written against the Python array API.

Same conventions as the losses (`pipekit_train.core.losses`): the array library is found
with `array_api_compat.array_namespace`, the result is a 0-d array of that library in
`pred`'s floating dtype (convert with `float(...)`), and the regression metrics refuse
mismatched shapes instead of broadcasting. Metrics are usually computed on the whole
validation set at once (numpy arrays on the host), but run on jax and torch arrays too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.losses._compose import _Registry, describe_callable
from pipekit_train.core.losses._losses import (
    _check_same_shape,
    _class_probabilities,
    _namespace,
    _regression_inputs,
    _shape,
)

__all__ = [
    "resolve_metrics",
    "accuracy",
    "binary_accuracy",
    "describe",
    "get",
    "mae",
    "names",
    "r2",
    "register",
    "rmse",
]

Metric = Callable[[Any, Any], Any]


def _float_dtype(xp: Any, pred: Any) -> Any:
    return pred.dtype if xp.isdtype(pred.dtype, "real floating") else xp.float32


def mae(pred: Any, target: Any) -> Any:
    """Mean absolute error over every element.

    Args:
        pred: predictions.
        target: targets of the same shape.

    Returns:
        A 0-d array.
    """
    xp, pred, target = _regression_inputs("mae", pred, target)
    return xp.mean(xp.abs(pred - target))


def rmse(pred: Any, target: Any) -> Any:
    """Root mean squared error over every element: `sqrt(mean((pred - target)**2))`.

    Args:
        pred: predictions.
        target: targets of the same shape.

    Returns:
        A 0-d array.
    """
    xp, pred, target = _regression_inputs("rmse", pred, target)
    diff = pred - target
    return xp.sqrt(xp.mean(diff * diff))


def r2(pred: Any, target: Any) -> Any:
    """Coefficient of determination, `1 - SS_res / SS_tot`, computed along the batch axis.

    Trailing axes are flattened into outputs; the R² of each output is computed over the
    batch (axis 0) and the outputs are averaged uniformly, like scikit-learn's
    `r2_score(multioutput="uniform_average")`. An output with a constant target scores
    1.0 when predicted exactly and 0.0 otherwise (scikit-learn's `force_finite=True`).

    Args:
        pred: predictions of shape `(n, ...)`.
        target: targets of the same shape.

    Returns:
        A 0-d array.

    Raises:
        ConfigError: scalar inputs or mismatched shapes.
    """
    xp, pred, target = _regression_inputs("r2", pred, target)
    if pred.ndim < 1:
        raise ConfigError(
            f"`pred` must have a batch axis for `r2`. Received: pred.shape={_shape(pred)}. "
            "Pass arrays of shape (n, ...)."
        )
    n = pred.shape[0]
    p = xp.reshape(pred, (n, -1))
    t = xp.reshape(target, (n, -1))
    res = t - p
    ss_res = xp.sum(res * res, axis=0)
    centred = t - xp.mean(t, axis=0, keepdims=True)
    ss_tot = xp.sum(centred * centred, axis=0)
    ones = xp.ones_like(ss_tot)
    zeros = xp.zeros_like(ss_tot)
    constant = ss_tot == 0
    score = 1.0 - ss_res / xp.where(constant, ones, ss_tot)
    score = xp.where(constant, xp.where(ss_res == 0, ones, zeros), score)
    return xp.mean(score)


def accuracy(pred: Any, target: Any) -> Any:
    """Multi-class accuracy: the fraction of samples whose arg-max class is right.

    `pred` holds logits or probabilities with the classes on the last axis `(..., C)`;
    `target` is integer class indices `(...)` or one-hot / probability targets `(..., C)`
    (their arg-max is the class), the same forms as `losses.cross_entropy`. For binary
    outputs with one logit per sample use `binary_accuracy`.

    Args:
        pred: class scores.
        target: class indices or one-hot targets.

    Returns:
        A 0-d array in `[0, 1]`.
    """
    xp, pred, target = _namespace(pred, target)
    probs = _class_probabilities("accuracy", xp, pred, target)
    correct = xp.argmax(pred, axis=-1) == xp.argmax(probs, axis=-1)
    return xp.mean(xp.astype(correct, _float_dtype(xp, pred)))


def binary_accuracy(pred: Any, target: Any) -> Any:
    """Binary accuracy from logits: the prediction is `pred > 0` (probability > 0.5).

    Args:
        pred: logits, the same forms as `losses.binary_cross_entropy`.
        target: labels in `{0, 1}` (or probabilities, thresholded at 0.5) of the same shape.

    Returns:
        A 0-d array in `[0, 1]`, averaged over every element.
    """
    xp, pred, target = _namespace(pred, target)
    _check_same_shape("binary_accuracy", pred, target)
    predicted = pred > 0
    actual = target > 0.5 if not xp.isdtype(target.dtype, "bool") else target
    return xp.mean(xp.astype(predicted == actual, _float_dtype(xp, pred)))


# --------------------------------------------------------------------------- registry


def _keep(name: str, fn: Callable[..., Any]) -> Metric:
    return fn


_REGISTRY: _Registry[Metric] = _Registry("metric", "metrics", _keep)
for _fn in (mae, rmse, r2, accuracy, binary_accuracy):
    _REGISTRY.register(_fn.__name__, _fn, overwrite=False)
del _fn


def names() -> list[str]:
    """The registered metric names, sorted."""
    return _REGISTRY.names()


def register(name: str, fn: Metric | None = None, *, overwrite: bool = False) -> Any:
    """Register a metric under `name`; usable directly or as `@register("name")`.

    Args:
        name: the name used in `TrainingLoop(metrics=[...])` (reported as `val_<name>`).
        fn: `fn(pred, target) -> scalar`.
        overwrite: replace an existing registration of the same name.

    Returns:
        `fn` (direct form) or a decorator returning the function unchanged.

    Raises:
        ConfigError: the name is empty or taken (without `overwrite`), or `fn` is not callable.
    """
    if fn is None:

        def decorator(func: Metric) -> Metric:
            _REGISTRY.register(name, func, overwrite=overwrite)
            return func

        return decorator
    return _REGISTRY.register(name, fn, overwrite=overwrite)


def get(name_or_callable: Any, *, field: str = "metrics") -> Metric:
    """Resolve a metric name to its function; a callable is returned unchanged.

    Args:
        name_or_callable: a registered name (`"rmse"`) or a callable `fn(pred, target)`.
        field: the user-facing field name used in error messages.

    Returns:
        The metric function.

    Raises:
        ConfigError: an unknown name (the message lists the known ones) or a non-callable.
    """
    if isinstance(name_or_callable, str):
        return _REGISTRY.resolve(name_or_callable, field)
    if callable(name_or_callable):
        return name_or_callable
    raise ConfigError(
        f"`{field}` must hold metric names or callables `fn(pred, target)`. "
        f"Received: {field}={name_or_callable!r}. Known metric names: {names()}."
    )


def describe(metric: Any) -> dict[str, Any]:
    """A JSON description of a metric: `{"name": ...}` when registered, else its import path.

    Args:
        metric: a name or a callable.

    Returns:
        `{"name": n}`, `{"import_path": "module:qualname"}` or `{"callable": repr}`.
    """
    fn = get(metric)
    for name in _REGISTRY.names():
        if _REGISTRY.lookup(name) is fn:
            return {"name": name}
    return describe_callable(fn)


def resolve_metrics(metrics: Any) -> dict[str, Callable[[Any, Any], Any]]:
    """`{name: metric}` from metric names, callables, a `{name: metric}` mapping, or a
    plan's JSON descriptions of them (`{"name": ...}`, `{"import_path": ...}`).

    Raises:
        ConfigError: an unknown name, or something that is not a metric.
    """
    if metrics is None:
        return {}
    if isinstance(metrics, str) or callable(metrics):
        metrics = [metrics]
    if isinstance(metrics, Mapping):
        return {str(k): _metric(v) for k, v in metrics.items()}
    if not isinstance(metrics, Sequence):
        raise ConfigError(
            f"`metrics` must be a list of metric names or callables. Received: metrics={metrics!r}."
        )
    out: dict[str, Callable[[Any, Any], Any]] = {}
    for m in metrics:
        fn = _metric(m)
        out[m if isinstance(m, str) else getattr(fn, "__name__", repr(fn))] = fn
    return out


def _metric(spec: Any) -> Callable[[Any, Any], Any]:
    """A metric from a name, a callable, or a plan's JSON description of one."""
    if isinstance(spec, Mapping):
        if "name" in spec:
            return get(spec["name"])
        if "import_path" in spec:
            from pipekit_train.core._imports import import_string

            return import_string(spec["import_path"], field="metrics")
        raise ConfigError(
            "`metrics` holds a description that cannot be rebuilt. Received: "
            f"{dict(spec)!r}. Pass the metric itself, e.g. metrics=['mae'] or a callable."
        )
    return get(spec)

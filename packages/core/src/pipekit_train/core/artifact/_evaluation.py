"""`evaluate`: a loss and metrics of a model operator on a dataset, with no backend.

The numbers are computed the way validation computes them during training (core's loss
and metric definitions on numpy): the loss is averaged over the batches weighted by their
size, each metric is computed once on the concatenated predictions. A model operator
predicts on numpy arrays (`op(x)`), so this runs the same for every backend, and for a
model loaded from a registry without its training code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import is_core_dataset
from pipekit_train.core.metrics import resolve_metrics

__all__ = ["aggregate_batches", "evaluate"]


def aggregate_batches(
    batches: Iterable[Mapping[str, np.ndarray]],
    eval_batch: Callable[[Any], tuple[Any, Any]],
    metrics: Mapping[str, Callable[[Any, Any], Any]],
    *,
    normalizer: Any = None,
) -> dict[str, float]:
    """`{"loss": ..., <metric>: ...}` over one pass of `batches`.

    Args:
        batches: numpy batch dicts with `x` and `y`.
        eval_batch: `batch -> (predictions, mean loss of the batch)`.
        metrics: name -> `fn(pred, target)`, computed on the concatenated predictions.
        normalizer: applied to every batch first (as in training), if given.
    """
    preds: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    total, count = 0.0, 0
    for batch in batches:
        if normalizer is not None:
            batch = normalizer.apply(batch)
        pred, loss = eval_batch(batch)
        n = len(batch["y"])
        total += float(np.asarray(loss)) * n
        count += n
        if metrics:
            preds.append(np.asarray(pred))
            targets.append(np.asarray(batch["y"]))
    out = {"loss": total / max(count, 1)}
    if metrics and preds:
        pred_all, target_all = np.concatenate(preds), np.concatenate(targets)
        for name, fn in metrics.items():
            out[name] = float(np.asarray(fn(pred_all, target_all)))
    return out


def _check_data(data: Any, batch_size: int) -> None:
    if not is_core_dataset(data) or not hasattr(data, "__len__"):
        raise ConfigError(
            "`data` must be a sized pipekit dataset with 'x' and 'y' (ArrayDataset, "
            "CachedDataset, SimulationDataset, a split). "
            f"Received: data={type(data).__name__}."
        )
    if len(data) == 0:
        raise ConfigError("`data` is empty. Received: a dataset with 0 samples.")
    keys = set(data[0])
    if not {"x", "y"} <= keys:
        raise ConfigError(
            f"`data` samples must hold 'x' and 'y'. Received: keys {sorted(keys)}. "
            "Use as_supervised(data, input=..., target=...) to name them."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise ConfigError(
            f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}."
        )
    if batch_size < 1:
        raise ConfigError(
            f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}."
        )


def evaluate(
    model: Any,
    data: Any,
    *,
    loss: Any = "mse",
    metrics: Any = None,
    batch_size: int = 256,
    normalizer: Any = None,
) -> dict[str, float]:
    """The loss and metrics of a model operator on a dataset, with no backend involved.

    ```python
    from pipekit_train.core import evaluate

    model = registry.load("emulator", trusted=["examples.models:*"])
    evaluate(model, test, loss="mse", metrics=["mae", "rmse"])
    # {'loss': 0.0123, 'mae': 0.081, 'rmse': 0.111}
    ```

    Args:
        model: a model operator (`op(x) -> predictions` on numpy arrays), e.g. a
            trained artifact's `model` or one loaded from a registry.
        data: a sized pipekit dataset whose samples hold `x` and `y`.
        loss: a loss name, callable or plan description (`"mse"` by default).
        metrics: metric names or callables (none by default).
        batch_size: rows per prediction call.
        normalizer: a `Normalizer` the model was trained with: batches are normalised
            first, so the numbers are in the units the model was trained in (as its
            validation metrics were).

    Returns:
        `{"loss": ..., <metric>: ...}` as floats.

    Raises:
        ConfigError: bad data, batch size, loss or metric names (before any prediction).
    """
    from pipekit_train.core import losses
    from pipekit_train.core.data import make_batches

    _check_data(data, batch_size)
    if not callable(model):
        raise ConfigError(
            "`model` must be a model operator (callable on a numpy array). "
            f"Received: model={type(model).__name__}."
        )
    loss_fn = losses.get(loss)
    metric_fns = resolve_metrics(metrics)

    def eval_batch(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, float]:
        pred = np.asarray(model(batch["x"]))
        return pred, float(np.asarray(loss_fn(pred, np.asarray(batch["y"]))))

    batches = make_batches(
        data, int(batch_size), seed=0, shuffle=False, drop_remainder=False, num_epochs=1
    )
    return aggregate_batches(batches, eval_batch, metric_fns, normalizer=normalizer)

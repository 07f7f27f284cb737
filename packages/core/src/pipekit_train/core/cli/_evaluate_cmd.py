"""`pipekit-train evaluate`: a registered model's loss and metrics on a dataset.

The model is rebuilt from the registry (record and weights verified, factory trusted);
the dataset comes from an importable factory. The loss, the metrics and the normalizer
are the ones the model was trained with (from the record), unless given on the command
line. Nothing is trained and nothing is written.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["evaluate_command"]


def _parse_ref(ref: str) -> tuple[str, int | str]:
    name, _, version = ref.partition(":")
    if not version:
        return name, "latest"
    if version.isdigit():
        return name, int(version)
    if version == "latest":
        return name, version
    raise ConfigError(
        f"The model reference must be NAME or NAME:VERSION. Received: {ref!r}. "
        f"Use {name}:latest or {name}:<a version number> (see `pipekit-train registry list`)."
    )


def _dataset(factory: str, kwargs_json: str | None) -> Any:
    from pipekit_train.core._imports import import_string

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules beside you import
    try:
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
    except ValueError as exc:
        raise ConfigError(
            f"--data-kwargs must be a JSON object. Received: --data-kwargs {kwargs_json!r} ({exc})."
        ) from exc
    if not isinstance(kwargs, dict):
        raise ConfigError(
            f"--data-kwargs must be a JSON object. Received: --data-kwargs {kwargs_json!r}."
        )
    fn = import_string(factory, field="--data")
    if not callable(fn):
        raise ConfigError(
            f"--data must name a callable that returns a dataset. Received: --data {factory}."
        )
    return fn(**kwargs)


def evaluate_command(
    uri: str,
    ref: str,
    *,
    data: str,
    data_kwargs: str | None = None,
    metrics: str | None = None,
    loss: str | None = None,
    batch_size: int | None = None,
    trust: list[str] | None = None,
    as_json: bool = False,
) -> int:
    """Evaluate a registered model on the dataset `data` builds; print the numbers."""
    from pipekit_train.core.artifact._evaluation import evaluate
    from pipekit_train.core.data import Normalizer

    from ._registry_cmd import open_registry

    if batch_size is not None and batch_size < 1:
        raise ConfigError(
            f"--batch-size must be a positive int. Received: --batch-size {batch_size}."
        )
    name, version = _parse_ref(ref)
    registry = open_registry(uri)
    from pipekit_train.core.model._trust import UntrustedFactoryError

    try:
        record, model = registry.load_record_and_model(name, version, trusted=trust or None)
    except UntrustedFactoryError as exc:
        text = str(exc).split(" Mark the function with")[0]
        raise ConfigError(
            f"{text} Trust it on the command line with --trust MODULE (a module prefix) or "
            "--trust MODULE:FACTORY, e.g. --trust mypkg.models."
        ) from exc
    plan = record.lineage.get("plan") or {}
    loss_spec: Any = loss if loss is not None else plan.get("loss") or "mse"
    if metrics is not None:
        metric_spec: Any = [m.strip() for m in metrics.split(",") if m.strip()]
    else:
        metric_spec = [k for k in (plan.get("metrics") or {})]
    if batch_size is None:
        batch_size = int(plan.get("batch_size") or 256)
    normalizer = Normalizer.from_json(record.normalizer) if record.normalizer else None
    dataset = _dataset(data, data_kwargs)
    result = evaluate(
        model,
        dataset,
        loss=loss_spec,
        metrics=metric_spec or None,
        batch_size=batch_size,
        normalizer=normalizer,
    )
    if as_json:
        print(json.dumps({"name": record.name, "version": record.version, "metrics": result}))
    else:
        values = ", ".join(f"{k}={v:.6g}" for k, v in result.items())
        print(f"{record.name}:{record.version} on {data} ({len(dataset)} samples): {values}")
    return 0

"""`MlflowWriter`: metrics to an MLflow run, logged in batches."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["MlflowWriter"]

_MAX_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch request
_MAX_PARAMS_PER_BATCH = 100


def _param_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


class MlflowWriter:
    """Log metrics to an MLflow run with `MlflowClient.log_batch`.

    Records are buffered and sent in batches of up to 1000 metrics on `flush()`, when
    1000 are pending, and on `close()`, which also marks the run `FINISHED`. MLflow is
    imported when the writer is built (it is slow to import), never when
    `pipekit_train.core.writers` is. The run is created at the first flush (or
    `state_dict()`), with `params` logged once; `state_dict()` holds its `run_id`, so a
    resumed run keeps logging into the same MLflow run.

    Args:
        tracking_uri: the MLflow tracking URI (`sqlite:///path/mlflow.db`, a server URL,
            ...); `None` uses MLflow's default (`MLFLOW_TRACKING_URI`).
        experiment_name: the experiment, created when missing; `None` uses MLflow's
            default experiment.
        run_name: the run's display name.
        params: run parameters (non-string values are logged as JSON).
        run_id: log into this existing run instead of creating one.
        tags: run tags, set when the run is created.

    Raises:
        ImportError: mlflow is not installed (install the `mlflow` extra).
        ConfigError: a bad argument.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
    ):
        for field, value in (
            ("tracking_uri", tracking_uri),
            ("experiment_name", experiment_name),
            ("run_name", run_name),
            ("run_id", run_id),
        ):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(
                    f"`{field}` must be a non-empty string or None. Received: {field}={value!r}."
                )
        for field, mapping in (("params", params), ("tags", tags)):
            if mapping is not None and not isinstance(mapping, Mapping):
                raise ConfigError(
                    f"`{field}` must be a dict or None. Received: {field}={mapping!r}."
                )
        optional_import("mlflow", extra="mlflow", package="pipekit-train-core")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._Metric = Metric
        self._Param = Param
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.params = dict(params or {})
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self._client = MlflowClient(tracking_uri=tracking_uri)
        self._run_id = run_id
        self._resumed = run_id is not None
        self._pending: list[Any] = []
        self._closed = False

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (`None` until the run is created)."""
        return self._run_id

    @property
    def client(self) -> Any:
        """The `MlflowClient`."""
        return self._client

    def _ensure_run(self) -> str:
        if self._run_id is not None:
            if self._resumed:
                self._client.update_run(self._run_id, status="RUNNING")
                self._resumed = False
            return self._run_id
        if self.experiment_name is None:
            experiment_id = "0"
        else:
            experiment = self._client.get_experiment_by_name(self.experiment_name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self._client.create_experiment(self.experiment_name)
            )
        run = self._client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
        self._run_id = run.info.run_id
        items = [self._Param(str(k), _param_value(v)) for k, v in self.params.items()]
        for i in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, params=items[i : i + _MAX_PARAMS_PER_BATCH])
        return self._run_id

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Buffer the metrics; send a batch when 1000 are pending."""
        if self._closed:
            raise RuntimeError("MlflowWriter is closed.")
        timestamp = int(time.time() * 1000)
        step = int(step)
        self._pending.extend(
            self._Metric(str(k), float(v), timestamp, step) for k, v in metrics.items()
        )
        if len(self._pending) >= _MAX_METRICS_PER_BATCH:
            self.flush()

    def flush(self) -> None:
        """Send the pending metrics (creating the run on first use)."""
        if not self._pending:
            return
        run_id = self._ensure_run()
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), _MAX_METRICS_PER_BATCH):
            self._client.log_batch(run_id, metrics=pending[i : i + _MAX_METRICS_PER_BATCH])

    def close(self) -> None:
        """Flush and mark the run `FINISHED`."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self._run_id is not None:
            self._client.set_terminated(self._run_id, status="FINISHED")

    def state_dict(self) -> dict[str, Any]:
        """JSON state: `{"run_id": ...}` (the run is created if needed)."""
        return {"run_id": self._ensure_run()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue logging into the saved run (its params are not logged again)."""
        run_id = state.get("run_id")
        if run_id:
            self._run_id = str(run_id)
            self._resumed = True

    def __repr__(self) -> str:
        return (
            f"MlflowWriter(tracking_uri={self.tracking_uri!r}, "
            f"experiment_name={self.experiment_name!r}, run_id={self._run_id!r})"
        )

"""`WandbWriter`: metrics to a Weights & Biases run (online, offline or disabled)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["WandbWriter"]

_MODES = ("online", "offline", "disabled", "shared")


class WandbWriter:
    """Log metrics to a Weights & Biases run with `Run.log(metrics, step=step)`.

    wandb is imported when the writer is built, never when `pipekit_train.core.writers`
    is. The run is started at the first `write` (or `state_dict()`) with
    `wandb.init(..., reinit="create_new")`, so several writers (a sweep's trials) can
    log to separate runs from one process. W&B's own service process sends the data (or,
    in offline mode, writes it under `<dir>/wandb/offline-run-*`, for `wandb sync`
    later); `flush()` has nothing to force, and `close()` finishes the run: it returns
    once the service holds all of the run's data, which the service then writes (an
    offline run's file is complete when it ends with W&B's `exit` record, at the latest
    when the Python process exits).

    `state_dict()` holds the run id, so a resumed training logs into the same W&B run
    (`resume="allow"`). W&B accepts only increasing steps: the steps a resumed training
    repeats (those after its checkpoint that the interrupted process had already
    logged) are skipped here, and an exact resume would log the same values anyway.

    Offline runs need no account and no network: `mode="offline"` (or
    `WANDB_MODE=offline` in the environment).

    Args:
        project: the W&B project; `None` uses W&B's default (`WANDB_PROJECT`, ...).
        name: the run's display name.
        config: run configuration (hyperparameters), stored with the run.
        entity: the W&B user or team.
        group: a group name, e.g. to gather a sweep's trials.
        tags: run tags.
        dir: the folder under which W&B writes its `wandb/` run folders (created when
            missing); `None` uses W&B's default (`WANDB_DIR` or the working directory).
        mode: `"online"`, `"offline"`, `"disabled"` or `"shared"`; `None` uses W&B's
            default (`WANDB_MODE`, then online).
        run_id: log into this run id (resuming it if it exists).

    Raises:
        ImportError: wandb is not installed (install the `wandb` extra).
        ConfigError: a bad argument.
    """

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        entity: str | None = None,
        group: str | None = None,
        tags: Sequence[str] | None = None,
        dir: str | os.PathLike[str] | None = None,
        mode: str | None = None,
        run_id: str | None = None,
    ):
        for field, value in (
            ("project", project),
            ("name", name),
            ("entity", entity),
            ("group", group),
            ("run_id", run_id),
        ):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(
                    f"`{field}` must be a non-empty string or None. Received: {field}={value!r}."
                )
        if config is not None and not isinstance(config, Mapping):
            raise ConfigError(f"`config` must be a dict or None. Received: config={config!r}.")
        if tags is not None and (
            isinstance(tags, str)
            or not isinstance(tags, Sequence)
            or not all(isinstance(t, str) for t in tags)
        ):
            raise ConfigError(
                f"`tags` must be a list of strings or None. Received: tags={tags!r}. "
                "Use e.g. tags=['baseline']."
            )
        if mode is not None and mode not in _MODES:
            raise ConfigError(f"`mode` must be one of {list(_MODES)}. Received: mode={mode!r}.")
        if isinstance(dir, os.PathLike):
            dir = os.fspath(dir)
        if dir is not None and (not isinstance(dir, str) or not dir):
            raise ConfigError(
                f"`dir` must be a folder path or None. Received: dir={dir!r}. Pass e.g. 'runs'."
            )
        self._wandb = optional_import("wandb", extra="wandb", package="pipekit-train-core")
        self.project = project
        self.name = name
        self.config = dict(config or {})
        self.entity = entity
        self.group = group
        self.tags = list(tags) if tags is not None else None
        self.dir = dir
        self.mode = mode
        self._run_id = run_id
        self._run: Any = None
        self._closed = False

    @property
    def run_id(self) -> str | None:
        """The W&B run id (`None` until the run is started, unless given)."""
        return self._run_id

    @property
    def run(self) -> Any:
        """The `wandb.Run` (`None` until the first write)."""
        return self._run

    def _ensure_run(self) -> Any:
        if self._run is None:
            if self._closed:
                raise RuntimeError("WandbWriter is closed.")
            if self.dir is not None:
                os.makedirs(self.dir, exist_ok=True)
            self._run = self._wandb.init(
                project=self.project,
                entity=self.entity,
                name=self.name,
                group=self.group,
                tags=self.tags,
                config=self.config or None,
                dir=self.dir,
                mode=self.mode,
                id=self._run_id,
                resume="allow" if self._run_id is not None else None,
                reinit="create_new",
            )
            self._run_id = self._run.id
        return self._run

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log `metrics` at `step` (skipped when W&B's run is already past `step`)."""
        if self._closed:
            raise RuntimeError("WandbWriter is closed.")
        run = self._ensure_run()
        step = int(step)
        if step < int(getattr(run, "step", 0) or 0):
            return  # a resumed run repeats steps W&B already has
        run.log({str(k): float(v) for k, v in metrics.items()}, step=step)

    def flush(self) -> None:
        """Nothing to do: W&B's service process writes and sends in the background."""

    def close(self) -> None:
        """Finish the run (waits until its data is written or sent)."""
        if self._closed:
            return
        self._closed = True
        if self._run is not None:
            self._run.finish()

    def state_dict(self) -> dict[str, Any]:
        """JSON state: `{"run_id": ...}` (the run is started if needed)."""
        return {"run_id": self._ensure_run().id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Log into the saved run id (before the run is started)."""
        run_id = state.get("run_id")
        if run_id and self._run is None:
            self._run_id = str(run_id)

    def __repr__(self) -> str:
        return f"WandbWriter(project={self.project!r}, mode={self.mode!r}, run_id={self._run_id!r})"

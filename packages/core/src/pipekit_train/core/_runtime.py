"""`RunContext`: the state of one run, which `RunLifecycle` drives.

It records what happened (`_record_step`, `_record_steps`, `record_validation`,
`record_checkpoint`) and says what is due (`_due_validation`, `_due_checkpoint`,
`_done`); it dispatches callbacks, routes metrics to writers in groups (`_metrics_routing`), runs
validation (`_validation`), keeps the checkpoint schedule (`_checkpoint_schedule`), the
history and the best monitored metric, and assembles the `TrainingArtifact`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._artifact import TrainingArtifact
from ._checkpoint_schedule import CheckpointSchedule
from ._errors import ConfigError
from ._history import History, loss_label
from ._lr_scale import adjusts_learning_rate, check_lr_scale
from ._metrics_routing import SKIPPED_METRIC, MetricRouting, _PendingGroup, default_fetch
from ._plan import Plan
from ._run_state import RunState
from ._validation import Validation
from ._versions import library_versions

__all__ = [
    "ADAPTER_SURFACE",
    "HOOKS",
    "SKIPPED_METRIC",
    "RunContext",
    "RunState",
    "default_fetch",
    "library_versions",
]

HOOKS = ("on_train_start", "on_step_end", "on_validation_end", "on_checkpoint", "on_train_end")

ADAPTER_SURFACE: frozenset[str] = frozenset(
    {
        "step",
        "epoch",
        "total_steps",
        "is_chief",
        "steps_until_event",
        "validate",
        "record_validation",
        "checkpoint_meta",
        "checkpoint_metrics",
        "record_checkpoint",
        "flush_metrics",
        "adjusts_lr",
        "bind_lr_scale",
    }
)
"""The `RunContext` members an adapter may use (its other members are private)."""


class _Normalized:
    """A batch iterator whose batches pass through `normalizer.apply` (state unchanged)."""

    def __init__(self, inner: Any, normalizer: Any):
        self._inner = inner
        self._normalizer = normalizer

    def __iter__(self) -> _Normalized:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return self._normalizer.apply(next(self._inner))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RunContext(MetricRouting, Validation, CheckpointSchedule):
    """Shared run machinery for adapters (see the module docstring).

    An adapter reaches it as `RunLifecycle.ctx` and uses only its public members, the
    adapter-facing surface (`ADAPTER_SURFACE`; everything else is private to core's
    run machinery, which `RunLifecycle` drives):

    - `step`, `epoch`, `total_steps`, `is_chief`: where the run is (read only);
    - `steps_until_event(limit)`: how many steps may be fused before the next event;
    - `validate(eval_batch, batches=None)`: run validation with the adapter's batch
      evaluator, or `record_validation(metrics)` for metrics the framework computed;
    - `checkpoint_meta(data_state)`, `checkpoint_metrics()`, `record_checkpoint(path)`:
      what a save stores besides the state, and its report afterwards;
    - `flush_metrics()`: fetch the pending step metrics now (and check them);
    - `adjusts_lr`, `bind_lr_scale(hook)`: whether a callback of the plan changes the
      learning rate (`ReduceLROnPlateau`), and the adapter's hook that applies core's
      learning-rate scale to its step.

    Args:
        plan: the frozen plan.
        fetch: turns a list of device values into numpy arrays in one go (e.g.
            `jax.device_get`); default `np.asarray` on each. Values arrive in step
            order (group by group, metric by metric), so a backend may copy a whole
            group to the host at once.
        learning_rate: `() -> float | None`, evaluated only when a callback asks.
        is_chief: only the chief process writes metrics and dispatches callbacks that
            write files (multi-process runs); every process follows stop requests.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        fetch: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
        learning_rate: Callable[[], float | None] | None = None,
        is_chief: bool = True,
    ):
        self._plan = plan
        self._plan_json = plan.to_json()
        self._backend = plan.backend
        self.step = 0
        self.epoch = 0
        self._stop_reason: str | None = None
        self._resumed_from_step: int | None = None
        self._history = History()
        self._annotate_history()
        self._best_metric: float | None = None
        self._best_step: int | None = None
        self._monitor = plan.checkpoint.monitor if plan.checkpoint else "val_loss"
        self._mode = plan.checkpoint.mode if plan.checkpoint else "min"
        self.is_chief = is_chief
        self._fetch = fetch or default_fetch
        self._lr = learning_rate
        self._pending: list[_PendingGroup] = []
        self._pending_steps = 0
        self._latest: dict[str, float] = {}
        self._writers = list(plan.writers) if is_chief else []
        self._callbacks = list(plan.callbacks)
        if plan.progress or (plan.progress is None and RunState(self).is_tty and is_chief):
            from .callbacks import ProgressBar

            if not any(isinstance(cb, ProgressBar) for cb in self._callbacks):
                self._callbacks.append(ProgressBar())
        self._step_hooks = [
            hook for cb in self._callbacks if callable(hook := getattr(cb, "on_step_end", None))
        ]
        self._state = RunState(self)
        self._t_start = time.perf_counter()
        self._steps_at_start = 0
        self._train_iter: Any = None
        self._last_checkpoint: str | None = None
        self._active: _PendingGroup | None = None
        self._steps_per_epoch: int | None = plan.steps_per_epoch
        self.total_steps: int | None = plan.total_steps
        # on_nonfinite="skip": skips so far, the current run of consecutive ones, the
        # latest skipped step, and a checkpoint postponed from a skipped step
        self._skipped_steps = 0
        self._consecutive_skips = 0
        self._last_skipped: int | None = None
        self._checkpoint_owed = False
        # the learning-rate scale (`_lr_scale`): only plans whose callbacks adjust the rate
        # use it; the adapter's hook applies it to the backend's step
        self.adjusts_lr = adjusts_learning_rate(plan)
        self._lr_scale = 1.0
        self._lr_scale_hook: Callable[[float], None] | None = None

    # -- data --------------------------------------------------------------------------
    def _train_batches(
        self, data_state: Mapping[str, Any] | None = None, *, shard: tuple[int, int] = (0, 1)
    ) -> Any:
        """The core batch iterator over the training data, positioned by `data_state`.

        `shard=(index, count)`: this process's part of every global batch of
        `plan.batch_size`. The state is global (the same on every process and for every
        process count), so the chief's saved state positions every process, and a run
        checkpointed with one process count resumes with another (elastic resume).
        """
        from .data import make_batches

        it = make_batches(
            self._plan.data,
            self._plan.batch_size,
            seed=self._plan.seed,
            shuffle=self._plan.shuffle,
            drop_remainder=self._plan.drop_remainder,
            shard=shard,
        )
        if data_state:
            it.set_state(data_state)
        self._train_iter = it
        if self._plan.normalizer is not None:
            return _Normalized(it, self._plan.normalizer)
        return it

    def _use_train_iterator(self, it: Any) -> Any:
        """Adopt a backend's own training batch iterator (a native loader's batches).

        Its `get_state()` (a JSON-able dict), when it has one, goes into every checkpoint
        (`checkpoint_meta`), so a resume is exact if the backend positions a new iterator
        with it. Without `get_state` a resumed run restarts the loader from its beginning
        (warned here). Returns the iterator to pull batches from (through the plan's
        normalizer, if any).
        """
        self._train_iter = it
        if self._resumed_from_step and not callable(getattr(it, "get_state", None)):
            warnings.warn(
                f"Resuming at step {self._resumed_from_step}, but the training loader "
                f"({type(it).__name__}) has no checkpointable state: it restarts from its "
                "beginning, so the resumed run sees different batches than an uninterrupted one.",
                stacklevel=2,
            )
        if self._plan.normalizer is not None:
            return _Normalized(it, self._plan.normalizer)
        return it

    def _sync_epoch(self) -> None:
        spe = self._steps_per_epoch
        if spe:
            self.epoch = self.step // spe

    # -- lifecycle ---------------------------------------------------------------------
    def _restore(self, meta: Mapping[str, Any]) -> None:
        """Load the run state saved in a checkpoint's meta (`checkpoint_meta()`)."""
        run = meta.get("run", {})
        self.step = int(meta.get("step", run.get("step", 0)))
        self._resumed_from_step = self.step
        self._sync_epoch()
        self._history = History.from_json(run.get("history", {}))
        self._annotate_history()
        self._best_metric = run.get("best_metric")
        self._best_step = run.get("best_step")
        self._latest = {k: float(v) for k, v in run.get("latest", {}).items()}
        # a checkpoint is never written right after a skipped step: no run of skips is open
        self._skipped_steps = int(self._history.last(SKIPPED_METRIC) or 0)
        self._lr_scale = check_lr_scale(run.get("lr_scale", 1.0))
        states = run.get("callbacks", {})
        for key, obj in self._stateful():
            if key in states and callable(getattr(obj, "load_state_dict", None)):
                obj.load_state_dict(states[key])

    def _annotate_history(self) -> None:
        """Tell the history what its series mean (loss name, units, backend, run)."""
        plan = self._plan
        if plan.checkpoint is not None:
            run = "/".join(plan.checkpoint.location.rstrip("/").split("/")[-3:])
        else:
            model = self._plan_json.get("model") or {}
            run = str(model.get("factory") or model.get("type") or "")
        if plan.sweep_id:
            run = f"{run} (sweep {plan.sweep_id})" if run else f"sweep {plan.sweep_id}"
        self._history.annotate(
            backend=self._backend,
            loss=loss_label(self._plan_json.get("loss")),
            normalized=plan.normalizer is not None,
            run=run or None,
        )

    def _stateful(self) -> list[tuple[str, Any]]:
        out = []
        for i, obj in enumerate([*self._callbacks, *self._writers]):
            if callable(getattr(obj, "state_dict", None)):
                out.append((f"{i}:{type(obj).__name__}", obj))
        return out

    def _begin(self) -> None:
        """Start the clock, hand the backend the (restored) rate scale, dispatch `on_train_start`."""
        self._t_start = time.perf_counter()
        self._steps_at_start = self.step
        if self.adjusts_lr and self._lr_scale_hook is not None:
            self._lr_scale_hook(self._lr_scale)
        self._dispatch("on_train_start")

    # -- learning-rate scale -----------------------------------------------------------
    def bind_lr_scale(self, hook: Callable[[float], None] | None) -> None:
        """The adapter's `scale -> None` that applies a new learning-rate scale to its step.

        Called once in `begin` (with the restored scale) and after every change, only
        for plans whose callbacks adjust the rate (`adjusts_learning_rate`).
        """
        self._lr_scale_hook = hook

    def _set_lr_scale(self, scale: float) -> None:
        """Set the learning-rate scale: the next steps train at `schedule(step) * scale`.

        Raises:
            ConfigError: `scale` is not a finite number > 0, or no callback of the plan
                declares `adjusts_learning_rate` (the backend was built without the scale).
        """
        value = check_lr_scale(scale)
        if not self.adjusts_lr:
            raise ConfigError(
                "`set_lr_scale` needs a callback with `adjusts_learning_rate = True` in the "
                f"plan (the {self._backend!r} step was built without a learning-rate scale). "
                f"Received: scale={scale!r}. Set the attribute on the callback class."
            )
        self._lr_scale = value
        if self._lr_scale_hook is not None:
            self._lr_scale_hook(value)

    @property
    def _done(self) -> bool:
        """Whether training should stop now (total steps reached or a stop requested)."""
        total = self.total_steps
        return self._stop_reason is not None or (total is not None and self.step >= total)

    # -- end ---------------------------------------------------------------------------
    def _dispatch(self, hook: str, *args: Any) -> None:
        for cb in self._callbacks:
            fn = getattr(cb, hook, None)
            if callable(fn):
                fn(self._state, *args)

    def _finish(
        self, model: Any, *, extra: Mapping[str, Any] | None = None, raw_model: Any = None
    ) -> TrainingArtifact:
        """Flush, assemble the artifact, dispatch `on_train_end`, close the writers."""
        self.flush_metrics()
        wall = time.perf_counter() - self._t_start
        ran = self.step - self._steps_at_start
        final = {name: self._history.last(name) for name in self._history.names}
        artifact = TrainingArtifact(
            model=model,
            history=self._history,
            final_metrics={k: v for k, v in final.items() if v is not None},
            best_metric=self._best_metric,
            best_step=self._best_step,
            checkpoint_dir=None
            if self._plan.checkpoint is None
            else self._plan.checkpoint.location,
            weights_sha256=TrainingArtifact.hash_weights(model),
            plan=self._plan_json,
            backend=self._backend,
            versions=library_versions(self._backend),
            wall_time_s=wall,
            steps_per_s=ran / wall if wall > 0 else 0.0,
            steps=self.step,
            resumed_from_step=self._resumed_from_step,
            stop_reason=self._stop_reason or "max_steps",
            sweep_id=self._plan.sweep_id,
            normalizer=self._plan.normalizer,
            extra=dict(extra or {}),
            raw_model=raw_model,
        )
        try:
            self._dispatch("on_train_end", artifact)
        finally:
            self._close_writers()
        return artifact

    def _abort(self) -> None:
        """Flush what is pending and close the writers after a failure (never raises)."""
        try:
            self.flush_metrics()
        except Exception:
            pass
        try:
            self._close_writers()
        except Exception:
            pass

"""`RunContext`: the state of one run, composed of single-purpose parts.

`RunLifecycle` drives it; nothing outside core's run machinery touches it. Its parts,
each with its own public interface:

- `progress` (`Progress`): step, epoch, total, stop request;
- `callbacks` (`Callbacks`): hook dispatch, with `state` (`RunState`) as their view;
- `metrics` (`MetricLog`): steps recorded with device values, fetched in groups, the
  non-finite policy, history and writers;
- `validation` (`Validation`): its schedule, core batching, the best monitored value;
- `checkpoints` (`CheckpointSchedule`): what is due, what a checkpoint's meta holds;
- `lr_scale` (`LearningRateScale`): the scale callbacks set and the backend applies.

The context itself holds what joins them: the training batches (core batching or a
native loader's), the resume of a saved run state, the start and end of training and
the `TrainingArtifact`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core.artifact._artifact import TrainingArtifact
from pipekit_train.core.artifact._history import History, loss_label
from pipekit_train.core.artifact._versions import library_versions
from pipekit_train.core.spec._lr_scale import adjusts_learning_rate
from pipekit_train.core.spec._plan import Plan

from ._checkpoint_schedule import CheckpointSchedule
from ._dispatch import Callbacks
from ._lr_scale import LearningRateScale
from ._metrics import MetricLog, default_fetch
from ._progress import Progress
from ._rollout_noise import NoisyBatches, plan_members
from ._state import RunState
from ._validation import Validation

__all__ = ["RunContext"]


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


class RunContext:
    """The state of one run (see the module docstring).

    Args:
        plan: the frozen plan.
        fetch: turns a list of device values into numpy arrays in one go (e.g.
            `jax.device_get`); default `np.asarray` on each. Values arrive in step
            order (group by group, metric by metric), so a backend may copy a whole
            group to the host at once.
        learning_rate: `() -> float | None`, evaluated only when a callback asks.
        is_chief: only the chief process writes metrics and dispatches callbacks that
            write files (multi-process runs); every process follows stop requests.

    Attributes:
        plan: the frozen plan; `plan_json` its JSON form; `backend` its backend name.
        is_chief: whether this process writes metrics and checkpoint metadata.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        fetch: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
        learning_rate: Callable[[], float | None] | None = None,
        is_chief: bool = True,
    ):
        self.plan = plan
        self.plan_json = plan.to_json()
        self.backend = plan.backend
        self.is_chief = is_chief
        self._lr = learning_rate
        self.progress = Progress(plan)
        self.state = RunState(self)
        callbacks = list(plan.callbacks)
        if plan.progress or (plan.progress is None and self.state.is_tty and is_chief):
            from pipekit_train.core.callbacks import ProgressBar

            if not any(isinstance(cb, ProgressBar) for cb in callbacks):
                callbacks.append(ProgressBar())
        self.callbacks = Callbacks(callbacks, self.state)
        history = History()
        self._annotate(history)
        writers = list(plan.writers) if is_chief else []
        self.metrics = MetricLog(
            plan, self.progress, self.callbacks, writers, fetch or default_fetch, history
        )
        self.validation = Validation(plan, self.progress, self.metrics, self.callbacks)
        self.lr_scale = LearningRateScale(adjusts_learning_rate(plan), plan.backend)
        self.checkpoints = CheckpointSchedule(
            plan, self.progress, self.metrics, self.validation, self._run_extras
        )
        self._t_start = time.perf_counter()
        self._steps_at_start = 0
        #: `batch -> predictions` with the current weights (bound by the lifecycle when
        #: the adapter hands over its evaluator; None for drivers without one).
        self.predict: Callable[[Mapping[str, Any]], np.ndarray] | None = None

    # -- data --------------------------------------------------------------------------
    def train_batches(
        self, data_state: Mapping[str, Any] | None = None, *, shard: tuple[int, int] = (0, 1)
    ) -> Any:
        """The core batch iterator over the training data, positioned by `data_state`.

        `shard=(index, count)`: this process's part of every global batch of
        `plan.batch_size`. The state is global (the same on every process and for every
        process count), so the chief's saved state positions every process, and a run
        checkpointed with one process count resumes with another (elastic resume).
        """
        from pipekit_train.core.data import make_batches

        plan = self.plan
        it = make_batches(
            plan.data,
            plan.batch_size,
            seed=plan.seed,
            shuffle=plan.shuffle,
            drop_remainder=plan.drop_remainder,
            shard=shard,
        )
        if data_state:
            it.set_state(data_state)
        return self._with_noise(self._normalized(it), shard)

    def adopt_train_iterator(self, it: Any) -> Any:
        """Adopt a backend's own training batch iterator (a native loader's batches).

        Its `get_state()` (a JSON-able dict), when it has one, goes into every checkpoint,
        so a resume is exact if the backend positions a new iterator with it. Without
        `get_state` a resumed run restarts the loader from its beginning (warned here).
        Returns the iterator to pull batches from (through the plan's normalizer, if any).
        """
        resumed = self.progress.resumed_from_step
        if resumed and not callable(getattr(it, "get_state", None)):
            warnings.warn(
                f"Resuming at step {resumed}, but the training loader "
                f"({type(it).__name__}) has no checkpointable state: it restarts from its "
                "beginning, so the resumed run sees different batches than an uninterrupted one.",
                stacklevel=3,
            )
        return self._with_noise(self._normalized(it), (0, 1))

    def _normalized(self, it: Any) -> Any:
        if self.plan.normalizer is not None:
            return _Normalized(it, self.plan.normalizer)
        return it

    def _with_noise(self, it: Any, shard: tuple[int, int]) -> Any:
        """Attach the rollout's input noise (`batch["noise"]`) and an ensemble loss's
        member noise (`batch["member_noise"]`) when the plan asks for them."""
        rollout = self.plan.rollout
        members = plan_members(self.plan)
        if rollout is None or (rollout.noise_std <= 0 and members is None):
            return it
        plan = self.plan
        start = self.progress.step * plan.accumulate_grad_batches
        return NoisyBatches(
            it, std=rollout.noise_std, seed=plan.seed, start=start, shard=shard, members=members
        )

    # -- run state ---------------------------------------------------------------------
    def _annotate(self, history: History) -> None:
        """Tell the history what its series mean (loss name, units, backend, run)."""
        plan = self.plan
        if plan.checkpoint is not None:
            run = "/".join(plan.checkpoint.location.rstrip("/").split("/")[-3:])
        else:
            model = self.plan_json.get("model") or {}
            run = str(model.get("factory") or model.get("type") or "")
        if plan.sweep_id:
            run = f"{run} (sweep {plan.sweep_id})" if run else f"sweep {plan.sweep_id}"
        history.annotate(
            backend=self.backend,
            loss=loss_label(self.plan_json.get("loss")),
            normalized=plan.normalizer is not None,
            run=run or None,
        )

    def _stateful(self) -> list[tuple[str, Any]]:
        out = []
        for i, obj in enumerate([*self.callbacks.callbacks, *self.metrics.writers]):
            if callable(getattr(obj, "state_dict", None)):
                out.append((f"{i}:{type(obj).__name__}", obj))
        return out

    def _run_extras(self) -> dict[str, Any]:
        """The run state a checkpoint saves besides counters, history and the best metric."""
        extras: dict[str, Any] = {
            "callbacks": {key: obj.state_dict() for key, obj in self._stateful()}
        }
        if self.lr_scale.enabled:
            extras["lr_scale"] = float(self.lr_scale.value)
        return extras

    def restore(self, meta: Mapping[str, Any]) -> None:
        """Load the run state saved in a checkpoint's meta (`CheckpointSchedule.meta`)."""
        run = meta.get("run", {})
        self.progress.resume_at(int(meta.get("step", run.get("step", 0))))
        history = History.from_json(run.get("history", {}))
        self._annotate(history)
        self.metrics.restore(history, run.get("latest", {}))
        self.validation.best_metric = run.get("best_metric")
        self.validation.best_step = run.get("best_step")
        self.lr_scale.restore(run.get("lr_scale", 1.0))
        states = run.get("callbacks", {})
        for key, obj in self._stateful():
            if key in states and callable(getattr(obj, "load_state_dict", None)):
                obj.load_state_dict(states[key])

    def learning_rate(self) -> float | None:
        """The backend's current learning rate, if it reports one."""
        return None if self._lr is None else self._lr()

    # -- start and end -----------------------------------------------------------------
    def begin(self) -> None:
        """Start the clock, hand the backend the (restored) rate scale, dispatch `on_train_start`."""
        self._t_start = time.perf_counter()
        self._steps_at_start = self.progress.step
        self.lr_scale.apply()
        self.callbacks.dispatch("on_train_start")

    def finish(
        self,
        model: Any,
        *,
        extra: Mapping[str, Any] | None = None,
        raw_model: Any = None,
        weights_step: int | None = None,
    ) -> TrainingArtifact:
        """Flush, assemble the artifact, dispatch `on_train_end`, close the writers.

        `weights_step`: the step whose weights `model` holds (default: the last step).
        """
        metrics, progress, plan = self.metrics, self.progress, self.plan
        metrics.flush()
        wall = time.perf_counter() - self._t_start
        ran = progress.step - self._steps_at_start
        history = metrics.history
        final = {name: history.last(name) for name in history.names}
        artifact = TrainingArtifact(
            model=model,
            history=history,
            final_metrics={k: v for k, v in final.items() if v is not None},
            best_metric=self.validation.best_metric,
            best_step=self.validation.best_step,
            checkpoint_dir=None if plan.checkpoint is None else plan.checkpoint.location,
            weights_sha256=TrainingArtifact.hash_weights(model),
            plan=self.plan_json,
            backend=self.backend,
            versions=library_versions(self.backend),
            wall_time_s=wall,
            steps_per_s=ran / wall if wall > 0 else 0.0,
            steps=progress.step,
            resumed_from_step=progress.resumed_from_step,
            stop_reason=progress.stop_reason or "max_steps",
            sweep_id=plan.sweep_id,
            normalizer=plan.normalizer,
            extra=dict(extra or {}),
            raw_model=raw_model,
            weights_step=progress.step if weights_step is None else int(weights_step),
        )
        try:
            self.callbacks.dispatch("on_train_end", artifact)
        finally:
            metrics.close_writers()
        return artifact

    def abort(self) -> None:
        """Flush what is pending and close the writers after a failure (never raises)."""
        try:
            self.metrics.flush()
        except Exception:
            pass
        try:
            self.metrics.close_writers()
        except Exception:
            pass

"""`OptunaSearch`: an adaptive search space for `HyperSweep`, with pruning.

The sweep's parent process *asks* the study for parameters and *tells* it the outcome;
trials run wherever the executor puts them. With a pruner, each trial's loop gets an
`OptunaPruningCallback` that reports the sweep metric after every validation and stops
the loop when the pruner says so. In a worker process the callback opens the study by
its storage URL and name, so a storage every worker can open is needed (the default,
SQLite in the sweep directory, works for one machine).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipekit_train.core import ConfigError
from pipekit_train.core.utils import optional_import

from ._grid import to_json_value

__all__ = ["OptunaPruningCallback", "OptunaSearch", "make_pruning_callback", "parse_space"]

_SHORTHAND = (
    "a tuple such as ('float', 1e-4, 1e-1, {'log': True}), ('int', 16, 128, {'step': 16}) or "
    "('categorical', [16, 32, 64])"
)


def _optuna() -> Any:
    return optional_import("optuna", extra="optuna", package="pipekit-train-sweep")


def _parse_one(name: str, spec: Any) -> Any:
    optuna = _optuna()
    dists = optuna.distributions
    if isinstance(spec, dists.BaseDistribution):
        return spec
    if not isinstance(spec, tuple) or not spec or spec[0] not in ("float", "int", "categorical"):
        raise ConfigError(
            f"`space[{name!r}]` must be an optuna distribution or {_SHORTHAND}. "
            f"Received: {name}={spec!r}."
        )
    kind = spec[0]
    try:
        if kind == "categorical":
            if len(spec) != 2 or not isinstance(spec[1], (list, tuple)) or not spec[1]:
                raise ConfigError(
                    f"`space[{name!r}]` categorical needs a non-empty list of choices, e.g. "
                    f"('categorical', [16, 32]). Received: {name}={spec!r}."
                )
            choices = [to_json_value(c, where=f"{name} choice") for c in spec[1]]
            return dists.CategoricalDistribution(choices)
        if len(spec) not in (3, 4) or (len(spec) == 4 and not isinstance(spec[3], Mapping)):
            raise ConfigError(
                f"`space[{name!r}]` must be ({kind!r}, low, high) or ({kind!r}, low, high, "
                f"{{'log': True}}). Received: {name}={spec!r}."
            )
        options = dict(spec[3]) if len(spec) == 4 else {}
        unknown = sorted(set(options) - {"log", "step"})
        if unknown:
            raise ConfigError(
                f"`space[{name!r}]` options may be 'log' and 'step'. Received: {unknown} in {name}={spec!r}."
            )
        if kind == "float":
            return dists.FloatDistribution(float(spec[1]), float(spec[2]), **options)
        return dists.IntDistribution(int(spec[1]), int(spec[2]), **options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"`space[{name!r}]` is not a valid distribution: {exc} Received: {name}={spec!r}."
        ) from exc


def parse_space(space: Any) -> dict[str, Any]:
    """`{name: optuna distribution}` from distributions or shorthand tuples.

    Shorthand: `("float", low, high)`, `("float", low, high, {"log": True})`,
    `("float", low, high, {"step": 0.1})`, `("int", low, high)`,
    `("int", low, high, {"log": True} | {"step": k})`, `("categorical", [choices...])`.
    """
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(
            f"`space` must be a non-empty dict of name -> distribution. Received: space={space!r}."
        )
    out = {}
    for name, spec in space.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"`space` keys must be non-empty strings. Received: key {name!r}.")
        out[name] = _parse_one(name, spec)
    return out


class OptunaPruningCallback:
    """Reports the sweep metric to an Optuna trial after each validation; stops when pruned.

    A core callback (duck-typed `on_validation_end`). `HyperSweep` appends it to each
    trial's `loop.plan.callbacks`; there is no need to build it yourself.

    Args:
        metric: the metric to report (read from `state.metrics`, e.g. `"val_loss"`).
        trial: an `optuna.Trial`, or a zero-argument function returning one (opened lazily
            in a worker process).
    """

    def __init__(self, metric: str, trial: Any):
        self.metric = metric
        self._trial = trial
        self.pruned = False
        self.pruned_at_step: int | None = None

    def _get_trial(self) -> Any:
        if callable(self._trial) and not hasattr(self._trial, "report"):
            self._trial = self._trial()
        return self._trial

    def on_validation_end(self, state: Any) -> None:
        """Report `state.metrics[metric]` at `state.step`; request a stop if pruned."""
        value = state.metrics.get(self.metric)
        if value is None or not math.isfinite(float(value)):
            return
        trial = self._get_trial()
        step = int(state.step)
        trial.report(float(value), step)
        if not self.pruned and trial.should_prune():
            self.pruned = True
            self.pruned_at_step = step
            state.request_stop(
                f"pruned by the Optuna pruner at step {step} ({self.metric}={float(value):.4g})"
            )


def make_pruning_callback(spec: Mapping[str, Any]) -> OptunaPruningCallback:
    """Build the pruning callback from a task's pruning spec (in whichever process runs it)."""
    if spec.get("trial") is not None:
        return OptunaPruningCallback(spec["metric"], spec["trial"])

    def open_trial() -> Any:
        optuna = _optuna()
        study = optuna.load_study(
            study_name=spec["study_name"], storage=spec["storage"], pruner=spec["pruner"]
        )
        return optuna.trial.Trial(study, spec["trial_id"])

    return OptunaPruningCallback(spec["metric"], open_trial)


class OptunaSearch:
    """An Optuna study as a `HyperSweep` search space (ask/tell, pruning, shared storage).

    The sweep asks the study for each trial's parameters and tells it the outcome:
    `"ok"` → the metric value, `"pruned"` → `TrialState.PRUNED`, `"failed"` (or a
    non-finite metric) → `TrialState.FAIL`. The study's direction follows the sweep's
    `mode` (`"min"` → minimize).

    Args:
        space: `{name: distribution}`: `optuna.distributions.*` objects or shorthand
            tuples — `("float", low, high)`, `("float", low, high, {"log": True})`,
            `("float", low, high, {"step": 0.1})`, `("int", low, high)`,
            `("int", low, high, {"step": 2})`, `("categorical", [choices...])`.
        n_trials: how many trials *this sweep* runs (trials already in its journal count,
            so a resumed sweep runs only the rest). Several sweeps sharing one study each
            run their own `n_trials`, like `study.optimize(n_trials=...)` per worker.
        sampler: an Optuna sampler (default: Optuna's default, TPE). Pass a seeded one,
            e.g. `optuna.samplers.TPESampler(seed=0)`, for a reproducible serial sweep.
        pruner: an Optuna pruner (e.g. `optuna.pruners.MedianPruner()`); None disables
            pruning. Pruning needs the trial's loop to validate (`validation=...`) and the
            sweep metric to be a validation metric.
        storage: an Optuna storage URL shared by every worker (default:
            `sqlite:///<sweep directory>/optuna.db`; use PostgreSQL/MySQL for many
            machines). An `optuna.storages.BaseStorage` object works with the serial
            executor, or without a pruner.
        study_name: the study to create or join (default: `"pipekit-<sweep_id>"`).
    """

    def __init__(
        self,
        space: Mapping[str, Any],
        n_trials: int,
        *,
        sampler: Any = None,
        pruner: Any = None,
        storage: Any = None,
        study_name: str | None = None,
    ):
        optuna = _optuna()
        self.distributions = parse_space(space)
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise ConfigError(
                f"`n_trials` must be a positive int. Received: n_trials={n_trials!r}."
            )
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler):
            raise ConfigError(
                f"`sampler` must be an optuna sampler, e.g. TPESampler(seed=0). Received: sampler={sampler!r}."
            )
        if pruner is not None and not isinstance(pruner, optuna.pruners.BasePruner):
            raise ConfigError(
                f"`pruner` must be an optuna pruner, e.g. MedianPruner(). Received: pruner={pruner!r}."
            )
        if storage is not None and not isinstance(storage, (str, optuna.storages.BaseStorage)):
            raise ConfigError(
                f"`storage` must be an Optuna storage URL such as 'sqlite:///optuna.db'. Received: storage={storage!r}."
            )
        if study_name is not None and (not isinstance(study_name, str) or not study_name):
            raise ConfigError(
                f"`study_name` must be a non-empty string. Received: study_name={study_name!r}."
            )
        self.n_trials = n_trials
        self.sampler = sampler
        self.pruner = pruner
        self.storage = storage
        self.study_name = study_name
        self._study: Any = None
        self._live: dict[int, Any] = {}
        self._url: str | None = (
            storage if isinstance(storage, str) else getattr(storage, "url", None)
        )
        self._pruning = pruner is not None and not isinstance(pruner, optuna.pruners.NopPruner)

    @property
    def study(self) -> Any:
        """The `optuna.Study` (available once a sweep has opened it)."""
        if self._study is None:
            raise RuntimeError("The study is opened by HyperSweep.run(); run the sweep first.")
        return self._study

    def describe(self) -> dict[str, Any]:
        """A JSON description (for `sweep.json` and `HyperSweep.get_config()`)."""
        optuna = _optuna()
        return {
            "type": "OptunaSearch",
            "space": {
                k: optuna.distributions.distribution_to_json(v)
                for k, v in self.distributions.items()
            },
            "n_trials": self.n_trials,
            "sampler": None if self.sampler is None else type(self.sampler).__name__,
            "pruner": None if self.pruner is None else type(self.pruner).__name__,
            "study_name": self.study_name,
        }

    # -- the protocol HyperSweep drives ---------------------------------------------------
    def _open(
        self, *, directory: Path, sweep_id: str, metric: str, mode: str, executor: str
    ) -> None:
        optuna = _optuna()
        self._sweep_metric = metric
        if self.storage is None:  # the default: SQLite in the sweep directory
            self._url = f"sqlite:///{(directory / 'optuna.db').resolve()}"
        if self._pruning and executor != "serial" and self._url is None:
            raise ConfigError(
                f"Pruning with executor={executor!r} needs a storage every worker can open. "
                f"Received: storage={self.storage!r}. Pass a URL such as 'sqlite:///optuna.db' or leave "
                "storage=None for SQLite in the sweep directory."
            )
        self._directory = str(directory.resolve())
        self._sweep_id = sweep_id
        self._executor = executor
        self._metric_direction = "minimize" if mode == "min" else "maximize"
        name = self.study_name or f"pipekit-{sweep_id}"
        try:
            self._study = optuna.create_study(
                storage=self.storage if self.storage is not None else self._url,
                sampler=self.sampler,
                pruner=self.pruner if self.pruner is not None else optuna.pruners.NopPruner(),
                study_name=name,
                direction=self._metric_direction,
                load_if_exists=True,
            )
        except ValueError as exc:
            raise ConfigError(
                f"Cannot open the Optuna study {name!r}: {exc}. Received: mode={mode!r}. Use the "
                "study's direction, or another study_name."
            ) from exc
        directions = [d.name.lower() for d in self._study.directions]
        if directions != [self._metric_direction]:
            raise ConfigError(
                f"The Optuna study {name!r} optimizes {directions}, but the sweep's mode={mode!r} "
                f"needs [{self._metric_direction!r}]. Use mode to match, or another study_name."
            )
        self._study_name = name

    def _recover(self, records: Mapping[int, Mapping[str, Any]]) -> None:
        """Settle trials left RUNNING by a killed run of this sweep (same directory)."""
        optuna = _optuna()
        running = self._study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for frozen in running:
            if frozen.user_attrs.get("pipekit_sweep_dir") != self._directory:
                continue  # another worker's trial
            record = records.get(frozen.number)
            if record is not None:  # journaled, but killed before `tell`
                self._tell(frozen.number, record["status"], record.get("value"))
            else:
                self._study.tell(
                    frozen.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True
                )
                self._study.enqueue_trial(dict(frozen.params), skip_if_exists=False)

    def _ask(self) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        trial = self._study.ask(self.distributions)
        trial.set_user_attr("pipekit_sweep_id", self._sweep_id)
        trial.set_user_attr("pipekit_sweep_dir", self._directory)
        self._live[trial.number] = trial
        params = {k: to_json_value(trial.params[k], where=k) for k in self.distributions}
        pruning = None
        if self._pruning:
            pruning = {
                "metric": self._sweep_metric,
                "study_name": self._study_name,
                "storage": self._url,
                "trial_id": trial._trial_id,
                "pruner": self.pruner,
                "trial": trial if self._executor == "serial" else None,
            }
        return trial.number, params, pruning

    def _tell(self, number: int, status: str, value: float | None) -> None:
        optuna = _optuna()
        trial = self._live.pop(number, number)
        states = optuna.trial.TrialState
        if status == "ok" and value is not None and math.isfinite(value):
            self._study.tell(trial, value, skip_if_finished=True)
        elif status == "pruned":
            self._study.tell(trial, state=states.PRUNED, skip_if_finished=True)
        else:
            self._study.tell(trial, state=states.FAIL, skip_if_finished=True)

    def _close(self) -> None:
        """Settle trials still in flight after an interruption: failed, and queued again."""
        optuna = _optuna()
        for number in list(self._live):
            trial = self._live.pop(number)
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            self._study.enqueue_trial(dict(trial.params), skip_if_exists=False)

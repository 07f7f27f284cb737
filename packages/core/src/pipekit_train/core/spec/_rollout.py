"""`Rollout`: training through the rollout, a frozen part of the training description.

`TrainingLoop(rollout=Rollout(steps=k, ...))` applies the emulator `k` times inside one
optimizer update, each step exactly the inference step of `NeuralForward`
(`RolloutSpec`: normalise → model → de-normalise → residual), and combines the per-step
losses with `weights`. The loss itself is written once in core
(`pipekit_train.core.rollout.rollout_loss`); a backend only supplies its arrays, its
gradient stop and its loop.

The rollout length may grow over training (`schedule`): the length at an optimizer
update is a pure function of the update's number, so an exact resume needs no state
beyond the step counter every checkpoint already holds. The input noise is drawn by
core's training feed from `(plan seed, global batch index)` for the same reason, the
same on every backend (`pipekit_train.core.rollout.rollout_noise`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipekit_train.core._checks import is_int
from pipekit_train.core._errors import ConfigError

from ._steppers import TARGETS, check_correction, resolve_stepper

__all__ = ["REDUCTIONS", "Backprop", "Rollout", "RolloutSchedule"]

Backprop = Literal["full", "last"] | int

REDUCTIONS = ("mean", "sum")
"""How a training update combines its per-step losses (`Rollout.reduction`)."""


def _count(name: str, value: Any, fix: str, *, least: int = 1) -> int:
    if not is_int(value) or value < least:
        raise ConfigError(f"`{name}` must be an int >= {least}. Received: {name}={value!r}. {fix}")
    return int(value)


@dataclass(frozen=True)
class RolloutSchedule:
    """A rollout-length curriculum: `k = min(maximum, start + update // every_n_steps)`.

    The length at optimizer update `n` (0-based) is a pure function of `n`, so a resumed
    run continues the curriculum where it stopped without any extra state.

    Args:
        start: the length at the first update, >= 1.
        every_n_steps: updates between two lengthenings by one step, >= 1.
        maximum: the longest length, >= `start`.

    Examples:
        >>> from pipekit_train.core import RolloutSchedule
        >>> RolloutSchedule(start=1, every_n_steps=100, maximum=4).stages()
        ((0, 1), (100, 2), (200, 3), (300, 4))
    """

    start: int = 1
    every_n_steps: int = 1000
    maximum: int = 1

    def __post_init__(self) -> None:
        _count("start", self.start, "Start the curriculum at one step: start=1.")
        _count("every_n_steps", self.every_n_steps, "E.g. every_n_steps=1000.")
        if not is_int(self.maximum) or self.maximum < self.start:
            raise ConfigError(
                "`maximum` must be an int >= `start`. Received: "
                f"maximum={self.maximum!r}, start={self.start!r}. Use maximum >= {self.start}."
            )

    def stages(self) -> tuple[tuple[int, int], ...]:
        """`((first update, k), ...)`: where each length begins, in update order."""
        return tuple(
            ((k - self.start) * self.every_n_steps, k) for k in range(self.start, self.maximum + 1)
        )

    def to_json(self) -> dict[str, int]:
        """`{"start", "every_n_steps", "maximum"}`."""
        return {"start": self.start, "every_n_steps": self.every_n_steps, "maximum": self.maximum}


def _stages(schedule: Any) -> tuple[tuple[int, int], ...]:
    """The `(first update, k)` stages of a schedule mapping (checked)."""
    if isinstance(schedule, RolloutSchedule):
        return schedule.stages()
    if isinstance(schedule, Mapping):
        pairs = list(schedule.items())
    elif isinstance(schedule, Sequence) and not isinstance(schedule, str):
        pairs = [tuple(p) if isinstance(p, Sequence) else p for p in schedule]
    else:
        raise ConfigError(
            "`schedule` must be a `RolloutSchedule`, a mapping {first update: k} or None. "
            f"Received: schedule={schedule!r}. E.g. schedule={{0: 1, 1000: 2, 2000: 4}}."
        )
    stages: list[tuple[int, int]] = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and is_int(pair[0]) and is_int(pair[1])):
            raise ConfigError(
                f"`schedule` maps an update (int >= 0) to a rollout length (int >= 1). "
                f"Received: schedule={schedule!r}. E.g. schedule={{0: 1, 1000: 2}}."
            )
        stages.append((int(pair[0]), int(pair[1])))
    stages.sort()
    if not stages or stages[0][0] != 0:
        raise ConfigError(
            "`schedule` must say the rollout length from the first update (a key 0). "
            f"Received: schedule={schedule!r}. Add 0: 1 (or the length to start with)."
        )
    if any(u < 0 or k < 1 for u, k in stages):
        raise ConfigError(
            "`schedule` maps updates >= 0 to rollout lengths >= 1. "
            f"Received: schedule={schedule!r}. Use non-negative keys and lengths >= 1."
        )
    for (u0, k0), (u1, k1) in zip(stages[:-1], stages[1:], strict=True):
        if k1 < k0:
            raise ConfigError(
                "`schedule` must be monotone: a rollout length never shrinks. Received: "
                f"schedule={schedule!r} (k={k0} from update {u0}, then k={k1} from update "
                f"{u1}). Use non-decreasing lengths."
            )
    return tuple(stages)


@dataclass(frozen=True)
class Rollout:
    """Training through the rollout: `k` emulator steps and `k` losses per optimizer update.

    Inside one update the first state of each window, `x_0` (plus Gaussian noise of
    `noise_std`), is advanced `k` times with exactly the inference step of
    `NeuralForward(residual=residual)` and the run's normalizer (normalise → model →
    de-normalise → residual). The loss of step `i` is the run's loss (`"mse"`) between
    the predicted state and the true state `x_i`, both **in normalised units of the
    state** (`(x - mean["x"]) / std["x"]` of the run's normalizer; physical units
    without one); the update's loss is the weighted mean
    `sum_i w_i loss_i / sum_i w_i` (or, with `reduction="sum"`, the weighted sum
    `sum_i w_i loss_i`). With `k = 1`, no normalizer and no noise this is
    ordinary one-step training on the same pairs. (With a normalizer and
    `residual=True` the one-step loss is in units of the increment instead, so the two
    differ by the per-channel factor `(std["y"] / std["x"])**2`.)

    The data is a `TrajectoryWindows` whose windows span at least the longest `k`, with
    `targets="increments"` for `residual=True` and `targets="states"` otherwise.

    Args:
        steps: the rollout length `k` (>= 1); with a `schedule`, the longest length the
            schedule reaches (the length of `weights` and what the windows must cover).
        weights: per-step loss weights (length `steps`, non-negative, not all zero);
            default uniform. At a shorter scheduled length `k` the first `k` are used.
        backprop: `"full"` (backpropagate through all `k` steps), `"last"` (pushforward:
            the first `k - 1` steps run without gradient, so their losses count in the
            reported value but only the last step's loss trains the model, through one
            model application), or an int `m >= 1` (cut backpropagation through time:
            the state is detached after every `m` steps).
        noise_std: the standard deviation of Gaussian noise added to `x_0`, in normalised
            units of the state (0: none). Core's training feed draws it (`batch["noise"]`)
            from `(plan seed, global batch index)`, the same on every backend, so a
            resumed run draws the same noise.
        schedule: a curriculum of rollout lengths: a `RolloutSchedule`, or a mapping
            `{first update: k}` with a key 0 and non-decreasing lengths (e.g.
            `{0: 1, 1000: 2, 2000: 4}`). The length at an update is a pure function of
            the update's number, so kill-and-resume mid-schedule needs no extra state.
            None: always `steps`.
        residual: the model predicts the increment (`next = state + prediction`), as in
            `NeuralForward(residual=True)`.
        gradient_checkpointing: recompute each unrolled step's model application in the
            backward pass instead of keeping its activations (`jax.checkpoint`,
            `torch.utils.checkpoint`): the activation memory of an update grows with `k`
            by one state per step instead of one model's activations per step, at the
            cost of about one more forward pass (XLA on the CPU merges the recomputation
            back, so there it saves nothing). The loss and the updates are the same
            (to float tolerance), so a run may resume with the flag flipped (it is not
            part of the resume key). A backend without it refuses it before any work
            (`Capabilities.rollout_checkpointing`).
        target: what each unrolled step is compared with: `"trajectory"` (the stored
            trajectory, supervised rollout training: apebench's `sup;T`) or
            `"diverted"` (the diverted chain of branch length one, trainax's
            `DivertedChainBranchOne`, apebench's `div;T`): step `i`'s prediction is
            compared with `ref_stepper` applied to the model's previous state (step 1:
            to `x_0`, with its noise), so only the windows' first states are used in
            training. Validation still compares the longest rollout with the held-out
            trajectory, so `"trajectory"` and `"diverted"` runs report comparable losses.
        ref_stepper: the reference stepper of `target="diverted"`: `fn(state) -> next
            state` on a batch of physical states (batch axis first) in the backend's
            array library (or the array API), differentiable; a module-level function or
            its import string (plans and resume keys hold its `"module:qualname"`).
        cut_div_chain: stop the gradient through the reference branch
            (`stop_gradient(ref_stepper(state))`). False (trainax's default, and
            apebench's `div;T`): the gradient flows through the stepper into the model's
            previous state as well, so the stepper must be differentiable.
        coarse_stepper: a coarse stepper the model corrects, at training and (given to
            `NeuralForward` too) at rollout: solver in the loop (Um et al. 2020;
            apebench's `correct;*`). Same form as `ref_stepper`; its parameters are not
            trained, the gradient flows through it into the state.
        correction: how the model corrects `coarse_stepper` (with `c = coarse(x)` and
            `p(u)` the de-normalised model output for input `u`): `"parallel"` is
            `next = c + p(x)` (apebench's `correct;parallel`; needs `residual=True`);
            `"sequential"` is `next = p(c)`, or with `residual=True` `next = c + p(c)`
            (apebench's `correct;sequential` and `correct;sequential_with_bypass`).
        reduction: how a training update combines its per-step losses: `"mean"` (the
            weighted mean `sum_i w_i loss_i / sum_i w_i`, the default) or `"sum"` (the
            weighted sum `sum_i w_i loss_i`, trainax's and so apebench's `sup;T` and
            `div;T`). The sum is the mean times `sum_i w_i`: the same minimiser, a
            gradient `sum_i w_i` times larger (Adam sees the difference only through its
            `eps`; plain SGD through its step size). Validation (the longest rollout
            against the held-out trajectory) reports the weighted mean either way, so
            runs with either reduction report comparable validation losses. Part of the
            plan's JSON and resume key only when `"sum"` (older checkpoints resume).

    A stepper combines with either target: a corrected model may be trained on the
    diverted chain. Steppers are for models of the state alone (not with history,
    forcings or static inputs), and a backend must declare
    `Capabilities.rollout_steppers`; each stepper is probed once on the backend's zeros of
    the data's state shape before any work, and one that changes the shape is refused.

    Raises:
        ConfigError: a bad field, naming the field, the value and the fix.

    Examples:
        >>> from pipekit_train.core import Rollout
        >>> r = Rollout(steps=4, schedule={0: 1, 100: 2, 200: 4}, backprop="last")
        >>> [r.steps_at(n) for n in (0, 99, 100, 250)]
        [1, 1, 2, 4]

        The diverted chain against a reference solver (`div;5`), and a model that
        corrects a coarse solver (`correct;parallel`):

        ```python
        Rollout(steps=5, target="diverted", ref_stepper=reference_step)
        Rollout(steps=5, residual=True, coarse_stepper=coarse_step, correction="parallel")
        ```
    """

    steps: int = 1
    weights: tuple[float, ...] | None = None
    backprop: Backprop = "full"
    noise_std: float = 0.0
    schedule: RolloutSchedule | Mapping[int, int] | None = None
    residual: bool = False
    gradient_checkpointing: bool = False
    target: Literal["trajectory", "diverted"] = "trajectory"
    # a callable after construction; an import string "module:name" is resolved then
    ref_stepper: Any = None
    cut_div_chain: bool = False
    coarse_stepper: Any = None
    correction: Literal["parallel", "sequential"] | None = None
    reduction: Literal["mean", "sum"] = "mean"

    def __post_init__(self) -> None:
        steps = _count("steps", self.steps, "Use steps=1 for one-step training, e.g. steps=4.")
        if self.weights is None:
            weights = (1.0,) * steps
        else:
            try:
                weights = tuple(float(w) for w in self.weights)
            except (TypeError, ValueError):
                weights = ()
            if len(weights) != steps:
                raise ConfigError(
                    f"`weights` needs one loss weight per rollout step. Received: "
                    f"weights={self.weights!r} for steps={steps}. Pass {steps} weights, or "
                    "None for uniform weights."
                )
        if any(not math.isfinite(w) or w < 0 for w in weights) or not any(weights):
            raise ConfigError(
                "`weights` must be finite, non-negative and not all zero. Received: "
                f"weights={self.weights!r}. E.g. weights={(1.0,) * steps}."
            )
        if isinstance(self.backprop, bool) or not (
            self.backprop in ("full", "last") or (is_int(self.backprop) and int(self.backprop) >= 1)
        ):
            raise ConfigError(
                "`backprop` must be 'full', 'last' (pushforward) or an int m >= 1 (cut "
                f"backpropagation every m steps). Received: backprop={self.backprop!r}."
            )
        noise = self.noise_std
        if (
            isinstance(noise, bool)
            or not isinstance(noise, (int, float))
            or not (math.isfinite(noise) and noise >= 0)
        ):
            raise ConfigError(
                "`noise_std` must be a finite float >= 0 (normalised units of the state). "
                f"Received: noise_std={noise!r}. Use 0 for no noise, e.g. 0.01."
            )
        if not isinstance(self.residual, bool):
            raise ConfigError(
                f"`residual` must be True or False. Received: residual={self.residual!r}."
            )
        if not isinstance(self.gradient_checkpointing, bool):
            raise ConfigError(
                "`gradient_checkpointing` must be True or False. Received: "
                f"gradient_checkpointing={self.gradient_checkpointing!r}. Use True to "
                "recompute each unrolled step in the backward pass (less memory, more time)."
            )
        if not isinstance(self.reduction, str) or self.reduction not in REDUCTIONS:
            raise ConfigError(
                f"`reduction` must be one of {list(REDUCTIONS)}. Received: "
                f"reduction={self.reduction!r}. Use 'mean' (the weighted mean of the "
                "per-step losses) or 'sum' (their weighted sum, as trainax)."
            )
        self._check_steppers()
        schedule = self.schedule
        if schedule is not None:
            stages = _stages(schedule)
            longest = stages[-1][1]
            if longest > steps:
                raise ConfigError(
                    f"`schedule` reaches k={longest}, longer than steps={steps}. Received: "
                    f"schedule={schedule!r}. Set steps={longest} (the longest length), or "
                    f"cap the schedule at {steps}."
                )
            if isinstance(schedule, Mapping):
                schedule = dict(stages)  # a fresh, sorted dict: the spec owns its copy
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(
            self,
            "backprop",
            self.backprop if isinstance(self.backprop, str) else int(self.backprop),
        )
        object.__setattr__(self, "noise_std", float(noise))
        object.__setattr__(self, "schedule", schedule)

    def _check_steppers(self) -> None:
        """Check the target and the steppers; resolve import strings; keep their names."""
        if self.target not in TARGETS:
            raise ConfigError(
                f"`target` must be one of {list(TARGETS)}. Received: target={self.target!r}. "
                "Use 'trajectory' (compare with the stored trajectory) or 'diverted' "
                "(compare with ref_stepper applied to the model's previous state)."
            )
        if not isinstance(self.cut_div_chain, bool):
            raise ConfigError(
                f"`cut_div_chain` must be True or False. Received: "
                f"cut_div_chain={self.cut_div_chain!r}."
            )
        names: dict[str, str] = {}
        if self.target == "diverted":
            if self.ref_stepper is None:
                raise ConfigError(
                    "The diverted chain compares each step with a reference stepper. "
                    "Received: target='diverted', ref_stepper=None. Pass ref_stepper=fn, "
                    "fn(state) -> next state on a batch of physical states, in the "
                    "backend's array library."
                )
            fn, names["ref_stepper"] = resolve_stepper("ref_stepper", self.ref_stepper)
            object.__setattr__(self, "ref_stepper", fn)
        elif self.ref_stepper is not None or self.cut_div_chain:
            given = "ref_stepper=..." if self.ref_stepper is not None else "cut_div_chain=True"
            raise ConfigError(
                f"`{given.split('=')[0]}` is for the diverted chain. Received: {given} with "
                "target='trajectory'. Pass target='diverted', or leave it out."
            )
        check_correction(self.correction, self.coarse_stepper, self.residual)
        if self.coarse_stepper is not None:
            fn, names["coarse_stepper"] = resolve_stepper("coarse_stepper", self.coarse_stepper)
            object.__setattr__(self, "coarse_stepper", fn)
        object.__setattr__(self, "_stepper_names", names)

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    # -- the steppers --------------------------------------------------------------------
    @property
    def steppers(self) -> dict[str, Callable[[Any], Any]]:
        """`{field: stepper}` of the steppers this rollout calls (empty: none)."""
        out: dict[str, Callable[[Any], Any]] = {}
        if self.ref_stepper is not None:
            out["ref_stepper"] = self.ref_stepper
        if self.coarse_stepper is not None:
            out["coarse_stepper"] = self.coarse_stepper
        return out

    def stepper_name(self, field: str) -> str | None:
        """The import path the plan records for the stepper of `field` (None: none)."""
        names: dict[str, str] = getattr(self, "_stepper_names", {})
        return names.get(field)

    # -- the schedule ------------------------------------------------------------------
    def stages(self) -> tuple[tuple[int, int], ...]:
        """`((first update, k), ...)`: the rollout length from each update on."""
        if self.schedule is None:
            return ((0, self.steps),)
        return _stages(self.schedule)

    def steps_at(self, update: int) -> int:
        """The rollout length at optimizer update `update` (0-based): a pure function."""
        k = self.stages()[0][1]
        for first, length in self.stages():
            if update >= first:
                k = length
        return k

    @property
    def max_steps(self) -> int:
        """The longest rollout length the schedule reaches (what the windows must cover)."""
        return self.stages()[-1][1]

    def step_weights(self, k: int) -> tuple[float, ...]:
        """The loss weights of a rollout of length `k` (the first `k` of `weights`)."""
        assert self.weights is not None
        return tuple(self.weights[:k])

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The JSON form (what the plan and its resume key hold)."""
        schedule: Any = None
        if isinstance(self.schedule, RolloutSchedule):
            schedule = {"type": "RolloutSchedule", **self.schedule.to_json()}
        elif self.schedule is not None:
            schedule = [[u, k] for u, k in self.stages()]
        return {
            "steps": self.steps,
            "weights": list(self.weights or ()),
            "backprop": self.backprop,
            "noise_std": self.noise_std,
            "schedule": schedule,
            "residual": self.residual,
            "gradient_checkpointing": self.gradient_checkpointing,
            **self._steppers_json(),
            # only when not the default: a mean-reduced rollout's JSON (and resume key)
            # is what it was before the field existed
            **({} if self.reduction == "mean" else {"reduction": self.reduction}),
        }

    def _steppers_json(self) -> dict[str, Any]:
        """The target and the steppers' import paths; nothing for a rollout without them,
        so its JSON (and resume key) is what it was before they existed."""
        data: dict[str, Any] = {}
        if self.target != "trajectory":
            data["target"] = self.target
            data["ref_stepper"] = self.stepper_name("ref_stepper")
            data["cut_div_chain"] = self.cut_div_chain
        if self.coarse_stepper is not None:
            data["coarse_stepper"] = self.stepper_name("coarse_stepper")
            data["correction"] = self.correction
        return data

    def resume_json(self) -> dict[str, Any]:
        """The JSON a resumed run must match: `to_json` without `gradient_checkpointing`.

        Checkpointing the unrolled steps changes the memory an update needs, not its
        loss or its updates, so a run may resume with it switched (e.g. on a smaller
        accelerator) and a checkpoint written before the field existed still resumes.
        """
        data = self.to_json()
        del data["gradient_checkpointing"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rollout:
        """The `Rollout` of `to_json`'s output (the steppers imported by their paths).

        Raises:
            ConfigError: a stepper's module or attribute cannot be imported.
        """
        raw = dict(data)
        schedule = raw.get("schedule")
        if isinstance(schedule, Mapping):
            fields = {k: v for k, v in schedule.items() if k != "type"}
            raw["schedule"] = RolloutSchedule(**fields)
        elif schedule is not None:
            raw["schedule"] = {int(u): int(k) for u, k in schedule}
        if raw.get("weights") is not None:
            raw["weights"] = tuple(raw["weights"])
        return cls(**raw)

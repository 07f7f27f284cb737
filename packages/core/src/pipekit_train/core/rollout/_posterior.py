"""Trained networks read as posteriors: one run's model, and several as one.

- `posterior_forward(model, normalizer, loss)`: the `NeuralForward` a run's model is as a
  posterior (the head read from the loss: `gaussian_nll` → Gaussian, `mixture_nll` →
  mixture, `flow_nll` → flow), for `pipekit_train.core.diagnostics.run_calibration`;
  `TrainingArtifact.calibration`, `evaluate(..., calibration=True)` and
  `CalibrationMonitor` read a model through it. `simulations_of(data)` reads a dataset of
  simulations as `(x, theta)`.
- `PosteriorEnsemble`: several posteriors as one. It has the `distribution(x)` of a posterior, so `diagnostics`
(`run_calibration`, `posterior_samples`) take it like a single network's. Registered
members (each network a version of one name) load back as one ensemble with
`PosteriorEnsemble.from_registry(registry, name, versions)`; the mixture itself is
`pipekit_train.core.distributions.Ensemble`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import is_core_dataset, make_batches
from pipekit_train.core.distributions._ensemble import Ensemble, member_weights
from pipekit_train.core.distributions._heads import head_for_loss, head_options_for_loss

from ._cycle import NeuralForward

__all__ = ["PosteriorEnsemble", "check_posterior_loss", "posterior_forward", "simulations_of"]


def simulations_of(data: Any, *, field: str = "data") -> tuple[np.ndarray, np.ndarray]:
    """`(x, theta)` of a sized pipekit dataset whose samples hold `x` (the observation)
    and `y` (the parameters it was simulated from), read in order."""
    if not is_core_dataset(data) or not hasattr(data, "__len__") or len(data) == 0:
        raise ConfigError(
            f"`{field}` must be a non-empty sized pipekit dataset of simulations with 'x' "
            "(observations) and 'y' (parameters), e.g. as_supervised(sims, input='x', "
            f"target='theta'). Received: {field}={type(data).__name__}."
        )
    keys = set(data[0])
    if not {"x", "y"} <= keys:
        raise ConfigError(
            f"`{field}` samples must hold 'x' and 'y'. Received: keys {sorted(keys)}. "
            "Use as_supervised(data, input=..., target=...) to name them."
        )
    xs, ys = [], []
    for batch in make_batches(
        data, 1024, seed=0, shuffle=False, drop_remainder=False, num_epochs=1
    ):
        xs.append(np.asarray(batch["x"]))
        ys.append(np.asarray(batch["y"]))
    return np.concatenate(xs), np.concatenate(ys)


def _head(loss: Any, head: str | None, head_options: Mapping[str, Any] | None) -> tuple[str, dict]:
    head = head or head_for_loss(loss)
    if head not in ("gaussian", "mixture", "flow"):
        raise ConfigError(
            "Calibration needs a posterior: a model trained with `gaussian_nll`, "
            f"`mixture_nll` or `flow_nll`. Received: loss={loss!r}, head={head!r}. Train with "
            "one of those losses, or pass head='gaussian', head='mixture' or head='flow' (with "
            "head_options)."
        )
    options = dict(head_options or head_options_for_loss(loss) or {})
    return head, options


def check_posterior_loss(loss: Any) -> None:
    """Refuse a run loss that implies no posterior (not `gaussian_nll`, `mixture_nll` or
    `flow_nll`)."""
    _head(loss, None, None)


def posterior_forward(
    model: Callable[[np.ndarray], Any],
    normalizer: Any,
    loss: Any,
    *,
    state_ndim: int = 1,
    head: str | None = None,
    head_options: Mapping[str, Any] | None = None,
) -> NeuralForward:
    """A run's model as a posterior `x -> distribution` in the parameters' units.

    Args:
        model: the model operator (raw output in the normalised units).
        normalizer: the run's `Normalizer` (or None).
        loss: the run's loss description (names the head).
        state_ndim: the axes of one observation (2 for a set of points `(n, d)`).
        head: override the head the loss implies.
        head_options: override the mixture's options.

    Raises:
        ConfigError: the loss implies no distribution (`head="point"`).
    """
    name, options = _head(loss, head, head_options)
    return NeuralForward(model, normalizer=normalizer, head=name, state_ndim=state_ndim, **options)


class PosteriorEnsemble:
    """Several posteriors (`artifact.posterior()`, a `NeuralForward`, or any object with
    `distribution(x)`) read as one: `distribution(x)` is their `Ensemble`.

    Args:
        posteriors: the members, at least one; typically networks of the same
            architecture trained on the same simulations from different seeds.
        weights: `(K,)` member weights (normalised); None: equal.
    """

    def __init__(self, posteriors: Sequence[Any], weights: Any = None):
        members = tuple(posteriors) if isinstance(posteriors, Sequence) else ()
        if not members or not all(callable(getattr(p, "distribution", None)) for p in members):
            raise ConfigError(
                "`posteriors` must be a non-empty sequence of posteriors with `distribution(x)` "
                f"(e.g. artifact.posterior()). Received: posteriors={posteriors!r}."
            )
        self.posteriors = members
        self.weights = member_weights(weights, len(members))
        if self.weights.ndim != 1:
            raise ConfigError(
                f"`weights` must be one weight per posterior, shape ({len(members)},). "
                f"Received: shape {self.weights.shape}."
            )

    @classmethod
    def from_registry(
        cls,
        registry: Any,
        name: str,
        versions: Sequence[int],
        *,
        weights: Any = None,
        trusted: Any = None,
        **forward_options: Any,
    ) -> PosteriorEnsemble:
        """The registered members `versions` of `name`, read as one posterior.

        Register each member as a version of one name (`artifact.register(registry,
        name)` per trained network); this loads each as
        `NeuralForward.from_record(*registry.load_record_and_model(name, v))`: the manifest,
        the weights and the factory are verified before anything is rebuilt, and nothing is
        unpickled. Every record is read first, and members that are not one posterior's
        networks (different heads or head options) are refused before any model loads.

        Args:
            registry: a `ModelRegistry` (e.g. `LocalModelRegistry(root)`).
            name: the registered name of the members.
            versions: the members' version numbers, at least one, each once.
            weights: `(K,)` member weights (normalised); None: equal.
            trusted: as for `registry.load`: code trusted beyond `@model_factory`.
            **forward_options: passed to `NeuralForward.from_record` (`state_ndim`, ...).

        Raises:
            ConfigError: bad `versions`, a missing version, or members with different heads.
        """
        chosen = list(versions) if isinstance(versions, Sequence) else None
        if (
            not chosen
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in chosen)
            or len(set(chosen)) != len(chosen)
        ):
            raise ConfigError(
                "`versions` must be a non-empty list of distinct version numbers of "
                f"{name!r}, e.g. [1, 2, 3]. Received: versions={versions!r}."
            )
        records = [registry.record(name, v) for v in chosen]
        first = records[0]
        for record in records[1:]:
            if (record.head, record.head_options) != (first.head, first.head_options):
                raise ConfigError(
                    f"The members of an ensemble must share a head. Received: version "
                    f"{first.version} of {name!r} has head={first.head!r} "
                    f"{first.head_options or ''}, but version {record.version} has "
                    f"head={record.head!r} {record.head_options or ''}."
                )
        members = [
            NeuralForward.from_record(
                *registry.load_record_and_model(name, v, trusted=trusted), **forward_options
            )
            for v in chosen
        ]
        return cls(members, weights)

    def distribution(self, x: Any) -> Ensemble:
        """The members' predicted distributions at `x` (one observation or a batch), mixed."""
        return Ensemble(tuple(p.distribution(x) for p in self.posteriors), self.weights)

    def __repr__(self) -> str:
        return f"PosteriorEnsemble({len(self.posteriors)} members)"

"""Trained networks read as posteriors: `PosteriorEnsemble`, several `NeuralForward`s as one.

`PosteriorEnsemble` has the `distribution(x)` of a posterior, so `diagnostics`
(`run_calibration`, `posterior_samples`) take it like a single network's. Registered
members (each network a version of one name) load back as one ensemble with
`PosteriorEnsemble.from_registry(registry, name, versions)`; the mixture itself is
`pipekit_train.core.distributions.Ensemble`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.distributions._ensemble import Ensemble, member_weights

from ._cycle import NeuralForward

__all__ = ["PosteriorEnsemble"]


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

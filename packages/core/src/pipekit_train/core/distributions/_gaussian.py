"""`Gaussian`: a predicted normal distribution (what a `head="gaussian"` model's output means).

A model trained with `losses.gaussian_nll` outputs a mean and a log-variance per target
value; `NeuralForward(..., head="gaussian").distribution(x)` returns them as a `Gaussian`
in the target's original units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

__all__ = ["Gaussian"]


@dataclass(frozen=True, eq=False)
class Gaussian:
    """Independent normal distributions, one per element: `N(mean, std**2)`.

    What a `NeuralForward` with a Gaussian head predicts, in the target's original
    units. Both arrays are stored as float64 (so an interval around a large mean keeps
    the digits of a small spread) and broadcast like numpy.

    Attributes:
        mean: the predicted means.
        std: the predicted standard deviations (positive), same shape.
    """

    mean: np.ndarray
    std: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", np.asarray(self.mean, dtype=np.float64))
        object.__setattr__(self, "std", np.asarray(self.std, dtype=np.float64))

    @property
    def var(self) -> np.ndarray:
        """The variances, `std**2`."""
        return np.square(self.std)

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """The central interval holding `level` of the probability: `mean ± z * std`.

        Args:
            level: the probability in (0, 1), e.g. 0.68 or 0.95.

        Returns:
            `(low, high)`, each of the mean's shape.
        """
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
            raise ConfigError(
                f"`level` must be a probability in (0, 1). Received: level={level!r}. "
                "Use e.g. level=0.95."
            )
        from statistics import NormalDist  # ~5 ms: only when an interval is asked for

        z = NormalDist().inv_cdf(0.5 + level / 2)
        return self.mean - z * self.std, self.mean + z * self.std

    def z_score(self, value: Any) -> np.ndarray:
        """`(value - mean) / std`: standard normal where the prediction is calibrated."""
        return (np.asarray(value, dtype=np.float64) - self.mean) / self.std

    def log_prob(self, value: Any) -> np.ndarray:
        """The log-density of `value` under each normal (elementwise)."""
        z = self.z_score(value)
        return -0.5 * z * z - np.log(self.std) - 0.5 * math.log(2 * math.pi)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> np.ndarray:
        """Draw from the distributions with `rng`: the mean's shape, or `(n, *shape)`."""
        shape = self.mean.shape if n is None else (int(n), *self.mean.shape)
        return self.mean + self.std * rng.standard_normal(shape)

    def __getitem__(self, index: Any) -> Gaussian:
        """The distributions at `index` (numpy indexing of mean and std)."""
        return Gaussian(self.mean[index], self.std[index])

    def __len__(self) -> int:
        return len(self.mean)

"""sbibm's tasks in numpy: priors, simulators, observations and reference posteriors.

Three tasks of the simulation-based inference benchmark (Lueckmann et al. 2021,
"Benchmarking simulation-based inference", AISTATS; github.com/sbi-benchmark/sbibm),
written here from sbibm's definitions (its `tasks/<name>/task.py`, version 1.1.0):

- `two_moons` (θ ∈ U(-1, 1)², x ∈ R²): `a ~ U(-π/2, π/2)`, `r ~ N(0.1, 0.01²)`,
  `p = (r cos a + 0.25, r sin a)`, `x = p + (-|θ₁ + θ₂| / √2, (θ₂ - θ₁) / √2)`; a posterior
  of two crescents.
- `slcp` (θ ∈ U(-3, 3)⁵, x ∈ R⁸): four i.i.d. 2-D points from `N(m, S)` with
  `m = (θ₁, θ₂)`, `s₁ = θ₃²`, `s₂ = θ₄²`, `ρ = tanh θ₅`,
  `S = [[s₁², ρ s₁ s₂], [ρ s₁ s₂, s₂²]] + 10⁻⁶ I`; x is the points one after the other
  (`x₁, y₁, x₂, y₂, ...`). The posterior has four symmetric modes (the signs of θ₃, θ₄).
- `gaussian_mixture` (θ ∈ U(-10, 10)², x ∈ R²): `x ~ ½ N(θ, I) + ½ N(θ, 0.01 I)`.

The observations (`x_o` of sbibm's observations 1–10) and reference posterior samples
(10 000 per observation) are sbibm's published files, vendored unchanged under
`files/<task>/num_observation_<k>/` with sbibm's MIT licence (`files/LICENSE`); sbibm
drew them with rejection sampling (two_moons, gaussian_mixture) and SMC-ABC-initialised
MCMC (slcp) from the exact likelihood.
"""

from __future__ import annotations

import bz2
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["TASKS", "Task", "get_task"]

FILES = Path(__file__).parent / "files"


@dataclass(frozen=True)
class Task:
    """One sbibm task: a uniform prior box and a vectorised simulator.

    Attributes:
        name: sbibm's name.
        dim_theta: the number of parameters.
        dim_x: the number of data values.
        low: the prior box's lower corner (every parameter alike).
        high: its upper corner.
        simulator: `simulator(theta (n, dim_theta), rng) -> x (n, dim_x)`.
        point_size: for data made of i.i.d. points, the values of one point (slcp: 2),
            else None.
        symmetries: the task's known symmetries in θ, as `dim_theta × dim_theta`
            matrices `G` (nested tuples; the identity left out) that leave the prior and
            the likelihood unchanged, `p(x | G θ) = p(x | θ)`, so that the posterior is
            unchanged by `θ → G θ` too; together with the identity they form a group.
    """

    name: str
    dim_theta: int
    dim_x: int
    low: float
    high: float
    simulator: Callable[[np.ndarray, np.random.Generator], np.ndarray]
    point_size: int | None = None
    symmetries: tuple[tuple[tuple[float, ...], ...], ...] = ()

    def group(self) -> list[np.ndarray]:
        """The symmetry group's matrices, the identity first."""
        return [np.eye(self.dim_theta)] + [np.asarray(g, dtype=np.float64) for g in self.symmetries]

    def prior(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` draws from the uniform prior, `(n, dim_theta)`."""
        return rng.uniform(self.low, self.high, size=(n, self.dim_theta))

    def simulate(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """`n` pairs `(theta, x)` from the prior and the simulator, float64."""
        rng = np.random.default_rng(seed)
        theta = self.prior(n, rng)
        return theta, self.simulator(theta, rng)

    def _file(self, k: int, name: str) -> Path:
        if not 1 <= k <= 10:
            raise ValueError(
                f"sbibm publishes observations 1 to 10. Received: observation={k}. "
                "Use an observation number from 1 to 10."
            )
        return FILES / self.name / f"num_observation_{k}" / name

    def observation(self, k: int) -> np.ndarray:
        """sbibm's observation `k` (1–10), `(dim_x,)`."""
        return np.loadtxt(self._file(k, "observation.csv"), delimiter=",", skiprows=1)

    def reference(self, k: int) -> np.ndarray:
        """sbibm's 10 000 reference posterior samples at observation `k`, `(10000, dim_theta)`."""
        with bz2.open(self._file(k, "reference_posterior_samples.csv.bz2"), "rt") as fh:
            return np.loadtxt(fh, delimiter=",", skiprows=1)

    def inside(self, theta: np.ndarray) -> np.ndarray:
        """Whether each row of `theta` lies in the prior box."""
        return np.all((theta >= self.low) & (theta <= self.high), axis=-1)


def _two_moons(theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(theta)
    a = rng.uniform(-math.pi / 2, math.pi / 2, n)
    r = rng.normal(0.1, 0.01, n)
    p = np.stack([r * np.cos(a) + 0.25, r * np.sin(a)], axis=1)
    z0 = (theta[:, 0] + theta[:, 1]) / math.sqrt(2.0)  # sbibm's rotation by -π/4
    z1 = (theta[:, 1] - theta[:, 0]) / math.sqrt(2.0)
    return p + np.stack([-np.abs(z0), z1], axis=1)


def _slcp(theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(theta)
    s1, s2, rho = theta[:, 2] ** 2, theta[:, 3] ** 2, np.tanh(theta[:, 4])
    v1, v2, cov = s1**2 + 1e-6, s2**2 + 1e-6, rho * s1 * s2
    # the Cholesky factor [[l11, 0], [l21, l22]] of the 2 x 2 covariance
    l11 = np.sqrt(v1)
    l21 = cov / l11
    l22 = np.sqrt(np.maximum(v2 - l21**2, 0.0))
    z = rng.standard_normal((n, 4, 2))
    x = theta[:, None, 0] + l11[:, None] * z[..., 0]
    y = theta[:, None, 1] + l21[:, None] * z[..., 0] + l22[:, None] * z[..., 1]
    return np.stack([x, y], axis=-1).reshape(n, 8)


def _gaussian_mixture(theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    scale = np.where(rng.random(len(theta)) < 0.5, 1.0, 0.1)
    return theta + scale[:, None] * rng.standard_normal(theta.shape)


def _signs(dim: int, flipped: tuple[int, ...]) -> tuple[tuple[float, ...], ...]:
    """The diagonal matrix that flips the signs of the parameters `flipped`."""
    return tuple(
        tuple((-1.0 if i in flipped else 1.0) if i == j else 0.0 for j in range(dim))
        for i in range(dim)
    )


#: two_moons: x depends on |θ₁ + θ₂| and θ₂ - θ₁, both unchanged by (θ₁, θ₂) → (-θ₂, -θ₁).
_TWO_MOONS_MIRROR = ((0.0, -1.0), (-1.0, 0.0))
#: slcp: the likelihood depends on θ₃² and θ₄² only: the sign flips of θ₃ and θ₄.
_SLCP_SIGNS = (_signs(5, (2,)), _signs(5, (3,)), _signs(5, (2, 3)))

TASKS: dict[str, Task] = {
    "two_moons": Task("two_moons", 2, 2, -1.0, 1.0, _two_moons, symmetries=(_TWO_MOONS_MIRROR,)),
    "slcp": Task("slcp", 5, 8, -3.0, 3.0, _slcp, point_size=2, symmetries=_SLCP_SIGNS),
    "gaussian_mixture": Task("gaussian_mixture", 2, 2, -10.0, 10.0, _gaussian_mixture),
}


def get_task(name: str) -> Task:
    """The task called `name` (`two_moons`, `slcp`, `gaussian_mixture`)."""
    if name not in TASKS:
        raise ValueError(f"Unknown task. Received: task={name!r}. Use one of {sorted(TASKS)}.")
    return TASKS[name]

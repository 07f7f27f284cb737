"""`smc_sample`: draws of `prior(θ) · exp(log_likelihood(θ))` by sequential Monte Carlo.

What a likelihood estimator (NLE: a head trained on `x` given `θ`) needs to become a
posterior. Backend-free (numpy); the likelihood is any vectorised function.

**The algorithm** (likelihood tempering; Del Moral, Doucet and Jasra 2006): particles
start as prior draws and follow the path `prior · L^β`, `β` from 0 to 1:

1. the next `β` is the largest whose incremental weights `L^(β' - β)` keep a share
   `ess` of the particles' effective sample size (bisection);
2. the particles are resampled by those weights (systematic resampling);
3. each makes `moves` Metropolis steps targeting `prior · L^β`. The particles are split
   into `clusters` groups by k-means (standardised), once per stage. With the default
   `kernel="walk"` each step proposes a normal around the particle with its group's
   covariance, scaled by a factor adapted between stages towards an acceptance of 0.25
   (the ratio holds the proposal densities of both directions, since the covariance
   depends on the particle's group). With `kernel="mixture"` the steps take turns: an
   *independence* step proposes a fresh draw from the groups' Gaussian mixture (each
   group's mean and covariance, weighted by its share of the particles; the Metropolis
   ratio holds the mixture's density at both points), which renews a particle in one
   accepted step and can carry it to another mode, and a random-walk step as above.

After `β = 1`, `final_moves` more steps spread the resampled copies. Since particles
start from the prior, every mode of the posterior is populated without a starting point.
Cost: `stages × moves + final_moves + 1` likelihood calls on `n` particles (the stages
grow with how much the data shrink the prior). The walk's defaults (`ess=0.9, moves=20,
final_moves=40, clusters=8`) make about 420 calls on sbibm's slcp observations 1–5; the
mixture kernel's (`ess=0.5, moves=4, final_moves=8, clusters=32`: its independence steps
accept about half their proposals on slcp, the walk's a quarter) make 33–37, at a C2ST
of 0.510 against the walk's 0.505 (`benchmarks/bench_smc.py`). `KERNEL_DEFAULTS` holds
them; an option given explicitly overrides the kernel's. Every call has `n` rows, all inside the prior's support (a proposal outside
is rejected without its likelihood: its row is scored at the particle's current point
and dropped), so a jax or Keras likelihood network compiles once per run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed, is_int, positive_int
from pipekit_train.core._errors import ConfigError

__all__ = ["check_prior", "smc_sample"]

#: The random-walk rate the proposal scale is steered towards.
TARGET_ACCEPTANCE = 0.25
#: The independence proposal: the groups' mixture with this scale on each covariance.
INDEPENDENT_SCALE = 1.0
#: The Metropolis kernels `smc_sample` takes.
KERNELS = ("mixture", "walk")

#: Each kernel's default `ess`, `moves`, `final_moves` and `clusters`.
KERNEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "walk": {"ess": 0.9, "moves": 20, "final_moves": 40, "clusters": 8},
    "mixture": {"ess": 0.5, "moves": 4, "final_moves": 8, "clusters": 32},
}


def _systematic(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    edges = np.cumsum(weights)
    edges[-1] = 1.0
    return np.searchsorted(edges, (rng.random() + np.arange(len(weights))) / len(weights))


def _ess(increment: np.ndarray) -> float:
    w = np.exp(increment - increment.max())
    return float(w.sum() ** 2 / (w**2).sum())


def _next_beta(ll: np.ndarray, beta: float, share: float) -> float:
    """The largest `β' ≤ 1` whose weights `exp((β' - β) ll)` keep `share` of the ESS."""
    keep = share * len(ll)
    if _ess((1.0 - beta) * ll) >= keep:
        return 1.0
    lo, hi = beta, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _ess((mid - beta) * ll) >= keep else (lo, mid)
    return hi if lo <= beta else lo


class _Groups:
    """k-means groups of the particles (standardised), each group's mean, covariance
    factor and share: the random walk's proposal shapes and the independence proposal's
    Gaussian mixture."""

    def __init__(self, theta: np.ndarray, k: int, rng: np.random.Generator, rounds: int = 20):
        n, d = theta.shape
        self.mu, self.sd = theta.mean(axis=0), theta.std(axis=0) + 1e-12
        z = (theta - self.mu) / self.sd
        k = min(k, n)
        self.centres = z[rng.choice(n, size=k, replace=False)]
        for _ in range(rounds):
            label = self._nearest(z)
            count = np.bincount(label, minlength=k)
            sums = np.stack([np.bincount(label, weights=z[:, i], minlength=k) for i in range(d)])
            self.centres = np.where(
                count[:, None] > 0, sums.T / np.maximum(count, 1)[:, None], self.centres
            )
        label = self._nearest(z)
        self.labels = label
        count = np.bincount(label, minlength=k)
        whole = np.atleast_2d(np.cov(theta.T))
        onehot = np.zeros((n, k))
        onehot[np.arange(n), label] = 1.0
        means = (onehot.T @ theta) / np.maximum(count, 1)[:, None]
        centred = theta - means[label]
        outer = (centred[:, :, None] * centred[:, None, :]).reshape(n, d * d)
        covs = (onehot.T @ outer).reshape(k, d, d) / np.maximum(count - 1, 1)[:, None, None]
        small = count <= d + 1
        covs[small] = whole
        means[small & (count == 0)] = self.mu
        jitter = 1e-12 + 1e-9 * np.diag(whole).max()
        self.chol = np.linalg.cholesky(covs + jitter * np.eye(d))
        self.inv = np.linalg.inv(self.chol)
        self.logdet = np.sum(np.log(np.diagonal(self.chol, axis1=-2, axis2=-1)), axis=-1)
        self.means = means
        self.shift = np.einsum("kij,kj->ki", self.inv, means)
        with np.errstate(divide="ignore"):
            self.log_share = np.log(count / n)

    def _nearest(self, z: np.ndarray) -> np.ndarray:
        return np.argmin(np.sum(self.centres**2, axis=1) - 2.0 * z @ self.centres.T, axis=1)

    def label(self, theta: np.ndarray) -> np.ndarray:
        return self._nearest((theta - self.mu) / self.sd)

    def log_q(self, diff: np.ndarray, group: np.ndarray, scale: float) -> np.ndarray:
        """`log N(diff; 0, scale² Σ_group)` up to a constant shared by all groups."""
        sol = _per_group(self.inv, diff, group) / scale
        return -0.5 * np.sum(sol**2, axis=-1) - self.logdet[group]

    def walk(
        self, theta: np.ndarray, group: np.ndarray, noise: np.ndarray, scale: float
    ) -> np.ndarray:
        """Random-walk proposals: `θ + scale · L_group · noise`."""
        return theta + scale * _per_group(self.chol, noise, group)

    def mixture_log_q(self, theta: np.ndarray, scale: float) -> np.ndarray:
        """`log Σ_j share_j N(θ; mean_j, scale² Σ_j)` up to a constant."""
        sol = (np.matmul(theta, self.inv.transpose(0, 2, 1)) - self.shift[:, None, :]) / scale
        terms = -0.5 * np.sum(sol**2, axis=-1) + (self.log_share - self.logdet)[:, None]
        top = terms.max(axis=0)
        return top + np.log(np.sum(np.exp(terms - top), axis=0))

    def mixture_draw(self, rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
        """`n` draws of the groups' mixture (covariances scaled by `scale²`)."""
        group = rng.choice(len(self.means), size=n, p=np.exp(self.log_share))
        noise = rng.standard_normal((n, self.means.shape[1]))
        return self.means[group] + scale * _per_group(self.chol, noise, group)


def _per_group(factors: np.ndarray, rows: np.ndarray, group: np.ndarray) -> np.ndarray:
    """`factors[group[i]] @ rows[i]` for every row: all groups by one batched product, then
    each row's own (cheaper than gathering an `(n, d, d)` stack for small `d` and groups)."""
    every = np.matmul(rows, factors.transpose(0, 2, 1))  # (groups, n, d)
    return every[group, np.arange(len(rows))]


def _checked_log(
    fn: Callable, theta: np.ndarray, field: str, per_value: bool = False
) -> np.ndarray:
    out = np.asarray(fn(theta), dtype=np.float64)
    if per_value and out.shape == theta.shape:  # a prior of independent values (`Gaussian`)
        out = out.sum(axis=-1)
    if out.shape != (len(theta),):
        raise ConfigError(
            f"`{field}` must return one value per row of θ, shape ({len(theta)},). "
            f"Received: shape {out.shape}."
        )
    if np.any(np.isnan(out)) or np.any(out == np.inf):
        raise ConfigError(
            f"`{field}` returned NaN or +inf for θ = {theta[~np.isfinite(out)][0].tolist()}. "
            "Return a finite log-density (or -inf where θ is impossible)."
        )
    return out


class _Target:
    """`log prior + β log L`, with `-inf` outside the prior's support."""

    def __init__(self, log_likelihood: Callable, log_prior: Callable):
        self.log_likelihood, self.log_prior = log_likelihood, log_prior

    def __call__(
        self, theta: np.ndarray, inside: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(log prior, log L)` at `theta`; `log L` is `-inf` outside the prior's support.

        With `inside` (points in the support, one per row), the likelihood sees every
        call with the same number of rows: a row outside the support is scored at its
        `inside` point instead, and its result dropped. A compiled likelihood (a jax or
        Keras network) then compiles once, not once per count of rows inside.
        """
        lp = _checked_log(self.log_prior, theta, "prior.log_prob", per_value=True)
        ll = np.full(len(theta), -np.inf)
        ok = np.isfinite(lp)
        if inside is not None:
            rows = np.where(ok[:, None], theta, inside)
            ll[ok] = _checked_log(self.log_likelihood, rows, "log_likelihood")[ok]
        elif np.any(ok):
            ll[ok] = _checked_log(self.log_likelihood, theta[ok], "log_likelihood")
        return lp, ll


def _metropolis(
    target: _Target,
    state: tuple[np.ndarray, np.ndarray, np.ndarray],
    prop: np.ndarray,
    log_back: np.ndarray,
    beta: float,
    rng: np.random.Generator,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """One Metropolis-Hastings step to `prop`; `log_back` is `log q(θ | θ') - log q(θ' | θ)`."""
    theta, lp, ll = state
    lp_new, ll_new = target(prop, inside=theta)  # `theta`: all inside the support
    with np.errstate(invalid="ignore"):  # -inf - -inf where both lie outside: rejected
        log_a = lp_new - lp + beta * (ll_new - ll) + log_back
    accept = np.isfinite(lp_new) & (np.log(rng.random(len(theta))) < log_a)
    theta = np.where(accept[:, None], prop, theta)
    return (theta, np.where(accept, lp_new, lp), np.where(accept, ll_new, ll)), accept


def _move(
    target: _Target,
    state: tuple[np.ndarray, np.ndarray, np.ndarray],
    beta: float,
    steps: int,
    scale: float,
    clusters: int,
    kernel: str,
    rng: np.random.Generator,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], float, list[float]]:
    """`steps` Metropolis steps targeting `prior · L^β` with the groups of the particles at
    the stage's start: random-walk steps (`"walk"`), or independence steps from the groups'
    mixture and random-walk steps by turns, the independence step first (`"mixture"`)."""
    theta = state[0]
    d = theta.shape[1]
    groups = _Groups(theta, clusters, rng)
    here = groups.labels
    rates, walk_rates = [], []
    for step in range(steps):
        theta = state[0]
        if kernel == "mixture" and step % 2 == 0:
            prop = groups.mixture_draw(rng, len(theta), INDEPENDENT_SCALE)
            back = groups.mixture_log_q(theta, INDEPENDENT_SCALE) - groups.mixture_log_q(
                prop, INDEPENDENT_SCALE
            )
            state, accept = _metropolis(target, state, prop, back, beta, rng)
            here = groups.label(state[0])
        else:
            prop = groups.walk(theta, here, rng.standard_normal(theta.shape), scale)
            there = groups.label(prop)
            back = groups.log_q(theta - prop, there, scale) - groups.log_q(
                prop - theta, here, scale
            )
            state, accept = _metropolis(target, state, prop, back, beta, rng)
            here = np.where(accept, there, here)
            walk_rates.append(float(accept.mean()))
        rates.append(float(accept.mean()))
    # the kernel stays fixed within a stage; its scale moves towards the target rate between
    if walk_rates:
        rate = float(np.mean(walk_rates))
        scale *= float(np.exp(np.clip(rate - TARGET_ACCEPTANCE, -0.25, 0.25) * 4 / np.sqrt(d)))
    return state, scale, rates


def check_prior(prior: Any) -> None:
    """Raise `ConfigError` unless `prior` has `sample(rng, m)` and `log_prob(theta)`."""
    if not (
        callable(getattr(prior, "sample", None)) and callable(getattr(prior, "log_prob", None))
    ):
        raise ConfigError(
            "`prior` must have `sample(rng, m)` and `log_prob(theta)`. Received: "
            f"prior={prior!r}. Use BoxPrior(low, high) for a uniform box."
        )


def smc_sample(
    log_likelihood: Callable[[np.ndarray], Any],
    prior: Any,
    n: int,
    *,
    seed: int = 0,
    ess: float | None = None,
    moves: int | None = None,
    final_moves: int | None = None,
    clusters: int | None = None,
    kernel: str = "walk",
    info: dict[str, Any] | None = None,
) -> np.ndarray:
    """`n` draws of the posterior `prior(θ) · exp(log_likelihood(θ))` (see the module doc).

    ```python
    prior = BoxPrior(low=[-3.0] * 5, high=[3.0] * 5)
    draws = smc_sample(lambda theta: log_lik(theta), prior, 10_000, seed=0)
    ```

    Args:
        log_likelihood: `θ (m, d) -> (m,)`, the log-likelihood of the observation at each
            row (an estimate such as `LikelihoodPosterior.log_likelihood(x)`); `-inf`
            where θ is impossible, never NaN.
        prior: an object with `sample(rng, m) -> (m, d)` and `log_prob(θ) -> (m,)`
            (`BoxPrior`, a `Gaussian`, ...), `-inf` outside its support.
        n: the particles, and the draws returned; at least 2·d + 2.
        seed: seeds every random choice (the same seed, the same draws).
        ess: the share of the effective sample size each tempering step keeps, in (0, 1):
            closer to 1 is more steps, each a smaller change (more accurate, slower).
            None: the kernel's default (`KERNEL_DEFAULTS`: 0.9 for `"walk"`, 0.5 for
            `"mixture"`).
        moves: Metropolis steps per tempering step (one likelihood call each); None: the
            kernel's default (20, 4).
        final_moves: Metropolis steps at `β = 1`; None: the kernel's default (40, 8).
        clusters: k-means groups of the particles, whose covariances shape the
            proposals (and, with `kernel="mixture"`, whose Gaussian mixture is the
            independence proposal: more groups fit a curved or funnel-shaped posterior
            better); None: the kernel's default (8, 32).
        kernel: `"walk"` (the default): random-walk steps only, the sampler whose draws
            the SBI guide's NLE tables measure. `"mixture"`: independence steps from the
            groups' Gaussian mixture and random-walk steps by turns (they jump between
            modes and renew a particle in one accepted step); with its defaults about a
            twelfth of the walk's likelihood calls, at a slightly larger C2ST on slcp
            (0.510 against 0.505 over observations 1–5, 0.531 at the worst;
            `benchmarks/bench_smc.py`).
        info: a dict filled with `stages` (tempering steps), `betas`, `calls` (likelihood
            calls, each on `n` rows) and `acceptance` (the last step's rate), when given.

    Returns:
        `(n, d)` draws.

    Raises:
        ConfigError: bad options, or a `log_likelihood` / prior with the wrong shape or NaN.
    """
    if not callable(log_likelihood):
        raise ConfigError(
            "`log_likelihood` must be a function θ (m, d) -> (m,). Received: "
            f"log_likelihood={log_likelihood!r}."
        )
    check_prior(prior)
    if kernel not in KERNELS:
        raise ConfigError(
            f"`kernel` must be one of {list(KERNELS)}. Received: kernel={kernel!r}. Use "
            '"walk" (the default) or "mixture" (independence and random-walk steps).'
        )
    defaults = KERNEL_DEFAULTS[kernel]
    ess = defaults["ess"] if ess is None else ess
    moves = defaults["moves"] if moves is None else moves
    final_moves = defaults["final_moves"] if final_moves is None else final_moves
    clusters = defaults["clusters"] if clusters is None else clusters
    if isinstance(ess, bool) or not isinstance(ess, float | int) or not 0.0 < ess < 1.0:
        raise ConfigError(f"`ess` must be a number in (0, 1). Received: ess={ess!r}.")
    moves, clusters = positive_int("moves", moves), positive_int("clusters", clusters)
    if not is_int(final_moves) or final_moves < 0:
        raise ConfigError(
            f"`final_moves` must be an int >= 0. Received: final_moves={final_moves!r}."
        )
    n = positive_int("n", n)
    rng = np.random.default_rng([check_seed(seed), 0x534D43])
    theta = np.atleast_2d(np.asarray(prior.sample(rng, n), dtype=np.float64))
    d = theta.shape[1]
    if theta.shape != (n, d):
        raise ConfigError(
            f"`prior.sample(rng, {n})` must return ({n}, d) parameters. Received: shape "
            f"{theta.shape}."
        )
    if n < 2 * d + 2:
        raise ConfigError(
            f"`n` must be at least 2·d + 2 = {2 * d + 2} for {d} parameters (each group's "
            f"covariance needs more particles than values). Received: n={n}."
        )
    target = _Target(log_likelihood, prior.log_prob)
    lp, ll = target(theta)
    if not np.any(np.isfinite(ll)):
        raise ConfigError(
            f"`log_likelihood` is -inf at all {n} prior draws: the observation is impossible "
            "under the prior. Check the observation against the simulator and the prior."
        )
    state, beta, scale, betas = (theta, lp, ll), 0.0, 2.38 / np.sqrt(d), []
    rates: list[float] = []
    calls = 1
    while beta < 1.0:
        theta, lp, ll = state
        nxt = _next_beta(np.where(np.isfinite(ll), ll, -1e300), beta, float(ess))
        with np.errstate(invalid="ignore"):
            increment = np.where(np.isfinite(ll), (nxt - beta) * ll, -np.inf)
        w = np.exp(increment - increment.max())
        pick = _systematic(w / w.sum(), rng)
        state, beta = (theta[pick], lp[pick], ll[pick]), nxt
        state, scale, rates = _move(target, state, beta, moves, scale, clusters, kernel, rng)
        betas.append(beta)
        calls += moves
    if final_moves:
        state, scale, rates = _move(target, state, 1.0, final_moves, scale, clusters, kernel, rng)
        calls += final_moves
    if info is not None:
        info.update(
            stages=len(betas),
            betas=betas,
            calls=calls,
            acceptance=rates[-1] if rates else None,
        )
    return state[0]

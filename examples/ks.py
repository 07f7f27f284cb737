"""The Kuramoto–Sivashinsky equation on a periodic 1-D domain: a chaotic field, in numpy.

`u_t + u u_x + u_xx + u_xxxx = 0` on `[0, L)` with `L = 22` (chaotic; the leading
Lyapunov exponent is about 0.043, one Lyapunov time about 23 time units), `N = 64` grid
points, stepped with ETDRK4 (Cox & Matthews 2002, with Kassam & Trefethen's 2005 contour
integrals for its coefficients) at an internal step of 0.25; one emulator step is one
time unit (4 internal steps). States are channels-last fields `(N, 1)`.
"""

from __future__ import annotations

import numpy as np

L = 22.0  # the domain length
N = 64  # grid points
DT = 0.25  # the internal ETDRK4 step
INNER = 4  # internal steps per emulator step
EMULATOR_DT = DT * INNER  # one emulator step: 1 time unit
SPIN_UP = 200.0  # time units run before recording (onto the attractor)
LYAPUNOV_TIME = 23.0  # about 1 / 0.043 time units


def _coefficients(h: float = DT) -> tuple[np.ndarray, ...]:
    k = 2.0 * np.pi / L * np.fft.rfftfreq(N, d=1.0 / N)
    lin = k**2 - k**4
    e, e2 = np.exp(h * lin), np.exp(h * lin / 2.0)
    m = 32
    r = np.exp(1j * np.pi * (np.arange(1, m + 1) - 0.5) / m)
    lr = h * lin[:, None] + r[None, :]
    q = h * np.real(np.mean((np.exp(lr / 2.0) - 1.0) / lr, axis=1))
    f1 = h * np.real(np.mean((-4.0 - lr + np.exp(lr) * (4.0 - 3.0 * lr + lr**2)) / lr**3, axis=1))
    f2 = h * np.real(np.mean((2.0 + lr + np.exp(lr) * (-2.0 + lr)) / lr**3, axis=1))
    f3 = h * np.real(np.mean((-4.0 - 3.0 * lr - lr**2 + np.exp(lr) * (4.0 - lr)) / lr**3, axis=1))
    g = -0.5j * k
    return e, e2, q, f1, f2, f3, g


_COEF = _coefficients()


def advance(u: np.ndarray, n_steps: int = INNER) -> np.ndarray:
    """`n_steps` ETDRK4 steps of a batch of states `(..., N)` or fields `(..., N, 1)`."""
    field = u.shape[-1] == 1 and u.ndim >= 2
    x = np.asarray(u[..., 0] if field else u, np.float64)
    e, e2, q, f1, f2, f3, g = _COEF

    def nonlinear(v: np.ndarray) -> np.ndarray:
        return g * np.fft.rfft(np.fft.irfft(v, n=N) ** 2)

    v = np.fft.rfft(x)
    for _ in range(n_steps):
        nv = nonlinear(v)
        a = e2 * v + q * nv
        na = nonlinear(a)
        b = e2 * v + q * na
        nb = nonlinear(b)
        c = e2 * a + q * (2.0 * nb - nv)
        nc = nonlinear(c)
        v = e * v + nv * f1 + 2.0 * (na + nb) * f2 + nc * f3
    out = np.fft.irfft(v, n=N)
    return out[..., None] if field else out


def trajectories(n: int, n_steps: int = 100, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
    """`n` trajectories of `n_steps` emulator steps after a spin-up: `(n, n_steps + 1, N, 1)`."""
    rng = np.random.default_rng(seed)
    grid = np.arange(N) * L / N
    phases = rng.uniform(0.0, 2.0 * np.pi, (n, 4))
    u = sum(np.cos(2.0 * np.pi * (j + 1) * grid[None] / L + phases[:, j : j + 1]) for j in range(4))
    u = u + 0.1 * rng.standard_normal((n, N))
    u = advance(u, int(SPIN_UP / DT))
    states = [u]
    for _ in range(n_steps):
        u = advance(u)
        states.append(u)
    return np.stack(states, axis=1)[..., None].astype(dtype)

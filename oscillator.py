import numpy as np


def prior(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform([0.5, 0.0], [2.0, 0.5]).astype(np.float32)


def simulator(theta: np.ndarray) -> np.ndarray:
    omega, damping = float(theta[0]), float(theta[1])
    pos, vel, dt = 1.0, 0.0, 0.005
    out = np.empty(16, dtype=np.float32)
    for step in range(1600):
        vel += dt * (-(omega**2) * pos - 2 * damping * omega * vel)
        pos += dt * vel
        if step % 100 == 0:
            out[step // 100] = pos
    return out

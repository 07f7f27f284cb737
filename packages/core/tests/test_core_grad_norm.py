"""`TrainingLoop(log_grad_norm=True)`: the `grad_norm` metric, defined once in core.

On core's numpy reference backend (analytic gradients): the recorded value is the global
L2 norm of the update's gradient, it reaches the history and the writers once per step,
it is off by default, and a backend that does not declare it refuses it before any work.
The cross-backend agreement is in `tests-integration/test_golden_runs.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipekit_train.core import ConfigError, NotSupportedError, TrainingLoop
from pipekit_train.core.adapter import GRAD_NORM, Capabilities, global_grad_norm
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.metrics._grad_norm import reduce_micro
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp
from pipekit_train.core.writers import MemoryWriter

N, BATCH = 64, 16


def _arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
    return x, y


def _data() -> ArrayDataset:
    x, y = _arrays()
    return ArrayDataset(x=x, y=y)


def _loop(**overrides: Any) -> TrainingLoop:
    kwargs: dict[str, Any] = {
        "model": NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1),
        "data": _data(),
        "optimizer_config": {"name": "sgd", "lr": 0.05},
        "batch_size": BATCH,
        "max_steps": 6,
        "shuffle": False,
        "log_every_n_steps": 4,
        "adapter": NumpyAdapter(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def _by_hand(steps: int) -> list[float]:
    """Plain numpy SGD on the same batches: the gradient norm of every step."""
    op = NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1)
    params = {k: v.copy() for k, v in op.model.parameters().items()}
    x_all, y_all = _arrays()
    norms = []
    for step in range(steps):
        start = (step * BATCH) % N
        x, y = x_all[start : start + BATCH], y_all[start : start + BATCH]
        err = x @ params["W"] + params["b"] - y
        g = 2.0 * err / err.size
        gw, gb = x.T @ g, g.sum(axis=0)
        norms.append(float(np.sqrt((gw * gw).sum() + (gb * gb).sum())))
        params = {"W": params["W"] - 0.05 * gw, "b": params["b"] - 0.05 * gb}
    return norms


def test_each_step_records_the_global_norm_of_its_gradient() -> None:
    writer = MemoryWriter()
    artifact = _loop(log_grad_norm=True, writers=[writer]).run()
    recorded = [float(v) for v in artifact.history[GRAD_NORM]]
    assert recorded == pytest.approx(_by_hand(6), rel=1e-5)
    assert len(set(recorded)) == 6  # a value per step, not one repeated
    steps, written = writer.series(GRAD_NORM)
    assert steps == [1, 2, 3, 4, 5, 6] and written == recorded
    assert artifact.plan["log_grad_norm"] is True


def test_off_by_default_and_the_losses_do_not_depend_on_it() -> None:
    off = _loop().run()
    on = _loop(log_grad_norm=True).run()
    assert GRAD_NORM not in off.history.names
    assert list(off.history["loss"]) == list(on.history["loss"])
    assert off.weights_sha256 == on.weights_sha256


def test_a_backend_without_it_refuses_before_any_work() -> None:
    class NoNorm(NumpyAdapter):
        capabilities = Capabilities(online=True, skip_nonfinite=True)

    with pytest.raises(NotSupportedError, match=r"Received: log_grad_norm=True"):
        _loop(log_grad_norm=True, adapter=NoNorm())
    with pytest.raises(ConfigError, match=r"log_grad_norm=1"):
        _loop(log_grad_norm=1)


def test_global_grad_norm_is_the_l2_norm_over_every_array() -> None:
    grads = [np.full((2, 3), 2.0, np.float32), None, np.array([1.0], np.float16)]
    assert float(global_grad_norm(grads)) == pytest.approx(np.sqrt(6 * 4.0 + 1.0))
    with pytest.raises(ValueError, match="at least one gradient"):
        global_grad_norm([None])


def test_the_flat_and_the_per_array_reductions_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipekit_train.core.metrics import _grad_norm

    rng = np.random.default_rng(0)
    grads = [rng.normal(size=s).astype(np.float32) for s in [(64, 3), (64,), (), (1, 64)]]
    grads.append(rng.normal(size=(5,)).astype(np.float16))
    exact = np.sqrt(sum(float(np.sum(np.asarray(g, np.float64) ** 2)) for g in grads))
    flat = float(global_grad_norm(grads))  # 261 elements: one flat reduction
    monkeypatch.setattr(_grad_norm, "CONCAT_LIMIT", 0)
    per_array = float(global_grad_norm(grads))
    assert flat == pytest.approx(exact, rel=1e-6)
    assert per_array == pytest.approx(exact, rel=1e-6)


def test_accumulated_steps_take_the_last_batch_value_of_grad_norm_and_the_mean_loss() -> None:
    values = np.array([1.0, 2.0, 3.0, 5.0])  # 2 steps of 2 accumulated batches
    assert list(reduce_micro("loss", values, 2, 2)) == [1.5, 4.0]
    assert list(reduce_micro(GRAD_NORM, values, 2, 2)) == [2.0, 5.0]
    # one value per step (a backend that reports per update) is taken as it is
    assert list(reduce_micro(GRAD_NORM, np.array([7.0, 8.0]), 2, 2)) == [7.0, 8.0]

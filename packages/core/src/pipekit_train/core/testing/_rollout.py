"""`check_device_rollout`: the checks every backend's device rollout passes.

Each adapter package calls it with a factory of its model operators; it compares
`NeuralForward(...).rollout` (the device path) with the host loop (`forward(state)` step
by step) for every head, `keep`, `chunk`, one state and an ensemble, `Cycle`'s device
path with and without a hook at given steps, and the errors (bad input before any work,
a non-finite state naming its step and member). `check_corrected_rollout` does the same
for a model that corrects a coarse stepper (the stepper called on the backend's arrays
on the device path, on numpy on the host).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data._normalizer import Normalizer
from pipekit_train.core.distributions._mixture_math import mixture_width
from pipekit_train.core.rollout._cycle import Cycle, NeuralForward
from pipekit_train.core.rollout._step import NonFiniteStateError

__all__ = [
    "ROLLOUT_HEADS",
    "check_corrected_rollout",
    "check_device_rollout",
    "check_stochastic_rollout",
    "host_rollout",
]

#: `(head, NeuralForward options, output width for a state of d values)` the checks run.
ROLLOUT_HEADS: tuple[tuple[str, dict[str, Any], Callable[[int], int]], ...] = (
    ("point", {}, lambda d: d),
    ("gaussian", {}, lambda d: 2 * d),
    ("mixture", {"n_components": 3}, lambda d: mixture_width(3, d, "diag")),
    (
        "mixture",
        {"n_components": 2, "covariance": "full"},
        lambda d: mixture_width(2, d, "full"),
    ),
)


def host_rollout(forward: Callable[[np.ndarray], Any], x0: np.ndarray, n_steps: int) -> np.ndarray:
    """The reference: `forward` applied step by step on the host, states `0..n_steps`."""
    states = [np.asarray(x0, dtype=np.float64)]
    for _ in range(n_steps):
        states.append(np.asarray(forward(states[-1]), dtype=np.float64))
    return np.stack(states)


def _normalizer(d: int, rng: np.random.Generator) -> Normalizer:
    return Normalizer(
        {"x": rng.uniform(-1, 1, d), "y": rng.uniform(-0.1, 0.1, d)},
        {"x": rng.uniform(0.5, 2, d), "y": rng.uniform(0.01, 0.1, d)},
    )


def check_corrected_rollout(
    make_op: Callable[[int, int], Any],
    *,
    d: int = 3,
    members: int = 4,
    n_steps: int = 6,
    rtol: float = 2e-4,
    atol: float = 2e-5,
) -> None:
    """Check that a model correcting a coarse stepper (`periodic_diffusion`, written with
    the array API) rolls out on the device as on the host, for `correction="parallel"`
    and `"sequential"`, and that `Cycle` takes the device path.

    Args:
        make_op: `make_op(in_size, out_size)` -> a model operator with a device rollout.
        d: the values of one state.
        members: the ensemble size.
        n_steps: the rollout's length.
        rtol: the tolerance against the host loop.
        atol: the tolerance against the host loop.

    Raises:
        AssertionError: a check failed.
    """
    from ._golden_rollout import periodic_diffusion

    rng = np.random.default_rng(1)
    norm = _normalizer(d, rng)
    x = rng.uniform(-1, 1, (members, d))
    op = make_op(d, d)
    for correction, residual in (("parallel", True), ("sequential", False)):
        forward = NeuralForward(
            op,
            normalizer=norm,
            residual=residual,
            coarse_stepper=periodic_diffusion,
            correction=correction,
        )
        assert forward.on_device, f"{type(op).__name__} has no device rollout"
        reference = host_rollout(forward, x, n_steps)
        got = forward.rollout(x, n_steps)
        np.testing.assert_allclose(got, reference, rtol=rtol, atol=atol, err_msg=correction)
        plain = NeuralForward(op, normalizer=norm, residual=residual).rollout(x, n_steps)
        assert not np.allclose(plain, got, rtol=rtol, atol=atol), correction  # it is used
        cycle = Cycle(forward, n_steps)
        assert cycle.on_device
        np.testing.assert_allclose(cycle.run(x), reference, rtol=rtol, atol=atol)


def check_device_rollout(
    make_op: Callable[[int, int], Any],
    *,
    d: int = 3,
    members: int = 5,
    n_steps: int = 12,
    rtol: float = 2e-4,
    atol: float = 2e-5,
    heads: tuple[str, ...] = ("point", "gaussian", "mixture"),
    extras: bool = True,
) -> None:
    """Run the device-rollout checks on the operators `make_op(in_size, out_size)` builds.

    The operators must have a `rollout` method (the device path) and compute in float32.

    Args:
        make_op: `make_op(in_size, out_size)` -> a model operator.
        d: the values of one state.
        members: the ensemble size.
        n_steps: the rollout's length.
        rtol: the tolerance against the host loop.
        atol: the tolerance against the host loop.
        heads: the heads to check (`ROLLOUT_HEADS` entries of these names).
        extras: also check the hook at given steps and the errors.

    Raises:
        AssertionError: a check failed.
    """
    rng = np.random.default_rng(0)
    norm = _normalizer(d, rng)
    x = rng.uniform(-1, 1, (members, d))
    for head, options, width in ROLLOUT_HEADS:
        if head not in heads:
            continue
        op = make_op(d, width(d))
        forward = NeuralForward(op, normalizer=norm, residual=True, head=head, **options)
        assert forward.on_device, f"{type(op).__name__} has no device rollout"
        reference = host_rollout(forward, x, n_steps)
        got = forward.rollout(x, n_steps)
        assert got.shape == (n_steps + 1, members, d), (head, got.shape)
        np.testing.assert_allclose(got, reference, rtol=rtol, atol=atol, err_msg=head)
        # the stored steps, in segments of other lengths
        np.testing.assert_allclose(forward.rollout(x, n_steps, chunk=5), got, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(
            forward.rollout(x, n_steps, keep=4, chunk=8), got[::4], rtol=1e-6, atol=1e-7
        )
        np.testing.assert_allclose(
            forward.rollout(x, n_steps, keep="last", chunk=5), got[-1:], rtol=1e-6, atol=1e-7
        )
        single = forward.rollout(x[1], n_steps)
        assert single.shape == (n_steps + 1, d)
        np.testing.assert_allclose(single, got[:, 1], rtol=1e-5, atol=1e-6)
        # Cycle takes the device path and returns the host loop's trajectory
        cycle = Cycle(forward, n_steps)
        assert cycle.on_device
        np.testing.assert_allclose(cycle.run(x), reference, rtol=rtol, atol=atol)
    if not extras:
        return

    # a hook at given steps sees what a per-step hook sees at those steps
    op = make_op(d, d)
    forward = NeuralForward(op, normalizer=norm, residual=True)
    truth = rng.uniform(-1, 1, d)
    steps = [3, 4, 10, n_steps]

    def analysis(step: int, ensemble: np.ndarray) -> np.ndarray:
        return ensemble + 0.5 * (truth + 0.01 * step - ensemble.mean(axis=0))

    seen: list[int] = []

    def recorded(step: int, ensemble: np.ndarray) -> np.ndarray:
        seen.append(step)
        return analysis(step, ensemble)

    def per_step(step: int, ensemble: np.ndarray) -> np.ndarray | None:
        return analysis(step, ensemble) if step in steps else None

    fast = Cycle(forward, n_steps, hook=recorded, hook_steps=steps)
    assert fast.on_device and not Cycle(forward, n_steps, hook=per_step).on_device
    np.testing.assert_allclose(
        fast.run(x), Cycle(forward, n_steps, hook=per_step).run(x), rtol=rtol, atol=atol
    )
    assert seen == steps
    every = Cycle(forward, n_steps, hook=per_step, hook_steps=1).run(x)
    np.testing.assert_allclose(
        every, Cycle(forward, n_steps, hook=per_step).run(x), rtol=rtol, atol=atol
    )

    # bad input is refused before any step
    for bad, match in (
        (np.zeros((2, 2, d)), r"state.shape=\(2, 2, 3\)"),
        (np.full(d, np.nan), "must be finite"),
    ):
        try:
            forward.rollout(bad, 3)
        except ConfigError as exc:
            assert re.search(match, str(exc)), str(exc)
        else:
            raise AssertionError(f"a state {bad.shape} was not refused")
    wrong = NeuralForward(make_op(d, d + 1), normalizer=None)
    try:
        wrong.rollout(x, 3)
    except ConfigError as exc:
        assert "prediction shape (4,)" in str(exc), str(exc)
    else:
        raise AssertionError("a model whose prediction is not a state was not refused")

    # a non-finite state names the first step and member, on the device path too
    blow = Normalizer({"x": np.zeros(d), "y": np.full(d, 2e38)}, {"x": np.ones(d), "y": np.ones(d)})
    diverging = NeuralForward(make_op(d, d), normalizer=blow, residual=True)
    start = np.zeros((members, d), np.float32)
    start[3] = 2e38
    for run in (lambda: diverging.rollout(start, 5), lambda: Cycle(diverging, 5).run(start)):
        try:
            run()
        except NonFiniteStateError as exc:
            assert "at step 1 (after `forward`), first in ensemble member 3" in str(exc), str(exc)
        else:
            raise AssertionError("a diverging rollout did not raise NonFiniteStateError")
    start[3] = 0.0
    try:
        diverging.rollout(start, 5, chunk=1)
    except NonFiniteStateError as exc:
        assert exc.step == 2 and exc.member == 0, str(exc)
    else:
        raise AssertionError("a diverging rollout did not raise NonFiniteStateError")


def _moments(dist: Any) -> tuple[np.ndarray, np.ndarray]:
    """The mean and per-value variance of a `Gaussian` or `Mixture` (original units)."""
    if hasattr(dist, "std"):
        return np.asarray(dist.mean), np.asarray(dist.std) ** 2
    second = np.einsum(
        "...k,...kd->...d",
        dist.weights,
        np.diagonal(dist.covariances, axis1=-2, axis2=-1) + dist.means**2,
    )
    return dist.mean, second - dist.mean**2


def check_stochastic_rollout(
    make_op: Callable[[int, int], Any],
    *,
    d: int = 2,
    members: int = 4000,
    heads: tuple[str, ...] = ("gaussian", "mixture"),
) -> None:
    """Check seeded stochastic rollouts on the operators `make_op(in_size, out_size)` builds.

    For each head: the same seed repeats the rollout exactly (also in other segments and
    with `keep="last"`), another seed does not; one step of an ensemble started from one
    state has the predicted distribution's mean and variance (to 6 standard errors); a
    point head is refused before any work.

    Raises:
        AssertionError: a check failed.
    """
    rng = np.random.default_rng(5)
    norm = _normalizer(d, rng)
    x = rng.uniform(-1, 1, (6, d))
    for head, options, width in ROLLOUT_HEADS:
        if head not in heads:
            continue
        forward = NeuralForward(
            make_op(d, width(d)), normalizer=norm, residual=True, head=head, **options
        )
        first = forward.rollout(x, 9, stochastic=True, seed=3)
        np.testing.assert_array_equal(forward.rollout(x, 9, stochastic=True, seed=3), first)
        np.testing.assert_allclose(
            forward.rollout(x, 9, stochastic=True, seed=3, chunk=4), first, rtol=1e-6, atol=1e-7
        )
        np.testing.assert_allclose(
            forward.rollout(x, 9, stochastic=True, seed=3, keep="last"),
            first[-1:],
            rtol=1e-6,
            atol=1e-7,
        )
        assert not np.allclose(forward.rollout(x, 9, stochastic=True, seed=4), first), head
        assert not np.allclose(first, forward.rollout(x, 9)), head  # not the mean rollout
        # one step from one state: the draws have the predicted distribution's moments
        ensemble = np.repeat(x[:1], members, axis=0)
        draws = forward.rollout(ensemble, 1, stochastic=True, seed=0, keep="last")[0]
        mean, var = _moments(forward.distribution(x[0]))
        se = np.sqrt(var / members)
        assert np.all(np.abs(draws.mean(axis=0) - mean) < 6 * se + 1e-6), (
            head,
            draws.mean(0),
            mean,
        )
        np.testing.assert_allclose(draws.var(axis=0), var, rtol=0.15, err_msg=head)
    point = NeuralForward(make_op(d, d), normalizer=norm, residual=True)
    try:
        point.rollout(x, 3, stochastic=True)
    except ConfigError as exc:
        assert "needs a Gaussian or mixture head. Received: head='point'" in str(exc), str(exc)
    else:
        raise AssertionError("a stochastic rollout of a point head was not refused")


def check_rollout_monitor(model: Any, adapter: Any = None, *, horizon: int = 20) -> None:
    """A `RolloutMonitor` on a backend: rollout errors at every validation, through the
    run's evaluator (the moving average, in eval mode), equal to the trained model's.

    Trains `model` (2 inputs, 2 outputs) for 40 updates on the damped oscillator's
    increments (`residual=True`, a fitted `Normalizer`, `optimizer_config["ema"]`),
    validating every 20; the monitor's last errors must equal `rollout_validation` of
    `NeuralForward(artifact.model, artifact.normalizer, residual=True)`, and best-k
    checkpoints must be able to rank by them.
    """
    import tempfile
    from pathlib import Path

    from pipekit_train.core import Checkpoint, RolloutMonitor, TrainingLoop, rollout_validation
    from pipekit_train.core.checkpoint import step_dirs
    from pipekit_train.core.data import ArrayDataset

    from ._tasks import damped_oscillator_step

    def trajectories(n: int, length: int, seed: int) -> np.ndarray:
        states = [np.random.default_rng(seed).uniform(-1.0, 1.0, size=(n, 2))]
        for _ in range(length - 1):
            states.append(damped_oscillator_step(states[-1]))
        return np.stack(states, axis=1).astype(np.float32)

    pairs = trajectories(64, 9, seed=0)
    x, nxt = pairs[:, :-1].reshape(-1, 2), pairs[:, 1:].reshape(-1, 2)
    train = ArrayDataset(x=x[:448], y=(nxt - x)[:448])
    val = ArrayDataset(x=x[448:], y=(nxt - x)[448:])
    held_out = trajectories(6, horizon + 1, seed=7)
    bounds = (1, 5, horizon)
    monitor = RolloutMonitor(held_out, horizon, residual=True, bounds=bounds)
    key = f"val_rollout_nrmse_lead_6_{horizon}"
    with tempfile.TemporaryDirectory() as folder:
        artifact = TrainingLoop(
            model=model,
            data=train,
            validation=val,
            loss="mse",
            normalizer=Normalizer.fit(train),
            optimizer_config={"name": "adam", "lr": 1e-2, "ema": 0.9},
            batch_size=32,
            max_steps=40,
            validate_every_n_steps=20,
            callbacks=[monitor],
            checkpoint=Checkpoint(
                Path(folder) / "ckpt", every_n_steps=20, max_to_keep=1, keep_best=1, monitor=key
            ),
            adapter=adapter,
            progress=False,
            seed=0,
        ).run()
        steps, values = artifact.history.series(key)
        if steps != [20, 40]:
            raise AssertionError(f"rollout errors at steps {steps}, expected [20, 40]")
        best = steps[int(np.argmin(values))]
        kept = set(step_dirs(Path(folder) / "ckpt"))
        if kept != {40, best}:
            raise AssertionError(f"kept checkpoints {kept}, expected the latest and {best}")
    forward = NeuralForward(artifact.model, artifact.normalizer, residual=True)
    expected = rollout_validation(forward, held_out, horizon, bounds=bounds).metrics
    if not np.allclose(values[-1], expected[key], rtol=1e-5, atol=1e-7):
        raise AssertionError(
            f"the monitor's last {key}={values[-1]!r} differs from the trained model's "
            f"{expected[key]!r}"
        )
